"""Worker entry points (a process's, a thread's): torch's worker set-up,
then the Rust loop.

Mirrors ``torch.utils.data._utils.worker._worker_loop`` up to the point
where it starts serving tasks: signal handlers, one intra-op thread, the
seeds of ``random``, ``torch`` and ``numpy`` derived from the loader's base
seed exactly as torch derives them, ``get_worker_info()``, then
``worker_init_fn``. Serving tasks is ``ferroloader._core.worker_loop``.
"""

from __future__ import annotations

import itertools
import os
import pickle
import random
import socket
import threading
from typing import Any, Callable, Optional, Union

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import signal_handling
from torch.utils.data._utils import worker as _torch_worker

import ferroloader._core as _core
from ferroloader.epoch.plan import stateful
from ferroloader.hosts.fetch import fetch_plan
from ferroloader.worker import thread_aware, worker_local


def _wrapper(where: str) -> Callable[[BaseException], bytes]:
    """Pickles a worker's exception with where it happened (torch's text:
    ``in DataLoader worker process 0``)."""

    def wrap(exc: BaseException) -> bytes:
        wrapped = ExceptionWrapper(exc_info=(type(exc), exc, exc.__traceback__), where=where)
        return pickle.dumps(wrapped)

    return wrap


class Unpickled:
    """The user's objects a worker needs (dataset, ``collate_fn``,
    ``worker_init_fn``) for a worker that does not fork: pickled when its
    process starts (``Process.start()`` pickles its arguments, which is
    where multiprocessing lets a lock or a shared value travel, as with
    torch), and unpickled inside the worker's set-up: an error there (a
    file gone, a module the worker cannot import) reaches the loop as the
    worker's exception, with its traceback, instead of a worker that dies
    before it runs."""

    def __init__(self, dataset: Any, collate_fn: Any, init_fn: Any) -> None:
        self.objects: Optional[tuple[Any, Any, Any]] = (dataset, collate_fn, init_fn)
        self.blob = b""

    def __getstate__(self) -> bytes:
        from multiprocessing.reduction import ForkingPickler

        return bytes(ForkingPickler.dumps(self.objects))

    def __setstate__(self, blob: bytes) -> None:
        self.objects, self.blob = None, blob

    def load(self) -> tuple[Any, Any, Any]:
        loaded: tuple[Any, Any, Any] = pickle.loads(self.blob)
        return loaded


class _Unavailable:
    """Stands for a dataset the worker could not unpickle (its error is
    the worker's set-up error, raised first)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __len__(self) -> int:
        return 0

    def _fail(self) -> RuntimeError:
        return RuntimeError(f"the dataset could not be loaded in this worker: {self.error!r}")

    def __getitem__(self, index: Any) -> Any:
        raise self._fail()

    def __iter__(self) -> Any:
        raise self._fail()

    def iter_shard(self, shard: Any, start: int = 0) -> Any:
        raise self._fail()


def _state_hooks(
    dataset: Any,
    iterable: bool,
    resume: Optional[dict[str, Any]],
) -> tuple[Callable[[], Any], Optional[_core._ReplicaState]]:
    """``make_iter`` (a new replica iterator per epoch) and what the engine
    reads to send the replica's state with each batch and with an
    iterable's end (``None`` when nothing in it can keep a state).

    The state is ``{"dataset": ..., "iterator": ...}``, torchdata's order:
    a resumed worker loads the dataset's state before ``iter(dataset)`` and
    the iterator's after it (an iterator that is the dataset itself is
    saved once, as the iterator). Without either, a resumed iterable skips
    the samples it had handed over."""
    ds_stateful = stateful(dataset)
    current: list[Any] = [None, False]  # this epoch's iterator, and whether it keeps state
    iter_state: list[Any] = [None]
    skip = [0]
    if resume is not None:
        st = resume.get("state")
        if st is not None:
            if st.get("dataset") is not None and ds_stateful:
                dataset.load_state_dict(st["dataset"])
            iter_state[0] = st.get("iterator")
            if resume.get("between") and iterable:
                # the state an epoch ended in, on persistent workers: the
                # ended iterator is restored (as torchdata does; its state
                # may hold e.g. the worker's RNG), the next epoch makes its own
                it, iter_state[0] = iter(dataset), None
                if st.get("iterator") is not None and stateful(it):
                    it.load_state_dict(st["iterator"])
        else:
            skip[0] = int(resume.get("skip_samples", 0))

    def make_iter() -> Any:
        it = iter(dataset)
        current[0], current[1] = it, stateful(it)
        st, iter_state[0] = iter_state[0], None
        if st is not None and current[1]:
            it.load_state_dict(st)
        n, skip[0] = skip[0], 0
        return itertools.islice(it, n, None) if n else it

    if not iterable and not ds_stateful:
        return make_iter, None
    return make_iter, {"current": current, "dataset_stateful": ds_stateful}


def worker_entry(
    socks: list[socket.socket],
    dataset_holder: list[Any],
    jobs: list[dict[str, Any]],
    base_seed: int,
    num_workers: int,
    main_pid: int,
    close_fds: list[int],
) -> None:
    """A worker process: torch's process set-up (signal handlers, one
    intra-op thread, the global generators seeded), then :func:`_serve`.
    ``jobs``: the settings (``DataLoader``'s ``_worker_jobs``) of the
    workers it runs, one per socket: one, or ``worker_threads`` threads
    (:func:`_serve_threads`)."""
    dataset = dataset_holder.pop()
    # Forked workers inherit the main process's ends of earlier workers'
    # sockets; holding them would keep those sockets open after the main
    # process closes its side.
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds = [sock.detach() for sock in socks]
    worker_id = jobs[0]["worker_id"]
    try:
        signal_handling._set_worker_signal_handlers()
        torch.multiprocessing._set_thread_name("pt_data_worker")
        torch.set_num_threads(1)
        wrap = _wrapper(f"in DataLoader worker process {worker_id}")
        init_exception = None
        if isinstance(dataset, Unpickled):
            try:
                dataset, collate_fn, init_fn = dataset.load()
            except Exception as e:
                init_exception = wrap(e)
                dataset, collate_fn, init_fn = _Unavailable(e), None, None
            for job in jobs:
                job["collate_fn"], job["init_fn"] = collate_fn, init_fn
        # the globals as torch seeds its worker's (with threads: as the
        # process's first worker's; each thread also has generators of its own)
        _seed_globals(dataset, worker_id, num_workers, base_seed)
        if len(jobs) == 1:
            _serve(fds[0], dataset, jobs[0], wrap, init_exception, main_pid, None)
        else:
            _serve_threads(fds, dataset, jobs, base_seed, num_workers, init_exception, main_pid)
    except KeyboardInterrupt:
        pass
    finally:
        _torch_worker._worker_info = None


def _serve_threads(
    fds: list[int],
    dataset: Any,
    jobs: list[dict[str, Any]],
    base_seed: int,
    num_workers: int,
    init_exception: Optional[bytes],
    main_pid: int,
) -> None:
    """``worker_threads=k``: the process's workers run as its threads (the
    first on its main thread), each with its own socket, arena and
    ``get_worker_info()`` (a thread worker's: ``rng`` seeded per worker),
    sharing the process's one dataset replica. Returns when all are done."""
    thread_aware()
    iterators = IteratorRegistry()
    process = jobs[0]["worker_id"]

    def run(fd: int, job: dict[str, Any]) -> None:
        where = f"in DataLoader worker {job['worker_id']} (a thread of worker process {process})"
        _serve_in_thread(
            fd, dataset, job, base_seed, num_workers, where, init_exception, main_pid, iterators
        )

    threads = [
        threading.Thread(target=run, args=(fd, job), name=f"pt_data_worker_{job['worker_id']}")
        for fd, job in zip(fds[1:], jobs[1:])
    ]
    for t in threads:
        t.daemon = True
        t.start()
    try:
        run(fds[0], jobs[0])
    finally:
        # the main process stops every worker; the process ends after the last
        for t in threads:
            t.join()


def thread_entry(
    sock: socket.socket,
    dataset: Any,
    job: dict[str, Any],
    base_seed: int,
    num_workers: int,
    iterators: IteratorRegistry,
) -> None:
    """A worker thread (``worker_method="thread"``) in the main process: the
    same loop as a process's, over the dataset object itself. Nothing
    process-wide is touched (signal handlers, torch's thread count, the
    global generators): the thread's ``get_worker_info()`` is its own and
    carries generators seeded as a process worker seeds the global ones
    (``rng``, which ``torch.thread_safe_generator()`` returns). Like a
    worker process, the thread runs torch with one intra-op thread
    (:func:`_one_intra_op_thread`)."""
    torch.multiprocessing._set_thread_name("pt_data_worker")
    _one_intra_op_thread()
    where = f"in DataLoader worker thread {job['worker_id']}"
    _serve_in_thread(sock, dataset, job, base_seed, num_workers, where, None, 0, iterators)


_intra_op_lock = threading.Lock()


def _one_intra_op_thread() -> None:
    """This thread runs torch's operators on one intra-op thread, as torch's
    worker processes do (and torchdata's thread workers): each worker
    thread's transforms otherwise start a team of the process's size, and
    the teams of two workers spin on two cores against each other (vision
    pipelines: 23,000 preemptions in 5 s against 500). ``set_num_threads``
    sets the calling thread's count and a process-wide default (that
    threads started later take, and the thread pool's size); a short
    thread puts the default back, so the main thread's count and later
    threads' are as they were."""
    with _intra_op_lock:
        before = torch.get_num_threads()  # (the default: this thread is new)
        if before == 1:
            return
        torch.set_num_threads(1)
        restore = threading.Thread(target=torch.set_num_threads, args=(before,),
                                   name="ferroloader-intra-op")
        restore.start()
        restore.join()


def _serve_in_thread(
    fd: Union[int, socket.socket],
    dataset: Any,
    job: dict[str, Any],
    base_seed: int,
    num_workers: int,
    where: str,
    init_exception: Optional[bytes],
    main_pid: int,
    iterators: IteratorRegistry,
) -> None:
    """:func:`_serve` with this thread's own ``get_worker_info()`` record
    (a worker thread's, of the main process or of a worker process)."""
    worker_local.set(thread_worker_info(dataset, job["worker_id"], num_workers, base_seed))
    try:
        _serve(fd, dataset, job, _wrapper(where), init_exception, main_pid, iterators)
    finally:
        worker_local.set(None)


def _serve(
    fd: Union[int, socket.socket],
    dataset: Any,
    job: dict[str, Any],
    wrap: Callable[[BaseException], bytes],
    init_exception: Optional[bytes],
    main_pid: int,
    iterators: Optional[IteratorRegistry],
) -> None:
    """``worker_init_fn``, the dataset's wrappers and fetch plan, then the
    Rust loop until the main process stops it; a process's and a thread's.
    A thread's socket is handed to the loop last: should anything before
    fail, the socket object closes and the main thread sees the worker end."""
    spec = worker_spec(dataset, job, wrap, init_exception, main_pid, iterators)
    _core.worker_loop(fd if isinstance(fd, int) else fd.detach(), spec)


def worker_spec(
    dataset: Any,
    job: dict[str, Any],
    wrap: Callable[[BaseException], bytes],
    init_exception: Optional[bytes],
    main_pid: int,
    iterators: Optional[IteratorRegistry],
) -> _core._WorkerSpec:
    """What a worker's host serves with: ``worker_init_fn`` run, the
    dataset's wrappers and fetch plan; a process's, a thread's and a
    remote actor's (``ferroloader.ray``)."""
    worker_id, iterable = job["worker_id"], job["iterable"]
    try:
        if job["init_fn"] is not None:
            job["init_fn"](worker_id)
    except Exception as e:
        init_exception = wrap(e)
    on_epoch = None
    if job["sample_seeds"] is not None:
        # per_sample_seed=True: (seed, first epoch); the worker counts
        # the epochs it serves after that
        seed, epoch = job["sample_seeds"]
        dataset = _core.SampleSeeder(seed, epoch, dataset)
        on_epoch = dataset.start_epoch
    sharded = None
    if job["shards"] is not None:
        # a sharded dataset: the engine's lanes read it through iter_shard
        descriptors, seeder = job["shards"]
        sharded = (dataset.iter_shard, descriptors, seeder, dataset._short_of_room())
        if seeder is not None:
            on_epoch = seeder.start_epoch
    try:
        # (a TableDataset opens its file here)
        getitems, tensors, table = fetch_plan(dataset, iterable)
    except Exception as e:
        getitems, tensors, table = None, None, None
        if init_exception is None:
            init_exception = wrap(e)
    try:
        make_iter, replica = _state_hooks(dataset, iterable, job["resume"])
    except Exception as e:
        # a state that the dataset's load_state_dict() refuses: the
        # first task re-raises it, as a failed worker_init_fn
        make_iter, replica = _state_hooks(dataset, iterable, None)
        if init_exception is None:
            init_exception = wrap(e)
    if iterators is not None:
        make_iter = iterators.checked(make_iter, worker_id)
    spec: _core._WorkerSpec = {
        "dataset": dataset,
        "iterable": iterable,
        "auto_collation": job["auto_collation"],
        "drop_last": job["drop_last"],
        "collate_fn": job["collate_fn"],
        "getitems": getitems,
        "tensors": tensors,
        "main_pid": main_pid,
        "shm_initial": job["shm_initial"],
        "shm_limit": job["shm_limit"],
        "prefetch_factor": job["prefetch_factor"],
        "make_iter": make_iter,
        "wrap_exception": wrap,
        "init_exception": init_exception,
        "on_epoch": on_epoch,
        "replica": None if sharded is not None else replica,
        "sharded": sharded,
        "batch_size": job["batch_size"],
        "table": table,
        "trim": job["trim"],
    }
    return spec


def actor_host(dataset: Any, job: dict[str, Any], base_seed: int, num_workers: int) -> Any:
    """A remote actor's worker (``ferroloader.ray``): torch's worker set-up
    (the global generators seeded, ``get_worker_info()``), then the same
    host a worker process serves with, called message by message."""
    worker_id = job["worker_id"]
    wrap = _wrapper(f"in DataLoader worker {worker_id} (a Ray actor)")
    _seed_globals(dataset, worker_id, num_workers, base_seed)
    return _core.ActorHost(worker_spec(dataset, job, wrap, None, 0, None))


def _seed_globals(dataset: Any, worker_id: int, num_workers: int, base_seed: int) -> None:
    """torch's worker set-up: the global generators seeded as torch seeds
    a worker's, and ``get_worker_info()``."""
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(_torch_worker._generate_state(base_seed, worker_id))
    except ImportError:
        pass
    _torch_worker._worker_info = _torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset
    )


class IteratorRegistry:
    """The iterators an iterable dataset handed to a loader's worker
    threads: one object given to two threads (``__iter__`` returning
    ``self``, or a generator stored on the dataset) would be advanced by
    both, each sample going to whichever asked first. That is refused with
    a clear error instead of silently wrong batches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: dict[int, tuple[int, Any]] = {}

    def checked(self, make_iter: Callable[[], Any], worker_id: int) -> Callable[[], Any]:
        def make() -> Any:
            it = make_iter()
            with self._lock:
                # drop this worker's iterator of an earlier epoch
                self._owner = {k: v for k, v in self._owner.items() if v[0] != worker_id}
                other = self._owner.get(id(it))
                if other is not None and other[1] is it:
                    raise RuntimeError(
                        f"iter(dataset) gave worker thread {worker_id} the iterator worker "
                        f"thread {other[0]} is reading ({type(it).__name__}); worker threads "
                        "share the dataset object, so __iter__ must return a new iterator on "
                        "every call (a generator function does), or use worker processes "
                        "(worker_method='multiprocessing', worker_threads=1)"
                    )
                self._owner[id(it)] = (worker_id, it)
            return it

        return make


def thread_worker_info(dataset: Any, worker_id: int, num_workers: int, base_seed: int) -> Any:
    """A worker thread's ``WorkerInfo``: torch's fields, ``worker_method=
    "thread"``, and ``rng``: a ``torch.Generator``, a ``random.Random`` and a
    ``numpy.random.RandomState`` seeded exactly as a worker process seeds the
    global ones (so a dataset drawing from them gets in a thread the draws a
    process gives it from the globals)."""
    seed = base_seed + worker_id
    gen = torch.Generator()
    gen.manual_seed(seed)
    numpy_rng: Any = None
    try:
        import numpy as np

        numpy_rng = np.random.RandomState(_torch_worker._generate_state(base_seed, worker_id))
    except ImportError:  # pragma: no cover - numpy comes with torch's wheels
        pass
    rng_type = getattr(_torch_worker, "_RNG", None)
    if rng_type is not None:
        rng: Any = rng_type(random.Random(seed), gen, numpy_rng)
    else:  # torch before thread_safe_generator: the same fields, our holder
        rng = _RNG(random.Random(seed), gen, numpy_rng)
    return _torch_worker.WorkerInfo(
        id=worker_id,
        num_workers=num_workers,
        seed=seed,
        dataset=dataset,
        rng=rng,
        worker_method="thread",
    )


class _RNG:
    """torch's ``_RNG`` for a torch that lacks it."""

    def __init__(self, random_generator: Any, torch_generator: Any, numpy_generator: Any) -> None:
        self.random_generator = random_generator
        self.torch_generator = torch_generator
        self.numpy_generator = numpy_generator
