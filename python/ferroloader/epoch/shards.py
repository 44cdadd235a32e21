"""One sharded epoch of one loader: the lanes' plan (static, dynamic) or the
address batches (elastic), a resumed state checked against the sharding,
the shards at URLs fetched ahead, and the job's shared queue
(``Sharding(across="world")``, ``epoch.world``)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import ferroloader._core as _core
from ferroloader.epoch.accounts import (
    OPEN,
    check_ranks,
    cut_list,
    even_count,
    job_accounts,
    list_unit,
    remaining,
    untouched,
    work_size,
)
from ferroloader.epoch.world import WorldEpoch
from ferroloader.errors import ConfigError
from ferroloader.seeds import epoch_seed
from ferroloader.sources.shards import Sharding


class ShardEpoch:
    """One sharded epoch of one loader, as its iterators need it: the lane
    plan (static, dynamic) or the address batches (elastic). ``rec``: the
    epoch's record (none where only its batches are counted)."""

    def __init__(self, loader: Any, epoch: int, resume: Optional[dict[str, Any]],
                 rec: Any = None) -> None:
        dataset = loader.dataset
        sharding: Sharding = loader.sharding
        self.sharding = sharding
        self.descriptors, self.lens = loader._shard_info()
        self.rank, self.world = sharding.ranks()
        self.shuffle = bool(loader._shard_shuffle)
        self.root = epoch_seed(loader.seed if loader.seed is not None else 0, epoch)
        self.batch = loader.batch_size if loader._auto_collation else None
        self.drop_last = bool(loader.drop_last)
        self.iter_shard = dataset.iter_shard
        self.plan: Optional[Any] = None
        self.addresses: Optional[Any] = None
        self.prefetch: Optional[Any] = None
        # for shards read through a cache: whether lanes let go of their
        # shards between batches (set for static and dynamic lanes)
        self.short_of_room: Optional[Callable[[], bool]] = None
        self.start = 0
        # the job's shared queue (Sharding(across="world"))
        self.world_epoch: Optional[Any] = None
        if resume is not None:
            _core.check_shard_resume(resume, sharding.across, sharding.mode, self.world,
                                     self.rank)
        if sharding.across != "world":
            self._this_rank(loader, resume)
            return
        self.world_epoch = WorldEpoch(self, loader, epoch, resume)
        # (a shared queue's epoch reads its end in the epoch's record)
        self.world_epoch.rec = rec

    def _this_rank(self, loader: Any, resume: Optional[dict[str, Any]]) -> None:
        """This rank's own shards: the address batches (elastic) or the
        lanes' plan (static, dynamic), then the remote ones fetched ahead
        in the order they are read."""
        dataset, sharding = loader.dataset, self.sharding
        if sharding.mode == "elastic":
            if self.lens is None:
                raise ConfigError(
                    "elastic sharding reads items by position, so it needs the length of every "
                    f"shard: {dataset._lengths_hint()}"
                )
            if not loader.in_order:
                raise ConfigError(
                    "elastic sharding hands batches over in order (a snapshot counts a prefix of "
                    "the global sequence); in_order=False is not supported with it"
                )
            self.start = int(resume["consumed"]) if resume is not None else 0
            tail = "split" if not sharding.even else ("drop" if self.drop_last else "pad")
            self.addresses = _core.AddressBatches(
                {
                    "lens": self.lens,
                    "block": sharding.shuffle_block,
                    "root": self.root,
                    "shuffle": self.shuffle,
                    "start": self.start,
                    # unbatched: each rank takes one item per global step
                    "batch": self.batch or 1,
                    "world": self.world,
                    "rank": self.rank,
                    "tail": tail,
                }
            )
            # (reads by address hold no shard open between batches)
            order: Sequence[int] = self.addresses.read_order
            holders = 0
        else:
            order, holders = self._lanes(loader, resume)
        self._start_prefetch(dataset, order, holders)

    def _lanes(self, loader: Any, resume: Optional[dict[str, Any]]) -> tuple[Sequence[int], int]:
        """The lanes' plan (static, dynamic): the order this rank reads its
        shards in, and how many lanes may each keep one open between
        batches."""
        dataset, sharding = loader.dataset, self.sharding
        if sharding.even and self.world > 1 and self.lens is None:
            raise ConfigError(
                "every rank must yield the same number of batches (even=True with more than one "
                f"rank), which needs the length of every shard: {dataset._lengths_hint()}, or "
                "pass Sharding(even=False) to read every item exactly once with uneven batch "
                "counts"
            )
        dynamic = sharding.mode == "dynamic"
        lanes = max(loader._workers, 1) if dynamic else sharding.lanes
        saved = None
        if resume is not None:
            saved = (
                [None if p is None else tuple(p) for p in resume["positions"]],
                int(resume["next_lane"]),
                int(resume["handed"]),
                None if resume["rest"] is None else [tuple(w) for w in resume["rest"]],
            )
        self.plan = _core.shard_plan(
            {
                "n_shards": len(self.descriptors),
                "lens": self.lens,
                "block": sharding.shuffle_block,
                "root": self.root,
                "shuffle": self.shuffle,
                "rank": self.rank,
                "world": self.world,
                "dynamic": dynamic,
                "lanes": lanes,
                "batch": self.batch,
                "drop_last": self.drop_last,
                "even": sharding.even,
                "largest_first": sharding.largest_first,
                "resume": saved,
                "shared": None,
            }
        )
        self.short_of_room = dataset._short_of_room()
        # each lane keeps at most one shard open between its batches
        return self.plan.read_order, lanes

    def _start_prefetch(self, dataset: Any, order: Sequence[int], holders: int) -> None:
        """Remote shards: fetch this rank's in the order the epoch reads
        them, ahead of the readers (stopped when this epoch is collected),
        and claim room for what ``holders`` readers keep open between
        batches; a cache that cannot hold one of them is an error now."""
        remote = dataset._remote(self.descriptors)
        if remote is not None:
            cache, pieces = remote
            # (the engine's cache checks, leases and fetches them)
            self.prefetch = cache._native().fetch_ahead([pieces[s] for s in order], holders,
                                                        cache.streams)

    def source(self, seeder: Any) -> tuple[Any, Any, Any, Any]:
        """``(iter_shard, descriptors, seeder, short_of_room)`` for the engine."""
        return (self.iter_shard, list(self.descriptors), seeder, self.short_of_room)

    def snapshot(self, it: Any) -> dict[str, Any]:
        """Where the epoch stands, read from its iterator between batches."""
        base = {"mode": self.sharding.mode, "rank": self.rank, "world": self.world}
        if self.world_epoch is not None:
            return {**base, **self.world_epoch.account(it)}
        if self.addresses is not None:
            drawn, pending = it._position[:2]
            handed = min(pending) if pending else drawn
            total = int(self.addresses.total)
            per_step = int(self.batch or 1) * self.world
            consumed = min(total, self.start + int(handed) * per_step)
            return {**base, "consumed": consumed}
        positions, next_lane, handed, rest = it._lane_snapshot
        return {
            **base,
            "positions": [None if p is None else list(p) for p in positions],
            "next_lane": int(next_lane),
            "handed": int(handed),
            "rest": None if rest is None else [list(w) for w in rest],
        }

    def batches(self) -> Optional[int]:
        """Batches this rank yields in this (whole) epoch, when every
        ``shard_len`` is known: static, each lane's items cut into batches
        (``ceil``, or ``floor`` with ``drop_last``), summed over lanes;
        dynamic, the rank's items cut as by one lane; elastic, the rank's
        share of the global batches; with ``even=True`` on several ranks,
        the least of that over ranks (static, dynamic)."""
        if self.addresses is not None:
            return len(self.addresses)
        assert self.plan is not None
        return self.plan.batches


def sharded_len(loader: Any) -> int:
    """``len()`` of a sharded loader: the batches its rank yields in the
    epoch running, or the next; with the job's shared queue, known once the
    epoch has begun (what the last one held back counts)."""
    rec = loader._epoch
    running = rec is not None and not rec.position()["ended"]
    epoch = rec.number if running else loader._epochs_started
    if loader.sharding.across == "world":
        world = rec.shards.world_epoch if running and rec.shards is not None else None
        if world is not None and world.whole():
            world = None  # (its last batch is out: the next epoch's count)
        budget = world.budget if world is not None else budget_ahead(loader)
        if budget is None:
            raise TypeError(
                "a loader whose shards come from the job's shared queue "
                "(Sharding(across='world')) has a len() with even=True on more than one rank "
                "and every shard's length known (with even=False the ranks' batch counts are "
                "not fixed)"
            )
        return int(budget)
    batches = ShardEpoch(loader, epoch, None).batches()
    if batches is None:
        raise TypeError(
            f"object of type '{type(loader.dataset).__name__}' has no len(): the loader counts "
            f"a sharded epoch's batches from its shards' lengths "
            f"({loader.dataset._lengths_hint()})"
        )
    return int(batches)


def budget_ahead(loader: Any) -> Optional[int]:
    """``len()`` of a loader over the shared queue before its epoch begins:
    with even counts on several ranks, the batches each rank will yield,
    computed as ``iter()`` will from the lengths, this rank's account of
    the last epoch (what it held back is the list's items less the batches
    every rank yielded) or the state loaded; ``None`` without even counts
    or lengths."""
    sharding = loader.sharding
    _rank, world = sharding.ranks()
    lens = loader._shard_info()[1]
    if not (sharding.even and world > 1) or lens is None:
        return None
    batch = (loader.batch_size if loader._auto_collation else None) or 1
    resume = loader._resume.get("shards") if loader._resume is not None else None
    if resume is not None:
        if not resume.get("merged"):
            return None if resume.get("budget") is None else int(resume["budget"])
        accounts = job_accounts(resume)
        check_ranks(accounts, "len()")
        return even_count(remaining(accounts), lens, world, batch, accounts)
    unit, _block = list_unit(loader.dataset, loader._shard_info()[0], lens, world, sharding,
                             bool(loader._shard_shuffle))
    works = cut_list([(s, 0, OPEN) for s in range(len(lens))], lens, unit)
    longest = max((work_size(w, lens) or 0 for w in works), default=0)
    held = 0
    carry = loader._resume_extra.get("world_carry")
    mine: Optional[dict[str, Any]] = None
    if carry is not None:
        mine = job_accounts(carry)[0] if carry.get("merged") else carry
    elif loader._world_prev is not None and loader._world_prev.rec is not None:
        mine = loader._world_prev.final_account()
    if mine is not None and mine.get("ended") and mine.get("budget") is not None:
        listed = sum(work_size(w, lens) or 0 for w in mine["list"])
        made = int(mine["budget"]) - int(mine.get("first", 0))
        held = max(0, listed - int(mine.get("world", world)) * made * batch)
    elif mine is not None and untouched([mine]):
        held = sum(work_size(w, lens) or 0 for w in mine["list"][: int(mine["carried"])])
    return int(_core.world_even_count(sum(lens) + held, longest, world, batch))
