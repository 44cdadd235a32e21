"""One shard queue for the whole job, kept in ``torch.distributed``'s store.

``Sharding(mode="dynamic", across="world")``: each epoch's works (the
shards in the epoch's seeded order, longest first where lengths are known,
after what the previous epoch held back) form one list that every rank
computes alike. Where the lengths are known (and the dataset reaches an
item without reading those before it), shards are cut into ranges of about
a 64th of a rank's share, whole shuffle blocks, so balance does not hang
on the number of shards. A counter in the store hands out its positions: a
rank claims the next position with one atomic ``add``, so every work is
read by exactly one rank, and a rank that reads faster claims more. Claims
are made ahead of need, on a thread of the training process, so the batch
path never waits on a round trip to the store: as many as the rank's lanes
take within a short horizon at their own rate (a slow rank holds about
one, a fast one more, several claimed in one ``add``); within a rank the
claimed works go to its lanes as in dynamic mode.

With ``even=True`` (and more than one rank) every rank yields the same
number of batches, decided at ``iter()`` from the lengths alone: with
``N`` items in the list, the longest work ``M`` items, ``W`` ranks and
batches of ``B``, each rank yields ``K = (N - (W - 1) * (M - 1)) // (W * B)``
batches and claims only until it holds ``K * B`` items. No rank can then
run short (a rank holds fewer than ``K * B + M`` items, so the others
leave it enough), and what the epoch holds back, fewer than
``W * B + (W - 1) * (M - 1)`` items, is read first in the next epoch.

The store is the default process group's (``init_process_group``), or the
one ``Sharding(store=...)`` names; keys live under
``ferroloader/<name>/<generation>/e<epoch>/`` and an epoch's keys are
removed once every rank has read them. No collective is joined.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from typing import Any, Callable, Optional, Sequence

import ferroloader._core as _core
from ferroloader.epoch.accounts import (
    OPEN,
    Work,
    _carry_of,
    _with_list,
    _without_list,
    cut_list,
    even_count,
    job_accounts,
    list_unit,
    merged_part,
    remaining,
    untouched,
    work_size,
)
from ferroloader.epoch.store import (
    default_store,
    describe,
    log,
    via_rank0,
)
from ferroloader.errors import ConfigError, ShardQueueError
from ferroloader.seeds import epoch_seed
from ferroloader.sources.worldqueue import QueueStats

# the most unread claims a rank holds, however fast it reads
MOST_AHEAD = 16
# seconds of a rank's own reading it claims ahead (the engine adds four
# round trips to the store); a claimed remote shard is downloaded first
HORIZON, REMOTE_HORIZON = 0.1, 2.0


class WorldQueue:
    """One epoch's claims by this rank, from the list ``works`` shared by
    every rank (``sizes``: items per work, or ``None`` each where unknown):
    the engine's ``WorldClaims`` keeps them and the lanes pull from it; a
    thread here makes the store's ``add`` calls ahead of need while the
    claims want more (what ``lanes`` readers take within ``horizon``
    seconds at their rate; ``quota``: no more claims once this many items
    are held)."""

    def __init__(self, store: Any, prefix: str, works: Sequence[Work],
                 sizes: Sequence[Optional[int]], quota: Optional[int], lanes: int,
                 stats: QueueStats, on_claim: Optional[Callable[[int], Any]] = None,
                 horizon: float = HORIZON,
                 agree: tuple[Sequence[str], str] = ((), "")) -> None:
        self.store = store
        self.key = f"{prefix}/next"
        self.agree = agree  # (keys, this rank's epoch and list)
        self.sizes = list(sizes)
        self.claims = _core.WorldClaims(list(works), self.sizes, quota, MOST_AHEAD, horizon,
                                        lanes)
        self.stats = stats
        self.on_claim = on_claim
        self._fetches: list[Any] = []  # prefetches of claimed shards, kept alive
        threading.Thread(target=self._run, name="ferroloader-claims", daemon=True).start()

    def _run(self) -> None:
        claims = self.claims
        keys, mine = self.agree
        if not all(self._agrees(key, mine) for key in keys):
            return
        while True:
            n = claims.wanted()
            if n == 0:
                return
            t0 = time.perf_counter()
            try:
                # (n positions in one round trip: the counter's n before it)
                last = int(self.store.add(self.key, n))
            except Exception as e:  # the store is gone or refuses
                claims.fail(
                    f"the job's shard queue lost its store ({describe(self.store)}, key "
                    f"{self.key!r}): {type(e).__name__}: {e}. Every rank claims its shards "
                    "there; restart the job from the ranks' last states"
                )
                return
            took = time.perf_counter() - t0
            self.stats.waited += took
            for position in range(last - n, last):
                if not claims.record(position, took / n):
                    return  # the list is spent
                self.stats.shards += 1
                self.stats.items += self.sizes[position] or 0
                if self.on_claim is not None:
                    try:
                        self._fetches.append(self.on_claim(position))
                    except Exception:
                        pass  # a prefetch is a hint: the reader fetches what is missing

    def _agrees(self, key: str, mine: str) -> bool:
        """Whether this rank's ``mine`` (its epoch and list) is what the
        first rank set at ``key`` (one ``compare_set``): a rank that began
        afresh beside ranks that resumed would claim positions of another
        list, or of another epoch's, and read items twice."""
        try:
            first = self.store.compare_set(key, "", mine)
        except Exception as e:
            self.claims.fail(f"the job's shard queue lost its store ({describe(self.store)}, key "
                             f"{key!r}): {type(e).__name__}: {e}")
            return False
        first = first.decode() if isinstance(first, bytes) else str(first)
        if first != mine:
            self.claims.fail(
                f"this rank's epoch and list ({mine}) are not those other ranks claim from "
                f"({first}): the ranks began from different states (one "
                "loaded a state and another did not, or states of different steps). Every "
                "rank loads a state of the same checkpoint; any rank's serves a rank that "
                "has none of its own")
            return False
        return True

    def account(self) -> tuple[list[int], list[Work]]:
        """The positions claimed so far, and the works among them not yet
        handed to the engine, read together."""
        return self.claims.account()

    def stop(self) -> None:
        self.claims.stop()


class WorldEpoch:
    """A dynamic epoch fed by the job's shared queue, for one rank: the
    epoch's list (what the last epoch held back, then the shards), this
    rank's claims from it, the batches it yields (with even counts), and
    its account of the epoch for a snapshot."""

    def __init__(self, ep: Any, loader: Any, epoch: int, resume: Optional[dict[str, Any]]) -> None:
        sharding = ep.sharding
        dataset = loader.dataset
        self.epoch = epoch
        self.rank, self.world = ep.rank, ep.world
        self.store = sharding.store if sharding.store is not None else default_store()
        self.wait = sharding.wait_for_ranks
        self.rec: Any = None  # the epoch's record (given by ShardEpoch)
        if loader._world_name is None:
            loader._world_name = sharding.name or _next_name()
        base = f"ferroloader/{loader._world_name}"
        if loader._world_gen is None:
            # each rank joins once per loader (and per load_state_dict): the
            # W joins of one start share a generation, so keys left in a
            # store that outlives a job are never read again
            joined = self._call(lambda: int(self.store.add(f"{base}/joins", 1)))
            loader._world_gen = (joined - 1) // self.world
            loader._world_prev = None
        self.ns = f"{base}/g{loader._world_gen}"
        self.prefix = f"{self.ns}/e{epoch}"
        self.stats: QueueStats = loader._queue_stats
        self.shuffle, self.root = ep.shuffle, ep.root
        self.lens = ep.lens
        self.seed = loader.seed if loader.seed is not None else 0
        lens = ep.lens
        batch = ep.batch or 1
        even = sharding.even and self.world > 1
        if even and lens is None:
            raise ConfigError(
                "every rank must yield the same number of batches (even=True with more than one "
                f"rank), which needs the length of every shard: {dataset._lengths_hint()}, or "
                "pass Sharding(even=False) to read every item exactly once with uneven batch "
                "counts"
            )
        handed = 0
        self.unit, self.block = list_unit(dataset, ep.descriptors, lens, self.world, sharding,
                                          self.shuffle)
        # the keys where every rank's epoch and list must agree (and, in the
        # generation's first epoch, that every rank began from one state)
        agree = [f"{self.prefix}/list"] + ([f"{self.ns}/began"] if loader._world_prev is None
                                           else [])
        self._meetings = 0  # state_dict()'s meetings of the ranks, this epoch
        self._met: Optional[tuple[str, dict[str, Any]]] = None
        accounts: Optional[list[dict[str, Any]]] = None
        if resume is not None:
            accounts = (job_accounts(resume) if resume.get("merged")
                        else self._exchange("resume", resume))
            works = remaining(accounts)
            self.n_carried = 0
            # (the saved positions count in the saved epoch's blocks)
            self.block = int(accounts[0].get("block", sharding.shuffle_block))
            handed = min(int(a["handed"]) for a in accounts)
        else:
            carried = self._carried(loader, even)
            self.n_carried = len(carried)
            works = carried + self._order(ep, sharding, lens)
        loader._world_prev = self
        self.first = handed
        self.list = works
        self.list_id = _core.world_list_id(works)
        sizes = [work_size(w, lens) for w in works]
        self.held = 0
        if even:
            self.budget: Optional[int] = even_count(works, lens, self.world, batch, accounts)
            quota: Optional[int] = (self.budget - handed) * batch
        else:
            self.budget, quota = None, None
        remote = dataset._remote(ep.descriptors)
        on_claim = None
        self.lease: Any = None
        if remote is not None:
            cache, pieces = remote
            wanted = [pieces[w[0]] for w in works if pieces[w[0]] is not None]
            if wanted:
                # the sizes checked now, and the room its lanes keep open
                # claimed; each claimed shard is fetched as it is claimed
                self.lease = cache._native().claim_room(wanted, max(loader._workers, 1))
                on_claim = _prefetcher(cache, pieces, works)
        lanes = max(loader._workers, 1)
        self.queue = WorldQueue(self.store, self.prefix, works, sizes, quota, lanes,
                                stats=self.stats, on_claim=on_claim,
                                horizon=REMOTE_HORIZON if on_claim is not None else HORIZON,
                                agree=(agree, f"e{epoch}:{self.list_id}"))
        ep.plan = _core_plan(ep, self.block, lanes, self.queue.claims, self.budget, handed)
        ep.short_of_room = dataset._short_of_room()

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ShardQueueError:
            raise
        except Exception as e:
            raise ShardQueueError(
                f"the job's shard queue cannot reach its store ({describe(self.store)}): "
                f"{type(e).__name__}: {e}"
            ) from None

    def _order(self, ep: Any, sharding: Any, lens: Optional[list[int]]) -> list[Work]:
        """The epoch's shards in its seeded order, longest first where the
        lengths are known (the order a one-rank dynamic queue hands out),
        cut into ranges of ``self.unit`` items where it is set."""

        one = _core.shard_plan({
            "n_shards": len(ep.descriptors), "lens": lens, "block": sharding.shuffle_block,
            "root": ep.root, "shuffle": ep.shuffle, "rank": 0, "world": 1, "dynamic": True,
            "lanes": 1, "batch": ep.batch, "drop_last": ep.drop_last, "even": False,
            "largest_first": sharding.largest_first, "resume": None, "shared": None,
        })
        return cut_list([(int(s), 0, OPEN) for s in one.read_order], lens, self.unit)

    def _exchange(self, what: str, account: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's ``account`` (``what``: of a resumed epoch, of the
        last one), through the store under this generation."""
        accounts = via_rank0(self.store, f"{self.ns}/{what}", self.rank, self.world, self.wait,
                             _without_list(account), "the state it resumes from", self._call)
        return _with_list(accounts, account["list"])

    def _carried(self, loader: Any, even: bool) -> list[Work]:
        """What the last epoch held back (even counts), read first in this
        one: the ranks' accounts of it exchanged through the store."""
        loaded = getattr(loader, "_next_world_carry", None)
        loader._next_world_carry = None
        prev = loader._world_prev
        if not even and (loaded is None or self.world > 1):
            # (nothing is held back without even counts; a state saved with
            # them on several ranks and loaded on one still carries it)
            return []
        if loaded is not None:
            accounts = (job_accounts(loaded) if loaded.get("merged")
                        else self._exchange("carry", loaded))
            carried, born, was = _carry_of(accounts, loader.sharding.shuffle_block)
        elif prev is not None and prev.rec is not None:
            carried, born, was = self._merged_carry(prev)
        else:
            return []
        lens = loader._shard_info()[1]
        if self.shuffle and carried:
            # positions in the last epoch's block orders, as this epoch's
            carried = _core.world_translate(carried, lens, was, self.block,
                                            epoch_seed(self.seed, born), self.root)
        # (no carried work longer than a range: the even budget, and len()
        # before the epoch, count on the ranges' length)
        carried = cut_list(carried, lens, self.unit)
        self.stats.held_back += sum(work_size(w, lens) or 0 for w in carried)
        return carried

    def _merged_carry(self, prev: WorldEpoch) -> tuple[list[Work], int, int]:
        """What the last epoch (``prev``) held back, as ``(works, its epoch,
        its block)``: rank 0 reads every rank's account and gives the
        result (or what was wrong with them)."""
        mine = prev.final_account()

        def carry(accounts: list[dict[str, Any]]) -> dict[str, Any]:
            try:
                accounts = _with_list(accounts, mine["list"])
                result = dict(zip(("works", "epoch", "block"), _carry_of(accounts, prev.block)))
                _say_left(prev, accounts)
                return result
            except ConfigError as e:
                return {"error": str(e)}

        result = via_rank0(self.store, f"{prev.prefix}/account", self.rank, self.world,
                           self.wait, _without_list(mine), f"its account of epoch {prev.epoch}",
                           self._call, carry, [f"{prev.prefix}/next", f"{prev.prefix}/list"])
        if "error" in result:
            raise ConfigError(result["error"])
        return ([(int(w[0]), int(w[1]), int(w[2])) for w in result["works"]],
                int(result["epoch"]), int(result["block"]))

    def meet(self, account: dict[str, Any]) -> dict[str, Any]:
        """The whole job's position for ``state_dict()``: every rank gives
        its ``account`` at its n-th saved position of the epoch and gets
        every rank's back, so each rank's state resumes the job alone, on
        any number of ranks. A rank saving again where it stands meets no
        one again. One rank: its own account."""
        if self.world == 1:
            return account
        mine = _without_list(account)
        here = json.dumps(mine, sort_keys=True)
        if self._met is None or self._met[0] != here:
            self._meetings += 1
            accounts = via_rank0(
                self.store, f"{self.prefix}/saved{self._meetings}", self.rank, self.world,
                self.wait, mine, "its state", self._call,
                hint="every rank calls state_dict() at the same step (as torch.distributed."
                     "checkpoint's save does): each rank's state then holds the whole job's")
            self._met = (here, merged_part(account["list"], accounts))
        return copy.deepcopy(self._met[1])

    def account(self, it: Any) -> dict[str, Any]:
        """This rank's account of the epoch, read between batches: its
        claims and what is left of them."""
        _positions, _next_lane, handed, rest = it._lane_snapshot
        claimed, buffered = self.queue.account()
        return {
            "across": "world",
            "epoch": self.epoch,
            "list": [list(w) for w in self.list],
            "list_id": self.list_id,
            "claimed": claimed,
            # (the engine writes a work that runs to its shard's end as
            # [shard, emitted])
            "rest": [[*w, OPEN] if len(w) == 2 else list(w) for w in (rest or [])]
            + [list(w) for w in buffered],
            "handed": int(handed),
            "budget": self.budget,
            # (the shuffle block its positions count in; the batches handed
            # before this list began: a resumed epoch's)
            "block": self.block,
            "first": self.first,
            "carried": self.n_carried,
        }

    def final_account(self) -> dict[str, Any]:
        """The account when the epoch ended (or was left), with whether it
        ended."""
        pos = self.rec.position()
        shards = pos.get("shards")
        if shards is None:
            return {"epoch": self.epoch, "list_id": self.list_id,
                    "list": [list(w) for w in self.list],
                    "claimed": [], "rest": [], "handed": 0, "ended": False,
                    "block": self.block, "first": self.first, "carried": self.n_carried}
        return dict(shards, ended=bool(pos["ended"]) or self._whole(shards))

    def _whole(self, shards: dict[str, Any]) -> bool:
        """With even counts the epoch is whole once its budget is handed
        over, one batch at least by this iterator: a trainer that counts
        len() batches (Lightning) stops there without asking for the end.
        (An epoch of no batches ends when it is asked for one.)"""
        handed = int(shards.get("handed", 0))
        return self.budget is not None and handed >= self.budget and handed > self.first

    def whole(self) -> bool:
        """Every batch of the epoch's budget was handed over (len() then
        counts the next epoch: a trainer asks for it there)."""
        shards = self.rec.position().get("shards") if self.rec is not None else None
        return shards is not None and self._whole(shards)

    def stop(self) -> None:
        self.queue.stop()


def _say_left(prev: WorldEpoch, accounts: list[dict[str, Any]]) -> None:
    """Logs (rank 0, once an epoch) an epoch of even counts that every rank
    left before its budget: what it had not read is not carried (a new
    ``iter()`` begins a fresh epoch, as torch's does), so a trainer that
    counts every epoch as the first's ``len()`` skips it."""
    if all(a.get("ended") for a in accounts) or untouched(accounts) or prev.budget is None:
        return
    handed = sorted({int(a.get("handed", 0)) for a in accounts})
    left = sum(work_size(w, prev.lens) or 0 for w in remaining(accounts))
    log.warning(
        "ferroloader: epoch %d of the shared queue was left after %s of its %d batches on every "
        "rank; the %d items it had not read are not carried into the next epoch (a new iter() "
        "begins a fresh one). A trainer that counts every epoch as the first's len() "
        "(transformers' Trainer) skips them so: see the frameworks guide", prev.epoch,
        "/".join(map(str, handed)), prev.budget, left)


_names = [0]
_names_lock = threading.Lock()


def _next_name() -> str:
    """The k-th loader of this process that uses the shared queue: ranks
    that build their loaders in the same order agree on it."""
    with _names_lock:
        _names[0] += 1
        return f"loader{_names[0]}"


def _prefetcher(cache: Any, pieces: Sequence[Any], works: Sequence[Work]) -> Callable[[int], Any]:
    """A claimed work's shard, fetched as soon as it is claimed."""
    def fetch(position: int) -> Any:
        piece = pieces[works[position][0]]
        if piece is None:
            return None
        item = (piece, None) if isinstance(piece, str) else (piece[0], tuple(piece[1]))
        return cache.prefetch_pieces([item], streams=1)

    return fetch


def _core_plan(ep: Any, block: int, lanes: int, source: Any, budget: Optional[int],
               handed: int) -> Any:
    sharding = ep.sharding
    return _core.shard_plan({
        "n_shards": len(ep.descriptors), "lens": ep.lens, "block": block,
        "root": ep.root, "shuffle": ep.shuffle, "rank": ep.rank, "world": ep.world,
        "dynamic": True, "lanes": lanes, "batch": ep.batch, "drop_last": ep.drop_last,
        "even": False, "largest_first": sharding.largest_first, "resume": None,
        "shared": {"source": source, "budget": budget, "handed": handed},
    })


__all__ = ["WorldEpoch", "WorldQueue"]


