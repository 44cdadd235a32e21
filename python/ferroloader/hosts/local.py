"""Local hosts, starting and stopping workers: worker processes
through ``multiprocessing`` (with torch's pickling hint), worker threads
(with the thread-safety lint), and the
SIGTERM/SIGKILL teardown."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
import threading
import time
import types
import warnings
import weakref
from typing import (
    Any,
    Iterator,
    Optional,
    TypeVar,
)

import torch

import ferroloader._core as _core
from ferroloader.epoch.plan import Plan
from ferroloader.errors import ConfigError, ThreadSafetyWarning
from ferroloader.hosts import entry as _worker
from ferroloader.hosts import forkserver
from ferroloader.worker import thread_aware

# A ferroloader DataLoader: not imported, as dataloader.py imports this
# module (the loader is read through torch's attributes and its own).
_Loader = Any

_T_co = TypeVar("_T_co", covariant=True)


def start_processes(
    loader: _Loader,
    plan: Plan,
    jobs: list[dict[str, Any]],
    socks: list[socket.socket],
    procs: list[Any],
    pids: list[int],
) -> None:
    """Worker processes through ``multiprocessing`` (the loader's context),
    each given its sockets: one, or ``worker_threads`` (worker ``i`` is a
    thread of process ``i % num_workers``, so consecutive tasks go to
    different processes). ``socks`` and ``pids`` are in worker order; they
    and ``procs`` grow as processes start, so a failed start can end those
    that did. Threads inside processes are linted first, and a fork server
    whose context was set after the loader's construction is warmed."""
    _check_thread_workers(loader, plan.dataset_stateful)
    forkserver.warm(loader)
    base_seed = plan.base_seed
    ctx = loader.multiprocessing_context or torch.multiprocessing
    fork = ctx.get_start_method() == "fork"
    p = loader.num_workers
    parents: list[Optional[socket.socket]] = [None] * len(jobs)
    owner = [0] * len(jobs)
    try:
        for first in range(p):
            group = jobs[first::p]
            # spawn and forkserver pickle the user's objects for each worker:
            # done here, they are unpickled inside the worker's set-up, where an
            # error is the worker's (not a worker that died). One pickle per
            # process: a tensor's shared storage is handed over once per pickle.
            dataset: Any = loader.dataset
            if not fork:
                # pickled by w.start() below (with torch's hint on failure)
                dataset = _worker.Unpickled(dataset, group[0]["collate_fn"], group[0]["init_fn"])
                group = [{**job, "collate_fn": None, "init_fn": None} for job in group]
            pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in group]
            mine = [pair[0] for pair in pairs]
            opened = [s for s in parents if s is not None]
            close_fds = [s.fileno() for s in (*opened, *mine)] if fork else []
            w = ctx.Process(
                target=_worker.worker_entry,
                args=(
                    [pair[1] for pair in pairs],
                    [dataset],
                    group,
                    base_seed,
                    len(jobs),
                    os.getpid(),
                    close_fds,
                ),
            )
            w.daemon = True
            for j, sock in enumerate(mine):
                parents[first + j * p] = sock
            try:
                with _pickle_hint():
                    w.start()
            finally:
                for pair in pairs:
                    pair[1].close()
            procs.append(w)
            _processes[w.pid] = w
            for j in range(len(group)):
                owner[first + j * p] = w.pid
    finally:
        # in worker order, those made so far (closed by the caller on failure)
        socks.extend(s for s in parents if s is not None)
    pids.extend(owner)


@contextlib.contextmanager
def _pickle_hint() -> Iterator[None]:
    """torch's warning when a worker's arguments do not pickle (spawn and
    forkserver pickle them: the dataset, collate_fn, worker_init_fn),
    given before the error is re-raised, as torch gives it; and where the
    fork server itself went away while starting a worker, why it usually
    does."""
    try:
        yield
    except (TypeError, AttributeError, pickle.PicklingError):
        warnings.warn(
            "Got pickle error when attempting to start a worker Process. "
            "This might be because the worker Process arguments are not picklable. "
            "Python 3.14+ changed the multiprocessing start method in non-Mac POSIX platforms "
            "to 'forkserver', which requires the worker Process arguments to be picklable. "
            "You can also try multiprocessing.set_start_method('fork').",
            stacklevel=5,
        )
        raise
    except (ConnectionError, EOFError):
        # torch says nothing here; the fork server's own error (printed on
        # stderr) names the bootstrapping phase but not the usual cause
        warnings.warn(
            "The fork server went away while starting a DataLoader worker. Under "
            "'forkserver' (Python 3.14's default start method on Linux) and 'spawn', "
            "workers import your main script: if it builds and iterates the loader at its "
            "top level, put that code under `if __name__ == '__main__':` (the fork server's "
            "own error, above, says so too), or pass multiprocessing_context='fork'.",
            stacklevel=5,
        )
        raise


def _check_thread_workers(loader: _Loader, dataset_stateful: bool) -> None:
    """What worker threads sharing a dataset object cannot do, refused
    before any worker starts."""
    if loader.worker_threads > 1:
        who = f"worker_threads={loader.worker_threads}: the threads of a worker process"
        fix = "worker_threads=1"
    elif loader.worker_method == "thread" and loader.num_workers > 1:
        who = "worker_method='thread': the worker threads"
        fix = "worker_method='multiprocessing' (or one worker)"
    else:
        return
    if dataset_stateful:
        raise ConfigError(
            f"{who} share one dataset object, and this dataset keeps a state "
            "(state_dict/load_state_dict) that torchdata's protocol keeps per worker "
            f"replica; use {fix}"
        )
    for name, problem in _thread_unsafe_attributes(loader.dataset):
        warnings.warn(
            f"{who} share one dataset object, and its attribute {name!r} is {problem}",
            ThreadSafetyWarning,
            stacklevel=_user_stacklevel(),  # the user's iter()
        )


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside ferroloader and torch
    (the user's ``iter()``, however many of the loader's frames lie between:
    ``num_workers="auto"`` adds some), for a warning given by the caller."""
    ours = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # the package
            os.path.dirname(torch.__file__))
    level = 1
    frame: Optional[types.FrameType] = sys._getframe(1)  # (1: the function that warns)
    while frame is not None and frame.f_code.co_filename.startswith(ours):
        level, frame = level + 1, frame.f_back
    return level


def _thread_unsafe_attributes(dataset: Any) -> list[tuple[str, str]]:
    """The dataset's own attributes that threads cannot share safely, with
    why and what to do instead (a lint: objects deeper down, or locked by
    the dataset itself, are not seen or are not a problem)."""
    if not any(_thread_unsafe(v) is not None for v in _held_values(dataset)):
        return []
    # (only now its names: reading __dict__ is what _held_values avoids)
    found = []
    for name, value in sorted(getattr(dataset, "__dict__", {}).items()):
        problem = _thread_unsafe(value)
        if problem is not None:
            found.append((name, problem))
    return found


def _held_values(obj: Any) -> list[Any]:
    """The values ``obj`` holds, found without reading its ``__dict__``: on
    CPython 3.11 and 3.12 reading it moves the attributes out of the
    object's inline storage, and each attribute read in its
    ``__getitem__`` then takes up to twice as long, for the object's life."""
    import gc

    values = []
    for ref in gc.get_referents(obj):
        values.append(ref)
        # (an instance dict already made: its values; one of many keys is
        # no attribute dict, and scanning it would cost an iter() dearly)
        if type(ref) is dict and len(ref) <= 256:
            values.extend(ref.values())
    return values


def _thread_unsafe(value: Any) -> Optional[str]:
    """Why threads cannot share ``value``, with what to do instead, or
    ``None``."""
    import io
    import random
    import sqlite3

    import numpy as np

    if isinstance(value, io.IOBase) and not value.closed:
        return ("an open file: a seek() and read() by one thread interleave "
                "with another's; open a file per worker (keyed by "
                "get_worker_info().id) or read at an offset with os.pread")
    if isinstance(value, (random.Random, np.random.RandomState, np.random.Generator,
                          torch.Generator)):
        return (f"a random generator ({type(value).__name__}): its draws then "
                "depend on which thread runs first; draw from "
                "get_worker_info().rng (or torch.thread_safe_generator())")
    if isinstance(value, sqlite3.Connection):
        return "a sqlite3 connection, which refuses use from other threads; connect once per worker"
    return None


def start_threads(
    loader: _Loader,
    plan: Plan,
    jobs: list[dict[str, Any]],
    socks: list[socket.socket],
    threads: list[Any],
    pids: list[int],
) -> None:
    """``worker_method="thread"``: the workers are threads of this process
    running the worker loop over the dataset object itself, each with its
    own arena and socket (pid 0: no process to watch), after the
    thread-safety lint."""
    _check_thread_workers(loader, plan.dataset_stateful)
    base_seed = plan.base_seed
    thread_aware()
    iterators = _worker.IteratorRegistry()
    for job in jobs:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        socks.append(parent)
        t = threading.Thread(
            target=_worker.thread_entry,
            name=f"pt_data_worker_{job['worker_id']}",
            args=(child, loader.dataset, job, base_seed, len(jobs), iterators),
            daemon=True,
        )
        t.start()
        threads.append(t)
        pids.append(0)


# Worker processes by pid, for how one ended (exit_code).
_processes: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def exit_code(pid: int) -> Optional[int]:
    """How worker ``pid`` ended, as ``multiprocessing`` says (a negative
    code is the signal), waiting up to a second; ``None`` when unknown.
    The engine asks when it could not read it itself: a worker a fork
    server started (``forkserver``, Python 3.14's default) is the server's
    child, and the server reaps it and reports to its ``Process``."""
    w = _processes.get(pid)
    if w is None:
        return None
    w.join(timeout=1.0)
    code = w.exitcode
    return None if code is None else int(code)


def _stop_processes(procs: Any, grace: float = 5.0) -> None:
    """Ends workers the engine does not hold (a start that failed part
    way) as the engine ends its own (``_core.end_processes``: ``grace`` to
    exit, then SIGTERM, then SIGKILL), then reaps them."""
    pids = [w.pid for w in procs if not isinstance(w, threading.Thread) and w.pid]
    _core.end_processes(pids, grace)
    _join(procs, grace)


def _join(workers: Any, grace: float, _monotonic: Any = time.monotonic,
          _current: Any = threading.current_thread, _thread: Any = threading.Thread) -> None:
    """Reaps worker processes once the engine has ended them (at once), and
    joins worker threads within ``grace``: one still in the user's code
    then (nothing can stop it from outside) leaves when that code returns
    and it finds its socket closed. (What it calls is bound at definition:
    at interpreter exit an iterator still alive comes here after this
    module's globals are gone.)"""
    deadline = _monotonic() + grace
    me = _current()
    for w in workers:
        if w is me:  # the iterator's last reference may die in a worker thread
            continue
        if isinstance(w, _thread):
            w.join(timeout=max(0.0, deadline - _monotonic()))
        else:
            w.join(timeout=1.0)
            popen = getattr(w, "_popen", None)
            if w.exitcode is not None and popen is not None:
                # its pipes go now (a fork server's process holds two), not
                # when the Process object is collected; exitcode and
                # is_alive() still answer from the code already read
                popen.close()


WORKER_METHODS = ("multiprocessing", "thread")


def check_worker_threads(k: Any, method: str, num_workers: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(
            f"worker_threads option should be a positive integer, but got worker_threads={k!r}"
        )
    if k > 1 and method == "thread":
        raise ConfigError(
            "worker_threads= sets the threads inside each worker process; with "
            "worker_method='thread' the workers are already threads (num_workers of them)"
        )
    if k > 1 and num_workers == 0:
        raise ConfigError(
            "worker_threads= sets the threads inside each worker process, and num_workers=0 "
            "starts none: set num_workers >= 1"
        )
    if method == "thread" and num_workers == 0:
        raise ConfigError(
            "worker_method='thread' runs num_workers worker threads, and num_workers=0 starts "
            "none (it loads in the main thread): set num_workers >= 1, or leave worker_method "
            "at its default"
        )


def thread_count_check(loader: Any) -> None:
    """torch's warning when more workers than CPUs would start, for worker
    threads: the same advice, naming them threads, once per loader (torch
    warns of processes at construction and each iter())."""
    if not loader.num_workers or loader._warned_thread_count:
        return
    suggest = torch._utils.cpu_count()  # what torch's check counts
    if suggest is not None and loader.num_workers <= suggest:
        return
    loader._warned_thread_count = True
    if suggest is None:
        advice = ("DataLoader is not able to compute a suggested max number of worker in "
                  "current system.")
    else:
        cpuset = "" if hasattr(os, "sched_getaffinity") else " (`cpuset` is not taken into account)"
        advice = (f"Our suggested max number of worker in current system is {suggest}{cpuset}, "
                  "which is smaller than what this DataLoader is going to create.")
    warnings.warn(
        f"This DataLoader will create {loader.num_workers} worker threads in total. {advice} "
        "Please be aware that excessive worker creation might get DataLoader running slow "
        "or even freeze, lower the worker number to avoid potential slowness/freeze if "
        "necessary.",
        stacklevel=2,
    )
