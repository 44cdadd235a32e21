"""Workers that start warm under ``forkserver``.

With the ``forkserver`` start method (Python 3.14's default on Linux, and
a common choice elsewhere) every worker is forked from a server process. By
default the server preloads only ``__main__``, so where the main module is
not a file (a notebook, pytest, ``python -c``) or does not import torch at
its top, each worker imports torch again (about 2 s here) before its first
batch, for every epoch without ``persistent_workers``.

When a loader with workers will use ``forkserver`` and the server is not
running yet, ferroloader adds to its preload list what every worker
imports anyway (``torch``, ``numpy``, ferroloader's worker module) and the
modules of the dataset, ``collate_fn`` and ``worker_init_fn`` when they are
importable modules, and starts the server at once (the ``DataLoader``'s
construction), so the imports overlap the rest of the user's set-up and
workers fork from a warm process. ``worker_init_fn``, seeds and
``multiprocessing_context`` behave as torch defines them. A server that is
already running keeps its preload list (multiprocessing cannot change it).

``spawn`` starts each worker as a fresh interpreter: there is nothing to
preload into, so it pays torch's import as torch's loader does.
"""

from __future__ import annotations

import multiprocessing
import sys
from multiprocessing import forkserver as _forkserver
from typing import Any, Optional

import torch

ALWAYS = ("torch", "numpy", "ferroloader.hosts.entry")


def start_method(loader: Any) -> Optional[str]:
    """The start method the loader's workers will use, read without fixing
    the process's default context (``set_start_method`` stays possible)."""
    ctx = loader.multiprocessing_context or torch.multiprocessing
    try:
        method = ctx.get_start_method(allow_none=True)
        if method is None:
            # not fixed yet: the platform's default is what the first
            # worker start would fix
            default = getattr(multiprocessing.context, "_default_context", None)
            method = getattr(getattr(default, "_default_context", None), "_name", None)
        return None if method is None else str(method)
    except (RuntimeError, ValueError, AttributeError, TypeError):
        return None


def _module_of(obj: Any) -> Optional[str]:
    if obj is None:
        return None
    name = getattr(obj, "__module__", None)
    if not isinstance(name, str) or isinstance(obj, (list, tuple, dict)):
        name = getattr(type(obj), "__module__", None)
    if not isinstance(name, str) or name == "__main__" or name in ALWAYS:
        return None
    if name.split(".")[0] in ("builtins", "torch", "ferroloader"):
        return None
    module = sys.modules.get(name)
    # only modules imported from a file: the server imports them by name
    return name if getattr(module, "__file__", None) else None


def preload_for(loader: Any) -> list[str]:
    """What the server should import for this loader's workers."""
    extra = [_module_of(loader.dataset), _module_of(type(loader.dataset))]
    extra += [_module_of(loader.collate_fn), _module_of(loader.worker_init_fn)]
    out = list(ALWAYS)
    for name in extra:
        if name is not None and name not in out:
            out.append(name)
    return out


def warm(loader: Any) -> bool:
    """Preloads and starts the fork server for ``loader``'s workers, if
    they use ``forkserver`` and the server is not running yet. Returns
    whether it started the server."""
    if loader.num_workers == 0 or getattr(loader, "worker_method", None) != "multiprocessing":
        return False
    if start_method(loader) != "forkserver":
        return False
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # importing the main module for a child (the fork server's own
        # preload, a spawned worker): a loader built at module level must
        # not start another server from there
        return False
    server = getattr(_forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is not None:
        return False
    current = list(getattr(server, "_preload_modules", None) or [])
    wanted = current + [m for m in preload_for(loader) if m not in current]
    try:
        server.set_forkserver_preload(wanted)
        server.ensure_running()
    except (OSError, ValueError, TypeError):
        return False  # the first worker start will try again, and report
    return True


def server_pid() -> Optional[int]:
    """The running fork server's pid, if any."""
    server = getattr(_forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    return int(pid) if pid is not None else None


__all__ = ["preload_for", "server_pid", "start_method", "warm"]
