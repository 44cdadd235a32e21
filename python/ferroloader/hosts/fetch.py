"""What the engine may do natively with a dataset, decided once per epoch."""

from __future__ import annotations

from typing import Any, Optional

from torch.utils.data.dataset import TensorDataset as _TorchTensorDataset

from ferroloader.sources.table import TableDataset


def fetch_plan(
    dataset: Any, iterable: bool
) -> tuple[Optional[Any], Optional[list[Any]], Optional[tuple[Any, Any]]]:
    """``(getitems, tensors, table)``: the dataset's truthy ``__getitems__``
    (torch calls it instead of ``__getitem__`` when present), the tensors of a
    plain ``TensorDataset`` whose rows the engine may gather directly, and a
    ``TableDataset``'s columns and transform (batches gathered from them)."""
    if iterable:
        return None, None, None
    candidate = getattr(dataset, "__getitems__", None)
    getitems = candidate if candidate else None
    tensors = None
    if getitems is None and type(dataset).__getitem__ is _TorchTensorDataset.__getitem__:
        tensors = list(dataset.tensors)
    table = None
    if (
        getitems is None
        and isinstance(dataset, TableDataset)
        and type(dataset).__getitem__ is TableDataset.__getitem__
    ):
        table = (dataset._native(), dataset.transform)
    return getitems, tensors, table
