"""An epoch: its record and its plan. The record keeps what a snapshot
needs (the generators' states when the epoch began, a stateful sampler's
recent batches, where a resumed epoch took up) and links to the iterator
whose engine reports the position (``epoch.state`` reads them). The
plan is built once when the epoch starts (:func:`build`): the record
opened, the index stream (or a sharded epoch's lanes) advanced to a loaded
state, the workers' base seed drawn where torch draws it, per-sample
seeding, and what each worker resumes from. The engine takes it in one call
(``_core.MultiProcessIter``)."""

from __future__ import annotations

import base64
import pickle
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.utils.data.dataloader as _tdl
import torch.utils.data.sampler as _ts

import ferroloader._core as _core
from ferroloader.epoch.shards import ShardEpoch
from ferroloader.errors import StateMismatchError
from ferroloader.sampler import ElasticBatchSampler, index_source
from ferroloader.seeds import epoch_seed


def stateful(obj: Any) -> bool:
    """Whether `obj` has torchdata's ``Stateful`` methods."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _load_state(obj: Any, state: Any) -> None:
    """A user's dataset or sampler (torchdata's ``Stateful``) loads a state."""
    obj.load_state_dict(state)


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
        # a resumed epoch: where it took up, for the engine, which reports
        # the position in the epoch's numbering (its iterator counts from 0)
        self.resumed: Optional[tuple[int, list[int], list[tuple[int, Optional[bytes]]]]] = None
        # the sampler state loaded for a resumed epoch: a sampler not yet
        # iterated since may not report it (torchdata's do not)
        self.loaded_sampler_state: Any = None
        # a sharded epoch (epoch.shards.ShardEpoch): its position is
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

    def position(self) -> dict[str, Any]:
        """Where the epoch stands: ``drawn``, ``pending`` (sequence numbers
        in flight), ``ended``; for an iterable, ``exhausted`` (one process)
        or ``workers`` and ``next_worker`` (several); a sharded epoch's
        ``shards``. Counted from the epoch's start, also in a resumed epoch."""
        it = self.iterator() if self.iterator is not None else None
        if it is not None:
            return self.read(it)
        if self.last is not None:
            return self.last
        return {"drawn": 0, "pending": [], "ended": False}

    def read(self, it: Any) -> dict[str, Any]:
        """The position iterator ``it`` reports, as the state keeps it."""
        if self.shards is not None:
            return {"drawn": 0, "pending": [], "ended": bool(it._position[2]),
                    "shards": self.shards.snapshot(it)}
        if not self.multiprocess:
            # (an iterable's position is counted in batches handed over)
            drawn, pending, ended, exhausted = it._position
            return {"drawn": int(drawn), "pending": list(pending), "ended": bool(ended),
                    "exhausted": bool(exhausted)}
        drawn, pending, ended = it._position
        pos: dict[str, Any] = {"drawn": int(drawn), "pending": list(pending),
                               "ended": bool(ended)}
        if self.iterable or self.worker_states:
            delivered, states, exhausted, next_worker, done = it._iterable_position
            pos["workers"] = [
                {"delivered": int(d), "state": None if s is None else pickle.loads(s),
                 "exhausted": bool(e), "done": bool(f)}
                for d, s, e, f in zip(delivered, states, exhausted, done)
            ]
            pos["next_worker"] = int(next_worker)
        return pos

    def attach(self, iterator: Any, multiprocess: bool) -> None:
        self.iterator = weakref.ref(iterator)
        self.multiprocess = multiprocess
        iterator._epoch_record = self


def _states(groups: list[tuple[list[str], torch.Generator]]) -> list[Any]:
    return [g.get_state() for _, g in groups]


def _set(groups: list[tuple[list[str], torch.Generator]], states: list[Any]) -> None:
    for (_, g), s in zip(groups, states):
        g.set_state(s)


def _tensor(raw: Any) -> torch.Tensor:
    if isinstance(raw, torch.Tensor):
        return raw
    if isinstance(raw, str):
        raw = base64.b64decode(raw.encode("ascii"), validate=True)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


@dataclass
class Plan:
    """A multi-process epoch as the engine and the workers take it."""

    rec: Epoch
    # the index stream (or a sharded epoch's shard addresses)
    source: Any
    shards: Optional[ShardEpoch]
    # a resumed iterable: where the round-robin starts, workers that are done
    round_robin: Optional[tuple[int, list[bool]]]
    # what each worker does before its first batch (worker_resume)
    worker_resume: list[Optional[dict[str, Any]]]
    sample_seeds: Optional[tuple[int, int]]
    shard_seeder: Optional[_core.SampleSeeder]
    dataset_stateful: bool

    @property
    def base_seed(self) -> int:
        """The workers' base seed (drawn, or the persistent workers')."""
        assert self.rec.base_seed is not None
        return self.rec.base_seed


def build(loader: Any, reset_seed: Optional[int] = None) -> Plan:
    """A multi-process epoch's plan; ``reset_seed``: the base seed of the
    persistent workers it runs on (torch draws none for them). What the
    record and the loaded state say is settled first; the epoch's source
    (the shards' plan, or the index stream) is made last."""
    rec, resume, now = open_epoch(loader)
    sharded = loader._sharded()
    at: Optional[dict[str, Any]] = None
    if sharded:
        base_seed(loader, rec, resume, reset_seed)
        # a sharded epoch draws nothing from the generators (its shard
        # list was read when the state was loaded: checked against it),
        # and the lanes' plan carries the position
        restore_generators(rec, now)
        at, resume = shard_resume(resume), None
    n = loader._workers
    per_batch = (loader.batch_size or 1) if loader._auto_collation else 1
    round_robin = None
    if resume is not None and "workers" in resume:
        round_robin = (int(resume["next_worker"]), finished_workers(resume, n))
    workers = [worker_resume(loader, resume, i, per_batch) for i in range(n)]
    ep: Optional[ShardEpoch] = None
    if sharded:
        ep = ShardEpoch(loader, rec.number, at, rec)
        source: Any = ep.addresses
    else:
        # made before the workers' base seed is drawn, as torch iterates
        # its sampler first; then advanced to a loaded state
        source = index_source(loader)
        base_seed(loader, rec, resume, reset_seed)
        elastic = isinstance(loader._index_sampler, ElasticBatchSampler)
        if reset_seed is None and not rec.reset and not elastic:
            # An elastic sampler (a mixture's too) draws from no
            # generator, and its first iteration took the resume position
            source = loader._index_stream_after_seed(source)
        source = resume_source(rec, source, resume, now, loader._window)
    rec.shards = ep
    return Plan(
        rec=rec,
        source=source,
        shards=ep,
        round_robin=round_robin,
        worker_resume=workers,
        sample_seeds=sample_seeds(loader, rec.number),
        shard_seeder=shard_seeder(loader, rec.number),
        dataset_stateful=stateful(loader.dataset),
    )


# seeds are taken modulo 2**64, as ferroloader.seeds takes them
_U64 = (1 << 64) - 1


def sample_seeds(loader: Any, epoch: int) -> Optional[tuple[int, int]]:
    """``(seed, epoch)`` for per-sample seeding of a map-style dataset,
    else ``None``."""
    if not loader.per_sample_seed or loader._dataset_kind == _tdl._DatasetKind.Iterable:
        return None
    assert loader.seed is not None
    return (loader.seed & _U64, epoch)


def shard_seeder(loader: Any, epoch: int) -> Optional[_core.SampleSeeder]:
    """Per-item seeding of a sharded dataset in ``epoch``, else ``None``."""
    if not loader.per_sample_seed or not loader._sharded():
        return None
    assert loader.seed is not None
    return _core.SampleSeeder(loader.seed & _U64, epoch)


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
            f"iter(): the state given to load_state_dict() cannot resume here: {kind} saved "
            f"with num_workers={saved} resumes only with "
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
    loader._resume_extra = {}
    loader._next_base_seed = extra.get("base_seed")
    loader._next_worker_states = extra.get("worker_states")
    # what a shared queue's last epoch held back (a state between epochs)
    loader._next_world_carry = extra.get("world_carry")
    if resume is None:
        loader._epochs_started += 1
        if loader._seeded_generator is not None:
            loader._seeded_generator.manual_seed(
                epoch_seed(loader.seed, loader._epochs_started - 1)
            )
    rec = Epoch(loader, loader._epochs_started - 1)
    now = None
    if resume is not None:
        now = _states(rec.groups)
        rec.start = [_tensor(s) for s in resume["generators_at_start"]]
        _set(rec.groups, rec.start)
    # the user's objects take their saved states: between epochs the
    # dataset's, mid-epoch the sampler's (with the generators back at the
    # epoch's start)
    between = resume is None and "dataset_state" in extra
    try:
        if between:
            _load_state(loader.dataset, extra["dataset_state"])
        elif resume is not None and rec.sampler is not None and "sampler_state" in resume:
            _load_state(rec.sampler, resume["sampler_state"])
    except BaseException:
        if resume is None:
            loader._epochs_started -= 1  # (no epoch began)
        raise
    if between:
        # (the epoch starts where the dataset's own state, e.g. of the
        # global RNG, put the generators)
        rec.start = _states(rec.groups)
    if resume is not None and "dataset_state" in extra:
        # loaded once the generators are back where the snapshot left them
        # (resume_source / resume_iterable): the dataset's own state, e.g.
        # of the global RNG, has the last word
        resume = dict(resume, dataset_state=extra["dataset_state"])
    loader._epoch = rec
    return rec, resume, now


def base_seed(
    loader: Any, rec: Epoch, resume: Optional[dict[str, Any]], reset_seed: Optional[int] = None
) -> int:
    """The workers' base seed for an epoch: drawn where torch draws it,
    unless the epoch (or, between epochs, the next one) began on persistent
    workers (``reset_seed``: theirs), which draw none; then the seed they
    had. With ``seed=`` the draw is made on persistent workers too and
    thrown away: the loader's own generator then gives the sampler the same
    draws on every layout (torch's persistent workers, with the global
    generator or ``generator=``, shift the sampler's draws; that is kept)."""
    if reset_seed is not None:
        seed = reset_seed
        rec.reset = True
    elif resume is not None and resume.get("reset"):
        seed = int(resume["base_seed"])
        rec.reset = True
    elif resume is None and loader._next_base_seed is not None:
        seed = int(loader._next_base_seed)
        rec.reset = True
    else:
        seed = draw_base_seed(loader)
    if rec.reset and _seeded(loader):
        draw_base_seed(loader)
    loader._next_base_seed = None
    rec.base_seed = seed
    return seed


def _seeded(loader: Any) -> bool:
    """The loader draws from its ``seed=`` generator (no ``generator=``)."""
    own = getattr(loader, "_seeded_generator", None)
    return own is not None and loader.generator is own


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
            workers = [
                (int(w["delivered"]), None if w["state"] is None else pickle.dumps(w["state"]))
                for w in resume.get("workers") or []
            ]
            rec.resumed = (handed, [], workers)
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
            rec.resumed = (drawn, pending if kept else [], [])
            rec.loaded_sampler_state = resume.get("sampler_state")
            rec.recorder = _core.Recorder(source, _keep(window), drawn, list(zip(pending, kept)))
            return rec.recorder
        # skips the batches handed over, re-sends those in flight first
        source, kept = _core.resume_stream(source, drawn, pending)
        rec.resumed = (drawn, kept, [])
        return source
    finally:
        _set(rec.groups, now)
        if "dataset_state" in resume:
            _load_state(rec.dataset, resume["dataset_state"])


def _keep(window: int) -> int:
    """How many recent batches of a stateful sampler the engine keeps: more
    than can be in flight (the window, batches being reordered)."""
    return 8 * window + 64


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
