"""Samplers: torch's classes, iterated by the Rust engine.

Each index sampler subclasses its torch counterpart (same constructor,
checks, attributes and ``len``) and replaces ``__iter__`` with a Rust
iterator that yields the same indices and consumes the generator exactly as
torch does. Configurations the engine does not cover (non-CPU generators, an
empty data source, non-integer subset indices) fall back to torch's own
``__iter__``, so they behave, and fail, exactly as in torch.

``BatchSampler`` (like ``Sampler``) is torch's class itself: a loader's
``batch_sampler`` must be exactly torch's ``BatchSampler`` for frameworks
that rebuild loaders (Lightning treats any other class, a subclass
included, as a custom batch sampler), and ``isinstance`` against
``ferroloader.BatchSampler`` must hold for it. The loader batches a torch
``BatchSampler`` over a known sampler in Rust anyway
(:func:`native_batch_iter`); iterated by hand, outside a loader, it is
torch's Python loop (the same batches).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable, Iterator, Optional, Union

import torch
import torch.utils.data.dataloader as _tdl
import torch.utils.data.sampler as _ts

import ferroloader._core as _core
from ferroloader.errors import ConfigError
from ferroloader.seeds import epoch_seed
from ferroloader.sources.shards import Sharding

Sampler = _ts.Sampler


# the loaders' own generators (``seed=``): only their loader draws from
# them, so the engine may draw a permutation from one's state and write the
# state back, and hand a live iterator's permutation to a resume beside it
_OWN: weakref.WeakSet[torch.Generator] = weakref.WeakSet()


def own_generator() -> torch.Generator:
    """A new generator for a loader's ``seed=`` (see ``_OWN``)."""
    g = torch.Generator()
    _OWN.add(g)
    return g


def _cpu_generator(gen: Any) -> bool:
    return gen is None or (isinstance(gen, torch.Generator) and gen.device.type == "cpu")


def _sequential(s: Any) -> Optional[_core.SamplerIter]:
    return _core.SamplerIter.sequential(len(s.data_source))


def _resolve_random(s: Any) -> Any:
    """``RandomSampler.__iter__``'s first step: read the sampler now."""
    n = len(s.data_source)
    num_samples = s.num_samples
    if n > 0 and _cpu_generator(s.generator) and type(num_samples) is int and num_samples > 0:
        own = s.generator in _OWN  # (None is in no WeakSet)
        return _core.SamplerIter.random(n, num_samples, bool(s.replacement), s.generator, own)
    return _ts.RandomSampler.__iter__(s)


def _resolve_weighted(s: Any) -> Any:
    if _cpu_generator(s.generator):
        return _core.SamplerIter.weighted(s.weights, s.num_samples, s.replacement, s.generator)
    return _ts.WeightedRandomSampler.__iter__(s)


def _random(s: Any) -> Optional[_core.SamplerIter]:
    return _core.SamplerIter.deferred(s, _resolve_random)


def _subset_random(s: Any) -> Optional[_core.SamplerIter]:
    indices = s.indices
    if not isinstance(indices, (list, tuple, range)) or not _cpu_generator(s.generator):
        return None
    if not all(type(i) is int for i in indices):
        return None
    return _core.SamplerIter.subset_random(list(indices), s.generator)


def _weighted(s: Any) -> Optional[_core.SamplerIter]:
    return _core.SamplerIter.deferred(s, _resolve_weighted)


def native_iter(sampler: Any) -> Optional[_core.SamplerIter]:
    """A Rust iterator for a sampler whose ``__iter__`` is torch's or ours,
    else ``None`` (the caller iterates it in Python)."""
    build = _NATIVE.get(getattr(type(sampler), "__iter__", None))
    return build(sampler) if build is not None else None


def native_batch_iter(batch_sampler: Any) -> Optional[_core.BatchSamplerIter]:
    """A Rust iterator of index lists for torch's ``BatchSampler`` (also
    ``ferroloader.BatchSampler``), unless a subclass overrides ``__iter__``."""
    if getattr(type(batch_sampler), "__iter__", None) not in _BATCH_ITERS:
        return None
    bs, drop_last = batch_sampler.batch_size, batch_sampler.drop_last
    if type(bs) is not int or not 0 < bs <= sys.maxsize:
        # (torch's own iteration raises islice's error past sys.maxsize)
        return None
    inner = batch_sampler.sampler
    source: Union[_core.SamplerIter, Any] = native_iter(inner)
    # A sampler the engine does not know is iterated in Python, lazily, as
    # torch's BatchSampler does (iter() on the first batch).
    return _core.BatchSamplerIter(source if source is not None else inner, bs, bool(drop_last))


class SequentialSampler(_ts.SequentialSampler):
    __doc__ = _ts.SequentialSampler.__doc__

    def __iter__(self) -> Iterator[int]:
        return _sequential(self)  # type: ignore[return-value]


class RandomSampler(_ts.RandomSampler):
    __doc__ = _ts.RandomSampler.__doc__

    def __iter__(self) -> Iterator[int]:
        return _random(self)  # type: ignore[return-value]


class SubsetRandomSampler(_ts.SubsetRandomSampler):
    __doc__ = _ts.SubsetRandomSampler.__doc__

    def __iter__(self) -> Iterator[int]:
        it = _subset_random(self)
        return it if it is not None else super().__iter__()


class WeightedRandomSampler(_ts.WeightedRandomSampler):
    __doc__ = _ts.WeightedRandomSampler.__doc__

    def __iter__(self) -> Iterator[int]:
        return _weighted(self)  # type: ignore[return-value]


BatchSampler = _ts.BatchSampler

_BATCH_ITERS = {_ts.BatchSampler.__iter__}

_NATIVE: dict[Any, Callable[[Any], Optional[_core.SamplerIter]]] = {
    _ts.SequentialSampler.__iter__: _sequential,
    SequentialSampler.__iter__: _sequential,
    _ts.RandomSampler.__iter__: _random,
    RandomSampler.__iter__: _random,
    _ts.SubsetRandomSampler.__iter__: _subset_random,
    SubsetRandomSampler.__iter__: _subset_random,
    _ts.WeightedRandomSampler.__iter__: _weighted,
    WeightedRandomSampler.__iter__: _weighted,
}


def register_native(iter_fn: Any, build: Callable[[Any], Optional[_core.SamplerIter]]) -> None:
    """Runs samplers whose ``__iter__`` is ``iter_fn`` with ``build`` (a Rust
    iterator, or ``None`` to fall back to Python). Used by modules that add
    samplers without this one importing them."""
    _NATIVE[iter_fn] = build


def _tail(drop_last: bool, even: bool) -> str:
    return "split" if not even else ("drop" if drop_last else "pad")


class ElasticBatchSampler(_ts.Sampler[list[int]]):
    """A batch sampler for map-style data that splits each *global* batch
    across ranks: the epoch's global sequence (``torch.randperm(n,
    generator=torch.Generator().manual_seed(epoch_seed(seed, epoch)))`` with
    ``shuffle=True``, else ``range(n)``) is cut into global batches of
    ``batch_size * world_size`` indices, and rank ``r`` takes indices
    ``[r * batch_size, (r + 1) * batch_size)`` of each. The sequence depends
    only on (seed, epoch), so a job saved on N ranks resumes on M ranks with
    exactly the rest of it (the loader's ``state_dict()`` records the
    global position).

    ``drop_last=False`` splits the last global batch evenly, padding it by
    wrapping around to a multiple of ``world_size`` (as
    ``DistributedSampler`` pads: one rank pads nothing), so every rank's
    last batch has the same, possibly smaller, size; ``True`` drops it; ``even=False`` splits it
    as it falls (every index once, the last batches shorter or missing on
    some ranks). Call ``set_epoch(epoch)`` before each epoch, as with
    ``DistributedSampler``.

    >>> import torch, ferroloader
    >>> ranks = [ferroloader.ElasticBatchSampler(10, 2, seed=0, rank=r, world_size=2)
    ...          for r in range(2)]
    >>> first = [next(iter(s)) for s in ranks]  # rank 0 and rank 1's first batches
    >>> sorted(first[0] + first[1]) == sorted(torch.randperm(
    ...     10, generator=torch.Generator().manual_seed(ferroloader.seeds.epoch_seed(0, 0))
    ... )[:4].tolist())
    True
    """

    def __init__(
        self,
        data_source: Union[int, Any],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        even: bool = True,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size}"
            )
        self.n = data_source if isinstance(data_source, int) else len(data_source)
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.even = bool(even)
        given = Sharding(rank=rank, world_size=world_size)
        self.rank, self.world_size = given.ranks()
        self.epoch = 0
        self._start = 0
        self._resume: Optional[tuple[int, int]] = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self) -> list[int]:
        """This rank's indices of the epoch (from a resumed position once)."""
        start = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            start = self._resume[1]
        self._resume = None
        self._start = start
        return _core.elastic_indices(
            self.n,
            start=start,
            batch=self.batch_size,
            world=self.world_size,
            rank=self.rank,
            tail=_tail(self.drop_last, self.even),
            seed=epoch_seed(self.seed, self.epoch) if self.shuffle else None,
        )

    def __iter__(self) -> Iterator[list[int]]:
        idx = self.indices()
        for i in range(0, len(idx), self.batch_size):
            yield idx[i : i + self.batch_size]

    def __len__(self) -> int:
        return self._batches(self.n, self._start_for_len())

    def _batches(self, n: int, start: int) -> int:
        """This rank's batches of a global sequence of ``n`` from ``start``."""
        step = self.batch_size * self.world_size
        left = max(n - start, 0)
        full, rest = divmod(left, step)
        if rest == 0 or (self.even and self.drop_last):
            return full
        if self.even:
            return full + 1
        return full + (1 if rest > self.rank * self.batch_size else 0)

    def _start_for_len(self) -> int:
        if self._resume is not None and self._resume[0] == self.epoch:
            return self._resume[1]
        return 0

    def native(self) -> Any:
        """The epoch's batches as the engine's batch iterator."""
        source = _core.SamplerIter.from_list(self.indices())
        return _core.BatchSamplerIter(source, self.batch_size, False)

    def consumed(self, handed: int) -> int:
        """The global position after ``handed`` of this epoch's batches."""
        return min(self.n, self._start + handed * self.batch_size * self.world_size)

    def resume_at(self, epoch: int, consumed: int) -> None:
        """The next iteration of ``epoch`` starts at global position
        ``consumed``."""
        self._resume = (int(epoch), int(consumed))


def index_source(loader: Any) -> Any:
    """The epoch's index stream: a Rust iterator for samplers the engine
    knows, else ``iter(index_sampler)`` as torch creates it."""
    if loader._dataset_kind == _tdl._DatasetKind.Iterable:
        return None
    index_sampler = loader._index_sampler
    auto = loader._auto_collation
    if isinstance(index_sampler, ElasticBatchSampler) and not loader.in_order:
        raise ConfigError(
            "ElasticBatchSampler hands batches over in order (a snapshot counts a prefix of the "
            "global sequence); in_order=False is not supported with it"
        )
    if getattr(index_sampler, "auto_epoch", False):
        index_sampler.set_epoch(loader._epochs_started - 1)
    if auto and getattr(type(index_sampler), "__iter__", None) is ElasticBatchSampler.__iter__:
        return index_sampler.native()
    native = native_batch_iter(index_sampler) if auto else native_iter(index_sampler)
    return native if native is not None else iter(index_sampler)


__all__ = [
    "BatchSampler",
    "ElasticBatchSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]
