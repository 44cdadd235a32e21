"""The state's layout: what a ``state_dict()`` must look like, field by
field, and what it must agree on with the loader it is loaded into (its
fingerprint). A state that was damaged, truncated, written by hand or
saved by another loader is refused here, before any of it is used."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

import torch
import torch.utils.data.dataloader as _tdl

import ferroloader._core as _core
from ferroloader._moved import old_path
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
        # (a class that moved is named by its old path, as saved states name it)
        "sampler": None if sampler is None
        else f"{old_path(sampler.__module__)}.{sampler.__qualname__}",
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


def _facts(loader: Any) -> dict[str, Any]:
    """What a state's layout depends on in ``loader`` (the engine checks
    the layout, ``_core.check_state_layout``)."""
    sampler = loader._index_sampler
    return {
        "shards": len(loader._shard_info()[0]) if loader._sharded() else None,
        "generator_bytes": int(torch.default_generator.get_state().numel()),
        "elastic": isinstance(sampler, ElasticBatchSampler),
        "mixture": (len(sampler.mixture.names) if isinstance(sampler, MixtureBatchSampler)
                    else None),
    }


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
    # every field the resume reads, with its type and range, before any of
    # it is used
    _core.check_state_layout(state, _facts(loader))
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
