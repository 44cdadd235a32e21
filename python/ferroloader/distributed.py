"""``DistributedSampler`` with its index list computed in Rust."""

from __future__ import annotations

from typing import Any, Iterator, Optional, TypeVar

import torch.utils.data.distributed as _td

import ferroloader._core as _core
from ferroloader.sampler import register_native

_T_co = TypeVar("_T_co", covariant=True)
_U64 = 1 << 64


def _distributed(s: Any) -> Optional[_core.SamplerIter]:
    """The epoch's indices in Rust, or ``None`` when the sampler's attributes
    are not what torch's own code would accept (torch then raises its error)."""
    seed = s.seed + s.epoch
    ints = (s.num_replicas, s.rank, s.num_samples, s.total_size)
    if not all(type(v) is int and v >= 0 for v in ints) or s.num_replicas == 0:
        return None
    if type(seed) is not int or not -(1 << 63) <= seed < _U64:
        return None
    return _core.SamplerIter.distributed(
        {
            "n": len(s.dataset),
            "num_replicas": s.num_replicas,
            "rank": s.rank,
            "shuffle": bool(s.shuffle),
            "seed": seed % _U64,
            "drop_last": bool(s.drop_last),
            "num_samples": s.num_samples,
            "total_size": s.total_size,
        }
    )


class DistributedSampler(_td.DistributedSampler[_T_co]):
    __doc__ = _td.DistributedSampler.__doc__

    def __iter__(self) -> Iterator[_T_co]:
        it = _distributed(self)
        return it if it is not None else super().__iter__()  # type: ignore[return-value]


register_native(_td.DistributedSampler.__iter__, _distributed)
register_native(DistributedSampler.__iter__, _distributed)

__all__ = ["DistributedSampler"]
