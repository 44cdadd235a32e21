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

import errno
import functools
import socket
from typing import Any, Callable, Optional

import torch.utils.data.dataloader as _tdl

from ferroloader import _machine
from ferroloader._env import _INITIAL_ARENA, shm_limit
from ferroloader.epoch.plan import Plan
from ferroloader.hosts import ray
from ferroloader.hosts.local import (
    WORKER_METHODS,
    _stop_processes,
    check_worker_threads,
    start_processes,
    start_threads,
    thread_count_check,
)
from ferroloader.hosts.ray.options import check_worker_method, is_ray


def start_workers(
    loader: Any, plan: Plan, trim: bool
) -> tuple[list[tuple[int, int]], list[Any]]:
    """Starts an epoch's workers, processes or threads, each with its job
    from the plan: ``(socket fd, pid)`` per worker (pid 0 for a thread),
    and the handles of what was started. The host is looked up by the
    loader's ``worker_method`` and does its own checks first (the
    thread-safety lint, the warm fork server). A failed start leaves
    nothing behind (e.g. EMFILE): the sockets are closed and the workers
    started so far are ended."""
    method = loader.worker_method
    start: Host = _HOSTS["ray" if is_ray(method) else method]
    jobs = _worker_jobs(loader, plan, trim)
    _check_fd_headroom(len(jobs))
    socks: list[socket.socket] = []
    procs: list[Any] = []
    pids: list[int] = []
    try:
        start(loader, plan, jobs, socks, procs, pids)
    except BaseException:
        for sock in socks:
            sock.close()
        _stop_processes(procs, grace=1.0)
        raise
    return [(s.detach(), pid) for s, pid in zip(socks, pids)], procs


# what a host is: it starts ``jobs`` for the plan's epoch, appending each
# worker's socket and pid (in worker order) and what it started as it goes
Host = Callable[[Any, Plan, list[dict[str, Any]], list[socket.socket], list[Any], list[int]],
                None]
_HOSTS: dict[str, Host] = {
    "multiprocessing": start_processes,
    "thread": start_threads,
    "ray": ray.start,
}


def _check_fd_headroom(num_workers: int) -> None:
    """Refuses to start workers that would run out of file descriptors part
    way (multiprocessing itself leaks a pipe when EMFILE strikes inside
    ``Process.start``): a clear ``OSError`` before anything is started."""
    free = _machine.free_fds()
    if free is None:
        return  # no /proc or no limits: let the start report what it hits
    limit, left = free
    need = _machine.FDS_PER_WORKER * num_workers + _machine.FDS_MARGIN
    if left < need:
        raise OSError(
            errno.EMFILE,
            f"Too many open files: starting {num_workers} DataLoader workers needs about "
            f"{need} file descriptors, and {left} of the process's limit of {limit} "
            "are free. Raise the limit (ulimit -n) or use fewer workers.",
        )


def _worker_jobs(loader: Any, plan: Plan, trim: bool) -> list[dict[str, Any]]:
    """Each worker's settings, a process's or a thread's (``_worker._serve``
    reads them): ``trim`` is off where the arenas are registered with the
    GPU (a registered arena keeps its pages, see PinArena)."""
    n = loader._workers
    per_worker = max(shm_limit() // n, 1 << 20)
    ep = plan.shards
    shards = None if ep is None else (list(ep.descriptors), plan.shard_seeder)
    return [
        {
            "worker_id": i,
            "iterable": loader._dataset_kind == _tdl._DatasetKind.Iterable,
            "auto_collation": loader._auto_collation,
            "collate_fn": loader.collate_fn,
            "drop_last": bool(loader.drop_last),
            "init_fn": loader.worker_init_fn,
            "shm_initial": min(_INITIAL_ARENA, per_worker),
            "shm_limit": per_worker,
            "prefetch_factor": loader.prefetch_factor,
            "sample_seeds": plan.sample_seeds,
            "resume": plan.worker_resume[i],
            "shards": shards,
            "batch_size": loader.batch_size,
            "trim": trim,
        }
        for i in range(n)
    ]


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
