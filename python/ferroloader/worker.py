"""Worker information, as ``torch.utils.data.get_worker_info``."""

from __future__ import annotations

from typing import Any, Optional

from torch.utils.data._utils.worker import WorkerInfo

_worker_info: Optional[WorkerInfo] = None


def get_worker_info() -> Optional[Any]:
    """Return information about the current loader worker, or ``None`` in the
    main process (every loader runs in the main process until multi-process
    loading lands)."""
    return _worker_info
