"""``DataLoader``: torch's class and argument checks, a Rust iterator.

``DataLoader`` subclasses ``torch.utils.data.DataLoader``: construction,
argument validation (same exception types and messages), attributes,
``len()`` and persistent-worker bookkeeping are torch's own code, and
``isinstance(loader, torch.utils.data.DataLoader)`` holds. Iteration is
replaced: indices, fetch, default collation and reassembly run in Rust.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Optional, TypeVar, Union, cast

import torch
import torch.utils.data.dataloader as _tdl

import ferroloader._core as _core
from ferroloader._env import check_environment
from ferroloader.epoch import plan as _epoch
from ferroloader.epoch import state
from ferroloader.epoch.mixture import Mixture, loader_batch_sampler
from ferroloader.epoch.shards import sharded_len
from ferroloader.epoch.state import merge_states
from ferroloader.errors import ConfigError
from ferroloader.hosts import check_method, forkserver, worker_count_check
from ferroloader.hosts.ray import places
from ferroloader.hosts.ray.options import is_ray
from ferroloader.patch import record_dataset, register_loader
from ferroloader.run.iterators import (
    _is_datapipe,
    _MultiProcessIter,
    _single_process_iter,
    close_iterators,
)
from ferroloader.sampler import (
    RandomSampler,
    SequentialSampler,
    own_generator,
)
from ferroloader.sources.remote import CacheStats, ShardCache
from ferroloader.sources.shards import ShardedDataset, Sharding
from ferroloader.sources.worldqueue import DynamicDistributedSampler, QueueStats
from ferroloader.stats import LoaderStats, of_iterator
from ferroloader.tuning import bounds as autotune
from ferroloader.tuning import live as _autoiter
from ferroloader.tuning.bounds import check_loader_args as check_autotune_args
from ferroloader.tuning.climb import Tuner

_T_co = TypeVar("_T_co", covariant=True)

# torch's classes, captured once: code that cannot be edited is often made
# to use ferroloader by rebinding torch's names to ferroloader's class
# (``torch.utils.data.dataloader.DataLoader = ferroloader.DataLoader``); a
# lookup through those names at call time would then find ours, and recurse.
_TorchDataLoader = _tdl.DataLoader
_TorchMultiProcessIter = _tdl._MultiProcessingDataLoaderIter




# What ferroloader adds to torch's docstring (help() shows both).
_ADDED_DOC = """
    ferroloader's ``DataLoader`` takes every argument above with torch's
    meaning, checks and messages, and gives the same batches. It adds:

    Args:
        num_workers (int, "auto" or Autotune): also ``"auto"``: the loader
            picks its layout (workers, processes or threads, threads inside
            processes, prefetch depth) and changes it while it runs, between
            batches, without changing one; ``ferroloader.Autotune(...)``
            bounds it. ``loader.num_workers`` then reads the layout in
            force, ``loader.stats().autotune`` its changes and why. It may
            load in the main process, so ``timeout`` must stay 0.
            ``prefetch_factor`` is its starting depth (at least 1).
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
            attribute (a non-negative int or ``None``, as torchdata reads
            it); ferroloader's state is exact after every batch, so it
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


class DataLoader(_TorchDataLoader[_T_co]):
    __doc__ = (_TorchDataLoader.__doc__ or "").rstrip() + "\n" + _ADDED_DOC

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Union[Any, Iterable[Any], None] = None,
        batch_sampler: Union[Any, Iterable[list[Any]], None] = None,
        num_workers: Union[int, str, autotune.Autotune] = 0,
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
        if isinstance(num_workers, str) and num_workers != "auto":
            # a string is ferroloader's: only "auto" (torch's `<` would say TypeError)
            raise ConfigError(
                "num_workers should be an int, 'auto' or a ferroloader.Autotune, but got "
                f"num_workers={num_workers!r}"
            )
        bounds = autotune.of(num_workers)
        if bounds is not None:
            if worker_method != "multiprocessing" or worker_threads != 1:
                raise ConfigError(
                    "num_workers='auto' picks worker_method and worker_threads itself; bound "
                    "its choice with num_workers=ferroloader.Autotune(methods=...)"
                )
            # torch's checks see a multi-process loader (prefetch_factor,
            # persistent_workers, multiprocessing_context are then allowed);
            # the tuner sets the layout at each iter()
        nw: int = 1 if bounds is not None else cast(int, num_workers)
        check_method(worker_method, nw, worker_threads, bounds is not None)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed should be an int or None, but got seed={seed!r}")
        if per_sample_seed and seed is None:
            raise ConfigError("per_sample_seed=True needs seed= (the seeds derive from it)")
        if per_sample_seed and callable(getattr(dataset, "__getitems__", None)):
            raise ConfigError(
                "per_sample_seed=True seeds each __getitem__ call, but this dataset fetches "
                "whole batches with __getitems__"
            )
        if isinstance(sampler, DynamicDistributedSampler):
            dataset, sharding, shuffle, seed = sampler.as_shards(dataset, batch_sampler, sharding,
                                                                 shuffle, seed)
            sampler = None
        sharded = isinstance(dataset, ShardedDataset)
        if sharding is not None and not isinstance(sharding, Sharding):
            raise ConfigError(
                f"sharding should be a ferroloader.Sharding or None, but got sharding={sharding!r}"
            )
        if snapshot_every_n_steps is not None and (
            isinstance(snapshot_every_n_steps, bool)
            or not isinstance(snapshot_every_n_steps, int)
            or snapshot_every_n_steps < 0
        ):
            # torchdata takes it modulo the batches yielded (0 or None: never)
            raise ConfigError(
                "snapshot_every_n_steps should be a non-negative integer or None, but got "
                f"snapshot_every_n_steps={snapshot_every_n_steps!r}"
            )
        if sharding is not None and not sharded:
            raise ConfigError(
                "sharding= shards a ferroloader.ShardedDataset; for map-style data pass "
                "batch_sampler=ferroloader.ElasticBatchSampler(...) (elastic) or a "
                "DistributedSampler"
            )
        if isinstance(dataset, Mixture):
            batch_sampler, batch_size, drop_last, shuffle = loader_batch_sampler(
                dataset, shuffle, sampler, batch_sampler, batch_size, drop_last)
        # seed=: a private generator, reseeded per epoch, decides the order
        # and the workers' base seed; generator= keeps priority
        own = own_generator() if seed is not None and generator is None else None
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
            nw,
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
        if bounds is not None:
            check_autotune_args(self)
        record_dataset(dataset, shared_queue=sharding is not None and sharding.across == "world")
        # torchdata's StatefulDataLoader argument: how often its workers send
        # their state. ferroloader's state is exact after every batch, so it
        # changes nothing here (docs/guide/state.md); kept as an attribute.
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self._epochs_started = 0
        self._epoch: Optional[_epoch.Epoch] = None
        self._resume: Optional[dict[str, Any]] = None
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
        # Sharding(across="world"): the queue's namespace in the store, the
        # generation this loader joined, its last epoch (what it held
        # back is read first in the next), what the queue did for it
        self._world_name: Optional[str] = None
        self._world_gen: Optional[int] = None
        self._world_prev: Any = None
        self._queue_stats = QueueStats()
        # the stats of the iterators that have ended (a box shared with them)
        self._stats_box: list[LoaderStats] = [LoaderStats()]
        # num_workers="auto": the bounds, the tuner (made at the first
        # iter(), it outlives epochs) and the layout it last chose
        self.autotune: Optional[autotune.Autotune] = bounds
        self._tuner: Optional[Tuner] = None
        self._tuned_layout: Optional[autotune.Layout] = None
        self._layout_in_force: Optional[autotune.Layout] = None  # (set by apply)
        if bounds is not None:
            self._tuned_layout = autotune.Layout(
                self._auto_min_workers, prefetch_factor=prefetch_factor or 2
            )
            _autoiter.apply(self, self._tuned_layout)
        # forkserver: workers fork from a server that has imported torch
        # (started now, so that its imports overlap the user's set-up)
        forkserver.warm(self)

    # the fewest workers num_workers="auto" may use: 0 (the main process)
    _auto_min_workers = 0

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
        if self._tuner is not None:
            total.autotune = self._tuner.report()
        # the shard caches the dataset reads through (a mixture's sources'),
        # each once
        holders = [self.dataset, *(self.dataset.sources if isinstance(self.dataset, Mixture)
                                   else [])]
        caches = {id(c): c for c in (getattr(d, "cache", None) for d in holders)
                  if isinstance(c, ShardCache)}
        if caches:
            total.remote = sum((c.stats() for c in caches.values()), CacheStats())
        if self.sharding is not None and self.sharding.across == "world":
            total.queue = dataclasses.replace(self._queue_stats)
        if is_ray(self.worker_method):

            total.ray = places(self)
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

    # Where torchdata's StatefulDataLoader does otherwise than torch's loader:
    # hooks of a multi-process epoch that StatefulDataLoader overrides.

    def _index_stream_after_seed(self, source: Any) -> Any:
        """The epoch's index stream once the workers' base seed is drawn:
        torch's loader iterates its sampler once, before that draw."""
        return source

    def _workers_started(self, it: Any, fresh: bool) -> None:
        """An epoch's workers were started (``fresh``) or reset: torch's
        loader reports a worker's failed set-up at the first ``next()``."""

    @property
    def _window(self) -> int:
        """The batches in flight at most: ``prefetch_factor`` per worker
        (torch's default 2 when workers are given none)."""
        return _core.prefetch_window(self.prefetch_factor or 2, self._workers)

    def __len__(self) -> int:
        if not self._sharded():
            return super().__len__()
        return sharded_len(self)

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as plain, picklable data: taken between
        batches (mid-epoch too, with workers running, without pausing them).
        A loader built the same way continues from it after
        ``load_state_dict``; see ``ferroloader.state``."""
        snap = state.snapshot(self)
        if self._tuned_layout is not None:
            # a resume starts where the tuning ended; mid-epoch, on the layout
            # that epoch runs (its state may hold per-worker parts)
            mid = snap["epoch"] is not None
            layout = (self._layout_in_force if mid else None) or self._tuned_layout
            snap["autotune"] = layout.as_dict()
        return snap

    def load_state_dict(self, state_dict: Union[dict[str, Any], list[dict[str, Any]]]) -> None:
        """Resume from ``state_dict()``'s result: the next ``iter()``
        continues the saved epoch with the batches that would have come
        next. Raises ``ValueError`` naming what does not match. With
        ``Sharding(across="world")``, every rank's states in a list (or
        ``ferroloader.merge_states`` of them) resume on any number of ranks."""
        if isinstance(state_dict, (list, tuple)):
            state_dict = merge_states(state_dict)
        state.load(self, state_dict)
        tuned = state_dict.get("autotune")
        if self.autotune is not None and isinstance(tuned, dict):
            self._tuned_layout = autotune.Layout(**tuned)

    def close(self) -> None:
        """Ends the loader's workers now: the persistent ones, those of any
        iterator still running (which then raises if iterated again), and
        hands its Ray actors back (see ``RayWorkers(idle_timeout=)``). The
        loader stays usable: the next ``iter()`` starts workers again.
        ``with DataLoader(...) as loader:`` closes it at the block's end.
        torch's loader has no ``close()``: its workers end with its
        iterators, and so do ferroloader's where nothing holds them."""
        self._iterator = None
        close_iterators(self)
        pool = self.__dict__.get("_ray_pool")
        if pool is not None:
            pool.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Any:
        if self.autotune is not None:
            return _autoiter.AutoIter(self, self._fixed_iter)
        return self._fixed_iter()

    def _fixed_iter(self) -> Any:
        """``iter()`` on the layout the attributes say."""
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
        hands it out, so no frame of ours comes between), ours for threads,
        none for Ray workers (they run on the cluster's nodes)."""
        check = worker_count_check(self)
        return check or _TorchDataLoader.check_worker_number_rationality.__get__(self)

    def _get_iterator(self) -> Any:
        check_environment()
        if self.num_workers == 0:
            return _single_process_iter(self)
        if self.autotune is None:
            # (the tuner keeps to its own bounds, beyond the cores for I/O)
            self.check_worker_number_rationality()
        if _is_datapipe(self.dataset):
            # DataPipes (deprecated in torch) need torch's sharding and seeding.
            return _TorchMultiProcessIter(self)
        return _MultiProcessIter.start(self)


register_loader("torch", DataLoader)



