"""The iterators of an epoch: the one-process iterator and the
multi-process one (torch's ``_SingleProcessDataLoaderIter`` and
``_MultiProcessingDataLoaderIter``), over the engine's ``_core`` iterators:
the epoch's index source, the pin settings, starting an epoch and
resetting one on persistent workers."""

from __future__ import annotations

import atexit
import itertools
import multiprocessing.connection as mp_connection
import os
import selectors
import sys
import threading
import weakref
from typing import (
    Any,
    Optional,
    TypeVar,
)

import torch.utils.data.dataloader as _tdl

import ferroloader._core as _core
from ferroloader.epoch import plan as _epoch
from ferroloader.epoch import state
from ferroloader.epoch.shards import ShardEpoch
from ferroloader.hosts import start_workers
from ferroloader.hosts.fetch import fetch_plan
from ferroloader.hosts.local import _join, _stop_processes
from ferroloader.run import pinning
from ferroloader.stats import LoaderStats, of_iterator

# A ferroloader DataLoader: not imported, as dataloader.py imports this
# module (the loader is read through torch's attributes and its own).
_Loader = Any

_T_co = TypeVar("_T_co", covariant=True)


def _is_datapipe(dataset: Any) -> bool:
    return isinstance(dataset, (_tdl.IterDataPipe, _tdl.MapDataPipe))


def _single_process_iter(loader: _Loader) -> Any:
    """Builds the iterator in the order ``_SingleProcessDataLoaderIter``
    does its work: index sampler iterator, base-seed draw, fetcher."""
    dataset: Any = loader.dataset
    if _is_datapipe(dataset):
        return _tdl._SingleProcessDataLoaderIter(loader)
    pin = pinning.settings(loader)
    iterable = loader._dataset_kind == _tdl._DatasetKind.Iterable
    rec, resume, now = _epoch.open_epoch(loader)
    if loader._sharded():
        return _single_process_sharded(loader, rec, resume, now, pin)
    source = _epoch.index_source(loader)
    _epoch.draw_base_seed(loader)
    if loader.timeout != 0:
        raise AssertionError("_SingleProcessDataLoaderIter requires timeout == 0")
    if iterable:
        per_batch = (loader.batch_size or 1) if loader._auto_collation else 1
        source = _resume_iterable(rec, dataset, resume, now, per_batch)
    else:
        source = _epoch.resume_source(rec, source, resume, now, window=1)
    seeds = _epoch.sample_seeds(loader, rec.number)
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
        ep = ShardEpoch(loader, rec.number, _epoch.shard_resume(resume), rec)
    finally:
        _epoch.restore_generators(rec, now)
    seeder = _epoch.shard_seeder(loader, rec.number)
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


def _resume_iterable(
    rec: _epoch.Epoch, dataset: Any, resume: Optional[dict[str, Any]], now: Any, per_batch: int
) -> Any:
    """An ``IterableDataset``'s iterator (``num_workers=0``), resumed in
    torchdata's order: the dataset's state, then ``iter(dataset)``, then
    the iterator's state; without either, by skipping the samples already
    used."""
    if resume is None:
        rec.dataset_iter = iter(dataset)
        return rec.dataset_iter
    rec.resumed = (int(resume["drawn"]), [], [])
    restored = False
    try:
        if "dataset_state" in resume:
            _epoch._set(rec.groups, now)
            restored = True
            dataset.load_state_dict(resume["dataset_state"])
        it = rec.dataset_iter = iter(dataset)
        if resume.get("exhausted"):
            # the epoch's last batch was handed over: nothing is left of it
            return iter(())
        if "iterator_state" in resume and _epoch.stateful(it):
            if not restored:
                _epoch._set(rec.groups, now)
                restored = True
            it.load_state_dict(resume["iterator_state"])
        elif "dataset_state" not in resume:
            for _ in itertools.islice(it, resume["drawn"] * per_batch):
                pass
        return it
    finally:
        if not restored:
            _epoch._set(rec.groups, now)


class _SingleProcessIter(_core.SingleProcessIter):
    """``_SingleProcessDataLoaderIter``; tells its epoch record its last
    position when it goes away (for ``state_dict()``), and its loader its
    stats."""

    _epoch_record: _epoch.Epoch
    _stats_box: list[LoaderStats]

    def __del__(self, _finalizing: Any = sys.is_finalizing) -> None:
        if _finalizing():
            # (at interpreter exit the module's globals may already be
            # None, and no state_dict() or stats() can follow)
            return
        rec = getattr(self, "_epoch_record", None)
        if rec is not None:
            state.detach(rec, self)
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
        """An epoch on new workers: the plan is built once, the workers are
        started with it, and the engine takes it in one call."""
        # a timeout torch's wait for a batch cannot take: its next() raises
        # the OverflowError (the engine's timer could not take it either)
        overflow = _wait_overflow(loader.timeout)
        pin = pinning.settings(loader)
        arena, pin_thread = pinning.plan(loader, pin)
        plan = _epoch.build(loader)
        # torch sets prefetch_factor to 2 when num_workers > 0 and none was given.
        assert loader.prefetch_factor is not None
        if loader.prefetch_factor <= 0:
            # torch's check, once its base iterator drew the base seed (as
            # build did), before any worker starts (the engine asserts it)
            raise AssertionError(
                "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
            )
        workers, procs = start_workers(loader, plan, trim=arena is None)
        ep = plan.shards
        iterable = loader._dataset_kind == _tdl._DatasetKind.Iterable
        spec: _core._IterSpec = {
            "iterable": iterable,
            # (the engine batches an iterable's samples; a map-style epoch's
            # batches come from its sampler, of any size)
            "batch_size": loader.batch_size if iterable else None,
            "auto_collation": loader._auto_collation,
            "prefetch_factor": loader.prefetch_factor,
            "in_order": bool(loader.in_order),
            "persistent": bool(loader.persistent_workers),
            "timeout": 0.0 if overflow is not None else float(loader.timeout),
            "timeout_text": str(loader.timeout),
            "pin": None if pin_thread else pin,
            "pin_where": None if pin_thread or pin is None else pinning.inline_where(),
            "index_sampler": loader._index_sampler,
            "len_called": None if ep is not None else loader._IterableDataset_len_called,
            "pin_arena": arena,
            "lanes": None if ep is None else ep.plan,
            "round_robin": plan.round_robin,
            "resumed": plan.rec.resumed,
            "pin_thread": pin if pin_thread else None,
        }
        kind = _PinnedMultiProcessIter if pin_thread else cls
        if overflow is not None:
            kind = _PinnedOverflowIter if pin_thread else _OverflowIter
        try:
            # the engine owns (and on failure closes) the sockets from here
            it = kind(workers, plan.source, loader.dataset, spec)
        except BaseException:
            _stop_processes(procs, grace=1.0)
            raise
        it._procs = procs
        it._owner_pid = os.getpid()
        it._stats_box = loader._stats_box
        it._base_seed_value = plan.base_seed
        if isinstance(it, (_OverflowIter, _PinnedOverflowIter)):
            it._wait_error = overflow
        plan.rec.attach(it, multiprocess=True)
        _LIVE.setdefault(loader, weakref.WeakSet()).add(it)  # (ended by loader.close())
        loader._workers_started(it, fresh=True)
        return it

    @property
    def _workers(self) -> list[Any]:
        """The worker processes (or threads), by torch's name for them."""
        return getattr(self, "_procs", [])

    def _reset(self, loader: _Loader, first_iter: bool = False) -> None:
        """A new epoch on persistent workers (``DataLoader.__iter__``)."""
        plan = _epoch.build(loader, reset_seed=self._base_seed_value)
        plan.rec.attach(self, multiprocess=True)
        ep = plan.shards
        if ep is not None:
            self._reset_epoch(ep.addresses, None, ep.plan)
        else:
            len_called = loader._IterableDataset_len_called
            self._reset_epoch(plan.source, len_called, None, plan.rec.resumed)
        loader._workers_started(self, fresh=False)

    def _shutdown_workers(self) -> None:
        rec = getattr(self, "_epoch_record", None)
        if rec is not None:
            state.detach(rec, self)
        _harvest_stats(self)
        # after a timeout a worker is stuck in user code: no grace for it (the
        # iterator often goes away while its timeout error is raised)
        grace = 0.0 if self._timed_out else 5.0
        # the engine ends its worker processes; here they are reaped, and
        # worker threads joined
        self._close(grace)
        _join(getattr(self, "_procs", ()), grace)

    def __del__(self, _getpid: Any = os.getpid) -> None:
        # (os.getpid bound here: at interpreter exit the module's globals
        # may already be None when a global iterator goes)
        if getattr(self, "_owner_pid", None) != _getpid():
            # a copy inherited by a forked process (a worker of another
            # loader collecting the garbage it inherited): the workers are
            # not its children, and shutting them down is the owner's job
            return
        try:
            self._shutdown_workers()
        except BaseException:
            # e.g. Ctrl-C while joining: nothing can be raised from __del__
            # (Python would print "Exception ignored"); end the workers now.
            self._close(0.0)
            if _join is not None:  # (None at interpreter exit)
                _join(getattr(self, "_procs", ()), 0.0)


class _PinnedMultiProcessIter(_MultiProcessIter):
    """A multi-process iterator whose batches a :class:`pinning.PinThread`
    takes from the engine and pins, ahead of the training loop. Reads of
    the engine's state go through the thread (the position before the
    batches it has queued)."""

    _pinner: pinning.PinThread

    def __init__(self, workers: Any, source: Any, dataset: Any, spec: _core._IterSpec) -> None:
        # (the engine's constructor took the same arguments and started the
        # epoch): the pin thread starts taking its batches
        pin = spec["pin_thread"]
        assert pin is not None
        self._pin = pin
        self._arena = spec["pin_arena"]
        self._index_sampler_ref = spec["index_sampler"]
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


def _wait_overflow(timeout: Any) -> Optional[OverflowError]:
    """The ``OverflowError`` torch's wait for a batch raises for this
    ``timeout`` (its ``multiprocessing.connection.wait`` selector cannot
    take it: above ~24.8 days, or infinite), else ``None``. Found by
    asking that selector, over a pipe that is ready at once. (With a pin
    thread torch waits on a ``queue.Queue`` instead, whose limit is higher
    and which raises only when it must wait: the same answer is given.)"""
    if not timeout > 0:
        return None
    selector = getattr(mp_connection, "_WaitSelector", selectors.PollSelector)
    read, write = os.pipe()
    try:
        with selector() as sel:
            sel.register(write, selectors.EVENT_WRITE)
            sel.select(timeout)
    except OverflowError as e:
        return e
    finally:
        os.close(read)
        os.close(write)
    return None


def _raise_wait_error(self: Any) -> Any:
    # a new one each time, as each of torch's waits raises its own
    raise OverflowError(*self._wait_error.args)


class _OverflowIter(_MultiProcessIter):
    """An epoch whose ``timeout`` torch cannot wait with: its workers run,
    and every ``next()`` raises torch's ``OverflowError``."""

    _wait_error: Optional[OverflowError]
    __next__ = _raise_wait_error


class _PinnedOverflowIter(_PinnedMultiProcessIter):
    """``_OverflowIter`` with a pin thread."""

    _wait_error: Optional[OverflowError]
    __next__ = _raise_wait_error


# each loader's iterators whose workers may be running (kept beside the
# loader, which pickles without them)
_LIVE: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()


def _end_worker_threads() -> None:
    """At interpreter exit, before finalisation: the worker threads of
    every iterator still alive (persistent workers, an epoch left midway)
    are told to stop and joined. Left to finalisation, a worker thread
    woken then (its iterator collected with the module's globals) takes
    the GIL once the interpreter is going and is ended inside the engine's
    frames: a crash (SIGSEGV or abort) instead of exit status 0. Worker
    processes need nothing here: the engine ends them with the process."""
    for its in list(_LIVE.values()):
        for it in list(its):
            if any(isinstance(w, threading.Thread) for w in it._workers):
                it._shutdown_workers()


atexit.register(_end_worker_threads)


def close_iterators(loader: Any) -> None:
    """Ends the workers of every iterator of ``loader`` still running; each
    then raises if iterated again, rather than ending its epoch short."""
    for it in list(_LIVE.pop(loader, ())):
        it._close(None, RuntimeError(
            "this iterator's DataLoader was closed (loader.close(), or the end of its "
            "`with` block): its workers are gone; iter(loader) starts a new epoch"))
        it._shutdown_workers()
