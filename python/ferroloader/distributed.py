"""``DistributedSampler`` with its index list computed in Rust."""

from __future__ import annotations

from typing import Iterator, TypeVar

import torch.utils.data.distributed as _td

from ferroloader import sampler as _sampler

_T_co = TypeVar("_T_co", covariant=True)


class DistributedSampler(_td.DistributedSampler[_T_co]):
    __doc__ = _td.DistributedSampler.__doc__

    def __iter__(self) -> Iterator[_T_co]:
        it = _sampler._distributed(self)
        return it if it is not None else super().__iter__()  # type: ignore[return-value]


_sampler._register_distributed()

__all__ = ["DistributedSampler"]
