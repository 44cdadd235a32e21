"""Weighted mixtures of datasets, resumable on any number of workers or ranks.

``Mixture({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3},
seed=0)`` is a map-style dataset over its sources (global index = the
source's offset + its index) whose epoch is a sequence of draws computed in
Rust (``ferroloader._core.mixture_indices``): draw ``p`` picks its source
by the weights from a hash of (seed, epoch, p) and reads that source
through a permutation of its own (or at a uniform index, with replacement).
The sequence depends on the seed, the epoch, the position and the weights
alone, not on ``num_workers`` or the number of ranks.

A ``DataLoader`` over a ``Mixture`` batches it with a
:class:`MixtureBatchSampler`, an :class:`~ferroloader.ElasticBatchSampler`
over the draws: each global batch of ``batch_size * world_size`` draws is
split across ranks, the loader's ``state_dict()`` holds the global position
(and the weights in force, a few numbers), and a job saved on N ranks
resumes on M with exactly the rest. Weights changed before resuming are
followed from the resume position on: the draws before it are the old
weights' and each source's read position carries over, so no item of a
source is read twice in its pass.
"""

from __future__ import annotations

import bisect
import math
import threading
from typing import Any, Mapping, Optional, Sequence, Union

from torch.utils.data import Dataset, IterableDataset

import ferroloader._core as _core
from ferroloader.errors import ConfigError
from ferroloader.sampler import ElasticBatchSampler, _tail
from ferroloader.seeds import epoch_seed
from ferroloader.sources.remote import fetch_ahead
from ferroloader.sources.shards import ShardedDataset

EXHAUSTED = ("stop_first", "drop", "cycle")
# torchdata's StopCriteria names (torchdata.nodes.MultiNodeWeightedSampler)
_TORCHDATA_NAMES = {
    "FIRST_DATASET_EXHAUSTED": "stop_first",
    "ALL_DATASETS_EXHAUSTED": "drop",
    "CYCLE_UNTIL_ALL_DATASETS_EXHAUSTED": "cycle",
}


class Mixture(Dataset[Any]):
    """Map-style datasets (and ``ShardedDataset``s with known shard
    lengths) drawn from by weight.

    - ``weights``: a weight per source name (any non-negative numbers,
      normalised; default equal). Change them with :meth:`set_weights`.
    - ``replacement=False`` (default): each source is read in a random
      order of its own (a sharded source: its shards in a random order,
      each shard's items in order), and ``exhausted`` says what a source that ran out
      does: ``"drop"`` (default; it leaves the mixture, the others'
      weights are renormalised, the epoch ends when all ran out: every item
      once), ``"stop_first"`` (the epoch ends at the first draw that needs a
      source with nothing left) or ``"cycle"`` (it starts a new pass; the
      epoch ends when every source of non-zero weight has run out once).
      An empty source of non-zero weight is refused with ``"stop_first"``
      and ``"cycle"`` (a ``ConfigError``; it would end every epoch at its
      first draw, or has nothing to cycle); ``"drop"`` never draws it.
      torchdata's ``StopCriteria`` names are taken too
      (``FIRST_DATASET_EXHAUSTED``, ``ALL_DATASETS_EXHAUSTED``,
      ``CYCLE_UNTIL_ALL_DATASETS_EXHAUSTED``).
    - ``replacement=True``: each draw takes a uniform index of its source;
      an epoch is ``num_samples`` draws (default: the sources' total).
    - ``num_samples`` also caps an epoch without replacement.

    A ``DataLoader`` over a mixture batches its draws (with a
    :class:`MixtureBatchSampler`); the draws depend only on (seed, epoch,
    position) and the weights, never on ``num_workers``.

    >>> import torch, ferroloader
    >>> mix = ferroloader.Mixture({"a": torch.arange(6), "b": torch.arange(100, 102)},
    ...                           weights={"a": 3, "b": 1}, seed=0)
    >>> len(mix), mix.locate(6)
    (8, ('b', 0))
    >>> items = [int(v) for batch in ferroloader.DataLoader(mix, batch_size=4) for v in batch]
    >>> sorted(items)
    [0, 1, 2, 3, 4, 5, 100, 101]
    """

    def __init__(
        self,
        sources: Mapping[str, Any],
        weights: Optional[Mapping[str, float]] = None,
        *,
        seed: int = 0,
        replacement: bool = False,
        exhausted: str = "drop",
        num_samples: Optional[int] = None,
    ) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise ConfigError("Mixture needs a non-empty mapping of names to datasets")
        readers: list[Any] = []
        for name, ds in sources.items():
            if isinstance(ds, ShardedDataset):
                readers.append(_ShardedReader(name, ds))
                continue
            if isinstance(ds, IterableDataset) or not hasattr(ds, "__getitem__"):
                raise ConfigError(
                    f"Mixture source {name!r} is not a map-style dataset "
                    f"({type(ds).__name__}); mix map-style datasets with __getitem__ and "
                    "__len__, or ferroloader.ShardedDatasets"
                )
            try:
                len(ds)
            except TypeError:
                raise ConfigError(f"Mixture source {name!r} has no len()") from None
            readers.append(ds)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"Mixture seed should be an int, but got seed={seed!r}")
        exhausted = _TORCHDATA_NAMES.get(exhausted, exhausted)
        if exhausted not in EXHAUSTED:
            raise ConfigError(
                f"exhausted should be one of {EXHAUSTED}, but got exhausted={exhausted!r}"
            )
        if num_samples is not None and (
            isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1
        ):
            raise ConfigError(
                f"num_samples should be a positive integer or None, but got {num_samples!r}"
            )
        self.names = list(sources)
        self.sources = [sources[n] for n in self.names]
        # what a draw reads: the dataset, or a sharded one's reader
        self._readers = readers
        self.seed = seed
        self.replacement = bool(replacement)
        self.exhausted = exhausted
        self.num_samples = num_samples
        self.lens = [len(r) for r in self._readers]
        self.shard_lens = [
            r.shard_lens if isinstance(r, _ShardedReader) else None for r in self._readers
        ]
        if self.replacement and 0 in self.lens:
            empty = self.names[self.lens.index(0)]
            raise ConfigError(
                f"Mixture source {empty!r} is empty: nothing to draw with replacement"
            )
        self.offsets = [0]
        for n in self.lens:
            self.offsets.append(self.offsets[-1] + n)
        self.weights: dict[str, float] = {}
        self.set_weights(weights)

    def set_weights(self, weights: Optional[Mapping[str, float]]) -> None:
        """New weights (a weight per source name): the next epoch draws
        with them, and so does a resumed epoch from its resume position."""
        if weights is None:
            weights = {n: 1.0 for n in self.names}
        if not isinstance(weights, Mapping) or set(weights) != set(self.names):
            got = sorted(weights) if isinstance(weights, Mapping) else weights
            raise ConfigError(
                f"Mixture weights should name every source ({sorted(self.names)}), got {got!r}"
            )
        clean = {}
        for name in self.names:
            w = weights[name]
            number = isinstance(w, (int, float)) and not isinstance(w, bool)
            if not number or not math.isfinite(w) or w < 0:
                raise ConfigError(
                    f"Mixture weight of {name!r} should be a finite number >= 0, got {w!r}"
                )
            clean[name] = float(w)
        if sum(clean.values()) <= 0:
            raise ConfigError("Mixture weights are all 0: nothing would be drawn")
        self._check_empty(clean)
        self.weights = clean

    def _check_empty(self, weights: Mapping[str, float]) -> None:
        """An empty source drawn from (a weight above 0) has run out before
        the epoch starts: ``"drop"`` leaves it out (every item of every
        source once: it has none), but ``"stop_first"`` would end every
        epoch at its first draw and ``"cycle"`` has nothing to start a new
        pass with; both are refused rather than silently never drawing it."""
        if self.exhausted == "drop":
            return
        for name, n in zip(self.names, self.lens):
            if n == 0 and weights[name] > 0:
                why = (
                    "the epoch would end at its first draw (torchdata's FIRST_DATASET_EXHAUSTED)"
                    if self.exhausted == "stop_first"
                    else "it has no item to start a new pass with"
                )
                raise ConfigError(
                    f"Mixture source {name!r} is empty and has weight {weights[name]!r}: with "
                    f"exhausted={self.exhausted!r} {why}. Leave it out, give it weight 0, or use "
                    "exhausted='drop' (an empty source is then never drawn)"
                )

    def weight_list(self) -> list[float]:
        return [self.weights[n] for n in self.names]

    def __len__(self) -> int:
        """Items addressable by global index (the sources' total); an
        epoch's length is its batch sampler's."""
        return self.offsets[-1]

    def _source_of(self, index: int) -> tuple[int, int]:
        """The source's position and its index for global index ``index``."""
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"Mixture index {index} out of range for {len(self)} items")
        s = bisect.bisect_right(self.offsets, index) - 1
        return s, index - self.offsets[s]

    def locate(self, index: int) -> tuple[str, int]:
        """The source name and its index for global index ``index``."""
        s, i = self._source_of(index)
        return self.names[s], i

    def __getitem__(self, index: int) -> Any:
        s, i = self._source_of(int(index))
        return self._readers[s][i]

    def _fetch_ahead(self, reach: Sequence[tuple[int, int]]) -> list[Any]:
        """Sharded sources at URLs: their shards fetched ahead of the
        workers, in the order a rank's epoch first reaches them (``reach``:
        ``(source, shard)``, from the engine's draws), each cache's in one
        prefetch. The handles stop it when collected."""
        remote = {}
        for s, r in enumerate(self._readers):
            got = r.ds._remote(r.shards) if isinstance(r, _ShardedReader) else None
            if got is not None:
                remote[s] = got
        by_cache: dict[int, tuple[Any, list[Any]]] = {}
        for s, k in reach:
            if s in remote:
                cache, pieces = remote[s]
                by_cache.setdefault(id(cache), (cache, []))[1].append(pieces[k])
        handles = [fetch_ahead(cache, pieces) for cache, pieces in by_cache.values()]
        return [h for h in handles if h is not None]


class _ShardedReader:
    """A ``ShardedDataset`` read by position: its shards laid end to end in
    their given order (every ``shard_len`` known). A draw continues the
    shard iterator the previous draw of this thread left open when it asks
    for the next item, else opens ``iter_shard(shard, start=offset)``: a
    sharded source's draws read shard after shard, so a worker reopens a
    shard about once per batch."""

    def __init__(self, name: str, ds: ShardedDataset[Any]) -> None:
        self.ds = ds
        self.shards = list(ds.shards())
        lens = [ds.shard_len(sh) for sh in self.shards]
        if any(n is None for n in lens):
            raise ConfigError(
                f"Mixture source {name!r} is a ShardedDataset whose shards' lengths are not all "
                f"known: a mixture needs each source's length ({ds._lengths_hint()})"
            )
        self.shard_lens = [int(n) for n in lens if n is not None]
        self.starts = [0]
        for n in self.shard_lens:
            self.starts.append(self.starts[-1] + n)
        self._open = threading.local()
        self._short_of_room = ds._short_of_room()

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> Any:
        k = bisect.bisect_right(self.starts, index) - 1
        offset = index - self.starts[k]
        held = getattr(self._open, "held", None)
        if held is not None and held[0] == (k, offset):
            it = held[1]
        else:
            it = iter(self.ds.iter_shard(self.shards[k], offset))
        try:
            item = next(it)
        except StopIteration:
            raise IndexError(
                f"shard {self.shards[k]!r} ended before its shard_len() ({self.shard_lens[k]})"
            ) from None
        if self._short_of_room is not None and self._short_of_room():
            # the cache is short of room: no shard stays open (pinned)
            # between draws; the next draw reopens it where it stood
            self._open.held = None
            close = getattr(it, "close", None)
            if close is not None:
                close()
        else:
            self._open.held = ((k, offset + 1), it)
        return item

    def __getstate__(self) -> dict[str, Any]:
        # an open iterator stays in its process
        return {k: v for k, v in self.__dict__.items() if k != "_open"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open = threading.local()


Segments = list[list[Union[int, list[float]]]]


class MixtureBatchSampler(ElasticBatchSampler):
    """Batches of a :class:`Mixture`'s draws, split across ranks as
    :class:`~ferroloader.ElasticBatchSampler` splits a permutation
    (``even`` defaults to whether there are several ranks). The
    epoch advances with each iteration (or with ``set_epoch``); a
    ``DataLoader`` over a ``Mixture`` builds one (``auto_epoch``: the
    loader's epoch count decides). Pass one yourself to choose the ranks.

    >>> import torch, ferroloader
    >>> mix = ferroloader.Mixture({"a": torch.arange(8), "b": torch.arange(8, 16)}, seed=0)
    >>> sampler = ferroloader.MixtureBatchSampler(mix, 4, rank=0, world_size=2)
    >>> loader = ferroloader.DataLoader(mix, batch_sampler=sampler)
    >>> len(loader), [len(b) for b in loader]
    (2, [4, 4])
    """

    def __init__(
        self,
        mixture: Mixture,
        batch_size: int,
        *,
        drop_last: bool = False,
        even: Optional[bool] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ) -> None:
        super().__init__(
            len(mixture), batch_size, shuffle=False, seed=mixture.seed, drop_last=drop_last,
            even=True, rank=rank, world_size=world_size,
        )
        # even (pad the last global batch so every rank gets one) only
        # where there are ranks to even out: one rank's last batch is short
        self.even = self.world_size > 1 if even is None else bool(even)
        self.mixture = mixture
        # set by a DataLoader that built it: the loader sets the epoch
        self.auto_epoch = False
        self._saved_segments: Optional[Segments] = None
        # the current epoch's weights, each in force from a position on
        self.segments: Segments = [[0, mixture.weight_list()]]
        self._cache: Optional[tuple[Any, tuple[int, list[int], list[Any]]]] = None
        self._prefetch: list[Any] = []

    def __getstate__(self) -> dict[str, Any]:
        # a prefetch under way belongs to this process
        return {k: ([] if k == "_prefetch" else v) for k, v in self.__dict__.items()}

    def _plan(self) -> tuple[int, Segments]:
        """The next iteration's start position and weight segments."""
        start = 0
        saved = None
        if self._resume is not None and self._resume[0] == self.epoch:
            start = self._resume[1]
            saved = self._saved_segments
        now = self.mixture.weight_list()
        if saved is None:
            return start, [[0, now]]
        segments = [list(s) for s in saved]
        if segments[-1][1] != now:
            if segments[-1][0] == start:
                segments[-1] = [start, now]
            else:
                segments.append([start, now])
        return start, segments

    def _draw(self, start: int, segments: Segments) -> tuple[int, list[int], list[Any]]:
        """The epoch's length, this rank's indices from ``start`` and the
        order they reach sharded sources' shards (one computation serves
        ``len()`` and the iteration)."""
        key = (self.epoch, start, repr(segments), self.world_size, self.rank, self.batch_size)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        m = self.mixture
        out = _core.mixture_indices(
            {
                "lens": m.lens,
                "segments": [(int(s[0]), list(s[1])) for s in segments],  # type: ignore[arg-type]
                "root": epoch_seed(m.seed, self.epoch),
                "replacement": m.replacement,
                "exhausted": m.exhausted,
                "num_samples": m.num_samples,
                "start": start,
                "batch": self.batch_size,
                "world": self.world_size,
                "rank": self.rank,
                "tail": _tail(self.drop_last, self.even),
                "shards": m.shard_lens,
            }
        )
        self._cache = (key, out)
        return out

    def indices(self) -> list[int]:
        start, segments = self._plan()
        n, idx, reach = self._draw(start, segments)
        # remote shards of sharded sources, fetched in this epoch's order
        # (the previous epoch's prefetch stops when replaced)
        self._prefetch = self.mixture._fetch_ahead(reach)
        self._resume = None
        self._saved_segments = None
        self._start = start
        self.n = n
        self.segments = segments
        return idx

    def __len__(self) -> int:
        start, segments = self._plan()
        n = self._draw(start, segments)[0]
        self.n = n
        return self._batches(n, start)

    def resume_at(self, epoch: int, consumed: int, segments: Optional[Segments] = None) -> None:
        super().resume_at(epoch, consumed)
        self._saved_segments = segments

    def snapshot_segments(self) -> Segments:
        out: Segments = []
        for start, weights in self.segments:
            assert isinstance(start, int) and isinstance(weights, list)
            out.append([start, [float(w) for w in weights]])
        return out


__all__ = ["Mixture", "MixtureBatchSampler"]


def check_loader_args(mixture: Mixture, shuffle: Any, sampler: Any, batch_sampler: Any) -> None:
    """What a loader over a ``Mixture`` cannot honour, rather than drop
    silently: its order is its weighted draws, from its seed and the epoch,
    and a sampler of the loader's would replace them (and the weights)."""
    if shuffle:
        raise ConfigError(
            f"shuffle={shuffle!r} has no meaning for a Mixture: its order is its weighted draws, "
            "computed from the Mixture's seed and the epoch (each epoch draws anew). For another "
            "order give the Mixture another seed: Mixture(..., seed=...)"
        )
    own = isinstance(batch_sampler, MixtureBatchSampler) and batch_sampler.mixture is mixture
    if sampler is not None or (batch_sampler is not None and not own):
        given = "sampler=" if sampler is not None else "batch_sampler="
        other = (
            "this MixtureBatchSampler draws from another Mixture; "
            if isinstance(batch_sampler, MixtureBatchSampler) and sampler is None
            else ""
        )
        raise ConfigError(
            f"{given} would replace a Mixture's weighted draws (its order from its seed and the "
            f"epoch, and its weights): {other}leave it unset, and the loader batches the draws "
            "(split across torch.distributed's ranks), or pass "
            "batch_sampler=ferroloader.MixtureBatchSampler(mixture, batch_size, rank=..., "
            "world_size=...) to choose the ranks"
        )


def loader_batch_sampler(mixture: Mixture, shuffle: Any, sampler: Any, batch_sampler: Any,
                         batch_size: Optional[int], drop_last: Any) -> tuple[Any, Any, Any, Any]:
    """A loader over ``mixture``: its arguments checked, and where it gives
    no sampler, the mixture's own batch sampler (whose epoch follows the
    loader's; its draws batched, and split across ranks) with the
    ``(batch_sampler, batch_size, drop_last, shuffle)`` torch is then given."""
    check_loader_args(mixture, shuffle, sampler, batch_sampler)
    if sampler is not None or batch_sampler is not None:
        return batch_sampler, batch_size, drop_last, shuffle
    if batch_size is None:
        raise ConfigError("a Mixture is batched by its draws: give batch_size (batch_size=None "
                          "is not supported with a Mixture)")
    if not isinstance(drop_last, bool):
        # torch's BatchSampler check (the mixture's sampler takes its place)
        raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
    own = MixtureBatchSampler(mixture, batch_size, drop_last=drop_last)
    own.auto_epoch = True
    return own, 1, False, None
