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
import json
from typing import Any, Optional, Sequence

import torch

from ferroloader.epoch.accounts import check_ranks, job_accounts, merged_part
from ferroloader.epoch.check import _KEY, FORMAT, _fingerprint, validate
from ferroloader.epoch.mixture import MixtureBatchSampler
from ferroloader.epoch.plan import (
    Epoch,
    _generators,
    _set,
    _stateful_sampler,
    _tensor,
    stateful,
)
from ferroloader.errors import ConfigError
from ferroloader.sampler import ElasticBatchSampler


def detach(rec: Epoch, iterator: Any) -> None:
    """The iterator is going away: keep its last position."""
    rec.last = rec.read(iterator)


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
    # (a shared queue's epoch: the whole job's position, met with the ranks)
    world = rec.shards.world_epoch if rec.shards is not None else None
    if pos["ended"]:
        _between_epochs(loader, rec, pos, state)
        if world is not None and "shards" in pos:
            job = world.meet(dict(pos["shards"], ended=True))
            if all(a.get("ended") for a in job.get("accounts", [job])):
                # what the ended epoch of the shared queue held back, for
                # the next (the whole job's account of it)
                state["world_carry"] = job
            else:
                # another rank reads on: the job is mid-epoch, and so is
                # its state on every rank
                state["epoch"] = {"shards": job,
                                  "generators_at_start": [_encode(s) for s in rec.start]}
                _persistent_seed(rec, state["epoch"])
        return state
    if "shards" in pos:
        # the lanes' positions (or the elastic sequence's) say it all; the
        # shared queue's, every rank's
        state["epoch"] = {
            "shards": world.meet(pos["shards"]) if world is not None else pos["shards"],
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
    loader._resume_extra = {
        k: state[k]
        for k in ("dataset_state", "base_seed", "worker_states", "world_carry")
        if k in state
    }
    # a shared queue's loader joins its ranks again (a new generation)
    loader._world_gen = None
    loader._world_prev = None
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


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's ``state_dict()`` of a loader over the job's shared
    queue (``Sharding(across="world")``), saved at the same step, as one
    state that any number of ranks resumes from: each rank loads it, and
    together they read exactly what the saved ranks had not (the unread
    part of every work they had claimed, then the works nobody had).
    ``DataLoader.load_state_dict`` also takes the list itself. (A state
    saved on several ranks already holds every rank's account: one serves
    alone, and an account several states hold alike counts once.)

    >>> import ferroloader
    >>> ferroloader.merge_states([])
    Traceback (most recent call last):
    ...
    ferroloader.errors.ConfigError: merge_states() needs the state of every rank, got none
    """
    import copy

    states = list(states)
    if not states:
        raise ConfigError("merge_states() needs the state of every rank, got none")
    for s in states:
        if not isinstance(s, dict) or "epoch" not in s:
            raise ConfigError("merge_states(): not a ferroloader DataLoader state")
    started = {s.get("epochs_started") for s in states}
    if len(started) != 1:
        seen = sorted(map(str, started))
        raise ConfigError(
            f"merge_states(): the states were saved in different epochs ({seen}); save every "
            "rank's state at the same step"
        )
    out = copy.deepcopy(states[0])

    def accounts_of(parts: list[Any], what: str) -> dict[str, Any]:
        """The job's accounts in ``parts``, checked, as one merged part. A
        state saved on several ranks holds every rank's: an account that
        several states hold alike counts once."""
        found: list[Any] = []
        seen: dict[Any, str] = {}
        for p in parts:
            if not isinstance(p, dict) or p.get("across", "world") != "world":
                raise ConfigError(f"merge_states(): a state's {what} is not of the job's "
                                  "shared queue (Sharding(across='world'))")
            for a in job_accounts(p) if p.get("merged") else [p]:
                key = json.dumps({k: v for k, v in a.items() if k != "list"}, sort_keys=True)
                rank = (a.get("rank"), a.get("world"))
                if rank[0] is not None and rank in seen and seen[rank] != key:
                    raise ConfigError(
                        f"merge_states(): the states hold two accounts of rank {rank[0]} of "
                        f"{rank[1]}: they were saved at different steps; give the states of "
                        "one checkpoint (any one of them holds every rank's)")
                if rank[0] is None or rank not in seen:
                    seen[rank] = key
                    found.append(a)
        check_ranks(found, "merge_states()")
        return merged_part(found[0]["list"], found)

    if all(s["epoch"] is None for s in states):
        carries = [s.get("world_carry") for s in states]
        if any(c is None for c in carries):
            if all(c is None for c in carries):
                return out  # before any epoch: nothing to merge
            raise ConfigError("merge_states(): some states hold what their last epoch held "
                              "back and some do not; save every rank's state at the same step")
        out["world_carry"] = accounts_of(carries, "last epoch")
        return out
    # mid-epoch: a rank that had finished the epoch gives its account of
    # it (its claims, nothing left of them)
    parts = []
    for s in states:
        if s["epoch"] is not None and "shards" in s["epoch"]:
            parts.append(s["epoch"]["shards"])
        elif s["epoch"] is None and s.get("world_carry") is not None:
            parts.append(s["world_carry"])
        else:
            raise ConfigError("merge_states(): a state is not of a loader sharded across the "
                              "world, or was saved before its first epoch while others were "
                              "mid-epoch; save every rank's state at the same step")
    base = next(s for s in states if s["epoch"] is not None)
    out = copy.deepcopy(base)
    out.pop("world_carry", None)
    out["epoch"]["shards"] = accounts_of(parts, "epoch")
    return out


__all__ = ["detach", "load", "merge_states", "snapshot"]
