"""Where workers run: the hosts of the one worker loop, behind one call.

``start_workers(loader, plan, trim)`` starts an epoch's workers and hands
the engine a socket (and a pid, 0 for a thread) per worker; the rest of
the package never asks which host runs them:

- ``local``: worker processes through ``multiprocessing`` (fork, spawn,
  forkserver, the user's context) and worker threads of this process, with
  the thread-safety lint and the processes' teardown;
- ``entry``: what a worker process or thread runs (torch's set-up, then
  the engine's loop), and the host a Ray actor builds;
- ``ray``: workers as actors of a Ray cluster, each served by a relay
  thread here;
- ``forkserver``: the warm fork server; ``fetch``: what the engine may
  fetch natively.
"""

from __future__ import annotations

import functools
import socket
from typing import Any, Callable, Optional

from ferroloader.epoch.plan import Plan
from ferroloader.hosts import ray
from ferroloader.hosts.local import (
    WORKER_METHODS,
    _check_fd_headroom,
    _check_thread_workers,
    _start_processes,
    _start_threads,
    _stop_processes,
    _worker_jobs,
    check_worker_threads,
    thread_count_check,
)
from ferroloader.hosts.ray.options import check_worker_method, is_ray


def start_workers(
    loader: Any, plan: Plan, trim: bool
) -> tuple[list[tuple[int, int]], list[Any]]:
    """Starts an epoch's workers, processes or threads, each with its job
    from the plan: ``(socket fd, pid)`` per worker (pid 0 for a thread),
    and the handles of what was started. A failed start leaves nothing
    behind (e.g. EMFILE): the sockets are closed and the workers started so
    far are ended."""
    threads = loader.worker_method == "thread"
    remote = not isinstance(loader.worker_method, str) or loader.worker_method == "ray"
    if not remote:
        _check_thread_workers(loader, plan.dataset_stateful)
    jobs = _worker_jobs(loader, plan, trim)
    _check_fd_headroom(len(jobs))
    socks: list[socket.socket] = []
    procs: list[Any] = []
    pids: list[int] = []
    try:
        start: Callable[..., None]
        if remote:
            start = ray.start
        else:
            start = _start_threads if threads else _start_processes
        start(loader, jobs, plan.base_seed, socks, procs, pids)
    except BaseException:
        for sock in socks:
            sock.close()
        _stop_processes(procs, grace=1.0)
        raise
    return [(s.detach(), pid) for s, pid in zip(socks, pids)], procs


def check_method(method: Any, num_workers: int, worker_threads: Any, auto: bool) -> None:
    """``worker_method=`` and ``worker_threads=`` as ``DataLoader`` takes
    them: a host this package has, with what that host needs."""
    remote = is_ray(method)
    if not remote and method not in WORKER_METHODS:
        near = [m for m in (*WORKER_METHODS, "ray")
                if isinstance(method, str) and m == method.strip().lower()]
        # (a ValueError, as torch's proposed worker_method raises)
        raise ValueError(
            "worker_method option should be 'multiprocessing', 'thread', 'ray' or a "
            f"ferroloader.RayWorkers, but got worker_method={method!r}"
            + (f" (did you mean {near[0]!r}?)" if near else "")
        )
    if remote:
        check_worker_method(method, num_workers, worker_threads, auto)
    check_worker_threads(worker_threads, "multiprocessing" if remote else method, num_workers)


def worker_count_check(loader: Any) -> Optional[Callable[[], None]]:
    """The check of the worker count against this machine's CPUs, where it
    is not torch's own (worker processes): threads warn as threads, Ray
    workers not at all (they run on the cluster's nodes)."""
    method = getattr(loader, "worker_method", "multiprocessing")
    if method == "thread":
        return functools.partial(thread_count_check, loader)
    if is_ray(method):
        return _no_check
    return None


def _no_check() -> None:
    pass


__all__ = ["check_method", "start_workers", "worker_count_check"]
