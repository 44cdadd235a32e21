"""``DataLoader``: torch's class and argument checks, a Rust iterator.

``DataLoader`` subclasses ``torch.utils.data.DataLoader``: construction,
argument validation (same exception types and messages), attributes,
``len()`` and persistent-worker bookkeeping are torch's own code, and
``isinstance(loader, torch.utils.data.DataLoader)`` holds. Iteration is
replaced: indices, fetch, default collation and reassembly run in Rust.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import pickle
import socket
import threading
import time
import warnings
from typing import Any, Callable, ClassVar, Iterable, Iterator, Optional, TypeVar, Union

import torch
import torch.utils.data.dataloader as _tdl
from torch.utils.data import _utils

from ferroloader import _core, _worker, forkserver, pinning, state
from ferroloader._fetch import fetch_plan
from ferroloader.errors import ConfigError, ThreadSafetyWarning
from ferroloader.mixture import Mixture, MixtureBatchSampler
from ferroloader.patch import record_dataset, register_loader
from ferroloader.sampler import (
    RandomSampler,
    SequentialSampler,
    native_batch_iter,
    native_iter,
)
from ferroloader.seeds import SeededDataset, ShardSeeder
from ferroloader.shards import ElasticBatchSampler, ShardedDataset, ShardEpoch, Sharding
from ferroloader.stats import LoaderStats, of_iterator
from ferroloader.worker import thread_aware

_T_co = TypeVar("_T_co", covariant=True)

WORKER_METHODS = ("multiprocessing", "thread")


# What ferroloader adds to torch's docstring (help() shows both).
_ADDED_DOC = """
    ferroloader's ``DataLoader`` takes every argument above with torch's
    meaning, checks and messages, and gives the same batches. It adds:

    Args:
        seed (int, optional): the loader's own seed. The order of epoch
            ``e`` and the workers' base seed come from a private generator
            seeded with ``ferroloader.seeds.epoch_seed(seed, e)``; the
            global generator is never drawn from. An explicit
            ``generator`` (or a sampler with its own) keeps priority.
            (default: ``None``: torch's behaviour)
        per_sample_seed (bool, optional): with ``seed``, seed torch's CPU
            generator, ``random`` and ``numpy`` with
            ``ferroloader.seeds.sample_seed(seed, e, i)`` right before
            ``dataset[i]``, so sample ``i``'s random augmentation is the
            same for any ``num_workers``, order or resume. A dataset with
            ``__getitems__`` is refused. (default: ``False``)
        sharding (Sharding, optional): how a ``ShardedDataset``'s shards
            are assigned to ranks and workers: ``Sharding(mode="static" |
            "dynamic" | "elastic", ...)``. Only for a ``ShardedDataset``;
            ``shuffle=True`` then permutes its shards and blocks of items.
            (default: ``Sharding()`` for a ``ShardedDataset``, else ``None``)
        worker_method (str, optional): ``"multiprocessing"`` (workers are
            processes, as in torch) or ``"thread"`` (workers are threads of
            this process, over the dataset object itself; the dataset must
            be thread-safe). Needs ``num_workers > 0``.
            (default: ``"multiprocessing"``)
        worker_threads (int, optional): threads inside each worker process,
            each a worker of its own: ``num_workers * worker_threads``
            workers in all, and the batches are those of that many worker
            processes. Needs ``num_workers > 0`` and
            ``worker_method="multiprocessing"``. (default: ``1``)
        snapshot_every_n_steps (int, optional): torchdata's
            ``StatefulDataLoader`` argument, accepted and kept as an
            attribute; ferroloader's state is exact after every batch, so it
            changes nothing. (default: ``1``)

    Methods beyond torch's:
        state_dict(): the loader's position as plain data, between any two
            batches (torchdata's ``StatefulDataLoader`` API).
        load_state_dict(state): the next ``iter()`` resumes from ``state``,
            also with another ``num_workers`` for map-style data.
        stats(): a ``LoaderStats`` of where the batches spent their time.

    The guide in the repository's ``docs/guide/`` has a page per feature.

    Example::

        >>> import torch, ferroloader
        >>> loader = ferroloader.DataLoader(torch.arange(10), batch_size=4, shuffle=True,
        ...                                 seed=0, num_workers=2)
        >>> sorted(int(v) for batch in loader for v in batch)
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        >>> it = iter(loader)
        >>> first = next(it)
        >>> state = loader.state_dict()
        >>> resumed = ferroloader.DataLoader(torch.arange(10), batch_size=4, shuffle=True,
        ...                                  seed=0, num_workers=0)
        >>> resumed.load_state_dict(state)
        >>> [b.tolist() for b in resumed] == [b.tolist() for b in it]
        True
"""


class DataLoader(_tdl.DataLoader[_T_co]):
    __doc__ = (_tdl.DataLoader.__doc__ or "").rstrip() + "\n" + _ADDED_DOC

    # torch reports a worker's failed setup (``worker_init_fn``) at the first
    # ``next()``; torchdata's ``StatefulDataLoader`` at ``iter()``.
    _setup_at_iter: ClassVar[bool] = False
    # torchdata's multi-process iterator iterates the sampler once before
    # and once after drawing the base seed; torch's draws from it once.
    _index_stream_twice: ClassVar[bool] = False

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Union[Any, Iterable[Any], None] = None,
        batch_sampler: Union[Any, Iterable[list[Any]], None] = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[list[Any]], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: Optional[int] = None,
        per_sample_seed: bool = False,
        sharding: Optional[Sharding] = None,
        snapshot_every_n_steps: Optional[int] = 1,
        worker_method: str = "multiprocessing",
        worker_threads: int = 1,
    ) -> None:
        if worker_method not in WORKER_METHODS:
            raise ValueError(
                "worker_method option should be 'multiprocessing' or 'thread', but got "
                f"worker_method={worker_method!r}"
            )
        _check_worker_threads(worker_threads, worker_method, num_workers)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed should be an int or None, but got seed={seed!r}")
        if per_sample_seed and seed is None:
            raise ConfigError("per_sample_seed=True needs seed= (the seeds derive from it)")
        if per_sample_seed and callable(getattr(dataset, "__getitems__", None)):
            raise ConfigError(
                "per_sample_seed=True seeds each __getitem__ call, but this dataset fetches "
                "whole batches with __getitems__"
            )
        sharded = isinstance(dataset, ShardedDataset)
        if sharding is not None and not isinstance(sharding, Sharding):
            raise ConfigError(
                f"sharding should be a ferroloader.Sharding or None, but got sharding={sharding!r}"
            )
        if sharding is not None and not sharded:
            raise ConfigError(
                "sharding= shards a ferroloader.ShardedDataset; for map-style data pass "
                "batch_sampler=ferroloader.ElasticBatchSampler(...) (elastic) or a "
                "DistributedSampler"
            )
        if isinstance(dataset, Mixture) and sampler is None and batch_sampler is None:
            # a mixture's order is its draws: batched (and split across
            # ranks) by its own sampler, whose epoch follows the loader's
            if batch_size is None:
                raise ConfigError(
                    "a Mixture is batched by its draws: give batch_size (batch_size=None "
                    "is not supported with a Mixture)"
                )
            batch_sampler = MixtureBatchSampler(dataset, batch_size, drop_last=bool(drop_last))
            batch_sampler.auto_epoch = True
            batch_size, drop_last, shuffle = 1, False, None
        # seed=: a private generator, reseeded per epoch, decides the order
        # and the workers' base seed; generator= keeps priority
        own = torch.Generator() if seed is not None and generator is None else None
        if (
            sampler is None
            and batch_sampler is None
            and not sharded
            and not isinstance(dataset, _tdl.IterableDataset)
        ):
            # the sampler torch would build, as ours (passed as torch's
            # sampler=, so torch's checks and its BatchSampler are unchanged)
            sampler = self._default_sampler(dataset, bool(shuffle), generator, own)
            shuffle = None
        # read by torch's __init__ (check_worker_number_rationality)
        self.worker_method = worker_method
        self._warned_thread_count = False
        super().__init__(
            dataset,
            batch_size,
            # torch refuses shuffle for an IterableDataset; a sharded one
            # is shuffled by the loader (shard order and blocks)
            None if sharded else shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator if own is None else own,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        record_dataset(dataset)
        # torchdata's StatefulDataLoader argument: how often its workers send
        # their state. ferroloader's state is exact after every batch, so it
        # changes nothing here (docs/guide/state.md); kept as an attribute.
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self._epochs_started = 0
        self._epoch: Optional[state.Epoch] = None
        self._resume: Optional[dict[str, Any]] = None
        self._resume_sampler_state: Any = None
        # a loaded state not yet consumed by iter() (state_dict() returns it),
        # its parts that outlive an epoch, and the worker count it was saved with
        self._pending_state: Optional[dict[str, Any]] = None
        self._resume_extra: dict[str, Any] = {}
        self._resume_workers = 0
        # the next epoch begins on the saved persistent workers' seed and states
        self._next_base_seed: Optional[int] = None
        self._next_worker_states: Optional[list[Any]] = None
        self.seed = seed
        self.per_sample_seed = bool(per_sample_seed)
        # torch's proposed name (pytorch/pytorch#161044): where the workers
        # run, processes or threads of this process
        self.worker_method = worker_method
        # threads inside each worker process (SPDL's layout): every thread
        # is a worker of its own (its id, its arena, its share of the tasks)
        self.worker_threads = int(worker_threads)
        self._seeded_generator = own
        self.sharding: Optional[Sharding] = (
            sharding if sharding is not None else (Sharding() if sharded else None)
        )
        self._shard_shuffle = bool(shuffle) if sharded else False
        self._shards_read: Optional[tuple[list[Any], Optional[list[int]]]] = None
        # the stats of the iterators that have ended (a box shared with them)
        self._stats_box: list[LoaderStats] = [LoaderStats()]
        # forkserver: workers fork from a server that has imported torch
        # (started now, so that its imports overlap the user's set-up)
        forkserver.warm(self)

    @classmethod
    def _default_sampler(
        cls,
        dataset: Any,
        shuffle: bool,
        generator: Optional[torch.Generator],
        seeded: Optional[torch.Generator],
    ) -> Any:
        """The sampler of a map-style dataset given none: torch's choice, as
        ferroloader's subclass (same draws), so ``isinstance`` holds against
        both libraries' names. ``seeded``: ``seed=``'s private generator."""
        if shuffle:
            return RandomSampler(dataset, generator=generator if seeded is None else seeded)
        return SequentialSampler(dataset)

    def stats(self) -> LoaderStats:
        """Where this loader's batches spent their time, over every epoch so
        far (see ``ferroloader.stats``); ``print(loader.stats())`` shows a
        short table."""
        total = self._stats_box[0]
        rec = self._epoch
        live = rec.iterator() if rec is not None and rec.iterator is not None else None
        if live is not None and not getattr(live, "_stats_harvested", False):
            total = total + of_iterator(live)
        return total

    def __getstate__(self) -> dict[str, Any]:
        # The running epoch's record (weak links to its iterator, recorded
        # batches) belongs to this process: a copy starts its next epoch
        # fresh, as a copy of torch's loader does. (torch's own iterators
        # refuse pickling, and so do ferroloader's.)
        state = dict(self.__dict__)
        state["_epoch"] = None
        return state

    def _shard_info(self) -> tuple[list[Any], Optional[list[int]]]:
        """The sharded dataset's shards and their lengths (``None`` unless
        every length is known), read once per loader."""
        if self._shards_read is None:
            dataset: Any = self.dataset
            shards = list(dataset.shards())
            lens = [dataset.shard_len(s) for s in shards]
            known = None if any(n is None for n in lens) else [int(n) for n in lens]
            self._shards_read = (shards, known)
        return self._shards_read

    def _sharded(self) -> bool:
        return self.sharding is not None

    @property
    def _workers(self) -> int:
        """How many workers serve the loader: ``num_workers`` processes (or
        threads), times ``worker_threads`` threads in each process. Each is
        one worker to the engine, the state and ``get_worker_info()``."""
        return self.num_workers * self.worker_threads

    @property
    def _window(self) -> int:
        """The batches in flight at most: ``prefetch_factor`` per worker
        (torch's default 2 when workers are given none)."""
        return (self.prefetch_factor or 2) * self._workers

    def __len__(self) -> int:
        if not self._sharded():
            return super().__len__()
        epoch = self._epochs_started
        if self._epoch is not None and not self._epoch.position()["ended"]:
            epoch = self._epoch.number
        batches = ShardEpoch(self, epoch, None).batches()
        if batches is None:
            raise TypeError(
                f"object of type '{type(self.dataset).__name__}' has no len(): the loader knows "
                "a sharded dataset's length from shard_len()"
            )
        return int(batches)

    def _sample_seeds(self) -> Optional[tuple[int, int]]:
        """``(seed, epoch)`` for per-sample seeding of a map-style dataset
        in the current epoch, else ``None``."""
        if not self.per_sample_seed or self._dataset_kind == _tdl._DatasetKind.Iterable:
            return None
        assert self.seed is not None
        return (self.seed, self._epochs_started - 1)

    def _shard_seeder(self, epoch: int) -> Optional[ShardSeeder]:
        """Per-item seeding of a sharded dataset in ``epoch``, else ``None``."""
        if not self.per_sample_seed or not self._sharded():
            return None
        assert self.seed is not None
        return ShardSeeder(self.seed, epoch)

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as plain, picklable data: taken between
        batches (mid-epoch too, with workers running, without pausing them).
        A loader built the same way continues from it after
        ``load_state_dict``; see ``ferroloader.state``."""
        return state.snapshot(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s result: the next ``iter()``
        continues the saved epoch with the batches that would have come
        next. Raises ``ValueError`` naming what does not match."""
        state.load(self, state_dict)

    def __iter__(self) -> Any:
        it: Any = self._iterator
        if it is not None and getattr(it, "_closed", False):
            # Persistent workers that failed (a worker died, a corrupt
            # message): the next epoch, or a retry, starts fresh workers.
            self._iterator = None
            it._shutdown_workers()
        return super().__iter__()

    @property
    def check_worker_number_rationality(self) -> Callable[[], None]:
        """torch's check of the worker count against the CPUs (called by its
        ``__init__`` and at each ``iter()``): torch's own method for worker
        processes (its text, and the locations its warnings name: a property
        hands it out, so no frame of ours comes between), ours for threads."""
        if getattr(self, "worker_method", "multiprocessing") == "thread":
            return self._check_thread_count
        return _tdl.DataLoader.check_worker_number_rationality.__get__(self)

    def _check_thread_count(self) -> None:
        """torch's warning when more workers than CPUs would start, for
        worker threads: the same advice, naming them threads, once per
        loader (torch warns of processes at construction and each iter())."""
        if not self.num_workers or self._warned_thread_count:
            return
        suggest = torch._utils.cpu_count()  # what torch's check counts
        if suggest is not None and self.num_workers <= suggest:
            return
        self._warned_thread_count = True
        if suggest is None:
            advice = (
                "DataLoader is not able to compute a suggested max number of worker in "
                "current system."
            )
        else:
            cpuset = (
                "" if hasattr(os, "sched_getaffinity") else " (`cpuset` is not taken into account)"
            )
            advice = (
                f"Our suggested max number of worker in current system is {suggest}{cpuset}, "
                "which is smaller than what this DataLoader is going to create."
            )
        warnings.warn(
            f"This DataLoader will create {self.num_workers} worker threads in total. {advice} "
            "Please be aware that excessive worker creation might get DataLoader running slow "
            "or even freeze, lower the worker number to avoid potential slowness/freeze if "
            "necessary.",
            stacklevel=2,
        )

    def _get_iterator(self) -> Any:
        check_environment()
        if self.num_workers == 0:
            return _single_process_iter(self)
        self.check_worker_number_rationality()
        if _is_datapipe(self.dataset):
            # DataPipes (deprecated in torch) need torch's sharding and seeding.
            return _tdl._MultiProcessingDataLoaderIter(self)
        return _MultiProcessIter.start(self)


register_loader("torch", DataLoader)


def _check_worker_threads(k: Any, method: str, num_workers: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(
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


def _pin_settings(loader: DataLoader[Any]) -> Optional[tuple[Any, Optional[str]]]:
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


def _index_source(loader: DataLoader[Any]) -> Any:
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


def _single_process_iter(loader: DataLoader[Any]) -> Any:
    """Builds the iterator in the order ``_SingleProcessDataLoaderIter``
    does its work: index sampler iterator, base-seed draw, fetcher."""
    dataset = loader.dataset
    if _is_datapipe(dataset):
        return _tdl._SingleProcessDataLoaderIter(loader)
    pin = _pin_settings(loader)
    iterable = loader._dataset_kind == _tdl._DatasetKind.Iterable
    rec, resume, now = state.open_epoch(loader)
    if loader._sharded():
        return _single_process_sharded(loader, rec, resume, now, pin)
    source = _index_source(loader)
    state.draw_base_seed(loader)
    if loader.timeout != 0:
        raise AssertionError("_SingleProcessDataLoaderIter requires timeout == 0")
    if iterable:
        per_batch = (loader.batch_size or 1) if loader._auto_collation else 1
        source = state.resume_iterable(rec, dataset, resume, now, per_batch)
    else:
        source = state.resume_source(rec, source, resume, now, window=1)
    seeds = loader._sample_seeds()
    guard = None
    if seeds is not None:
        dataset = guard = SeededDataset(dataset, *seeds)
    getitems, tensors, table = fetch_plan(dataset, iterable)
    it = _SingleProcessIter(
        source,
        dataset,
        iterable=iterable,
        getitems=getitems,
        tensors=tensors,
        auto_collation=loader._auto_collation,
        batch_size=loader.batch_size or 0,
        drop_last=bool(loader.drop_last),
        collate_fn=loader.collate_fn,
        pin=pin,
        index_sampler=loader._index_sampler,
        len_called=loader._IterableDataset_len_called,
        rng_guard=guard,
        table=table,
    )
    rec.attach(it, multiprocess=False)
    if not iterable and resume is None:
        rec.watch_first_draw(it)
    it._stats_box = loader._stats_box
    return it


def _single_process_sharded(
    loader: DataLoader[Any], rec: state.Epoch, resume: Any, now: Any, pin: Any
) -> Any:
    """A sharded epoch in this process: the engine's lanes (or address
    batches) over ``iter_shard``."""
    state.draw_base_seed(loader)
    if loader.timeout != 0:
        raise AssertionError("_SingleProcessDataLoaderIter requires timeout == 0")
    try:
        ep = ShardEpoch(loader, rec.number, state.shard_resume(resume))
    finally:
        state.restore_generators(rec, now)
    seeder = loader._shard_seeder(rec.number)
    it = _SingleProcessIter(
        ep.addresses,
        loader.dataset,
        iterable=True,
        getitems=None,
        tensors=None,
        auto_collation=loader._auto_collation,
        batch_size=loader.batch_size or 0,
        drop_last=bool(loader.drop_last),
        collate_fn=loader.collate_fn,
        pin=pin,
        index_sampler=loader._index_sampler,
        len_called=None,
        rng_guard=seeder,
        sharded=ep.source(seeder),
        plan=ep.plan,
        block=ep.sharding.shuffle_block,
    )
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

    _epoch_record: state.Epoch
    _stats_box: list[LoaderStats]

    def __del__(self) -> None:
        rec = getattr(self, "_epoch_record", None)
        if rec is not None:
            rec.detach(self)
        _harvest_stats(self)


_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_INITIAL_ARENA = 64 << 20


# a larger budget cannot be a size of memory (and would overflow the engine's)
_MAX_SHM = 1 << 60


def shm_limit() -> int:
    """The loader's shared-memory budget in bytes, shared by its workers:
    ``FERROLOADER_SHM_LIMIT`` (a byte count, optionally with a K, M, G or T
    suffix), else half of physical memory."""
    raw = os.environ.get("FERROLOADER_SHM_LIMIT", "").strip().upper().removesuffix("B")
    if raw:
        unit = raw[-1] if raw[-1] in _SIZE_SUFFIXES else ""
        number = raw[: len(raw) - len(unit)].strip()
        try:
            value = float(number) * _SIZE_SUFFIXES[unit]
        except ValueError:
            value = math.nan
        if not 1 <= value <= _MAX_SHM:  # also NaN and inf
            raise ConfigError(
                f"FERROLOADER_SHM_LIMIT={os.environ['FERROLOADER_SHM_LIMIT']!r} is not a size "
                "from 1 byte to 1024T (e.g. 512M or 8G)"
            ) from None
        return int(value)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


# FERROLOADER_DISABLE's names: the engine's (src/facilities.rs) and the
# pinning's (ferroloader.pinning.DISABLE)
_DISABLE = ("memfd", "pidfd", pinning.DISABLE)


def check_environment() -> None:
    """Refuses settings the engine would otherwise ignore: each read when
    an epoch starts, so a bad value is named before any worker starts."""
    shm_limit()
    # (an empty value is unset, as for FERROLOADER_SHM_LIMIT)
    spin = os.environ.get("FERROLOADER_SPIN_US", "").strip() or None
    if spin is not None and not (
        spin.strip().isascii() and spin.strip().isdigit() and int(spin) <= 10_000_000
    ):
        raise ConfigError(
            f"FERROLOADER_SPIN_US={spin!r} is not a whole number of microseconds up to "
            "10000000 (e.g. 100)"
        )
    disable = os.environ.get("FERROLOADER_DISABLE", "")
    unknown = [
        n.strip() for n in disable.split(",") if n.strip() and n.strip().lower() not in _DISABLE
    ]
    if unknown:
        raise ConfigError(
            f"FERROLOADER_DISABLE={disable!r} names {', '.join(map(repr, unknown))}, which is "
            f"not a facility ferroloader can turn off; it takes a comma-separated list of "
            f"{', '.join(_DISABLE)}"
        )
    share = os.environ.get("FERROLOADER_WARN_WAITING", "").strip() or None
    if share is not None:
        try:
            ok = 0.0 < float(share) < 1.0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(
                f"FERROLOADER_WARN_WAITING={share!r} is not a share between 0 and 1 (e.g. 0.3)"
            )


class _MultiProcessIter(_core.MultiProcessIter):
    """torch's ``_MultiProcessingDataLoaderIter``: workers started through
    ``multiprocessing``; dispatch, transport and reassembly in Rust."""

    _procs: list[Any]
    _owner_pid: int
    _base_seed_value: int
    _stats_box: list[LoaderStats]

    @classmethod
    def start(cls, loader: DataLoader[Any]) -> _MultiProcessIter:
        dataset = loader.dataset
        pin = _pin_settings(loader)
        arena, pin_thread = pinning.plan(loader, pin)
        iterable = loader._dataset_kind == _tdl._DatasetKind.Iterable
        rec, resume, now = state.open_epoch(loader)
        ep: Optional[ShardEpoch] = None
        if loader._sharded():
            base_seed = state.base_seed(loader, rec, resume)
            try:
                ep = ShardEpoch(loader, rec.number, state.shard_resume(resume))
            finally:
                state.restore_generators(rec, now)
            source: Any = ep.addresses
            resume = None  # the plan carries the position
        else:
            source = _index_source(loader)
            base_seed = state.base_seed(loader, rec, resume)
            elastic = isinstance(loader._index_sampler, ElasticBatchSampler)
            if loader._index_stream_twice and not rec.reset and not elastic:
                # torchdata's iterator: iter(sampler) again in _reset, after
                # the base seed (its sampler draws when iterated). An
                # elastic sampler (a mixture's too) draws from no generator,
                # and its first iteration took the resume position
                source = _index_source(loader)
            source = state.resume_source(rec, source, resume, now, loader._window)
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
            it = kind(
                workers,
                source,
                dataset,
                iterable=iterable,
                batch_size=loader.batch_size,
                auto_collation=loader._auto_collation,
                prefetch_factor=loader.prefetch_factor,
                in_order=bool(loader.in_order),
                persistent=bool(loader.persistent_workers),
                timeout=timeout,
                timeout_text=str(loader.timeout),
                pin=None if pin_thread or pin is None else pinning.inline(pin),
                index_sampler=loader._index_sampler,
                len_called=None if ep is not None else loader._IterableDataset_len_called,
                pin_arena=arena,
            )
            if isinstance(it, _PinnedMultiProcessIter):
                assert pin is not None
                it._pin_setup(pin, arena, loader._index_sampler)
            if ep is not None and ep.plan is not None:
                it._start_lanes(ep.plan)
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
        if resume is not None and "workers" in resume:
            it._restore_round_robin(int(resume["next_worker"]), state.finished_workers(resume, n))
        it._prime()
        if loader._setup_at_iter:
            try:
                it._await_setup()
            except BaseException:
                it._shutdown_workers()
                raise
        return it

    def __iter__(self) -> _MultiProcessIter:
        return self  # without borrowing the engine, which next() may hold

    def _reset(self, loader: DataLoader[Any], first_iter: bool = False) -> None:
        """A new epoch on persistent workers (``DataLoader.__iter__``)."""
        rec, resume, now = state.open_epoch(loader)
        # torch draws no base seed for persistent workers: they keep theirs
        rec.reset = True
        rec.base_seed = self._base_seed_value
        if loader._sharded():
            try:
                ep = ShardEpoch(loader, rec.number, state.shard_resume(resume))
            finally:
                state.restore_generators(rec, now)
            rec.shards = ep
            rec.attach(self, multiprocess=True)
            self._reset_epoch(ep.addresses, None, ep.plan)
            if loader._setup_at_iter:
                self._await_setup()
            return
        source = state.resume_source(rec, _index_source(loader), resume, now, loader._window)
        rec.attach(self, multiprocess=True)
        self._reset_epoch(source, loader._IterableDataset_len_called)
        if loader._setup_at_iter:
            self._await_setup()

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

    def _reset(self, loader: DataLoader[Any], first_iter: bool = False) -> None:
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
_FDS_PER_WORKER = 6
_FDS_MARGIN = 8


def _check_fd_headroom(num_workers: int) -> None:
    """Refuses to start workers that would run out of file descriptors part
    way (multiprocessing itself leaks a pipe when EMFILE strikes inside
    ``Process.start``): a clear ``OSError`` before anything is started."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            return
        used = sum(1 for fd in os.listdir("/proc/self/fd") if int(fd) < limit)
    except (ImportError, OSError, ValueError):
        return  # no /proc or no limits: let the start report what it hits
    need = _FDS_PER_WORKER * num_workers + _FDS_MARGIN
    if limit - used < need:
        raise OSError(
            errno.EMFILE,
            f"Too many open files: starting {num_workers} DataLoader workers needs about "
            f"{need} file descriptors, and {limit - used} of the process's limit of {limit} "
            "are free. Raise the limit (ulimit -n) or use fewer workers.",
        )


def _worker_jobs(
    loader: DataLoader[Any],
    base_seed: int,
    resume: Optional[dict[str, Any]],
    ep: Optional[ShardEpoch],
    epoch: int,
    trim: bool,
) -> list[dict[str, Any]]:
    """Each worker's settings, a process's or a thread's (``_worker._serve``
    reads them): ``trim`` is off where the arenas are registered with the
    GPU (a registered arena keeps its pages, see PinArena)."""
    n = loader._workers
    per_worker = max(shm_limit() // n, 1 << 20)
    per_batch = (loader.batch_size or 1) if loader._auto_collation else 1
    shards = None if ep is None else (list(ep.descriptors), loader._shard_seeder(epoch))
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
            "sample_seeds": loader._sample_seeds(),
            "resume": state.worker_resume(loader, resume, i, per_batch),
            "shards": shards,
            "batch_size": loader.batch_size,
            "trim": trim,
        }
        for i in range(n)
    ]


def _start_processes(
    loader: DataLoader[Any],
    jobs: list[dict[str, Any]],
    base_seed: int,
    socks: list[socket.socket],
    procs: list[Any],
    pids: list[int],
) -> None:
    """Worker processes through ``multiprocessing`` (the loader's context),
    each given its sockets: one, or ``worker_threads`` (worker ``i`` is a
    thread of process ``i % num_workers``, so consecutive tasks go to
    different processes). ``socks`` and ``pids`` are in worker order; they
    and ``procs`` grow as processes start, so a failed start can end those
    that did."""
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
                with _pickle_hint():
                    dataset = _worker.Unpickled(
                        dataset, group[0]["collate_fn"], group[0]["init_fn"]
                    )
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
    given before the error is re-raised, as torch gives it."""
    try:
        yield
    except (TypeError, AttributeError, pickle.PicklingError):
        warnings.warn(
            "Got pickle error when attempting to start a worker Process. "
            "This might be because the worker Process arguments are not picklable. "
            "Python 3.14+ changed the multiprocessing start method in non-Mac POSIX platforms "
            "to 'forkserver', which requires the worker Process arguments to be picklable. "
            "You can also try multiprocessing.set_start_method('fork').",
            stacklevel=4,
        )
        raise


def _check_thread_workers(loader: DataLoader[Any]) -> None:
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
    if state.stateful(loader.dataset):
        raise ConfigError(
            f"{who} share one dataset object, and this dataset keeps a state "
            "(state_dict/load_state_dict) that torchdata's protocol keeps per worker "
            f"replica; use {fix}"
        )
    for name, problem in _thread_unsafe_attributes(loader.dataset):
        warnings.warn(
            f"{who} share one dataset object, and its attribute {name!r} is {problem}",
            ThreadSafetyWarning,
            stacklevel=6,  # the user's iter()
        )


def _thread_unsafe_attributes(dataset: Any) -> list[tuple[str, str]]:
    """The dataset's own attributes that threads cannot share safely, with
    why and what to do instead (a lint: objects deeper down, or locked by
    the dataset itself, are not seen or are not a problem)."""
    import io
    import random
    import sqlite3

    import numpy as np

    found = []
    for name, value in sorted(getattr(dataset, "__dict__", {}).items()):
        if isinstance(value, io.IOBase) and not value.closed:
            found.append((name, "an open file: a seek() and read() by one thread interleave "
                          "with another's; open a file per worker (keyed by "
                          "get_worker_info().id) or read at an offset with os.pread"))
        elif isinstance(value, (random.Random, np.random.RandomState, np.random.Generator,
                                torch.Generator)):
            found.append((name, f"a random generator ({type(value).__name__}): its draws then "
                          "depend on which thread runs first; draw from "
                          "get_worker_info().rng (or torch.thread_safe_generator())"))
        elif isinstance(value, sqlite3.Connection):
            found.append((name, "a sqlite3 connection, which refuses use from other threads; "
                          "connect once per worker"))
    return found


def _start_threads(
    loader: DataLoader[Any],
    jobs: list[dict[str, Any]],
    base_seed: int,
    socks: list[socket.socket],
    threads: list[Any],
    pids: list[int],
) -> None:
    """``worker_method="thread"``: the workers are threads of this process
    running the worker loop over the dataset object itself, each with its
    own arena and socket (pid 0: no process to watch)."""
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


def _stop_processes(procs: Any, grace: float = 5.0) -> None:
    """Bounded teardown: ``grace`` seconds in all for the workers to exit
    after Shutdown, then SIGTERM and a second, then SIGKILL (which a stopped
    or signal-ignoring worker cannot refuse). Worker threads are joined
    within ``grace``; one still in the user's code then (it cannot be
    stopped from outside) leaves when that code returns and it finds its
    socket closed."""
    procs = list(procs)
    deadline = time.monotonic() + grace
    me = threading.current_thread()
    for w in procs:
        if w is not me:  # the iterator's last reference may die in a worker thread
            w.join(timeout=max(0.0, deadline - time.monotonic()))
    procs = [w for w in procs if not isinstance(w, threading.Thread)]
    alive = [w for w in procs if w.is_alive()]
    for w in alive:
        w.terminate()
    deadline = time.monotonic() + 1.0
    for w in alive:
        w.join(timeout=max(0.0, deadline - time.monotonic()))
    for w in alive:
        if w.is_alive():
            w.kill()
            w.join()


__all__ = ["DataLoader"]
