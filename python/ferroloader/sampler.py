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

from typing import Any, Callable, Iterator, Optional, Union

import torch
import torch.utils.data.sampler as _ts

from ferroloader import _core

Sampler = _ts.Sampler


def _cpu_generator(gen: Any) -> bool:
    return gen is None or (isinstance(gen, torch.Generator) and gen.device.type == "cpu")


def _sequential(s: Any) -> Optional[_core.SamplerIter]:
    return _core.SamplerIter.sequential(len(s.data_source))


def _resolve_random(s: Any) -> Any:
    """``RandomSampler.__iter__``'s first step: read the sampler now."""
    n = len(s.data_source)
    num_samples = s.num_samples
    if n > 0 and _cpu_generator(s.generator) and type(num_samples) is int and num_samples > 0:
        return _core.SamplerIter.random(n, num_samples, bool(s.replacement), s.generator)
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
    if type(bs) is not int or bs <= 0:
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


__all__ = [
    "BatchSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]
