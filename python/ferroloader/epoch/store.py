"""The job's store as the shared queue uses it (``torch.distributed``'s
client): reaching it, naming it in errors, and the ranks' accounts
exchanged through it, with a bounded, logged wait for ranks that do not
come."""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

from ferroloader.errors import ConfigError, ShardQueueError

# after this many seconds of waiting for other ranks, a rank says so (once)
LOG_AFTER = 5.0


log = logging.getLogger("ferroloader.worldqueue")


def default_store() -> Any:
    """The default process group's store."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            "Sharding(across='world') keeps its queue in torch.distributed's store: call "
            "torch.distributed.init_process_group() first, or pass Sharding(store=...) (a "
            "torch.distributed.Store every rank reaches, e.g. a TCPStore or FileStore)"
        )
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def describe(store: Any) -> str:
    """How errors name a store: its kind and, for a TCPStore, where it is
    (through the PrefixStores a process group wraps it in)."""
    kind = type(store).__name__
    try:
        inner = getattr(store, "underlying_store", None)
        host, port = getattr(store, "host", None), getattr(store, "port", None)
    except Exception:  # a store gone may fail to say
        inner = host = port = None
    if inner is not None and inner is not store:
        return f"{kind} over {describe(inner)}"
    if host is not None and port is not None:
        return f"{kind} at {host}:{port}"
    return kind


def publish(store: Any, key: str, value: Any) -> None:
    store.set(key, json.dumps(value))


# why a rank may not come, where the wait does not say
NOT_STARTED = ("a rank that did not start this epoch (ranks given different epoch counts, or one "
               "that ended early) or did not load its state")


def gather(store: Any, keys: Sequence[str], wait: float, what: str,
           ranks: Optional[tuple[list[int], int]] = None, hint: str = NOT_STARTED) -> list[Any]:
    """The values at ``keys`` (key ``r`` is rank ``r``'s, or ``ranks[0][r]``'s
    of ``ranks[1]``), waiting up to ``wait`` seconds for them: logged once
    after ``LOG_AFTER`` seconds, then a ``ShardQueueError`` naming the ranks
    whose keys never came (and ``hint``: why they may not have)."""
    owners, of = ranks if ranks is not None else (list(range(len(keys))), len(keys))
    start = time.monotonic()
    logged = False
    while True:
        left = wait - (time.monotonic() - start)
        step = min(max(left, 0.001), LOG_AFTER if not logged else 5.0)
        try:
            store.wait(list(keys), timedelta(seconds=step))
            return [json.loads(store.get(k)) for k in keys]
        except Exception as e:
            failure = e  # a timeout, or a store that is gone: missing() tells
        missing = [owners[i] for i in _missing(store, keys, failure)]
        if not missing:
            continue  # (they came between the wait and the check)
        waited = time.monotonic() - start
        names = ", ".join(map(str, missing[:16])) + (", ..." if len(missing) > 16 else "")
        if waited >= wait:
            raise ShardQueueError(
                f"the job's shared shard queue waited {waited:.0f} s for {what} from rank"
                f"{'s' if len(missing) > 1 else ''} {names} (of {of}), at "
                f"{describe(store)}: {hint}. Sharding(wait_for_ranks=...) sets the wait"
            ) from None
        if not logged and waited >= LOG_AFTER:
            logged = True
            log.warning(
                "ferroloader: waiting for %s from rank%s %s of %d (%.0f s so far, up to %.0f s: "
                "Sharding(wait_for_ranks=...))", what, "s" if len(missing) > 1 else "", names,
                of, waited, wait)


def via_rank0(store: Any, key: str, rank: int, world: int, wait: float, mine: Any, what: str,
              call: Callable[[Callable[[], Any]], Any],
              combine: Optional[Callable[[list[Any]], Any]] = None,
              forget_too: Sequence[str] = (), hint: str = NOT_STARTED) -> Any:
    """Every rank's ``mine``, through the store: each rank sets its own at
    ``key/<rank>``, rank 0 gathers them all and sets ``combine`` of them
    (the list itself without one) at ``key/all``, and every other rank
    reads that one key: ``3 W`` calls on the store, not ``W**2``. The last
    rank to read removes the keys, and ``forget_too``. ``call`` runs each
    store call (naming a store that fails)."""
    call(lambda: publish(store, f"{key}/{rank}", mine))
    if rank == 0:
        got = gather(store, [f"{key}/{r}" for r in range(world)], wait, what, hint=hint)
        result = combine(got) if combine is not None else got
        call(lambda: publish(store, f"{key}/all", result))
    else:
        result = gather(store, [f"{key}/all"], wait, "every rank's, as rank 0 gathered them",
                        ([0], world), hint=hint)[0]
    if int(call(lambda: store.add(f"{key}/read", 1))) == world:
        forget(store, [f"{key}/{r}" for r in range(world)] + [f"{key}/all", f"{key}/read",
                                                               *forget_too])
    return result


def _missing(store: Any, keys: Sequence[str], failure: BaseException) -> list[int]:
    """The ranks whose key is not in the store yet; a store that cannot
    answer is gone (``ShardQueueError``)."""
    try:
        return [r for r, k in enumerate(keys) if not store.check([k])]
    except Exception as e:
        raise ShardQueueError(
            f"the job's shard queue lost its store ({describe(store)}) while it waited for "
            f"every rank's account of the epoch: {type(e).__name__}: {e} (the wait said: "
            f"{type(failure).__name__}: {failure})"
        ) from None


def forget(store: Any, keys: Sequence[str]) -> None:
    for k in keys:
        try:
            store.delete_key(k)
        except Exception:
            pass  # best effort: an epoch's keys are a few bytes


__all__ = ["default_store", "describe", "forget", "gather", "publish", "via_rank0"]
