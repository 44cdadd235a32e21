"""Worker information, as ``torch.utils.data.get_worker_info``.

A worker process sets torch's record (a module global, as torch's own
workers do). Worker threads (``worker_method="thread"``) share the
process, so each keeps its record in a thread-local, and torch's
``get_worker_info`` is made to read that first (:func:`thread_aware`):
``torch.utils.data.get_worker_info()`` and ``torch.thread_safe_generator()``
then answer per thread, inside ferroloader's worker threads only.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from torch.utils.data._utils import worker as _torch_worker


class _WorkerLocal(threading.local):
    info: Optional[Any] = None

    def set(self, info: Optional[Any]) -> None:
        self.info = info


# The current worker thread's WorkerInfo (``None`` outside worker threads).
worker_local = _WorkerLocal()


def get_worker_info() -> Optional[_torch_worker.WorkerInfo]:
    """Information about the current loader worker (id, num_workers, seed,
    dataset; in a worker thread also ``rng`` and ``worker_method``), or
    ``None`` in the main process. Workers set torch's record, so
    ``torch.utils.data.get_worker_info()`` answers the same inside them."""
    info = worker_local.info
    return info if info is not None else _torch_worker._worker_info


def _torch_get_worker_info() -> Any:  # pragma: no cover - runs as torch's code
    # The body torch's get_worker_info gets (thread_aware): it runs with
    # torch's module globals, where _ferroloader_local is the thread-local.
    info = _ferroloader_local.info  # type: ignore[name-defined]  # noqa: F821
    return _worker_info if info is None else info  # type: ignore[name-defined]  # noqa: F821


_patch_lock = threading.Lock()


def thread_aware() -> None:
    """Makes torch's ``get_worker_info`` read a worker thread's own record
    first (its code object is swapped, so every reference to the function,
    ``from torch.utils.data import get_worker_info`` included, answers per
    thread). Outside ferroloader's worker threads it returns what it
    returned before. Done once, when the first thread worker starts."""
    with _patch_lock:
        fn = _torch_worker.get_worker_info
        if fn.__code__ is _torch_get_worker_info.__code__:
            return
        _torch_worker._ferroloader_local = worker_local  # type: ignore[attr-defined]
        fn.__code__ = _torch_get_worker_info.__code__


__all__ = ["get_worker_info"]
