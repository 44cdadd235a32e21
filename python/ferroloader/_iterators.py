"""The iterators of an epoch: the one-process iterator and the
multi-process one (torch's ``_SingleProcessDataLoaderIter`` and
``_MultiProcessingDataLoaderIter``), over the engine's ``_core`` iterators:
the epoch's index source, the pin settings, starting an epoch and
resetting one on persistent workers."""

from __future__ import annotations

import os
import socket
import warnings
from typing import (
    Any,
    Optional,
    TypeVar,
)

import torch
import torch.utils.data.dataloader as _tdl
from torch.utils.data import _utils

from ferroloader import _core, _epoch, forkserver, pinning
from ferroloader._fetch import fetch_plan
from ferroloader._launch import (
    _check_fd_headroom,
    _check_thread_workers,
    _start_processes,
    _start_threads,
    _stop_processes,
    _worker_jobs,
)
from ferroloader.errors import ConfigError
from ferroloader.sampler import (
    native_batch_iter,
    native_iter,
)
from ferroloader.shards import ElasticBatchSampler, ShardEpoch
from ferroloader.stats import LoaderStats, of_iterator

# A ferroloader DataLoader: not imported, as dataloader.py imports this
# module (the loader is read through torch's attributes and its own).
_Loader = Any

_T_co = TypeVar("_T_co", covariant=True)


def _is_datapipe(dataset: Any) -> bool:
    return isinstance(dataset, (_tdl.IterDataPipe, _tdl.MapDataPipe))


def _torch_deprecates_pin_memory_device() -> bool:
    """Whether the installed torch ignores ``pin_memory_device`` in favour of
    the current accelerator (newer torch) or pins on it (torch 2.6-2.8):
    read from torch's own iterator, so ferroloader follows whichever torch
    is installed."""
    import inspect

    try:
        source = inspect.getsource(_tdl._BaseDataLoaderIter.__init__)
    except (OSError, TypeError):  # pragma: no cover - no source shipped
        return tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 9)
    return "pin_memory_device is deprecated" in source


_PIN_DEVICE_DEPRECATED = _torch_deprecates_pin_memory_device()


def _pin_settings(loader: _Loader) -> Optional[tuple[Any, Optional[str]]]:
    """The pin-memory decision and warnings of ``_BaseDataLoaderIter.__init__``
    (of the installed torch)."""
    if loader.pin_memory_device and not _PIN_DEVICE_DEPRECATED:
        # torch 2.6-2.8: an explicit device is pinned on as given
        if not loader.pin_memory:
            warnings.warn(
                "'pin_memory_device' is set but 'pin_memory' argument is not set, "
                "then device pinned memory won't be used."
                "please set 'pin_memory' to true, if you need to use the device pin memory",
                stacklevel=4,
            )
            return None
        return (_utils.pin_memory.pin_memory, loader.pin_memory_device)
    if loader.pin_memory and loader.pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{loader.pin_memory_device}'.",
            stacklevel=4,
        )
    if loader.pin_memory and not torch.accelerator.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=4,
        )
    pin = loader.pin_memory and torch.accelerator.is_available()
    acc = torch.accelerator.current_accelerator() if pin else None
    device = acc.type if acc is not None else None
    if device == "mps":
        mps_message = (
            "'pin_memory' argument is set as true but not supported on MPS now, "
            + ("device" if _PIN_DEVICE_DEPRECATED else "then device")
            + " pinned memory won't be used."
        )
        warnings.warn(mps_message, stacklevel=4)
        return None
    if not pin:
        return None
    return (_utils.pin_memory.pin_memory, device if _PIN_DEVICE_DEPRECATED else None)


def _index_source(loader: _Loader) -> Any:
    """The epoch's index stream: a Rust iterator for samplers the engine
    knows, else ``iter(index_sampler)`` as torch creates it."""
    if loader._dataset_kind == _tdl._DatasetKind.Iterable:
        return None
    index_sampler = loader._index_sampler
    auto = loader._auto_collation
    if isinstance(index_sampler, ElasticBatchSampler) and not loader.in_order:
        raise ConfigError(
            "ElasticBatchSampler hands batches over in order (a snapshot counts a prefix of the "
            "global sequence); in_order=False is not supported with it"
        )
    if getattr(index_sampler, "auto_epoch", False):
        index_sampler.set_epoch(loader._epochs_started - 1)
    if auto and type(index_sampler).__iter__ is ElasticBatchSampler.__iter__:
        return index_sampler.native()
    native = native_batch_iter(index_sampler) if auto else native_iter(index_sampler)
    return native if native is not None else iter(index_sampler)


def _single_process_iter(loader: _Loader) -> Any:
    """Builds the iterator in the order ``_SingleProcessDataLoaderIter``
    does its work: index sampler iterator, base-seed draw, fetcher."""
    dataset: Any = loader.dataset
    if _is_datapipe(dataset):
        return _tdl._SingleProcessDataLoaderIter(loader)
    pin = _pin_settings(loader)
    iterable = loader._dataset_kind == _tdl._DatasetKind.Iterable
    rec, resume, now = _epoch.open_epoch(loader)
    if loader._sharded():
        return _single_process_sharded(loader, rec, resume, now, pin)
    source = _index_source(loader)
    _epoch.draw_base_seed(loader)
    if loader.timeout != 0:
        raise AssertionError("_SingleProcessDataLoaderIter requires timeout == 0")
    if iterable:
        per_batch = (loader.batch_size or 1) if loader._auto_collation else 1
        source = _epoch.resume_iterable(rec, dataset, resume, now, per_batch)
    else:
        source = _epoch.resume_source(rec, source, resume, now, window=1)
    seeds = loader._sample_seeds()
    guard = None if seeds is None else _core.SampleSeeder(seeds[0], seeds[1], dataset)
    if guard is not None:
        dataset = guard
    getitems, tensors, table = fetch_plan(dataset, iterable)
    spec = _single_spec(loader, pin, guard)
    spec["iterable"], spec["getitems"], spec["tensors"] = iterable, getitems, tensors
    spec["len_called"], spec["table"] = loader._IterableDataset_len_called, table
    spec["resumed"] = rec.resumed
    it = _SingleProcessIter(source, dataset, spec)
    rec.attach(it, multiprocess=False)
    if not iterable and resume is None:
        rec.watch_first_draw(it)
    it._stats_box = loader._stats_box
    return it


def _single_spec(loader: _Loader, pin: Any, rng_guard: Any) -> _core._SingleSpec:
    """A one-process epoch's spec from the loader (a map-style epoch's
    fields; the caller sets what its kind of epoch reads)."""
    return {
        "iterable": False,
        "getitems": None,
        "tensors": None,
        "auto_collation": loader._auto_collation,
        "batch_size": loader.batch_size or 0,
        "drop_last": bool(loader.drop_last),
        "collate_fn": loader.collate_fn,
        "pin": pin,
        "index_sampler": loader._index_sampler,
        "len_called": None,
        "rng_guard": rng_guard,
        "sharded": None,
        "plan": None,
        "block": 1,
        "table": None,
        "resumed": None,
    }


def _single_process_sharded(
    loader: _Loader, rec: _epoch.Epoch, resume: Any, now: Any, pin: Any
) -> Any:
    """A sharded epoch in this process: the engine's lanes (or address
    batches) over ``iter_shard``."""
    _epoch.draw_base_seed(loader)
    if loader.timeout != 0:
        raise AssertionError("_SingleProcessDataLoaderIter requires timeout == 0")
    try:
        ep = ShardEpoch(loader, rec.number, _epoch.shard_resume(resume))
    finally:
        _epoch.restore_generators(rec, now)
    seeder = loader._shard_seeder(rec.number)
    spec = _single_spec(loader, pin, seeder)
    spec["iterable"], spec["sharded"] = True, ep.source(seeder)
    spec["plan"], spec["block"] = ep.plan, ep.sharding.shuffle_block
    it = _SingleProcessIter(ep.addresses, loader.dataset, spec)
    rec.shards = ep
    rec.attach(it, multiprocess=False)
    it._stats_box = loader._stats_box
    return it


def _harvest_stats(it: Any) -> None:
    """Adds an ending iterator's stats to its loader's (once)."""
    box = getattr(it, "_stats_box", None)
    if box is None or getattr(it, "_stats_harvested", False):
        return
    it._stats_harvested = True
    box[0] = box[0] + of_iterator(it)


class _SingleProcessIter(_core.SingleProcessIter):
    """``_SingleProcessDataLoaderIter``; tells its epoch record its last
    position when it goes away (for ``state_dict()``), and its loader its
    stats."""

    _epoch_record: _epoch.Epoch
    _stats_box: list[LoaderStats]

    def __del__(self) -> None:
        rec = getattr(self, "_epoch_record", None)
        if rec is not None:
            rec.detach(self)
        _harvest_stats(self)


class _MultiProcessIter(_core.MultiProcessIter):
    """torch's ``_MultiProcessingDataLoaderIter``: workers started through
    ``multiprocessing``; dispatch, transport and reassembly in Rust."""

    _procs: list[Any]
    _owner_pid: int
    _base_seed_value: int
    _stats_box: list[LoaderStats]

    @classmethod
    def start(cls, loader: _Loader) -> _MultiProcessIter:
        dataset = loader.dataset
        pin = _pin_settings(loader)
        arena, pin_thread = pinning.plan(loader, pin)
        iterable = loader._dataset_kind == _tdl._DatasetKind.Iterable
        rec, resume, now = _epoch.open_epoch(loader)
        ep: Optional[ShardEpoch] = None
        if loader._sharded():
            base_seed = _epoch.base_seed(loader, rec, resume)
            try:
                ep = ShardEpoch(loader, rec.number, _epoch.shard_resume(resume))
            finally:
                _epoch.restore_generators(rec, now)
            source: Any = ep.addresses
            resume = None  # the plan carries the position
        else:
            source = _index_source(loader)
            base_seed = _epoch.base_seed(loader, rec, resume)
            elastic = isinstance(loader._index_sampler, ElasticBatchSampler)
            if not rec.reset and not elastic:
                # An elastic sampler (a mixture's too) draws from no
                # generator, and its first iteration took the resume position
                source = loader._index_stream_after_seed(source)
            source = _epoch.resume_source(rec, source, resume, now, loader._window)
        threads = loader.worker_method == "thread"
        n = loader._workers
        _check_thread_workers(loader)
        if not threads:
            forkserver.warm(loader)  # a context set after construction
        jobs = _worker_jobs(loader, base_seed, resume, ep, rec.number, arena is None)
        _check_fd_headroom(n)
        socks: list[socket.socket] = []
        procs: list[Any] = []
        pids: list[int] = []
        try:
            start = _start_threads if threads else _start_processes
            start(loader, jobs, base_seed, socks, procs, pids)
            workers = [(s.detach(), pid) for s, pid in zip(socks, pids)]
            socks = []  # the engine owns (and on failure closes) them now
            # torch sets prefetch_factor to 2 when num_workers > 0 and none was given.
            assert loader.prefetch_factor is not None
            timeout = float(loader.timeout)
            kind = _PinnedMultiProcessIter if pin_thread else cls
            spec: _core._IterSpec = {
                "iterable": iterable,
                "batch_size": loader.batch_size,
                "auto_collation": loader._auto_collation,
                "prefetch_factor": loader.prefetch_factor,
                "in_order": bool(loader.in_order),
                "persistent": bool(loader.persistent_workers),
                "timeout": timeout,
                "timeout_text": str(loader.timeout),
                "pin": None if pin_thread else pin,
                "pin_where": None if pin_thread or pin is None else pinning.inline_where(),
                "index_sampler": loader._index_sampler,
                "len_called": None if ep is not None else loader._IterableDataset_len_called,
                "pin_arena": arena,
                "lanes": None if ep is None else ep.plan,
                "round_robin": None,
                "resumed": rec.resumed,
            }
            if resume is not None and "workers" in resume:
                finished = _epoch.finished_workers(resume, n)
                spec["round_robin"] = (int(resume["next_worker"]), finished)
            it = kind(workers, source, dataset, spec)
            if isinstance(it, _PinnedMultiProcessIter):
                assert pin is not None
                it._pin_setup(pin, arena, loader._index_sampler)
        except BaseException:
            # a failed start (e.g. EMFILE) leaves nothing behind: the sockets
            # are closed and the workers started so far are ended
            for sock in socks:
                sock.close()
            _stop_processes(procs, grace=1.0)
            raise
        it._procs = procs
        it._owner_pid = os.getpid()
        it._stats_box = loader._stats_box
        rec.shards = ep
        rec.attach(it, multiprocess=True)
        it._base_seed_value = base_seed
        loader._workers_started(it, fresh=True)
        return it

    def __iter__(self) -> _MultiProcessIter:
        return self  # without borrowing the engine, which next() may hold

    def _reset(self, loader: _Loader, first_iter: bool = False) -> None:
        """A new epoch on persistent workers (``DataLoader.__iter__``)."""
        rec, resume, now = _epoch.open_epoch(loader)
        # torch draws no base seed for persistent workers: they keep theirs
        rec.reset = True
        rec.base_seed = self._base_seed_value
        if loader._sharded():
            try:
                ep = ShardEpoch(loader, rec.number, _epoch.shard_resume(resume))
            finally:
                _epoch.restore_generators(rec, now)
            rec.shards = ep
            rec.attach(self, multiprocess=True)
            self._reset_epoch(ep.addresses, None, ep.plan)
            loader._workers_started(self, fresh=False)
            return
        source = _epoch.resume_source(rec, _index_source(loader), resume, now, loader._window)
        rec.attach(self, multiprocess=True)
        self._reset_epoch(source, loader._IterableDataset_len_called, None, rec.resumed)
        loader._workers_started(self, fresh=False)

    def _shutdown_workers(self) -> None:
        rec = getattr(self, "_epoch_record", None)
        if rec is not None:
            rec.detach(self)
        _harvest_stats(self)
        # after a timeout a worker is stuck in user code: no grace for it (the
        # iterator often goes away while its timeout error is raised)
        stuck = self._timed_out
        self._close()
        _stop_processes(getattr(self, "_procs", ()), grace=0.0 if stuck else 5.0)

    def __del__(self) -> None:
        if getattr(self, "_owner_pid", None) != os.getpid():
            # a copy inherited by a forked process (a worker of another
            # loader collecting the garbage it inherited): the workers are
            # not its children, and shutting them down is the owner's job
            return
        try:
            self._shutdown_workers()
        except BaseException:
            # e.g. Ctrl-C while joining: nothing can be raised from __del__
            # (Python would print "Exception ignored"); end the workers now.
            _stop_processes(getattr(self, "_procs", ()), grace=0.0)


class _PinnedMultiProcessIter(_MultiProcessIter):
    """A multi-process iterator whose batches a :class:`pinning.PinThread`
    takes from the engine and pins, ahead of the training loop. Reads of
    the engine's state go through the thread (the position before the
    batches it has queued)."""

    _pinner: pinning.PinThread

    def _pin_setup(self, pin: Any, arena: Optional[_core.PinArena], index_sampler: Any) -> None:
        self._pin = pin
        self._arena = arena
        self._index_sampler_ref = index_sampler
        self._pinner = pinning.PinThread(self, *pin)

    def __next__(self) -> Any:
        if self._arena is not None:
            # the reuse guard's tick: the loop's current stream, and a fence
            # for the batches it freed since its last next()
            self._arena.tick()
        return self._pinner.next()

    def __len__(self) -> int:
        return len(self._index_sampler_ref)

    _position = property(lambda self: self._pinner.read(self, "_position"))
    _iterable_position = property(lambda self: self._pinner.read(self, "_iterable_position"))
    _lane_snapshot = property(lambda self: self._pinner.read(self, "_lane_snapshot"))
    _closed = property(lambda self: self._pinner.read(self, "_closed"))

    @property
    def _stats(self) -> Any:
        return self._pinner.stats(self)

    def _reset(self, loader: _Loader, first_iter: bool = False) -> None:
        # the stopped thread keeps the old epoch's position (what it had
        # queued is dropped) while the new epoch is set up
        self._pinner.stop()
        super()._reset(loader, first_iter)
        self._pinner = pinning.PinThread(self, *self._pin)

    def _shutdown_workers(self) -> None:
        pinner = getattr(self, "_pinner", None)
        if pinner is not None:
            pinner.stop()
        super()._shutdown_workers()


# File descriptors the main process holds per worker (its socket, mailbox,
# pidfd, multiprocessing's sentinel and pipes), and a margin for the start.
