"""``DataLoader``: torch's class and argument checks, a Rust iterator.

``DataLoader`` subclasses ``torch.utils.data.DataLoader``: construction,
argument validation (same exception types and messages), attributes,
``len()`` and persistent-worker bookkeeping are torch's own code, and
``isinstance(loader, torch.utils.data.DataLoader)`` holds. Iteration is
replaced: indices, fetch, default collation and reassembly run in Rust.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, Optional, TypeVar, Union

import torch
import torch.utils.data.dataloader as _tdl
from torch.utils.data import _utils
from torch.utils.data.dataset import TensorDataset as _TorchTensorDataset

from ferroloader import _core
from ferroloader.sampler import native_batch_iter, native_iter

_T_co = TypeVar("_T_co", covariant=True)

_NOT_YET = (
    "ferroloader: multi-process loading (num_workers > 0) is not implemented yet; "
    "use num_workers=0"
)


class DataLoader(_tdl.DataLoader[_T_co]):
    __doc__ = _tdl.DataLoader.__doc__

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Union[Any, Iterable[Any], None] = None,
        batch_sampler: Union[Any, Iterable[list[Any]], None] = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[list[Any]], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        if num_workers > 0:
            raise NotImplementedError(_NOT_YET)

    def _get_iterator(self) -> Any:
        if self.num_workers > 0:
            raise NotImplementedError(_NOT_YET)
        return _single_process_iter(self)


def _is_datapipe(dataset: Any) -> bool:
    return isinstance(dataset, (_tdl.IterDataPipe, _tdl.MapDataPipe))


def _pin_settings(loader: DataLoader[Any]) -> Optional[tuple[Any, str]]:
    """The pin-memory decision and warnings of ``_BaseDataLoaderIter.__init__``."""
    if loader.pin_memory and loader.pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{loader.pin_memory_device}'.",
            stacklevel=4,
        )
    if loader.pin_memory and not torch.accelerator.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=4,
        )
    pin = loader.pin_memory and torch.accelerator.is_available()
    acc = torch.accelerator.current_accelerator() if pin else None
    device = acc.type if acc is not None else None
    if device == "mps":
        warnings.warn(
            "'pin_memory' argument is set as true but not supported on MPS now, "
            "device pinned memory won't be used.",
            stacklevel=4,
        )
        return None
    if not pin:
        return None
    return (_utils.pin_memory.pin_memory, device)  # type: ignore[return-value]


def _single_process_iter(loader: DataLoader[Any]) -> Any:
    """Builds the iterator in the order ``_SingleProcessDataLoaderIter``
    does its work: index sampler iterator, base-seed draw, fetcher."""
    dataset = loader.dataset
    if _is_datapipe(dataset):
        return _tdl._SingleProcessDataLoaderIter(loader)
    pin = _pin_settings(loader)
    index_sampler = loader._index_sampler
    auto = loader._auto_collation
    iterable = loader._dataset_kind == _tdl._DatasetKind.Iterable
    source: Any = None
    if not iterable:
        native = native_batch_iter(index_sampler) if auto else native_iter(index_sampler)
        source = native if native is not None else iter(index_sampler)
    # The loader's base seed: drawn (and the generator advanced) even though
    # a single-process loader has no worker to hand it to.
    torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
    if loader.timeout != 0:
        raise AssertionError("_SingleProcessDataLoaderIter requires timeout == 0")
    getitems = None
    tensors = None
    if iterable:
        source = iter(dataset)
    else:
        candidate = getattr(dataset, "__getitems__", None)
        getitems = candidate if candidate else None
        if type(dataset).__getitem__ is _TorchTensorDataset.__getitem__ and getitems is None:
            tensors = list(dataset.tensors)
    return _core.SingleProcessIter(
        source,
        dataset,
        iterable=iterable,
        getitems=getitems,
        tensors=tensors,
        auto_collation=auto,
        batch_size=loader.batch_size or 0,
        drop_last=loader.drop_last,
        collate_fn=loader.collate_fn,
        pin=pin,
        index_sampler=index_sampler,
        len_called=loader._IterableDataset_len_called,
    )


__all__ = ["DataLoader"]
