"""Sharding done by the loader: static, dynamic and elastic, across workers
and ranks.

A :class:`ShardedDataset` is a list of shards (``shards()``) and a way to
read one from an item on (``iter_shard(shard, start)``); optionally each
shard's length (``shard_len(shard)``). Which rank, worker and reader reads
which shard is the loader's business (``DataLoader(..., sharding=...)``),
decided in the main process by the engine; no user code calls
``get_worker_info()``.

- **static** (default): each epoch the shards are put in an order (with
  ``shuffle=True`` a permutation from the loader's seed and the epoch); rank
  ``r`` of ``W`` takes the shards at positions ``r, r + W, ...``. Within a
  rank, ``lanes`` logical readers (default 8) take those shards in turn;
  each lane reads its shards one after another and makes batches of its
  own items; the rank yields the lanes' batches round-robin. Workers only
  execute lanes (lane ``l`` runs on worker ``l % num_workers``), so a rank's
  batches are the same for any ``num_workers``.
- **dynamic**: one lane per worker; a worker that finishes a shard gets the
  rank's next unread shard from the main process, so uneven shards keep
  every worker busy. When every ``shard_len`` is known the longest shards
  go out first (``largest_first``), so an epoch does not end with one
  worker reading a large shard alone. The batch order then depends on
  timing; the items read do not, nor does the number of batches: a lane
  that runs out of shards while others read on makes no short batch but
  hands its last items back, and the last lane to run out reads them all,
  so only the rank's last batch may be short (dropped with
  ``drop_last=True``), as if one lane read all the rank's items.
- **elastic**: the epoch's items form one global sequence (shards in
  order, each in shard order) that depends only on (seed, epoch); each
  global batch of ``batch_size * world_size`` items is split across ranks.
  A job saved on N ranks resumes on M and reads exactly the rest of the
  sequence. Needs every ``shard_len``; reads by address (see the README).

With ``shuffle=True`` items are also shuffled within each shard in blocks of
``shuffle_block`` items (a permutation per block from the seed), so at most
``shuffle_block`` items per lane are held in memory and a resume re-reads at
most one block.
"""

from __future__ import annotations

import inspect
import itertools
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar, Union

import torch

from ferroloader.dataset import IterableDataset
from ferroloader.errors import ConfigError
from ferroloader.sources.remote import ShardCache, cache_for, is_url

_T_co = TypeVar("_T_co", covariant=True)

_MODES = ("static", "dynamic", "elastic")
# each lane is a reader the engine keeps (and numbers in 32 bits): far more
# than any machine runs at once
_MAX_LANES = 1 << 16


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` from ``torch.distributed`` when it is
    initialised, else ``(0, 1)``. Nothing here joins a collective."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardedDataset(IterableDataset[_T_co]):
    """An iterable dataset made of shards, which the loader assigns to
    ranks, workers and readers itself.

    Subclasses define ``shards()`` (picklable shard descriptors: paths,
    row-group ids, ranges), ``iter_shard(shard, start=0)`` (the items of one
    shard from item ``start`` on) and, when they know it, ``shard_len(shard)``
    (needed for even batch counts across ranks and for elastic sharding).
    ``shards()`` is read once per loader, in the main process.

    Iterated on its own or by ``torch.utils.data.DataLoader``, it reads the
    shards at its rank's and worker's positions, in order, so each item is
    read once there too (without shuffling or lanes).

    >>> import ferroloader
    >>> class Ranges(ferroloader.ShardedDataset):
    ...     def shards(self):
    ...         return [0, 1, 2]
    ...     def iter_shard(self, shard, start=0):
    ...         return iter(range(10 * shard + start, 10 * shard + 10))
    ...     def shard_len(self, shard):
    ...         return 10
    >>> loader = ferroloader.DataLoader(Ranges(), batch_size=5, shuffle=True, seed=0,
    ...                                 num_workers=2)
    >>> len(loader), sorted(int(v) for b in loader for v in b) == list(range(30))
    (6, True)
    """

    #: Whether ``iter_shard(shard, start)`` reaches item ``start`` without
    #: reading the items before it. The job's shared queue
    #: (``Sharding(across="world")``) then cuts shards of known length into
    #: ranges; set it to ``False`` where a start costs a scan.
    seeks_to_start: bool = True

    def shards(self) -> Sequence[Any]:
        raise NotImplementedError(f"{type(self).__name__} must define shards()")

    def iter_shard(self, shard: Any, start: int = 0) -> Iterable[_T_co]:
        raise NotImplementedError(f"{type(self).__name__} must define iter_shard(shard, start)")

    def shard_len(self, shard: Any) -> Optional[int]:
        """The number of items of ``shard``; ``None`` when unknown."""
        return None

    def _remote(self, shards: Sequence[Any]) -> Optional[tuple[Any, list[Any]]]:
        """``(cache, what each shard reads)`` when shards are read through a
        ``ShardCache`` (the loader prefetches them), else ``None``: per
        shard a URL, ``(url, (start, end))`` for a byte range of one, or
        ``None`` (a local shard)."""
        return None

    def _lengths_hint(self) -> str:
        """How a user gives this dataset its shards' lengths (for errors)."""
        return f"define shard_len() on {type(self).__name__}"

    def _short_of_room(self) -> Optional[Callable[[], bool]]:
        """For shards read through a ``ShardCache`` (``self.cache``): its
        check whether readers should let go of their shards between
        batches, else ``None``."""
        cache = getattr(self, "cache", None)
        return cache.short_of_room if isinstance(cache, ShardCache) else None

    def __iter__(self) -> Iterator[_T_co]:
        rank, world = distributed_rank()
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        for shard in list(self.shards())[rank * nw + wid :: world * nw]:
            yield from self.iter_shard(shard, 0)

    def __len__(self) -> int:
        total = 0
        for s in self.shards():
            n = self.shard_len(s)
            if n is None:
                raise TypeError(
                    f"{type(self).__name__} has no len(): the length of shard {s!r} is not "
                    f"known ({self._lengths_hint()})"
                )
            total += int(n)
        return total


def _takes_start(reader: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(reader).parameters
    except (TypeError, ValueError):
        return False
    return "start" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


class FileShards(ShardedDataset[_T_co]):
    """A sharded dataset over files: one shard per path, read by
    ``reader(path)`` (an iterable of items), or ``reader(path, start=k)``
    when the reader takes a ``start`` argument (it should then skip the
    first ``k`` items cheaply). ``lengths``: each file's item count, as a
    sequence in the order of ``paths`` or a function of the path.

    A path may be a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``,
    ``file://``): the reader then gets the local path of the shard in
    ``cache`` (a ``ferroloader.ShardCache``; by default one with its
    default directory and budget), which the loader fills ahead of the
    readers (see ``ferroloader.remote``). ``lengths`` as a function gets
    the URL.

    >>> import os, tempfile, ferroloader
    >>> folder = tempfile.mkdtemp()
    >>> paths = [os.path.join(folder, f"part-{p}.txt") for p in range(2)]
    >>> for p, path in enumerate(paths):
    ...     with open(path, "w") as f:
    ...         _ = f.write("".join(f"{p}-{i}\\n" for i in range(3)))
    >>> def read_lines(path, start=0):
    ...     with open(path) as f:
    ...         yield from (line.strip() for i, line in enumerate(f) if i >= start)
    >>> ds = ferroloader.FileShards(paths, read_lines, lengths=[3, 3])
    >>> sorted(x for b in ferroloader.DataLoader(ds, batch_size=2) for x in b)
    ['0-0', '0-1', '0-2', '1-0', '1-1', '1-2']
    """

    def __init__(
        self,
        paths: Iterable[Union[str, os.PathLike[str]]],
        reader: Callable[..., Iterable[_T_co]],
        *,
        lengths: Union[Sequence[int], Callable[[str], int], None] = None,
        cache: Optional[ShardCache] = None,
    ) -> None:
        self.paths = [os.fspath(p) for p in paths]
        self.reader = reader
        self.lengths = lengths
        if lengths is not None and not callable(lengths) and len(lengths) != len(self.paths):
            raise ConfigError(f"FileShards: {len(lengths)} lengths for {len(self.paths)} paths")
        # (a reader without ``start`` skips by reading: shards stay whole)
        self.seeks_to_start = _takes_start(reader)
        self.cache = cache_for(self.paths, cache)

    def shards(self) -> list[str]:
        return self.paths

    def iter_shard(self, shard: Any, start: int = 0) -> Iterable[_T_co]:
        if self.cache is not None and is_url(shard):
            return self.cache.read(shard, lambda path: self._read(path, start))
        return self._read(shard, start)

    def _read(self, path: str, start: int) -> Iterable[_T_co]:
        if self.seeks_to_start:
            return self.reader(path, start=start)
        return itertools.islice(self.reader(path), start, None)

    def _remote(self, shards: Sequence[Any]) -> Optional[tuple[Any, list[Any]]]:
        if self.cache is None:
            return None
        return self.cache, [s if is_url(s) else None for s in shards]

    def _lengths_hint(self) -> str:
        return (
            "pass FileShards(..., lengths=...): a sequence in path order, or a function of "
            "the path"
        )

    def shard_len(self, shard: Any) -> Optional[int]:
        if self.lengths is None:
            return None
        if callable(self.lengths):
            return int(self.lengths(shard))
        return int(self.lengths[self.paths.index(shard)])


@dataclass(frozen=True)
class Sharding:
    """How the loader shards a :class:`ShardedDataset` (see the module doc).

    - ``mode``: ``"static"``, ``"dynamic"`` or ``"elastic"``.
    - ``lanes``: static mode's readers per rank (independent of
      ``num_workers``; more lanes than workers keep every worker busy).
    - ``shuffle_block``: with ``shuffle=True``, items are shuffled within
      blocks of this many items of a shard.
    - ``even``: every rank yields the same number of batches per epoch, so
      DDP never waits on a rank that ran out (needs ``shard_len``). Static
      and dynamic modes stop each rank after the fewest batches any rank can
      make; elastic mode splits the last global batch evenly, padded by
      wrapping around to a multiple of the ranks (as ``DistributedSampler``
      pads), or drops it with ``drop_last=True``. ``even=False`` reads every item
      exactly once, with uneven batch counts.
    - ``rank``, ``world_size``: given explicitly, or from ``torch.distributed``
      when it is initialised, else one rank.
    - ``largest_first``: dynamic mode hands out the longest shards first
      (when every length is known; equal lengths keep the epoch's order).
    - ``across``: dynamic mode's queue: ``"rank"`` (each rank its own
      shards) or ``"world"``: one queue for the whole job, kept in
      ``torch.distributed``'s store, from which a faster rank claims more
      (``ferroloader.worldqueue``). ``store``: that store (default: the
      default process group's); ``name``: its keys' namespace, when two
      loaders of a job read the same shards (default: the loader's place
      among the process's loaders that use the queue). ``wait_for_ranks``:
      the seconds a rank waits for the other ranks' accounts when an epoch
      with ``even=True`` starts or a resume begins (logged after 5 s), then
      a ``ShardQueueError`` naming the ranks that did not come.

    >>> import ferroloader
    >>> ferroloader.Sharding(mode="dynamic").lanes
    8
    >>> ferroloader.Sharding(mode="elastic", rank=1, world_size=4).ranks()
    (1, 4)
    """

    mode: str = "static"
    lanes: int = 8
    shuffle_block: int = 64
    even: bool = True
    rank: Optional[int] = None
    world_size: Optional[int] = None
    largest_first: bool = True
    across: str = "rank"
    store: Any = field(default=None, compare=False, repr=False)
    name: Optional[str] = None
    wait_for_ranks: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.mode, str) or self.mode not in _MODES:
            raise ConfigError(f"Sharding mode should be one of {_MODES}, but got {self.mode!r}")
        if not isinstance(self.across, str) or self.across not in ("rank", "world"):
            raise ConfigError(f"Sharding across should be 'rank' or 'world', but got "
                              f"{self.across!r}")
        for flag in ("even", "largest_first"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"Sharding {flag} should be True or False, but got "
                                  f"{getattr(self, flag)!r}")
        for count in ("rank", "world_size"):
            value = getattr(self, count)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"Sharding {count} should be an int (or None: from "
                                  f"torch.distributed), but got {value!r}")
        wait = self.wait_for_ranks
        if (isinstance(wait, bool) or not isinstance(wait, (int, float))
                or not 0 < wait < float("inf")):
            raise ConfigError(f"Sharding wait_for_ranks should be a positive number of seconds, "
                              f"but got {wait!r}")
        if self.store is not None and not all(
                callable(getattr(self.store, m, None)) for m in ("add", "set", "get", "wait")):
            hint = (" (an address: a TCPStore there is torch.distributed.TCPStore(host, port, "
                    "world_size, is_master=rank == 0))" if isinstance(self.store, str) else "")
            raise ConfigError(
                f"Sharding store should be a torch.distributed.Store every rank reaches (a "
                f"TCPStore, FileStore or HashStore), but got {self.store!r}{hint}"
            )
        if self.across == "world" and self.mode != "dynamic":
            raise ConfigError(
                f"Sharding(across='world') is a dynamic queue shared by the ranks: it needs "
                f"mode='dynamic' (got mode={self.mode!r}; elastic sharding is already global)"
            )
        if self.across == "rank" and (self.store is not None or self.name is not None):
            raise ConfigError("Sharding store= and name= are for across='world'")
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ConfigError(f"Sharding name should be a non-empty str, but got {self.name!r}")
        for name, most in (("lanes", _MAX_LANES), ("shuffle_block", 2**63 - 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ConfigError(
                    f"Sharding {name} should be a positive int (at most {most}), but got {value!r}"
                )
        if (self.rank is None) != (self.world_size is None):
            raise ConfigError(f"Sharding rank and world_size should be given together (or both "
                              f"left None), but got rank={self.rank!r}, "
                              f"world_size={self.world_size!r}")
        if self.rank is not None:
            assert self.world_size is not None
            if self.world_size < 1:
                raise ConfigError(f"Sharding world_size should be a positive int, but got "
                                  f"{self.world_size}")
            if not 0 <= self.rank < self.world_size:
                raise ConfigError(
                    f"Sharding rank should be in [0, {self.world_size - 1}], but got {self.rank}"
                )

    def ranks(self) -> tuple[int, int]:
        """``(rank, world_size)`` for this process."""
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        return distributed_rank()


__all__ = ["FileShards", "ShardedDataset", "Sharding"]
