"""Snapshot and resume: ``DataLoader.state_dict()`` / ``load_state_dict()``.

How a snapshot works. When an epoch starts, the loader records the state of
every ``torch.Generator`` the epoch may draw from (the global one, the
loader's ``generator=``, a sampler's ``generator``); about 5 KB each, read
once per epoch. ``state_dict()`` then only reads counters the engine keeps
anyway: how many batches were drawn from the index stream, and which of
them (by sequence number) have not been handed over yet, being in flight in
a worker or waiting their turn. It neither pauses nor asks the workers.

How a resume works. ``load_state_dict()`` validates the state and puts the
generators back where they were when it was taken. The next ``iter()``
rebuilds the interrupted epoch: the generators are set to their
epoch-start states, the epoch is opened exactly as before (same
permutation, same base seed), the index stream is advanced past the batches
already handed over (in Rust, without building them, for the built-in
samplers), the batches that were in flight are queued first, and the
generators are put back. So no batch is lost or repeated, and the order
does not depend on ``num_workers``.

Samplers, batch samplers and datasets with ``state_dict()`` /
``load_state_dict()`` (the ``torchdata`` ``Stateful`` protocol) are saved
and restored through those methods; any other Python sampler is
fast-forwarded by drawing and dropping the indices already used.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import itertools
import json
import os
import pickle
import weakref
from typing import Any, Optional

import torch
import torch.utils.data.dataloader as _tdl
import torch.utils.data.sampler as _ts

from ferroloader import _core
from ferroloader.errors import ConfigError, StateMismatchError
from ferroloader.mixture import MixtureBatchSampler
from ferroloader.seeds import epoch_seed
from ferroloader.shards import ElasticBatchSampler

FORMAT = 2
"""Version of the state's layout; a state of another version is refused.
Version 2: plain JSON types only (generator states as base64 text), worker
replica states for map-style datasets, states at an epoch's end."""

_KEY = "ferroloader_state"


def stateful(obj: Any) -> bool:
    """Whether `obj` has torchdata's ``Stateful`` methods."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _generators(loader: Any) -> list[tuple[list[str], torch.Generator]]:
    """The CPU generators an epoch may draw from, each once, with the roles
    it plays (``global``, ``loader``, ``sampler``, ``batch_sampler.sampler``)."""
    found: list[tuple[str, Any]] = [("global", torch.default_generator)]
    if loader.generator is not None:
        found.append(("loader", loader.generator))
    found.append(("sampler", getattr(loader.sampler, "generator", None)))
    inner = getattr(loader.batch_sampler, "sampler", None)
    found.append(("batch_sampler.sampler", getattr(inner, "generator", None)))
    groups: list[tuple[list[str], torch.Generator]] = []
    for role, g in found:
        if not isinstance(g, torch.Generator) or g.device.type != "cpu":
            continue
        for roles, known in groups:
            if known is g:
                roles.append(role)
                break
        else:
            groups.append(([role], g))
    return groups


def _stateful_sampler(loader: Any) -> Optional[Any]:
    """The sampler whose own state methods save the epoch's position: the
    index sampler, or the sampler inside a ``BatchSampler``."""
    index_sampler = loader._index_sampler
    if stateful(index_sampler):
        return index_sampler
    if isinstance(index_sampler, _ts.BatchSampler) and stateful(index_sampler.sampler):
        return index_sampler.sampler
    return None


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


class Epoch:
    """One epoch's record: the generators' states when it began, and a
    weak link to the iterator that reports its position."""

    def __init__(self, loader: Any, number: int) -> None:
        self.number = number
        self.dataset = loader.dataset
        self.groups = _generators(loader)
        self.start = [g.get_state() for _, g in self.groups]
        self.sampler = _stateful_sampler(loader)
        self.iterator: Optional[weakref.ref[Any]] = None
        # the engine's record of a stateful sampler's recent batches
        self.recorder: Optional[_core.Recorder] = None
        # the position when the iterator went away (read from it until then)
        self.last: Optional[dict[str, Any]] = None
        self.dataset_iter: Optional[Any] = None
        self.multiprocess = False
        self.iterable = loader._dataset_kind == _tdl._DatasetKind.Iterable
        # a resumed epoch: where it resumed (its iterator counts from 0)
        self.base: Optional[dict[str, Any]] = None
        # the sampler state loaded for a resumed epoch: a sampler not yet
        # iterated since may not report it (torchdata's do not)
        self.loaded_sampler_state: Any = None
        # a sharded epoch (ferroloader.shards.ShardEpoch): its position is
        # the lanes' (or the elastic sequence's), in absolute terms
        self.shards: Optional[Any] = None
        # the workers' base seed, and whether the epoch began on persistent
        # workers (torch draws a base seed only for new workers)
        self.base_seed: Optional[int] = None
        self.reset = False
        # one process: the generators' states when iter() was done with them,
        # and, if other code drew from them (or reseeded them) before the
        # first index was drawn, their states then (a resume replays that)
        self.after_iter: Optional[list[Any]] = None
        self.first_draw: Optional[list[Any]] = None
        # a map-style dataset with state methods, in workers: each worker's
        # replica state travels with its batches
        self.worker_states = (
            not self.iterable and loader.num_workers > 0 and stateful(loader.dataset)
        )

    def watch_first_draw(self, iterator: Any) -> None:
        """A one-process epoch draws its first index at the first
        ``next()``; what ran since ``iter()`` may have moved the generators
        the sampler draws from."""
        self.after_iter = _states(self.groups)
        iterator._on_first_draw(self._first_draw)

    def _first_draw(self) -> None:
        now = _states(self.groups)
        before, self.after_iter = self.after_iter, None
        if before is not None and any(not torch.equal(a, b) for a, b in zip(before, now)):
            self.first_draw = now

    def attach(self, iterator: Any, multiprocess: bool) -> None:
        self.iterator = weakref.ref(iterator)
        self.multiprocess = multiprocess
        iterator._epoch_record = self

    def position(self) -> dict[str, Any]:
        """Where the epoch stands: ``drawn``, ``pending`` (sequence numbers
        in flight), ``ended``; for an iterable, ``exhausted`` (one process)
        or ``workers`` and ``next_worker`` (several). Counted from the
        epoch's start, also in a resumed epoch."""
        it = self.iterator() if self.iterator is not None else None
        if it is not None:
            pos = self.read(it)
        elif self.last is not None:
            pos = self.last
        else:
            pos = {"drawn": 0, "pending": [], "ended": False}
        return pos if self.base is None else self._from_start(pos)

    def _from_start(self, pos: dict[str, Any]) -> dict[str, Any]:
        """A resumed iterator's position in the epoch's own numbering: its
        first draws were the batches in flight at the snapshot (``kept``),
        then the epoch went on from the snapshot's ``drawn``."""
        assert self.base is not None
        kept: list[int] = self.base["kept"]
        start = int(self.base["drawn"])
        k = len(kept)
        drawn = int(pos["drawn"])

        def seq(i: int) -> int:
            return kept[i] if i < k else start + (i - k)

        out = dict(pos)
        out["drawn"] = start + max(0, drawn - k)
        out["pending"] = sorted([seq(i) for i in pos["pending"]] + kept[drawn:])
        if "workers" in pos and self.base.get("workers"):
            out["workers"] = [
                {
                    "delivered": old["delivered"] + new["delivered"],
                    "state": old["state"] if new["state"] is None else new["state"],
                    "exhausted": new["exhausted"],
                    "done": new["done"],
                }
                for old, new in zip(self.base["workers"], pos["workers"])
            ]
        return out

    def detach(self, iterator: Any) -> None:
        """The iterator is going away: keep its last position."""
        self.last = self.read(iterator)

    def read(self, it: Any) -> dict[str, Any]:
        if self.shards is not None:
            ended = bool(it._position[2])
            return {
                "drawn": 0,
                "pending": [],
                "ended": ended,
                "shards": self.shards.snapshot(it, self.multiprocess),
            }
        if not self.multiprocess:
            drawn, yielded, ended, exhausted = it._position
            # an iterable's position is counted in batches handed over
            return {
                "drawn": int(yielded if self.iterable else drawn),
                "pending": [],
                "ended": bool(ended),
                "exhausted": bool(exhausted),
            }
        drawn, pending, ended = it._position
        pos: dict[str, Any] = {"drawn": int(drawn), "pending": list(pending), "ended": bool(ended)}
        if self.iterable or self.worker_states:
            delivered, states, exhausted, next_worker, done = it._iterable_position
            pos["workers"] = [
                {
                    "delivered": int(d),
                    "state": None if s is None else pickle.loads(s),
                    "exhausted": bool(e),
                    "done": bool(f),
                }
                for d, s, e, f in zip(delivered, states, exhausted, done)
            ]
            pos["next_worker"] = int(next_worker)
        return pos


def _states(groups: list[tuple[list[str], torch.Generator]]) -> list[Any]:
    return [g.get_state() for _, g in groups]


def _set(groups: list[tuple[list[str], torch.Generator]], states: list[Any]) -> None:
    for (_, g), s in zip(groups, states):
        g.set_state(s)


def _encode(g: torch.Tensor) -> str:
    """A generator state as JSON-ready text (base64 of its bytes)."""
    return base64.b64encode(g.numpy().tobytes()).decode("ascii")


def _pristine(loader: Any) -> Optional[dict[str, Any]]:
    """A loaded state that no ``iter()`` has consumed yet: ``state_dict()``
    returns it as it was loaded (torchdata's contract)."""
    return loader._pending_state


def snapshot(loader: Any) -> dict[str, Any]:
    """``DataLoader.state_dict()``."""
    pending = _pristine(loader)
    if pending is not None:
        return _copy(pending)
    rec: Optional[Epoch] = loader._epoch
    groups = _generators(loader)
    state: dict[str, Any] = {
        _KEY: FORMAT,
        "fingerprint": _fingerprint(loader),
        "epochs_started": loader._epochs_started,
        # workers: processes (or threads) times worker_threads
        "num_workers": loader._workers,
        "generators": [
            {"roles": list(roles), "state": _encode(g.get_state())} for roles, g in groups
        ],
        "epoch": None,
    }
    sampler = _stateful_sampler(loader)
    if sampler is not None:
        # between epochs too: a stateful sampler may count epochs itself
        state["sampler_state"] = sampler.state_dict()
    dataset = loader.dataset
    if loader.num_workers == 0 and not loader._sharded() and stateful(dataset):
        # the dataset is iterated here: its state is the main process's
        it = rec.dataset_iter if rec is not None and rec.iterable else None
        if it is not dataset:
            state["dataset_state"] = dataset.state_dict()
    if rec is None:
        return state
    pos = rec.position()
    if pos["ended"]:
        _between_epochs(loader, rec, pos, state)
        return state
    if "shards" in pos:
        # the lanes' positions (or the elastic sequence's) say it all
        state["epoch"] = {
            "shards": pos["shards"],
            "generators_at_start": [_encode(s) for s in rec.start],
        }
        _persistent_seed(rec, state["epoch"])
        return state
    pending = pos["pending"]
    epoch: dict[str, Any] = {
        "drawn": pos["drawn"],
        "pending": pending,
        "generators_at_start": [_encode(s) for s in rec.start],
        "exhausted": pos.get("exhausted", False),
    }
    if rec.first_draw is not None:
        epoch["generators_at_first_draw"] = [_encode(s) for s in rec.first_draw]
    _persistent_seed(rec, epoch)
    if "workers" in pos:
        # each worker's replica: batches handed over, and the state that
        # came with its last one (when the dataset has state methods)
        epoch["workers"] = pos["workers"]
        epoch["next_worker"] = pos["next_worker"]
    sampler = loader._index_sampler
    if isinstance(sampler, ElasticBatchSampler):
        # the global position after the batches handed over (in order)
        handed = min(pending) if pending else pos["drawn"]
        epoch["elastic_sampler"] = {
            "epoch": sampler.epoch,
            "consumed": sampler.consumed(int(handed)),
        }
        if isinstance(sampler, MixtureBatchSampler):
            # the weights in force over the epoch so far (a resume with
            # other weights follows them from its position on)
            epoch["elastic_sampler"]["mixture"] = sampler.snapshot_segments()
    if rec.sampler is not None:
        untouched = rec.recorder is not None and not rec.recorder.pulled
        if untouched and rec.loaded_sampler_state is not None:
            epoch["sampler_state"] = rec.loaded_sampler_state
        else:
            epoch["sampler_state"] = rec.sampler.state_dict()
        if rec.recorder is not None and pending:
            batches = rec.recorder.batches(pending)
            missing = [s for s, b in zip(pending, batches) if b is None]
            if missing:
                raise ConfigError(
                    f"state_dict(): batches {missing} are in flight but no longer recorded"
                )
            epoch["pending_batches"] = batches
    if rec.iterable and not rec.multiprocess:
        it = rec.dataset_iter
        if it is not None and stateful(it):
            epoch["iterator_state"] = it.state_dict()
    state["epoch"] = epoch
    return state


def _persistent_seed(rec: Epoch, epoch: dict[str, Any]) -> None:
    """An epoch begun on persistent workers drew no base seed: its resume
    must not draw one either, and its workers keep the seed they had."""
    if rec.reset and rec.base_seed is not None:
        epoch["reset"] = True
        epoch["base_seed"] = int(rec.base_seed)


def _between_epochs(loader: Any, rec: Epoch, pos: dict[str, Any], state: dict[str, Any]) -> None:
    """An ended epoch whose persistent workers live on: the next epoch
    begins on them (no base-seed draw), each replica in the state it ended
    with."""
    it = rec.iterator() if rec.iterator is not None else None
    if not loader.persistent_workers or it is None or getattr(it, "_closed", True):
        return
    if rec.base_seed is None or rec.shards is not None:
        return
    state["base_seed"] = int(rec.base_seed)
    if "workers" in pos:
        states = [w["state"] for w in pos["workers"]]
        if any(s is not None for s in states):
            state["worker_states"] = states


def _copy(state: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(state)


def _tensor(raw: Any) -> torch.Tensor:
    if isinstance(raw, torch.Tensor):
        return raw
    if isinstance(raw, str):
        raw = base64.b64decode(raw.encode("ascii"), validate=True)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


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


def _check_shards(sh: Any, n_shards: int) -> None:
    _need(isinstance(sh, dict), "epoch.shards is not a mapping")
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


def load(loader: Any, state: dict[str, Any]) -> None:
    """``DataLoader.load_state_dict()``: validate, restore the generators,
    and leave the epoch to resume for the next ``iter()``."""
    validate(loader, state)
    loaded = state
    epoch = state["epoch"]
    if epoch is not None and "elastic_sampler" in epoch:
        # the global position decides; any number of ranks continues it
        e = epoch["elastic_sampler"]
        if "mixture" in e:
            loader._index_sampler.resume_at(e["epoch"], e["consumed"], e["mixture"])
        else:
            loader._index_sampler.resume_at(e["epoch"], e["consumed"])
        epoch = dict(epoch, drawn=0, pending=[], elastic=True)
        state = dict(state, epoch=epoch)
    groups = _generators(loader)
    _set(groups, [_tensor(g["state"]) for g in state["generators"]])
    loader._epochs_started = int(state["epochs_started"])
    loader._resume = state["epoch"]
    loader._resume_sampler_state = state.get("sampler_state")
    loader._resume_extra = {
        k: state[k] for k in ("dataset_state", "base_seed", "worker_states") if k in state
    }
    loader._resume_workers = int(state["num_workers"])
    sampler = _stateful_sampler(loader)
    if state["epoch"] is None and sampler is not None and "sampler_state" in state:
        # Between epochs: the sampler's state describes the epoch just
        # finished (until its next __iter__, torchdata's convention); run
        # that epoch out, so the next iter() begins the one after.
        sampler.load_state_dict(state["sampler_state"])
        for _ in sampler:
            pass
    loader._epoch = None
    # persistent workers serve the old position: the next iter() starts anew
    loader._iterator = None
    loader._pending_state = _copy(loaded)


def _check_workers(loader: Any, resume: Optional[dict[str, Any]], extra: dict[str, Any]) -> None:
    """A state that lives in the workers' replicas (an IterableDataset's
    position, a dataset's own state) resumes only with as many workers;
    torchdata refuses the same at ``iter()``."""
    saved = loader._resume_workers
    if saved == loader._workers:
        return
    sharded = resume is not None and "shards" in resume
    iterable = loader._dataset_kind == _tdl._DatasetKind.Iterable
    mid_epoch = resume is not None and not sharded and not resume.get("elastic")
    if (mid_epoch and (iterable or stateful(loader.dataset))) or "worker_states" in extra:
        kind = "an IterableDataset" if iterable else "a dataset with state_dict()"
        raise StateMismatchError(
            f"load_state_dict(): {kind} saved with num_workers={saved} resumes only with "
            f"num_workers={saved} (each worker keeps its own replica of the dataset and its "
            "state; threads inside worker processes count as workers, num_workers x "
            f"worker_threads); this loader has {_describe_workers(loader)}. Resume with the "
            "same num_workers, save at an epoch boundary without persistent workers, or make the "
            "dataset a ferroloader.ShardedDataset (its position does not depend on num_workers)"
        )


def _describe_workers(loader: Any) -> str:
    k = loader.worker_threads
    if k == 1:
        return f"num_workers={loader.num_workers}"
    return f"{loader._workers} workers (num_workers={loader.num_workers} x worker_threads={k})"


def open_epoch(loader: Any) -> tuple[Epoch, Optional[dict[str, Any]], Any]:
    """Starts an epoch's record. When a loaded state resumes this epoch,
    returns it and the generators' current states, after setting the
    generators to their states at the epoch's start."""
    resume = loader._resume
    extra = loader._resume_extra
    if loader._pending_state is not None:
        _check_workers(loader, resume, extra)
    loader._pending_state = None
    loader._resume = None
    loader._resume_sampler_state = None
    loader._resume_extra = {}
    loader._next_base_seed = extra.get("base_seed")
    loader._next_worker_states = extra.get("worker_states")
    if "dataset_state" in extra and resume is None:
        # between epochs: the dataset continues from its saved state
        loader.dataset.load_state_dict(extra["dataset_state"])
    if resume is None:
        loader._epochs_started += 1
        if loader._seeded_generator is not None:
            loader._seeded_generator.manual_seed(
                epoch_seed(loader.seed, loader._epochs_started - 1)
            )
        rec = Epoch(loader, loader._epochs_started - 1)
        loader._epoch = rec
        return rec, None, None
    rec = Epoch(loader, loader._epochs_started - 1)
    now = _states(rec.groups)
    rec.start = [_tensor(s) for s in resume["generators_at_start"]]
    _set(rec.groups, rec.start)
    if rec.sampler is not None and "sampler_state" in resume:
        rec.sampler.load_state_dict(resume["sampler_state"])
    if "dataset_state" in extra:
        # loaded once the generators are back where the snapshot left them
        # (resume_source / resume_iterable): the dataset's own state, e.g.
        # of the global RNG, has the last word
        resume = dict(resume, dataset_state=extra["dataset_state"])
    loader._epoch = rec
    return rec, resume, now


def base_seed(loader: Any, rec: Epoch, resume: Optional[dict[str, Any]]) -> int:
    """The workers' base seed for an epoch on new workers: drawn where torch
    draws it, unless the epoch (or, between epochs, the next one) began on
    persistent workers, which draw none; then the seed they had."""
    if resume is not None and resume.get("reset"):
        seed = int(resume["base_seed"])
        rec.reset = True
    elif resume is None and loader._next_base_seed is not None:
        seed = int(loader._next_base_seed)
        rec.reset = True
    else:
        seed = draw_base_seed(loader)
    loader._next_base_seed = None
    rec.base_seed = seed
    return seed


def draw_base_seed(loader: Any) -> int:
    """The loader's base seed, drawn where torch draws it (the generator
    advances even when no worker needs it)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item())


def shard_resume(resume: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The sharded position a resumed epoch continues from."""
    if resume is None:
        return None
    return resume.get("shards")


def restore_generators(rec: Epoch, now: Any) -> None:
    """Puts the generators back after a resumed epoch was opened."""
    if now is not None:
        _set(rec.groups, now)


def _is_native(source: Any) -> bool:
    if isinstance(source, _core.BatchSamplerIter):
        return source.is_native
    return isinstance(source, _core.SamplerIter)


def resume_source(
    rec: Epoch, source: Any, resume: Optional[dict[str, Any]], now: Any, window: int
) -> Any:
    """The epoch's index stream, advanced to the snapshot when resuming;
    puts the generators back to ``now`` afterwards."""
    if resume is None:
        if rec.sampler is not None:
            rec.recorder = _core.Recorder(source, _keep(window))
            return rec.recorder
        return source
    try:
        if rec.iterable:
            # each worker resumes its replica (worker_resume)
            # its tasks are numbered on from the batches handed over
            in_flight = list(resume["pending"])
            handed = min(in_flight) if in_flight else int(resume["drawn"])
            rec.base = {"drawn": handed, "kept": [], "workers": resume.get("workers")}
            return source
        if resume.get("elastic"):
            # the sampler starts at the saved global position itself
            return source
        pending: list[int] = list(resume["pending"])
        drawn = int(resume["drawn"])
        if "generators_at_first_draw" in resume:
            # the generators as the sampler found them at its first draw
            rec.first_draw = [_tensor(s) for s in resume["generators_at_first_draw"]]
            _set(rec.groups, rec.first_draw)
        if rec.sampler is not None:
            # The sampler resumed itself at `drawn`; re-send what was in flight.
            kept = list(resume.get("pending_batches", []))
            rec.base = {"drawn": drawn, "kept": pending if kept else []}
            rec.loaded_sampler_state = resume.get("sampler_state")
            rec.recorder = _core.Recorder(source, _keep(window), drawn, list(zip(pending, kept)))
            return rec.recorder
        first = pending[0] if pending else drawn
        if isinstance(source, (_core.BatchSamplerIter, _core.SamplerIter)):
            got = source._skip(first)
        else:
            got = sum(1 for _ in itertools.islice(source, first))
        if got < first:
            raise _past_end(drawn, got)
        wanted = set(pending)
        kept = []
        for seq in range(first, drawn):
            try:
                item = next(source)
            except StopIteration:
                # (the batches in flight at the snapshot are re-drawn here:
                # a bare StopIteration would end iter() as an empty epoch)
                raise _past_end(drawn, seq) from None
            if seq in wanted:
                kept.append(item)
        rec.base = {"drawn": drawn, "kept": [s for s in range(first, drawn) if s in wanted]}
        if not kept:
            return source
        if _is_native(source):
            source._prepend(kept)
            return source
        return itertools.chain(kept, source)
    finally:
        _set(rec.groups, now)
        if "dataset_state" in resume:
            rec.dataset.load_state_dict(resume["dataset_state"])


def _keep(window: int) -> int:
    """How many recent batches of a stateful sampler the engine keeps: more
    than can be in flight (the window, batches being reordered)."""
    return 8 * window + 64


def _past_end(drawn: int, batches: int) -> ConfigError:
    return ConfigError(
        f"load_state_dict(): the state is {drawn} batches into the epoch, but this "
        f"loader's epoch has {batches}"
    )


def resume_iterable(
    rec: Epoch, dataset: Any, resume: Optional[dict[str, Any]], now: Any, per_batch: int
) -> Any:
    """An ``IterableDataset``'s iterator (``num_workers=0``), resumed in
    torchdata's order: the dataset's state, then ``iter(dataset)``, then
    the iterator's state; without either, by skipping the samples already
    used."""
    if resume is None:
        rec.dataset_iter = iter(dataset)
        return rec.dataset_iter
    rec.base = {"drawn": int(resume["drawn"]), "kept": []}
    restored = False
    try:
        if "dataset_state" in resume:
            _set(rec.groups, now)
            restored = True
            dataset.load_state_dict(resume["dataset_state"])
        it = rec.dataset_iter = iter(dataset)
        if resume.get("exhausted"):
            # the epoch's last batch was handed over: nothing is left of it
            return iter(())
        if "iterator_state" in resume and stateful(it):
            if not restored:
                _set(rec.groups, now)
                restored = True
            it.load_state_dict(resume["iterator_state"])
        elif "dataset_state" not in resume:
            for _ in itertools.islice(it, resume["drawn"] * per_batch):
                pass
        return it
    finally:
        if not restored:
            _set(rec.groups, now)


def worker_resume(
    loader: Any, resume: Optional[dict[str, Any]], worker_id: int, per_batch: int
) -> Optional[dict[str, Any]]:
    """What worker ``worker_id`` does before its first batch: load its
    replica's state, or skip the batches it had handed over (an iterable
    without state methods). ``None``: start from the beginning. Between
    epochs, persistent workers' replicas continue from their saved states."""
    if resume is None or "workers" not in resume:
        states = loader._next_worker_states
        if resume is None and states is not None and worker_id < len(states):
            s = states[worker_id]
            return None if s is None else {"state": s, "between": True}
        return None
    w = resume["workers"][worker_id]
    if w["state"] is not None:
        # before its first batch, a persistent replica's state is the one
        # it ended the previous epoch in
        return {"state": w["state"], "between": int(w["delivered"]) == 0}
    if loader._dataset_kind != _tdl._DatasetKind.Iterable:
        return None
    return {"skip_samples": int(w["delivered"]) * per_batch}


def finished_workers(resume: Optional[dict[str, Any]], n: int) -> list[bool]:
    """Workers of a resumed epoch whose replica had run out with every
    batch handed over: they get no task."""
    if resume is None or "workers" not in resume:
        return [False] * n
    return [bool(w.get("done", False)) for w in resume["workers"]][:n]
