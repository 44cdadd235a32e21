"""``default_collate`` and friends, run by the Rust collate engine.

The registry is torch's own ``default_collate_fn_map`` object, so a type
registered through either ``ferroloader.default_collate_fn_map`` or
``torch.utils.data._utils.collate.default_collate_fn_map`` is honoured by both
loaders. The Rust engine walks the batch as torch's ``collate`` does (exact
type lookup in the map, then ``isinstance`` in insertion order, then
containers); where the map resolves to one of torch's default functions it
runs a native equivalent, and anything else is handed to the registered
Python function, or to torch's own ``collate`` for unknown container types.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from torch.utils.data._utils import collate as _torch_collate

import ferroloader._core as _core

CollateFnMap = dict[Union[type, tuple[type, ...]], Callable[..., Any]]

default_collate_fn_map: CollateFnMap = _torch_collate.default_collate_fn_map

# batch_size=None converts each sample with torch's own function: it only
# wraps numpy arrays with torch.as_tensor, which shares memory and cannot be
# done faster elsewhere.
default_convert = _torch_collate.default_convert


def collate(batch: Any, *, collate_fn_map: Optional[CollateFnMap] = None) -> Any:
    """Collate ``batch`` as ``torch.utils.data._utils.collate.collate``."""
    return _core.collate(batch, collate_fn_map)


def default_collate(batch: Any) -> Any:
    """Same output as ``torch.utils.data.default_collate``."""
    return _core.collate(batch, default_collate_fn_map)


__all__ = ["collate", "default_collate", "default_collate_fn_map", "default_convert"]
