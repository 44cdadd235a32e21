"""Typed stub for the compiled engine ``ferroloader._core``.

Checked against the built module by ``mypy.stubtest`` in ``scripts/test``.
"""

from typing import Any, Iterator, Optional, final

import torch
from typing_extensions import Self, disjoint_base

__version__: str

__all__ = [
    "BatchSamplerIter",
    "MultiProcessIter",
    "SamplerIter",
    "SingleProcessIter",
    "__version__",
    "collate",
    "randperm",
    "worker_loop",
]

def collate(batch: Any, collate_fn_map: Optional[dict[Any, Any]] = None) -> Any:
    """torch's ``collate`` with native paths for its default functions."""

def randperm(n: int, generator: Optional[torch.Generator] = None) -> list[int]:
    """``torch.randperm(n, generator=generator).tolist()``, drawn natively."""

@final
class SamplerIter(Iterator[int]):
    """A sampler's epoch of indices, drawn in Rust."""

    @staticmethod
    def deferred(sampler: Any, resolve: Any) -> SamplerIter: ...
    @staticmethod
    def sequential(n: int) -> SamplerIter: ...
    @staticmethod
    def random(
        n: int, num_samples: int, replacement: bool, generator: Optional[torch.Generator] = None
    ) -> SamplerIter: ...
    @staticmethod
    def subset_random(
        indices: list[int], generator: Optional[torch.Generator] = None
    ) -> SamplerIter: ...
    @staticmethod
    def weighted(
        weights: torch.Tensor,
        num_samples: int,
        replacement: bool,
        generator: Optional[torch.Generator] = None,
    ) -> SamplerIter: ...
    @staticmethod
    def distributed(
        n: int,
        num_replicas: int,
        rank: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        num_samples: int,
        total_size: int,
    ) -> Optional[SamplerIter]:
        """``None`` when the sampler's sizes are inconsistent (torch raises)."""
    def __iter__(self) -> SamplerIter: ...
    def __next__(self) -> int: ...
    def _skip(self, n: int) -> int:
        """Draws and drops ``n`` indices; how many there were."""
    def _prepend(self, indices: list[int]) -> None:
        """Hands out ``indices`` before the sampler's own."""

@final
class BatchSamplerIter(Iterator[list[Any]]):
    """Index lists of ``batch_size`` from a sampler, batched in Rust."""

    def __new__(cls, source: Any, batch_size: int, drop_last: bool) -> Self: ...
    @property
    def is_native(self) -> bool: ...
    def __iter__(self) -> BatchSamplerIter: ...
    def __next__(self) -> list[Any]: ...
    def _skip(self, n: int) -> int:
        """Draws and drops ``n`` batches without building them; how many there were."""
    def _prepend(self, batches: list[list[int]]) -> None:
        """Hands out ``batches`` first (native batches only)."""

@disjoint_base
class SingleProcessIter(Iterator[Any]):
    """``num_workers=0``: indices, fetch and collate in one native ``__next__``."""

    def __new__(
        cls,
        source: Any,
        dataset: Any,
        *,
        iterable: bool,
        getitems: Optional[Any],
        tensors: Optional[list[torch.Tensor]],
        auto_collation: bool,
        batch_size: int,
        drop_last: bool,
        collate_fn: Optional[Any],
        pin: Optional[tuple[Any, Any]],
        index_sampler: Any,
        len_called: Optional[int],
        rng_guard: Optional[Any] = None,
    ) -> Self: ...
    def __iter__(self) -> SingleProcessIter: ...
    def __next__(self) -> Any: ...
    def __len__(self) -> int: ...
    @property
    def _position(self) -> tuple[int, int, bool, bool]:
        """``(drawn, yielded, ended, exhausted)`` of the current epoch."""

@disjoint_base
class MultiProcessIter(Iterator[Any]):
    """The main-process side of multi-process loading (subclassed in Python)."""

    def __new__(
        cls,
        workers: list[tuple[int, int]],
        source: Any,
        dataset: Any,
        *,
        iterable: bool,
        batch_size: Optional[int],
        auto_collation: bool,
        prefetch_factor: int,
        in_order: bool,
        persistent: bool,
        timeout: float,
        timeout_text: str,
        pin: Optional[tuple[Any, Any]],
        index_sampler: Any,
        len_called: Optional[int],
    ) -> Self: ...
    def _prime(self) -> None: ...
    def _reset_epoch(self, source: Any, len_called: Optional[int]) -> None: ...
    def _close(self) -> None: ...
    @property
    def _position(self) -> tuple[int, list[int], bool]:
        """``(drawn, pending sequence numbers, ended)`` of the current epoch."""
    @property
    def _iterable_position(
        self,
    ) -> tuple[list[int], list[Optional[bytes]], list[bool], int]:
        """``(delivered, states, exhausted, next_worker)`` per worker."""
    def _restore_round_robin(self, next_worker: int, exhausted: list[bool]) -> None: ...
    @property
    def _closed(self) -> bool:
        """The workers were stopped (a failure, or a non-persistent epoch's end)."""
    def __iter__(self) -> MultiProcessIter: ...
    def __next__(self) -> Any: ...
    def __len__(self) -> int: ...

def worker_loop(
    fd: int,
    *,
    dataset: Any,
    iterable: bool,
    auto_collation: bool,
    drop_last: bool,
    collate_fn: Optional[Any],
    getitems: Optional[Any],
    tensors: Optional[list[torch.Tensor]],
    main_pid: int,
    shm_initial: int,
    shm_limit: int,
    prefetch_factor: int,
    make_iter: Any,
    wrap_exception: Any,
    init_exception: Optional[bytes],
    on_epoch: Optional[Any] = None,
    state_fn: Optional[Any] = None,
) -> None:
    """Serve tasks from the main process until it stops or goes away."""
