"""Worker information, as ``torch.utils.data.get_worker_info``."""

from __future__ import annotations

from typing import Optional

from torch.utils.data._utils import worker as _torch_worker


def get_worker_info() -> Optional[_torch_worker.WorkerInfo]:
    """Information about the current loader worker (id, num_workers, seed,
    dataset), or ``None`` in the main process. Workers set torch's record, so
    ``torch.utils.data.get_worker_info()`` answers the same inside them."""
    return _torch_worker._worker_info


__all__ = ["get_worker_info"]
