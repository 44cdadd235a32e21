"""ferroloader's own option classes, drawn by hypothesis: ``RayWorkers``,
``Sharding``, ``ShardCache``, ``Autotune`` and ``DynamicDistributedSampler``.

Each example sets one argument (or the pair ``rank``/``world_size``) to a
drawn value (zero, negative, huge, NaN, infinite, wrong types, strings
that look like numbers, addresses or method names) and leaves the others
at their defaults. The oracle is each argument's documented forms, written
here from the docstrings: a value of those forms constructs the object; any
other raises ``ConfigError`` at construction, naming the argument and what
it accepts. Never a raw ``TypeError`` or ``AttributeError``, never a value
accepted and misread later (``even="yes"``, ``methods="threads"`` split into
letters, ``address=6379``)."""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import ferroloader as fl
import pytest
import torch
import torch.distributed as dist
from helpers import ferro_only
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = ferro_only

CARELESS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70000),
    st.sampled_from([2**63, -(2**63), 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["yes", "0", "2", "threads", "Ray", "GPU", "auto", "stream", "static",
                     "localhost:29500", "127.0.0.1:6379", "ray://h:10001", "6379", "CPU",
                     "processes", "/some/dir"]),
    st.lists(st.sampled_from(["processes", "threads", "x", 1]), max_size=3),
    st.tuples(st.sampled_from(["processes", "threads", "threads_in_processes"])),
    st.dictionaries(st.sampled_from(["GPU", "CPU", "", "other", 1]),
                    st.one_of(st.integers(-1, 3), st.floats(allow_nan=True), st.text(max_size=2)),
                    max_size=2),
)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _address(v: Any) -> bool:
    if v is None or v in ("auto", "local"):
        return True
    if not isinstance(v, str):
        return False
    rest = v.split("://", 1)[1] if "://" in v else v
    host, _, port = rest.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _resources(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and all(
        isinstance(k, str) and k not in ("", "CPU") and _number(x) and x >= 0
        for k, x in v.items()))


RAY_WORKERS: dict[str, Callable[[Any], bool]] = {
    "address": _address,
    "num_cpus": lambda v: _number(v) and v >= 0,
    "resources": _resources,
    "avoid_trainer_node": lambda v: isinstance(v, bool),
    "max_restarts": lambda v: _int(v) and v >= 0,
    "transport": lambda v: v in ("stream", "object_store"),
    "place_within": lambda v: _number(v) and v > 0,
    "idle_timeout": lambda v: _number(v) and v >= 0,
}

AUTOTUNE: dict[str, Callable[[Any], bool]] = {
    "max_workers": lambda v: v is None or (_int(v) and v >= 0),
    "cpu": lambda v: v is None or (_number(v) and v > 0),
    "ram": lambda v: v is None or (_int(v) and v >= 1),
    "methods": lambda v: v is None or (
        isinstance(v, (list, tuple)) and len(v) > 0
        and all(m in ("processes", "threads", "threads_in_processes") for m in v)),
    "prefetch": lambda v: isinstance(v, bool),
}

SHARDING: dict[str, Callable[[Any], bool]] = {
    "mode": lambda v: v in ("static", "dynamic", "elastic"),
    "lanes": lambda v: _int(v) and 1 <= v <= 1 << 16,
    "shuffle_block": lambda v: _int(v) and 1 <= v <= 2**63 - 1,
    "even": lambda v: isinstance(v, bool),
    "largest_first": lambda v: isinstance(v, bool),
    "wait_for_ranks": lambda v: _number(v) and v > 0,
}
# the shared queue's own arguments (with mode="dynamic", across="world")
WORLD: dict[str, Callable[[Any], bool]] = {
    "store": lambda v: v is None,  # (no drawn value is a store; a real one is below)
    "name": lambda v: v is None or (isinstance(v, str) and v != ""),
}

SAMPLER: dict[str, Callable[[Any], bool]] = {
    "block": lambda v: _int(v) and 1 <= v < 2**63,
    "shuffle": lambda v: isinstance(v, bool),
    "even": lambda v: isinstance(v, bool),
    "seed": _int,
}


def _pair(rank: Any, world: Any) -> bool:
    if rank is None and world is None:
        return True
    return _int(rank) and _int(world) and world >= 1 and 0 <= rank < world


def check(make: Callable[[], Any], accepted: bool, names: tuple[str, ...], value: Any) -> None:
    if accepted:
        make()
        return
    with pytest.raises(fl.ConfigError) as e:
        make()
    text = str(e.value)
    assert any(n in text for n in names), (names, value, text)
    assert "should be" in text or "not a setting" in text, text


@given(arg=st.sampled_from(sorted(RAY_WORKERS)), value=CARELESS)
@settings(max_examples=max(60, settings.default.max_examples))
def test_ray_workers(arg, value):
    check(lambda: fl.RayWorkers(**{arg: value}), RAY_WORKERS[arg](value), (arg,), value)


@given(arg=st.sampled_from(sorted(AUTOTUNE)), value=CARELESS)
@settings(max_examples=max(60, settings.default.max_examples))
def test_autotune(arg, value):
    check(lambda: fl.Autotune(**{arg: value}), AUTOTUNE[arg](value), (arg,), value)


@given(arg=st.sampled_from(sorted(SHARDING) + sorted(WORLD)), value=CARELESS)
@settings(max_examples=max(60, settings.default.max_examples))
def test_sharding(arg, value):
    if arg in WORLD:
        make = lambda: fl.Sharding(mode="dynamic", across="world", **{arg: value})  # noqa: E731
        check(make, WORLD[arg](value), (arg,), value)
    else:
        check(lambda: fl.Sharding(**{arg: value}), SHARDING[arg](value), (arg,), value)


@given(rank=CARELESS, world=CARELESS)
def test_sharding_rank_and_world_size(rank, world):
    check(lambda: fl.Sharding(rank=rank, world_size=world), _pair(rank, world),
          ("rank", "world_size"), (rank, world))


@given(arg=st.sampled_from(sorted(SAMPLER)), value=CARELESS)
@settings(max_examples=max(60, settings.default.max_examples))
def test_dynamic_distributed_sampler(arg, value):
    ds = torch.arange(10)
    check(lambda: fl.DynamicDistributedSampler(ds, store=dist.HashStore(), **{arg: value}),
          SAMPLER[arg](value), (arg,), value)


@given(rank=CARELESS, world=CARELESS)
def test_dynamic_distributed_sampler_rank_and_num_replicas(rank, world):
    ds = torch.arange(10)
    check(lambda: fl.DynamicDistributedSampler(ds, rank=rank, num_replicas=world),
          _pair(rank, world), ("rank", "num_replicas"), (rank, world))


@given(value=CARELESS)
def test_shard_cache_budget_streams_and_dir(tmp_path_factory, value):
    folder = str(tmp_path_factory.mktemp("cache"))
    if not isinstance(value, str):  # (a size string has its own test)
        check(lambda: fl.ShardCache(dir=folder, budget=value),
              value is None or (_int(value) and 1 <= value <= 2**64 - 1), ("budget",), value)
    check(lambda: fl.ShardCache(dir=folder, streams=value), _int(value) and value >= 1,
          ("streams",), value)
    check(lambda: fl.ShardCache(dir=value if value is not None else folder),
          value is None or isinstance(value, str), ("dir",), value)


KNOWN = ["aws_endpoint", "aws_region", "allow_http", "aws_allow_http", "endpoint", "timeout",
         "google_service_account", "azure_storage_account_name", "retries", "retry_timeout"]


@given(key=st.one_of(st.sampled_from(KNOWN), st.text(max_size=12),
                     st.sampled_from(["bogus", "aws_endpont", "AWS_ENDPOINT", "allow-http",
                                      "alow_http", "endpoint_urll"])))
def test_shard_cache_options_keys_are_the_stores(tmp_path_factory, key):
    """A key some store knows is taken; any other is refused naming it (a
    misspelt endpoint sent the engine to the default one, real AWS)."""
    folder = str(tmp_path_factory.mktemp("cache"))
    value = "1" if key in ("retries", "retry_timeout", "timeout") else "true"
    if key in KNOWN:
        fl.ShardCache(dir=folder, options={key: value})
        return
    from ferroloader import _core

    if _core.store_option_known(key):  # (a drawn key that happens to be one)
        return
    with pytest.raises(fl.ConfigError, match="is not a setting of any store") as e:
        fl.ShardCache(dir=folder, options={key: value})
    assert repr(key) in str(e.value)


def test_careless_inputs_from_the_walk():
    """The walk's cases, each with the hint it gives."""
    with pytest.raises(fl.ConfigError, match=r"did you mean 'aws_endpoint'"):
        fl.ShardCache(options={"aws_endpont": "http://localhost:9000"})
    with pytest.raises(fl.ConfigError, match=r"ShardCache\(dir='/some/dir'\)"):
        fl.FileShards(["a", "b"], lambda p: [], cache="/some/dir")
    with pytest.raises(fl.ConfigError, match=r"no store reads ftp:// URLs"):
        fl.FileShards(["ftp://host/part-0"], lambda p: [])
    with pytest.raises(fl.ConfigError, match=r"TCPStore\(host, port"):
        fl.Sharding(mode="dynamic", across="world", store="localhost:29500")
    with pytest.raises(fl.ConfigError, match=r"such as \('threads',\)"):
        fl.Autotune(methods="threads")
    with pytest.raises(ValueError, match=r"'ray'.*did you mean 'ray'"):
        fl.DataLoader(torch.arange(4), num_workers=1, worker_method="Ray")
    with pytest.raises(fl.ConfigError, match=r"world_size should be a positive int"):
        fl.Sharding(rank=0, world_size=0)
    with pytest.raises(fl.ConfigError, match=r"\{'GPU': 1\}"):
        fl.RayWorkers(resources="GPU")
    # a real store is taken
    fl.Sharding(mode="dynamic", across="world", store=dist.HashStore())
    fl.ShardCache(dir=os.getcwd(), budget="1MiB", options={"allow_http": True})
