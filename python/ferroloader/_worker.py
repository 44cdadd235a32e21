"""Worker process entry point: torch's worker set-up, then the Rust loop.

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
from typing import Any, Callable, Optional

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import signal_handling
from torch.utils.data._utils import worker as _torch_worker

from ferroloader import _core
from ferroloader._fetch import fetch_plan
from ferroloader.seeds import SeededDataset
from ferroloader.state import stateful


def _wrapper(worker_id: int) -> Callable[[BaseException], bytes]:
    where = f"in DataLoader worker process {worker_id}"

    def wrap(exc: BaseException) -> bytes:
        wrapped = ExceptionWrapper(exc_info=(type(exc), exc, exc.__traceback__), where=where)
        return pickle.dumps(wrapped)

    return wrap


class Unpickled:
    """The user's objects a worker needs (dataset, ``collate_fn``,
    ``worker_init_fn``), pickled by the main process for a worker that does
    not fork, and unpickled inside the worker's set-up: an
    error there (a file gone, a module the worker cannot import) reaches the
    loop as the worker's exception, with its traceback, instead of a worker
    that dies before it runs."""

    def __init__(self, dataset: Any, collate_fn: Any, init_fn: Any) -> None:
        from multiprocessing.reduction import ForkingPickler

        self.blob = bytes(ForkingPickler.dumps((dataset, collate_fn, init_fn)))

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
) -> tuple[Callable[[], Any], Optional[Callable[[], Optional[bytes]]]]:
    """``make_iter`` (a new replica iterator per epoch) and ``state_fn``
    (the replica's pickled state, sent with each batch and with an
    iterable's end; ``None`` when nothing in it keeps a state).

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

    def iterable_state() -> Optional[bytes]:
        it, it_stateful = current
        own = ds_stateful and it is not dataset
        if not (own or it_stateful):
            return None
        return pickle.dumps(
            {
                "dataset": dataset.state_dict() if own else None,
                "iterator": it.state_dict() if it_stateful else None,
            }
        )

    def map_state() -> bytes:
        return pickle.dumps({"dataset": dataset.state_dict(), "iterator": None})

    if iterable:
        return make_iter, iterable_state
    return make_iter, (map_state if ds_stateful else None)


def worker_entry(
    sock: socket.socket,
    dataset_holder: list[Any],
    iterable: bool,
    auto_collation: bool,
    collate_fn: Optional[Callable[[Any], Any]],
    drop_last: bool,
    base_seed: int,
    init_fn: Optional[Callable[[int], None]],
    worker_id: int,
    num_workers: int,
    main_pid: int,
    shm_initial: int,
    shm_limit: int,
    prefetch_factor: int,
    close_fds: list[int],
    sample_seeds: Optional[tuple[int, int]] = None,
    resume: Optional[dict[str, Any]] = None,
    shards: Optional[tuple[list[Any], Any]] = None,
    batch_size: Optional[int] = None,
    trim: bool = True,
) -> None:
    dataset = dataset_holder.pop()
    # Forked workers inherit the main process's ends of earlier workers'
    # sockets; holding them would keep those sockets open after the main
    # process closes its side.
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fd = sock.detach()
    try:
        signal_handling._set_worker_signal_handlers()
        torch.multiprocessing._set_thread_name("pt_data_worker")
        torch.set_num_threads(1)
        wrap = _wrapper(worker_id)
        init_exception = None
        if isinstance(dataset, Unpickled):
            try:
                dataset, collate_fn, init_fn = dataset.load()
            except Exception as e:
                init_exception = wrap(e)
                dataset, init_fn = _Unavailable(e), None
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
        try:
            if init_fn is not None:
                init_fn(worker_id)
        except Exception as e:
            init_exception = wrap(e)
        on_epoch = None
        if sample_seeds is not None:
            # per_sample_seed=True: (seed, first epoch); the worker counts
            # the epochs it serves after that
            dataset = SeededDataset(dataset, *sample_seeds)
            on_epoch = dataset.start_epoch
        sharded = None
        if shards is not None:
            # a sharded dataset: the engine's lanes read it through iter_shard
            descriptors, seeder = shards
            sharded = (dataset.iter_shard, descriptors, seeder)
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
            make_iter, state_fn = _state_hooks(dataset, iterable, resume)
        except Exception as e:
            # a state that the dataset's load_state_dict() refuses: the
            # first task re-raises it, as a failed worker_init_fn
            make_iter, state_fn = _state_hooks(dataset, iterable, None)
            if init_exception is None:
                init_exception = wrap(e)
        _core.worker_loop(
            fd,
            dataset=dataset,
            iterable=iterable,
            auto_collation=auto_collation,
            drop_last=drop_last,
            collate_fn=collate_fn,
            getitems=getitems,
            tensors=tensors,
            main_pid=main_pid,
            shm_initial=shm_initial,
            shm_limit=shm_limit,
            prefetch_factor=prefetch_factor,
            make_iter=make_iter,
            wrap_exception=wrap,
            init_exception=init_exception,
            on_epoch=on_epoch,
            state_fn=None if sharded is not None else state_fn,
            sharded=sharded,
            batch_size=batch_size,
            table=table,
            trim=trim,
        )
    except KeyboardInterrupt:
        pass
    finally:
        _torch_worker._worker_info = None
