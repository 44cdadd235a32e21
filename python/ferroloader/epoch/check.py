"""The state's layout: what a ``state_dict()`` must look like, field by
field, and what it must agree on with the loader it is loaded into (its
fingerprint). A state that was damaged, truncated, written by hand or
saved by another loader is refused here, before any of it is used."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from typing import Any, Optional

import torch
import torch.utils.data.dataloader as _tdl

from ferroloader.epoch.mixture import MixtureBatchSampler
from ferroloader.epoch.plan import _generators
from ferroloader.errors import ConfigError
from ferroloader.sampler import ElasticBatchSampler

FORMAT = 2
"""Version of the state's layout; a state of another version is refused.
Version 2: plain JSON types only (generator states as base64 text), worker
replica states for map-style datasets, states at an epoch's end."""

_KEY = "ferroloader_state"



def _fingerprint(loader: Any) -> dict[str, Any]:
    """What a state must agree on with the loader it is loaded into."""
    iterable = loader._dataset_kind == _tdl._DatasetKind.Iterable
    try:
        length: Optional[int] = len(loader.dataset)
    except TypeError:
        length = None
    sampler = None if iterable else type(loader._index_sampler)
    inner = getattr(loader._index_sampler, "sampler", None) if sampler else None
    sharding = getattr(loader, "sharding", None)
    sharded = None
    if sharding is not None:
        sharded = {
            "mode": sharding.mode,
            "lanes": sharding.lanes if sharding.mode == "static" else None,
            "shuffle_block": sharding.shuffle_block,
            "even": sharding.even,
            "shuffle": loader._shard_shuffle,
            "largest_first": sharding.largest_first if sharding.mode == "dynamic" else None,
            "across": sharding.across,
        }
    shard_count = shard_digest = None
    if sharding is not None:
        shards, lens = loader._shard_info()
        shard_count = len(shards)
        # the shard list is read once per loader, and so is its digest
        shard_digest = getattr(loader, "_shard_digest_cache", None)
        if shard_digest is None:
            shard_digest = loader._shard_digest_cache = _shard_digest(shards, lens)
    return {
        "dataset kind": "iterable" if iterable else "map",
        "sharding": sharded,
        "shard count": shard_count,
        "shard list (digest of names and lengths)": shard_digest,
        "dataset length": length,
        "batch size": loader.batch_size,
        "drop_last": bool(loader.drop_last),
        "sampler": None if sampler is None else f"{sampler.__module__}.{sampler.__qualname__}",
        "inner sampler": None if inner is None else type(inner).__qualname__,
        "seed": loader.seed,
        "per_sample_seed": loader.per_sample_seed,
    }


def _plain(obj: Any) -> Any:
    """A shard descriptor as stable plain data: what names it (a path, a
    number, a tuple of them), never an object's address."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    return type(obj).__qualname__


def _shard_digest(shards: list[Any], lens: Optional[list[int]]) -> str:
    """What a sharded position depends on: the shards, in order, and their
    lengths (when known), as a short digest."""
    text = json.dumps([[_plain(s) for s in shards], lens], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Malformed(Exception):
    """A field of a state has the wrong type or an impossible value."""


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise _Malformed(what)


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _int_list(v: Any, what: str) -> None:
    _need(isinstance(v, list) and all(_is_int(x) for x in v), f"{what} is not a list of counts")


def _check_generator_text(v: Any, size: int, what: str) -> None:
    _need(isinstance(v, str), f"{what} is not text")
    try:
        raw = base64.b64decode(v.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise _Malformed(f"{what} is not base64") from None
    _need(len(raw) == size, f"{what} has {len(raw)} bytes, a generator state has {size}")


def _check_worker_entry(w: Any, i: int) -> None:
    what = f"epoch.workers[{i}]"
    _need(isinstance(w, dict), f"{what} is not a mapping")
    _need(_is_int(w.get("delivered")), f"{what}.delivered is not a count")
    for key in ("exhausted", "done"):
        _need(isinstance(w.get(key, False), bool), f"{what}.{key} is not a bool")
    st = w.get("state")
    _need(
        st is None or (isinstance(st, dict) and set(st) <= {"dataset", "iterator"}),
        f"{what}.state is not a replica state",
    )


def _check_works(v: Any, n_shards: int, what: str) -> None:
    _need(isinstance(v, list), f"{what} is not a list")
    for w in v:
        _int_list(w, f"a work of {what}")
        _need(len(w) == 3, f"a work of {what} is not (shard, emitted, end)")
        _need(w[0] < n_shards, f"a work of {what} names shard {w[0]} of {n_shards}")
        _need(w[2] >= w[1], f"a work of {what} ends before it begins")


def _check_account(a: Any, n_shards: int, what: str) -> None:
    """One rank's account of an epoch of the shared queue."""
    _need(isinstance(a, dict), f"{what} is not a mapping")
    _check_works(a.get("list"), n_shards, f"{what}.list")
    _need(isinstance(a.get("list_id"), str), f"{what}.list_id is not text")
    claimed = a.get("claimed")
    _int_list(claimed, f"{what}.claimed")
    _need(all(p < len(a["list"]) for p in claimed), f"{what}.claimed names no work of its list")
    _check_works(a.get("rest"), n_shards, f"{what}.rest")
    _need(_is_int(a.get("handed")), f"{what}.handed is not a count")
    _need(a.get("budget") is None or _is_int(a["budget"]), f"{what}.budget is not a count")
    _need(isinstance(a.get("ended", False), bool), f"{what}.ended is not a bool")


def check_world(sh: Any, n_shards: int, what: str) -> None:
    """A rank's account, or every rank's (``merged``: ``merge_states``)."""
    _need(isinstance(sh, dict), f"{what} is not a mapping")
    if sh.get("merged"):
        accounts = sh.get("accounts")
        _need(isinstance(accounts, list) and bool(accounts), f"{what}.accounts is not a list")
        for i, a in enumerate(accounts):
            _check_account(a, n_shards, f"{what}.accounts[{i}]")
        return
    _check_account(sh, n_shards, what)


def _check_shards(sh: Any, n_shards: int) -> None:
    _need(isinstance(sh, dict), "epoch.shards is not a mapping")
    if sh.get("across") == "world":
        check_world(sh, n_shards, "epoch.shards")
        return
    _need(isinstance(sh.get("mode"), str), "epoch.shards.mode is not text")
    for key in ("rank", "world"):
        _need(key not in sh or _is_int(sh[key]), f"epoch.shards.{key} is not a count")
    if "consumed" in sh:
        _need(_is_int(sh["consumed"]), "epoch.shards.consumed is not a count")
        return
    _need(_is_int(sh.get("next_lane")), "epoch.shards.next_lane is not a count")
    _need(_is_int(sh.get("handed")), "epoch.shards.handed is not a count")
    positions = sh.get("positions")
    _need(isinstance(positions, list), "epoch.shards.positions is not a list")
    _need(sh["next_lane"] < max(len(positions), 1), "epoch.shards.next_lane names no lane")
    for p in positions:
        if p is not None:
            # (begun works, shard, items emitted from it)
            _int_list(p, "a lane position")
            _need(len(p) == 3, "a lane position is not (started, shard, emitted)")
            _need(p[1] < n_shards, f"a lane position names shard {p[1]} of {n_shards}")
    rest = sh.get("rest")
    _need(rest is None or isinstance(rest, list), "epoch.shards.rest is not a list")
    for w in rest or []:
        # (shard, items emitted from it[, where its part ends]): a dynamic
        # lane's batches not handed over end before their shard does
        _int_list(w, "a queued shard")
        _need(len(w) in (2, 3), "a queued shard is not (shard, emitted[, end])")
        _need(w[0] < n_shards, f"a queued shard names shard {w[0]} of {n_shards}")
        _need(len(w) == 2 or w[2] >= w[1], "a queued shard ends before it begins")


def _check_epoch(loader: Any, epoch: Any, generators: int, size: int, workers: int) -> None:
    _need(isinstance(epoch, dict), "epoch is not a mapping")
    for key in ("generators_at_start", "generators_at_first_draw"):
        if key == "generators_at_start" or key in epoch:
            states = epoch.get(key)
            _need(
                isinstance(states, list) and len(states) == generators,
                f"epoch.{key} does not list every generator",
            )
            for i, g in enumerate(states):
                _check_generator_text(g, size, f"epoch.{key}[{i}]")
    if "shards" in epoch:
        _need(loader._sharded(), "the state is of a sharded epoch, this loader is not sharded")
        _check_shards(epoch["shards"], len(loader._shard_info()[0]))
        return
    _need(not loader._sharded(), "this loader is sharded, the state's epoch is not")
    drawn = epoch.get("drawn")
    _need(_is_int(drawn), "epoch.drawn is not a count")
    pending = epoch.get("pending")
    _int_list(pending, "epoch.pending")
    _need(
        pending == sorted(set(pending)) and all(p < drawn for p in pending),
        "epoch.pending is not a sorted set of batches drawn",
    )
    _need(isinstance(epoch.get("exhausted", False), bool), "epoch.exhausted is not a bool")
    for key in ("reset",):
        _need(isinstance(epoch.get(key, False), bool), f"epoch.{key} is not a bool")
    if epoch.get("reset"):
        _need(_is_int(epoch.get("base_seed")), "epoch.base_seed is not a seed")
    if "workers" in epoch:
        ws = epoch["workers"]
        _need(isinstance(ws, list) and len(ws) == workers, "epoch.workers is not one per worker")
        for i, w in enumerate(ws):
            _check_worker_entry(w, i)
        nw = epoch.get("next_worker")
        _need(_is_int(nw) and nw < max(workers, 1), "epoch.next_worker is not a worker")
    if "elastic_sampler" in epoch:
        e = epoch["elastic_sampler"]
        _need(
            isinstance(e, dict) and _is_int(e.get("epoch")) and _is_int(e.get("consumed")),
            "epoch.elastic_sampler is not (epoch, consumed)",
        )
        _need(
            isinstance(loader._index_sampler, ElasticBatchSampler),
            "the state is of an ElasticBatchSampler, this loader has none",
        )
        if "mixture" in e:
            _check_segments(loader, e["mixture"])
    if "pending_batches" in epoch:
        pb = epoch["pending_batches"]
        _need(
            isinstance(pb, list) and len(pb) == len(pending),
            "epoch.pending_batches does not match epoch.pending",
        )


def _check_layout(loader: Any, state: dict[str, Any]) -> None:
    """Every field the resume reads, with its type and range: a state that
    was damaged, truncated or written by hand is refused here, before any
    of it is used."""
    _need(isinstance(state.get("fingerprint"), dict), "fingerprint is not a mapping")
    _need(_is_int(state.get("epochs_started")), "epochs_started is not a count")
    workers: Any = state.get("num_workers")
    _need(_is_int(workers), "num_workers is not a count")
    gens: Any = state.get("generators")
    _need(isinstance(gens, list), "generators is not a list")
    size = int(torch.default_generator.get_state().numel())
    for i, g in enumerate(gens):
        _need(isinstance(g, dict), f"generators[{i}] is not a mapping")
        roles = g.get("roles")
        _need(
            isinstance(roles, list) and all(isinstance(r, str) for r in roles),
            f"generators[{i}].roles is not a list of names",
        )
        _check_generator_text(g.get("state"), size, f"generators[{i}].state")
    _need("base_seed" not in state or _is_int(state["base_seed"]), "base_seed is not a seed")
    if "worker_states" in state:
        ws = state["worker_states"]
        _need(isinstance(ws, list) and len(ws) == workers, "worker_states is not one per worker")
        for i, w in enumerate(ws):
            _check_worker_entry({"delivered": 0, "state": w}, i)
    if "world_carry" in state:
        check_world(state["world_carry"], len(loader._shard_info()[0]), "world_carry")
    _need("epoch" in state, "the state has no epoch")
    if state["epoch"] is not None:
        _check_epoch(loader, state["epoch"], len(gens), size, workers)


def _check_segments(loader: Any, segments: Any) -> None:
    sampler = loader._index_sampler
    _need(
        isinstance(sampler, MixtureBatchSampler), "the state is of a Mixture, this loader's is not"
    )
    n = len(sampler.mixture.names)
    listed = isinstance(segments, list) and bool(segments)
    _need(listed, "epoch.elastic_sampler.mixture is not a list")
    last = -1
    for seg in segments:
        ok = (
            isinstance(seg, list) and len(seg) == 2 and _is_int(seg[0]) and seg[0] > last
            and isinstance(seg[1], list) and len(seg[1]) == n
            and all(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0
                    for w in seg[1])
        )
        _need(ok, f"epoch.elastic_sampler.mixture is not [start, {n} weights] segments")
        last = seg[0]
    _need(segments[0][0] == 0, "epoch.elastic_sampler.mixture does not start at 0")


def validate(loader: Any, state: Any) -> dict[str, Any]:
    """Checks a state against the loader; a ``ValueError`` names the first
    mismatch or malformed field."""
    if not isinstance(state, dict) or _KEY not in state:
        raise ConfigError("load_state_dict(): not a ferroloader DataLoader state")
    if state[_KEY] != FORMAT:
        raise ConfigError(
            f"load_state_dict(): the state has format version {state[_KEY]!r}; this ferroloader "
            f"reads version {FORMAT}"
        )
    try:
        _check_layout(loader, state)
    except _Malformed as e:
        raise ConfigError(f"load_state_dict(): the state is malformed: {e}") from None
    mine = _fingerprint(loader)
    saved = state["fingerprint"]
    for key, value in mine.items():
        if key not in saved or saved[key] != value:
            raise ConfigError(
                f"load_state_dict(): the state was saved with {key} {saved.get(key)!r}, "
                f"this loader has {value!r}"
            )
    roles = [g["roles"] for g in state["generators"]]
    here = [r for r, _ in _generators(loader)]
    if roles != here:
        raise ConfigError(
            f"load_state_dict(): the state's generators are {roles}, this loader's are {here} "
            "(was generator= passed to one loader and not the other?)"
        )
    return state
