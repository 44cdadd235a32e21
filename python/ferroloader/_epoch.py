"""An epoch's record: the generators' states when the epoch began, and
the position its iterator reports (the engine's, in the epoch's own
numbering, also after a resume). ``ferroloader.state`` reads it for
``state_dict()``; ``ferroloader._plan`` opens it."""

from __future__ import annotations

import base64
import pickle
import weakref
from typing import Any, Optional

import torch
import torch.utils.data.dataloader as _tdl
import torch.utils.data.sampler as _ts

from ferroloader import _core


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
        return pos

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
                "shards": self.shards.snapshot(it),
            }
        if not self.multiprocess:
            # (an iterable's position is counted in batches handed over)
            drawn, pending, ended, exhausted = it._position
            return {
                "drawn": int(drawn),
                "pending": list(pending),
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


def _tensor(raw: Any) -> torch.Tensor:
    if isinstance(raw, torch.Tensor):
        return raw
    if isinstance(raw, str):
        raw = base64.b64decode(raw.encode("ascii"), validate=True)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)
