"""The shared queue's epoch list and the ranks' accounts of it, as data:
how the list is cut into works, what an epoch has left or held back, the
even count, and the checks a state's accounts pass before a read. No store
and no thread here (``world.py`` has them)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import ferroloader._core as _core
from ferroloader.errors import ConfigError

# a work: (shard, first item, end) in the shard's order; end OPEN: its end
Work = tuple[int, int, int]
OPEN = 2**64 - 1



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


def even_count(works: Sequence[Work], lens: Optional[list[int]], world: int, batch: int,
               accounts: Optional[Sequence[dict[str, Any]]] = None) -> int:
    """The batches each of ``world`` ranks yields from the epoch's list
    ``works``, counted from the batches handed before it where it resumes
    every rank's ``accounts``; where those were saved by as many ranks, no
    more than the saved job would have made, so a restart on the same
    ranks yields the same count."""
    sizes = [work_size(w, lens) or 0 for w in works]
    k = int(_core.world_even_budget(sizes, world, batch))
    if not accounts:
        return k
    handed = min(int(a["handed"]) for a in accounts)
    budgets = {a.get("budget") for a in accounts}
    saved = budgets.pop() if len(budgets) == 1 else None
    if len(accounts) == world and saved is not None:
        k = min(k, max(0, int(saved) - handed))
    return handed + k


def untouched(accounts: Sequence[dict[str, Any]]) -> bool:
    """No rank handed over a batch of the epoch these accounts describe."""
    return all("carried" in a and int(a.get("handed", 0)) == int(a.get("first", 0))
               for a in accounts)


def job_accounts(merged: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's account in a state that holds the whole job's (each
    with the epoch's list, which the state holds once)."""
    accounts = list(merged["accounts"])
    return _with_list(accounts, merged["list"]) if "list" in merged else accounts


def merged_part(works: Any, accounts: list[dict[str, Any]]) -> dict[str, Any]:
    """A state's part that holds the whole job's position: the epoch's list
    once, and every rank's account without it."""
    return {"mode": "dynamic", "across": "world", "merged": True, "list": works,
            "accounts": [_without_list(a) for a in accounts]}


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


__all__ = ["OPEN", "Work", "check_ranks", "cut_list", "even_count", "job_accounts", "list_unit",
           "merged_part", "remaining", "untouched", "work_size"]
