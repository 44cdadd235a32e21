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

import threading
import time
from typing import Any, Callable, Optional, Sequence

import ferroloader._core as _core
from ferroloader.epoch.store import default_store, describe, forget, gather, publish
from ferroloader.errors import ConfigError, ShardQueueError
from ferroloader.seeds import epoch_seed
from ferroloader.sources.worldqueue import QueueStats

# a work: (shard, first item, end) in the shard's order; end OPEN: its end
Work = tuple[int, int, int]
OPEN = 2**64 - 1


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
                 horizon: float = HORIZON) -> None:
        self.store = store
        self.key = f"{prefix}/next"
        self.sizes = list(sizes)
        self.claims = _core.WorldClaims(list(works), self.sizes, quota, MOST_AHEAD, horizon,
                                        lanes)
        self.stats = stats
        self.on_claim = on_claim
        self._fetches: list[Any] = []  # prefetches of claimed shards, kept alive
        threading.Thread(target=self._run, name="ferroloader-claims", daemon=True).start()

    def _run(self) -> None:
        claims = self.claims
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

    def account(self) -> tuple[list[int], list[Work]]:
        """The positions claimed so far, and the works among them not yet
        handed to the engine, read together."""
        return self.claims.account()

    def stop(self) -> None:
        self.claims.stop()


def work_size(work: Sequence[int], lens: Optional[Sequence[int]]) -> Optional[int]:
    if lens is None:
        return None
    shard, emitted, end = work
    return max(0, min(end, lens[shard]) - emitted)


def remaining(accounts: Sequence[dict[str, Any]]) -> list[Work]:
    """What an epoch has left, from every rank's account of it (checked
    first): the unread parts of the works the ranks claimed, by shard and
    position, then the works nobody claimed, in the list's order."""
    check_ranks(accounts, "iter()")
    return _core.world_remaining(list(accounts))


def check_ranks(accounts: Sequence[dict[str, Any]], what: str) -> None:
    """Every rank of the saved job exactly once, all of one epoch of one
    job (a ``ConfigError`` naming the ranks missing or repeated)."""
    try:
        _core.world_check_ranks(list(accounts), what)
    except (KeyError, TypeError) as e:
        raise ConfigError(f"{what}: not a state of the job's shared queue ({e})") from None


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
        if resume is not None:
            accounts = (resume["accounts"] if resume.get("merged")
                        else self._exchange("resume", resume))
            works = remaining(accounts)
            self.n_carried = 0
            # (the saved positions count in the saved epoch's blocks)
            self.block = int(accounts[0].get("block", sharding.shuffle_block))
            handed = min(int(a["handed"]) for a in accounts)
            prev_budget = resume.get("budget") if not resume.get("merged") else None
        else:
            carried = self._carried(loader, even)
            self.n_carried = len(carried)
            works = carried + self._order(ep, sharding, lens)
            prev_budget = None
        loader._world_prev = self
        self.first = handed
        self.list = works
        self.list_id = _core.world_list_id(works)
        sizes = [work_size(w, lens) for w in works]
        self.held = 0
        if even:
            k = _core.world_even_budget([s or 0 for s in sizes], self.world, batch)
            if prev_budget is not None and resume is not None:
                # the same job resumed: no more batches than it would have made
                k = min(k, max(0, int(prev_budget) - handed))
            self.budget: Optional[int] = handed + k
            quota: Optional[int] = k * batch
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
                                horizon=REMOTE_HORIZON if on_claim is not None else HORIZON)
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
        key = f"{self.ns}/{what}"
        self._call(lambda: publish(self.store, f"{key}/{self.rank}", _without_list(account)))
        accounts = gather(self.store, [f"{key}/{r}" for r in range(self.world)], self.wait,
                          "the states it resumes from")
        if int(self._call(lambda: self.store.add(f"{key}/read", 1))) == self.world:
            forget(self.store, [f"{key}/{r}" for r in range(self.world)] + [f"{key}/read"])
        return _with_list(accounts, account["list"])

    def _carried(self, loader: Any, even: bool) -> list[Work]:
        """What the last epoch held back (even counts), read first in this
        one: the ranks' accounts of it exchanged through the store."""
        loaded = getattr(loader, "_next_world_carry", None)
        loader._next_world_carry = None
        prev = loader._world_prev
        if not even:
            return []
        if loaded is not None:
            accounts = (loaded["accounts"] if loaded.get("merged")
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
        its block)``: every rank gives its account, rank 0 reads them all
        and gives the result (or what was wrong with them), and every other
        rank reads that one key: ``3 W`` calls on the store, not ``W**2``."""
        mine = prev.final_account()
        key = f"{prev.prefix}/account"
        merged = f"{prev.prefix}/carried"
        self._call(lambda: publish(self.store, f"{key}/{self.rank}", _without_list(mine)))
        if self.rank == 0:
            accounts = _with_list(gather(self.store, [f"{key}/{r}" for r in range(self.world)],
                                         self.wait, f"its account of epoch {prev.epoch}"),
                                  mine["list"])
            try:
                result: dict[str, Any] = dict(zip(
                    ("works", "epoch", "block"),
                    _carry_of(accounts, prev.block)))
            except ConfigError as e:
                result = {"error": str(e)}
            self._call(lambda: publish(self.store, merged, result))
        else:
            result = gather(self.store, [merged], self.wait,
                            f"the accounts of epoch {prev.epoch}, merged", ([0], self.world))[0]
        done = [f"{key}/{r}" for r in range(self.world)] + [merged, f"{prev.prefix}/read",
                                                              f"{prev.prefix}/next"]
        if int(self._call(lambda: self.store.add(f"{prev.prefix}/read", 1))) == self.world:
            forget(self.store, done)
        if "error" in result:
            raise ConfigError(result["error"])
        return ([(int(w[0]), int(w[1]), int(w[2])) for w in result["works"]],
                int(result["epoch"]), int(result["block"]))

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


def list_unit(dataset: Any, descriptors: Sequence[Any], lens: Optional[list[int]], world: int,
              sharding: Any, shuffle: bool) -> tuple[Optional[int], int]:
    """The range every rank cuts its shards into (``None``: shards stay
    whole) and the shuffle block that goes with it: the same on every rank,
    from the lengths alone. Whole where a length is unknown, the shards are
    remote, or a start costs a scan."""
    if lens is None or not dataset.seeks_to_start or dataset._remote(descriptors) is not None:
        return None, sharding.shuffle_block
    unit, block = _core.world_unit(sum(lens), world, sharding.shuffle_block, shuffle)
    return unit, block


def cut_list(works: list[Work], lens: Optional[list[int]], unit: Optional[int]) -> list[Work]:
    """``works`` as works of at most ``unit`` items (as they are, without one)."""
    if unit is None or lens is None:
        return works
    return list(_core.world_cut(works, lens, unit))


def _carry_of(accounts: list[dict[str, Any]], block: int) -> tuple[list[Work], int, int]:
    """What an epoch held back, from every rank's account of it: ``(works,
    the epoch, its block)``. The unread rest where every rank ended it; what
    it carried itself where no rank read a batch of it; else nothing (an
    epoch left early)."""
    first = accounts[0]
    born, was = int(first.get("epoch", 0)), int(first.get("block", block))
    if all(a.get("ended") for a in accounts):
        return remaining(accounts), born, was
    if untouched(accounts):
        # an iterator made and dropped before its first batch on every rank
        # (Lightning makes one so, before each epoch's own): what it carried
        # passes on, as the works its list began with
        return ([(int(w[0]), int(w[1]), int(w[2]))
                 for w in first["list"][: int(first["carried"])]], born, was)
    return [], born, was  # an epoch left early: what it did not read is not carried


def untouched(accounts: Sequence[dict[str, Any]]) -> bool:
    """No rank handed over a batch of the epoch these accounts describe."""
    return all("carried" in a and int(a.get("handed", 0)) == int(a.get("first", 0))
               for a in accounts)


def _without_list(account: dict[str, Any]) -> dict[str, Any]:
    """An account as the store carries it: without the epoch's list, which
    every rank holds alike (its digest, ``list_id``, says so). With ranges
    the list has about 64 works per rank: each rank gathering every rank's
    copy would move ``64 * W**2`` works per epoch."""
    return {k: v for k, v in account.items() if k != "list"}


def _with_list(accounts: list[dict[str, Any]], mine: Any) -> list[dict[str, Any]]:
    """Accounts gathered from the store, each with this rank's list again
    (checked against its digest with the rest)."""
    return [dict(a, list=mine) if "list" not in a else a for a in accounts]


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


__all__ = ["OPEN", "WorldEpoch", "WorldQueue", "check_ranks", "cut_list", "list_unit",
           "remaining", "untouched", "work_size"]


