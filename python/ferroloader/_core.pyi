"""Typed stub for the compiled engine ``ferroloader._core``.

Checked against the built module by ``mypy.stubtest`` in ``scripts/test``.
"""

from typing import Any, Callable, Iterator, Optional, Sequence, TypedDict, final

import torch
from typing_extensions import Required, Self, disjoint_base

__version__: str
TUNE_SHAPES: tuple[str, ...]
TUNE_SHIFT_AT: float

__all__ = [
    "TUNE_SHAPES",
    "TUNE_SHIFT_AT",
    "ActorHost",
    "AddressBatches",
    "ArrowTable",
    "BatchSamplerIter",
    "CacheLease",
    "ClimbPolicy",
    "MultiProcessIter",
    "Packer",
    "PinArena",
    "PinnedShard",
    "Recorder",
    "SampleSeeder",
    "SamplerIter",
    "ShardCacheCore",
    "ShardPlan",
    "ShardPrefetch",
    "SingleProcessIter",
    "StopFlag",
    "TunePolicy",
    "WorldClaims",
    "_FakeCudaRuntime",
    "__version__",
    "_fake_pin_arena",
    "_panic_in_guard",
    "block_seed",
    "check_settings",
    "check_shard_resume",
    "check_state_layout",
    "collate",
    "derive",
    "disabled_setting",
    "elastic_indices",
    "end_processes",
    "epoch_seed",
    "is_url",
    "mixture_indices",
    "prefetch_window",
    "ragged",
    "randperm",
    "relay_loop",
    "resume_stream",
    "sample_seed",
    "seed_everything",
    "shard_item_index",
    "shard_order_seed",
    "shard_plan",
    "shm_limit_setting",
    "store_option_known",
    "tune_best",
    "tune_bounds",
    "tune_candidates",
    "tune_draw",
    "tune_outcome",
    "tune_past_noise",
    "tune_sim_rate",
    "tune_simulate",
    "tune_soft_min",
    "worker_loop",
    "world_check_ranks",
    "world_cut",
    "world_even_budget",
    "world_even_count",
    "world_list_id",
    "world_remaining",
    "world_translate",
    "world_unit",
]

# A sharded epoch's saved position: (positions, next_lane, handed, rest),
# positions per lane (started, shard, emitted) or None, rest [shard, emitted]
# or [shard, emitted, end] (a part of a shard; given back as any sequence).
_LaneSnapshot = tuple[
    list[Optional[tuple[int, int, int]]], int, int, Optional[Sequence[Sequence[int]]]
]
# (iter_shard, shard descriptors, per-item seed hook or None, the cache's
# short_of_room check or None)
_ShardsArg = tuple[Any, list[Any], Optional[Any], Optional[Callable[[], bool]]]
# main (wait, decode, pin, loop, batches) ns, per worker (fetch, collate, transfer, batches)
_StatsTuple = tuple[tuple[int, int, int, int, int], list[tuple[int, int, int, int]]]
# (a table's columns, its batch transform or None)
_TableArg = tuple[ArrowTable, Optional[Any]]

# The test doubles (src/doubles): in the module only when built with the
# `test-doubles` feature, as scripts/test builds the module it tests.
def _panic_in_guard() -> None: ...
def _fake_pin_arena(runtime: _FakeCudaRuntime, stream_fn: Any, guard: bool = True) -> PinArena:
    """Pinned arenas over the fake runtime."""

def collate(batch: Any, collate_fn_map: Optional[dict[Any, Any]] = None) -> Any:
    """torch's ``collate`` with native paths for its default functions."""

def randperm(n: int, generator: Optional[torch.Generator] = None) -> list[int]:
    """``torch.randperm(n, generator=generator).tolist()``, drawn natively."""

@final
class Recorder(Iterator[Any]):
    """A stateful sampler's index stream as the engine draws it, keeping
    the last ``keep`` batches by sequence number; a resumed one counts on
    from ``count`` and re-sends ``kept`` first."""

    def __new__(
        cls, source: Iterator[Any], keep: int, count: int = ..., kept: list[tuple[int, Any]] = ...
    ) -> Recorder: ...
    def __iter__(self) -> Recorder: ...
    def __next__(self) -> Any: ...
    @property
    def pulled(self) -> bool: ...
    def batches(self, seqs: list[int]) -> list[Any]: ...

@final
class SamplerIter(Iterator[int]):
    """A sampler's epoch of indices, drawn in Rust."""

    @staticmethod
    def deferred(sampler: Any, resolve: Any) -> SamplerIter: ...
    @staticmethod
    def sequential(n: int) -> SamplerIter: ...
    @staticmethod
    def random(
        n: int,
        num_samples: int,
        replacement: bool,
        generator: Optional[torch.Generator] = None,
        own: bool = False,
    ) -> SamplerIter: ...
    @staticmethod
    def permutation(n: int, generator: torch.Generator) -> SamplerIter: ...
    @staticmethod
    def subset_random(
        indices: list[int], generator: Optional[torch.Generator] = None
    ) -> SamplerIter: ...
    @staticmethod
    def weighted(
        weights: torch.Tensor,
        num_samples: int,
        replacement: bool,
        generator: Optional[torch.Generator] = None,
    ) -> SamplerIter: ...
    @staticmethod
    def from_list(indices: list[int]) -> SamplerIter: ...
    @staticmethod
    def distributed(spec: _Distributed) -> Optional[SamplerIter]:
        """``None`` when the sampler's sizes are inconsistent (torch raises)."""
    def __iter__(self) -> SamplerIter: ...
    def __next__(self) -> int: ...
    def _skip(self, n: int) -> int:
        """Draws and drops ``n`` indices; how many there were."""
    def _prepend(self, indices: list[int]) -> None:
        """Hands out ``indices`` before the sampler's own."""

@final
class BatchSamplerIter(Iterator[list[Any]]):
    """Index lists of ``batch_size`` from a sampler, batched in Rust."""

    def __new__(cls, source: Any, batch_size: int, drop_last: bool) -> Self: ...
    @property
    def is_native(self) -> bool: ...
    def __iter__(self) -> BatchSamplerIter: ...
    def __next__(self) -> list[Any]: ...
    def _skip(self, n: int) -> int:
        """Draws and drops ``n`` batches without building them; how many there were."""
    def _prepend(self, batches: list[list[int]]) -> None:
        """Hands out ``batches`` first (native batches only)."""

@disjoint_base
class SingleProcessIter(Iterator[Any]):
    """``num_workers=0``: indices, fetch and collate in one native ``__next__``."""

    def __new__(cls, source: Any, dataset: Any, spec: _SingleSpec) -> Self: ...
    def __iter__(self) -> SingleProcessIter: ...
    def __next__(self) -> Any: ...
    def __len__(self) -> int: ...
    def _on_first_draw(self, callback: Callable[[], None]) -> None: ...
    @property
    def _position(self) -> tuple[int, list[int], bool, bool]:
        """``(drawn, pending, ended, exhausted)`` of the current epoch, in its
        own numbering (an iterable's drawn counts batches handed over)."""
    @property
    def _lane_snapshot(self) -> Optional[_LaneSnapshot]:
        """A sharded epoch's position; ``None`` for other epochs."""
    @property
    def _stats(self) -> _StatsTuple:
        """Stage timings in ns: main ``(wait, decode, pin, loop, batches)``,
        then ``(fetch, collate, transfer, batches)`` per worker."""

@disjoint_base
class MultiProcessIter(Iterator[Any]):
    """The main-process side of multi-process loading (subclassed in Python)."""

    def __new__(
        cls, workers: list[tuple[int, int]], source: Any, dataset: Any, spec: _IterSpec
    ) -> Self:
        """Starts the epoch: the lanes or the round-robin set up, the window filled."""
    def _next_unpinned(self, stop: Optional[StopFlag] = None) -> Any:
        """The next batch as the engine hands it over, not pinned (``None`` at
        the end of the epoch); a raised ``stop`` ends a wait with
        ``InterruptedError``."""
    @property
    def _pin_counts(self) -> Optional[tuple[int, int, int, int, int, int]]:
        """``PinArena.counts`` of the pinned arenas, if pinned."""
    def _reset_epoch(
        self,
        source: Any,
        len_called: Optional[int],
        plan: Optional[ShardPlan] = None,
        resumed: Optional[_Resumed] = None,
    ) -> None: ...
    @property
    def _lane_snapshot(self) -> Optional[_LaneSnapshot]:
        """A sharded epoch's position; ``None`` for other epochs."""
    @property
    def _stats(self) -> _StatsTuple:
        """Stage timings in ns: main ``(wait, decode, pin, loop, batches)``,
        then ``(fetch, collate, transfer, batches)`` per worker."""
    def _close(self, grace: Optional[float] = None,
               error: Optional[BaseException] = None) -> None:
        """Stops the workers; with ``grace``, ends the worker processes too;
        with ``error``, each later ``next()`` raises it (``loader.close()``)."""
    @property
    def _position(self) -> tuple[int, list[int], bool]:
        """``(drawn, pending sequence numbers, ended)`` of the current epoch,
        in its own numbering (also after a resume)."""
    @property
    def _iterable_position(
        self,
    ) -> tuple[list[int], list[Optional[bytes]], list[bool], int, list[bool]]:
        """``(delivered, states, exhausted, next_worker, done)`` per worker."""
    def _await_setup(self) -> None: ...
    def _hold(self, held: bool) -> None:
        """Holds back new tasks so the epoch drains (``next()`` then stops
        without ending it); ``False`` lets them go out again."""
    @property
    def _held(self) -> bool: ...
    @property
    def _in_flight(self) -> int:
        """Answers not yet handed over."""
    def _set_prefetch_factor(self, prefetch_factor: int) -> None: ...
    @property
    def _timed_out(self) -> bool: ...
    @property
    def _closed(self) -> bool:
        """The workers were stopped (a failure, or a non-persistent epoch's end)."""
    def __iter__(self) -> MultiProcessIter: ...
    def __next__(self) -> Any: ...
    def __len__(self) -> int: ...

class _Distributed(TypedDict):
    """A ``DistributedSampler``'s attributes at ``__iter__``; ``seed`` is
    its ``seed + epoch`` modulo 2**64."""

    n: int
    num_replicas: int
    rank: int
    shuffle: bool
    seed: int
    drop_last: bool
    num_samples: int
    total_size: int

# A resumed epoch: (drawn at the snapshot, the batches then in flight in
# the order they are re-drawn, each worker's (handed over, pickled state)).
_Resumed = tuple[int, list[int], list[tuple[int, Optional[bytes]]]]

class _SingleSpec(TypedDict):
    """How an epoch's ``SingleProcessIter`` runs."""

    iterable: bool
    getitems: Optional[Any]
    tensors: Optional[list[torch.Tensor]]
    auto_collation: bool
    batch_size: int
    drop_last: bool
    collate_fn: Optional[Any]
    pin: Optional[tuple[Any, Any]]
    index_sampler: Any
    len_called: Optional[int]
    rng_guard: Optional[Any]
    sharded: Optional[_ShardsArg]
    plan: Optional[ShardPlan]
    block: int
    table: Optional[_TableArg]
    resumed: Optional[_Resumed]

class _IterSpec(TypedDict):
    """How an epoch's ``MultiProcessIter`` runs."""

    iterable: bool
    batch_size: Optional[int]
    auto_collation: bool
    prefetch_factor: int
    in_order: bool
    persistent: bool
    timeout: float
    timeout_text: str
    pin: Optional[tuple[Any, Any]]
    pin_where: Optional[str]
    index_sampler: Any
    len_called: Optional[int]
    pin_arena: Optional[PinArena]
    lanes: Optional[ShardPlan]
    round_robin: Optional[tuple[int, list[bool]]]
    resumed: Optional[_Resumed]
    # not the engine's: the Python subclass that pins on a thread reads it
    pin_thread: Optional[tuple[Any, Any]]

class _ReplicaState(TypedDict):
    """What a worker reads to send its replica's state with each batch:
    ``current`` is ``[iterator, whether it has state methods]``."""

    current: list[Any]
    dataset_stateful: bool

class _WorkerSpec(TypedDict):
    """What a worker serves with (``worker_loop``'s one argument besides its socket)."""

    dataset: Any
    iterable: bool
    auto_collation: bool
    drop_last: bool
    collate_fn: Optional[Any]
    getitems: Optional[Any]
    tensors: Optional[list[torch.Tensor]]
    main_pid: int
    shm_initial: int
    shm_limit: int
    prefetch_factor: int
    make_iter: Any
    wrap_exception: Any
    init_exception: Optional[bytes]
    on_epoch: Optional[Any]
    replica: Optional[_ReplicaState]
    sharded: Optional[_ShardsArg]
    batch_size: Optional[int]
    table: Optional[_TableArg]
    trim: bool

def worker_loop(fd: int, spec: _WorkerSpec) -> None:
    """Serve tasks from the main process until it stops or goes away."""

# a remote worker's task: ("ints", [...]), ("int", i), ("pickled", bytes),
# ("iterable", n or None), ("lane", l) or ("addresses", [(shard, offset)])
_Task = tuple[str, Any]
# (kind, payload, replica state or None, (lane, started, shard, emitted) or None)
_Reply = tuple[str, Any, Optional[bytes], Optional[tuple[int, int, int, int]]]

@final
class ActorHost:
    """A worker's host in a remote actor (``ferroloader.ray``)."""

    def __new__(cls, spec: _WorkerSpec) -> Self: ...
    def start_epoch(self) -> Optional[bytes]: ...
    def lanes(self, lanes: list[int], shuffle: bool, block: int, root: int) -> None: ...
    def assign(self, lane: int, works: list[tuple[int, int, int]], last: bool) -> None: ...
    def hand_back(self, lane: int) -> None: ...
    def run(self, task: _Task) -> tuple[_Reply, tuple[int, int, int, int]]:
        """One task: the reply and its stage timings (ns: fetch, collate,
        transfer; batches)."""

def relay_loop(fd: int, relay: Any, shm: tuple[int, int, int, bool]) -> None:
    """A remote worker's relay: the worker loop over ``fd``, each call sent
    to ``relay``."""

@final
class StopFlag:
    """Asks a thread waiting in ``MultiProcessIter._next_unpinned`` to stop."""

    def __new__(cls) -> Self: ...
    def set(self) -> None: ...
    @property
    def is_stopped(self) -> bool: ...

@final
class PinArena:
    """Pinned arenas of one iterator: worker arenas registered with the CUDA
    runtime, and the guard that keeps a freed record from reuse until the
    copies queued before its free have run."""

    @staticmethod
    def cuda(library: str, stream_fn: Any, guard: bool = True) -> PinArena:
        """Over the CUDA runtime library at ``library`` (the one torch
        loaded); ``stream_fn() -> [(device, raw stream), ...]``."""
    def check(self) -> Optional[str]:
        """``None`` if one page of shared memory can be registered, else why not."""
    def tick(self) -> None:
        """The training loop's ``next()``: its current stream joins those
        fences cover, and records freed since the last tick are fenced."""
    def close(self) -> None:
        """The iterator is closing: records freed from now on are fenced at once."""
    @property
    def counts(self) -> tuple[int, int, int, int, int, int]:
        """``(segments, bytes, failed, fenced, synchronized, unfenced)``."""
    @property
    def first_error(self) -> Optional[str]: ...
    @property
    def streams(self) -> list[tuple[int, int]]: ...

@final
class _FakeCudaRuntime:
    """(Test builds only.) A model of the CUDA runtime for tests: registered ranges, streams of
    asynchronous copies that run on ``run()``, events over them."""

    def __new__(cls) -> Self: ...
    current: Optional[tuple[int, int]]
    def fail_registration(self, fail: bool) -> None: ...
    def copy_async(self, ptr: int, nbytes: int, stream: int, device: int = 0) -> int: ...
    def wait_stream(self, stream: int, other: int, device: int = 0) -> None: ...
    def run(self, stream: int, device: int = 0) -> None: ...
    def result(self, op: int) -> Optional[bytes]: ...
    @property
    def registered(self) -> list[tuple[int, int]]: ...
    @property
    def register_calls(self) -> list[tuple[int, int]]: ...
    @property
    def unregister_calls(self) -> list[int]: ...
    @property
    def fences(self) -> int: ...

@final
class ShardPlan:
    """A sharded epoch's lane plan for one rank (opaque)."""

    @property
    def budget(self) -> Optional[int]:
        """Batches every rank yields (``None``: counts not kept even)."""
    @property
    def lanes(self) -> int: ...
    @property
    def batches(self) -> Optional[int]:
        """Batches this rank yields in the epoch, when shard lengths are known."""
    @property
    def read_order(self) -> list[int]:
        """The shards in the order the epoch first reads them."""

class _PlanArgs(TypedDict):
    n_shards: int
    lens: Optional[list[int]]
    block: int
    root: int
    shuffle: bool
    rank: int
    world: int
    dynamic: bool
    lanes: int
    batch: Optional[int]
    drop_last: bool
    even: bool
    largest_first: bool
    resume: Optional[_LaneSnapshot]
    shared: Optional[_SharedArgs]

class _SharedArgs(TypedDict):
    # the job's shared queue: (shard, emitted, end) or None, one per call
    source: Callable[[], Optional[tuple[int, int, int]]]
    budget: Optional[int]
    handed: int

def shard_plan(args: _PlanArgs) -> ShardPlan:
    """The epoch's lane plan for one rank, or the plan continuing ``resume``."""

class _AddressArgs(TypedDict):
    lens: list[int]
    block: int
    root: int
    shuffle: bool
    start: int
    batch: int
    world: int
    rank: int
    tail: str

@final
class AddressBatches(Iterator[list[tuple[int, int]]]):
    """Elastic sharding: one rank's batches of ``(shard, offset)``."""

    def __new__(cls, args: _AddressArgs) -> Self: ...
    @property
    def total(self) -> int:
        """Items in the epoch's whole global sequence."""
    @property
    def read_order(self) -> list[int]:
        """The shards in the order the rest of the sequence reads them."""
    def __len__(self) -> int: ...
    def __iter__(self) -> AddressBatches: ...
    def __next__(self) -> list[tuple[int, int]]: ...
    def _skip(self, n: int) -> int: ...

def elastic_indices(
    n: int,
    *,
    start: int,
    batch: int,
    world: int,
    rank: int,
    tail: str,
    seed: Optional[int] = None,
) -> list[int]:
    """One rank's indices of an elastic split of a global sequence."""

class _MixtureArgs(TypedDict, total=False):
    lens: Required[list[int]]
    segments: Required[list[tuple[int, list[float]]]]
    root: Required[int]
    replacement: Required[bool]
    exhausted: Required[str]
    num_samples: Required[Optional[int]]
    start: Required[int]
    batch: Required[int]
    world: Required[int]
    rank: Required[int]
    tail: Required[str]
    shards: Optional[list[Optional[list[int]]]]

def mixture_indices(args: _MixtureArgs) -> tuple[int, list[int], list[tuple[int, int]]]:
    """A mixture epoch's length, one rank's global indices from ``start``,
    and the sharded sources' ``(source, shard)`` in the order they reach them."""

def end_processes(pids: list[int], grace: float) -> None:
    """Ends worker processes (``grace`` to exit, then SIGTERM, then SIGKILL),
    without reaping them."""

def resume_stream(source: Any, drawn: int, pending: list[int]) -> tuple[Any, list[int]]:
    """The index stream resumed at a snapshot ``drawn`` batches in: those
    handed over skipped, those in flight (``pending``) first; and their
    sequence numbers."""

def prefetch_window(prefetch_factor: int, num_workers: int) -> int:
    """The most tasks in flight at once (``prefetch_factor * num_workers``)."""

def check_settings() -> None:
    """Checks every ``FERROLOADER_*`` setting (``ConfigError`` naming a bad one)."""

def shm_limit_setting() -> Optional[int]:
    """``FERROLOADER_SHM_LIMIT`` in bytes, ``None`` when unset."""

def disabled_setting() -> list[str]:
    """The names ``FERROLOADER_DISABLE`` lists (trimmed, lower-cased)."""

def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of a seeded loader's generator for ``epoch`` (0-based)."""

def sample_seed(seed: int, epoch: int, index: Any) -> int:
    """The seed set before ``dataset[index]`` in ``epoch`` with ``per_sample_seed``
    (a key that is not an integer counts as the CRC-32 of its ``repr``)."""

def seed_everything(s: int) -> None:
    """Seeds torch's CPU generator, ``random`` and numpy (a worker thread's own)."""

@final
class SampleSeeder:
    """``per_sample_seed=True``: ``seeder[i]`` seeds then reads ``dataset[i]``;
    ``seeder(shard, offset)`` seeds before a shard item is drawn."""

    def __new__(
        cls, seed: int, epoch: int, dataset: Optional[Any] = None, started: bool = False
    ) -> SampleSeeder: ...
    @property
    def epoch(self) -> int: ...
    @property
    def dataset(self) -> Optional[Any]: ...
    def __getitem__(self, key: Any, /) -> Any: ...
    def __len__(self) -> int: ...
    def __call__(self, shard: int, offset: int) -> None: ...
    def save(self) -> None: ...
    def restore(self) -> None: ...
    def start_epoch(self) -> None: ...

def derive(root: int, parts: list[int]) -> int:
    """Folds each part into ``root``."""

def shard_order_seed(root: int) -> int:
    """The seed of a sharded epoch's shard order, from the epoch's root."""

def block_seed(root: int, shard: int, block: int) -> int:
    """The seed of the order of block ``block`` of shard ``shard``."""

def shard_item_index(shard: int, offset: int) -> int:
    """The index that stands for item ``offset`` of shard ``shard``."""

@final
class ArrowTable:
    """A table's columns imported through the Arrow PyCapsule interface."""

    def __new__(
        cls, source: Any, names: Optional[list[str]] = None, mapping: Optional[list[int]] = None
    ) -> Self: ...
    def __len__(self) -> int: ...
    @property
    def names(self) -> list[str]: ...
    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as a dict of column name to value."""
    def gather(self, indices: list[int]) -> dict[str, Any]:
        """Rows ``indices`` as a batch: ``default_collate`` of the rows."""

def ragged(samples: Any) -> dict[str, Any]:
    """1-D integer sequences as ``{"tokens": flat int64, "lengths": int64}``."""

@final
class Packer:
    """Packs sequences into ``rows`` rows of ``seq_len`` tokens."""

    def __new__(cls, seq_len: int, rows: int, method: str, pad_id: int) -> Self: ...
    def push(self, batch: Any) -> None: ...
    def pop(self) -> Optional[dict[str, Any]]: ...
    def flush(self) -> Optional[dict[str, Any]]: ...
    def pending(self) -> dict[str, Any]: ...

def is_url(path: str) -> bool:
    """Whether ``path`` is a URL the shard cache reads."""

def store_option_known(key: str) -> bool:
    """Whether ``key`` is a setting S3's, GCS's, Azure's or the HTTP
    client's store knows, or ``retries`` / ``retry_timeout``."""

@final
class ShardCacheCore:
    """One process's handle on a shard cache directory (``ferroloader.ShardCache``)."""

    def __new__(
        cls,
        dir: str,
        budget: int,
        options: list[tuple[str, str]],
    ) -> Self: ...
    def open(
        self, url: str, start: Optional[int] = None, end: Optional[int] = None
    ) -> PinnedShard:
        """The object at ``url`` (or bytes ``start:end`` of it), pinned in
        the cache until ``release()``."""
    def prefetch(
        self,
        items: list[tuple[str, Optional[tuple[int, int]], Optional[int]]],
        streams: int = 8,
    ) -> ShardPrefetch:
        """Fetches ``(url, (start, end) or None, size or None)`` items in
        order on ``streams`` threads."""
    def publish(self, dir: str) -> None:
        """Writes this process's counters into a file of its own in ``dir``."""
    @staticmethod
    def published(dir: str) -> tuple[int, int, int, int, float, int]:
        """The counters every process published in ``dir``, summed."""
    def counters(self) -> tuple[int, int, int, int, float, int]:
        """``(bytes fetched, downloads, hits, misses, seconds waited,
        re-downloads)`` of this process."""
    def sizes(self, urls: list[str]) -> list[int]:
        """The objects' sizes (HEAD requests), remembered by this handle."""
    def known_size(self, url: str) -> Optional[int]:
        """The size remembered for ``url``, if it was asked."""
    def check(self, pieces: list[tuple[str, Optional[tuple[int, int]]]]) -> list[int]:
        """The pieces' sizes, after checking the cache can hold each (a
        ``ConfigError`` over the budget, an ``OSError`` over the disk)."""
    def lease(self, hold: int, readers: int) -> Optional[CacheLease]:
        """Claims ``hold`` bytes of room for what ``readers`` keep open
        between batches, until ``release()`` (or collection); ``None`` for
        nothing. Warns once (``CacheBudgetWarning``) above the budget."""
    def fetch_ahead(self, pieces: list[Any], holders: int, streams: int
                    ) -> Optional[ShardPrefetch]:
        """Fetches ``pieces`` (a URL, ``(url, (start, end))`` or ``None``
        each; repeats once) in order after checking them, holding a lease
        on the room the largest ``holders`` take; ``None`` if none is remote."""
    def claim_room(self, pieces: list[Any], readers: int) -> Optional[CacheLease]:
        """The pieces checked, and a lease on the room the largest
        ``readers`` of them take (``None`` for nothing)."""
    def short_of_room(self) -> bool:
        """Whether the live leases claim more than the budget."""
    def leased(self) -> int:
        """The bytes the live leases claim."""

@final
class CacheLease:
    """A loader's lease on a shard cache's room."""

    def release(self) -> None: ...

@final
class PinnedShard:
    """An object pinned in the shard cache."""

    @property
    def path(self) -> str: ...
    def release(self) -> None: ...

@final
class ShardPrefetch:
    """A prefetch under way."""

    def stop(self) -> None: ...

# The job's shared queue (ferroloader.epoch.world): works as (shard, emitted, end)

def world_check_ranks(accounts_: list[dict[str, Any]], what: str) -> None:
    """Every rank of the saved job exactly once, or a ``ConfigError`` naming the ranks."""

def world_remaining(accounts_: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """What an epoch has left to read, from every rank's account of it."""

def world_translate(works: list[tuple[int, int, int]], lens: list[int], size_from: int,
                    size_to: int, root_from: int, root_to: int) -> list[tuple[int, int, int]]:
    """Works of one shuffled epoch as works reading the same items in another."""

def world_even_count(items: int, longest: int, world: int, batch: int) -> int:
    """Batches each rank yields with even counts, from a list's items and its longest work."""

def world_unit(total: int, world: int, block: int, shuffled: bool) -> tuple[int, int]:
    """``(items per range, shuffle block)`` of the shared queue's list."""

def world_cut(works: list[tuple[int, int, int]], lens: list[int],
              unit: int) -> list[tuple[int, int, int]]:
    """``works`` as works of at most ``unit`` items."""

def world_list_id(works: list[tuple[int, int, int]]) -> str:
    """The digest of an epoch's list that every rank compares."""

def world_even_budget(sizes: list[int], world: int, batch: int) -> int:
    """Batches each rank yields with even counts."""

@final
class WorldClaims:
    """A rank's claims of an epoch of the shared queue; the lanes pull from it."""

    def __new__(cls, works: list[tuple[int, int, int]], sizes: list[Optional[int]],
                quota: Optional[int], most_ahead: int, horizon: float,
                lanes: int) -> Self: ...
    def wanted(self) -> int:
        """Waits until claims are wanted: how many; ``0`` once none will be."""
    def ahead(self) -> tuple[int, int]:
        """``(unread works held, how many the horizon wants held)``."""
    def record(self, position: int, seconds: float) -> bool:
        """The counter gave ``position``: whether it is a work of the list."""
    def fail(self, why: str) -> None: ...
    def stop(self) -> None: ...
    def work(self, position: int) -> Optional[tuple[int, int, int]]: ...
    def account(self) -> tuple[list[int], list[tuple[int, int, int]]]: ...
    def counts(self) -> tuple[int, int, float]: ...

def check_shard_resume(resume: dict[str, Any], across: str, mode: str, world: int,
                       rank: int) -> None:
    """A sharded epoch's loaded position against the loader resuming it
    (same ``across``, mode, and for static and dynamic the same rank of as
    many): a ``ConfigError`` saying which differs."""

def check_state_layout(state: dict[str, Any], facts: dict[str, Any]) -> None:
    """A loader state's layout, field by field, for a loader of these
    ``facts``: a ``ConfigError`` naming the first field that is wrong."""

_Layout = tuple[int, str, int, int]
_Interval = tuple[_Layout, float, int, int, float, float, float, float, int, float, bool]

@final
class TunePolicy:
    """``tuning.policy.Policy``'s decisions over measured intervals."""

    def __new__(cls, ctx: Any, layout: _Layout) -> Self: ...
    def observe(self, m: Any) -> Optional[tuple[_Layout, str]]: ...
    @property
    def settled(self) -> bool: ...
    @property
    def gil(self) -> float: ...
    @property
    def changes(self) -> int: ...
    @property
    def layout(self) -> _Layout: ...
    def seen(self) -> list[tuple[_Layout, list[_Interval]]]: ...
    def need(self, layout: _Layout) -> float: ...
    def fits(self, layout: _Layout) -> bool: ...
    def predict(self, layout: _Layout) -> float: ...

@final
class ClimbPolicy:
    """``tuning.climb.Tuner``'s climb: its steps over measured intervals."""

    def __new__(cls, prefetch: bool) -> Self: ...
    @property
    def settled(self) -> bool: ...
    @settled.setter
    def settled(self, settled: bool) -> None: ...
    def observe(
        self,
        m: tuple[float, float, float, float],
        layout: _Layout,
        settled_wait: Optional[float],
        bounds: tuple[int, Optional[float], float, float, float, bool, bool, bool, float, bool],
    ) -> tuple[Optional[tuple[_Layout, str]], Optional[str], list[str]]:
        """An interval ``(batches, wall, wait, cpu)`` on ``layout``: the next
        layout and why (or ``None``), a note (or ``None``), lines to log."""

def tune_bounds(cpu: float, wait: float, moving: float, gil: float, step: float, batch: float,
                cores: float, layout: _Layout) -> list[float]:
    """The rates that bound ``layout``, from costs per sample."""

def tune_soft_min(bounds: list[float], sharpness: float) -> float: ...
def tune_candidates(cap: int, processes: bool, threads: bool,
                    inner: bool) -> list[_Layout]: ...
def tune_past_noise(ratios: list[tuple[float, float]]) -> float: ...
# the simulator (tuning.model): a job and a machine are read by attribute
_Job = tuple[float, float, float, float, float, float, float, float, int, float]
def tune_sim_rate(job: Any, machine: Any, layout: _Layout) -> float: ...
def tune_best(job: Any, machine: Any, candidates: list[_Layout],
              arena: float) -> tuple[_Layout, float]: ...
def tune_draw(n: int, seed: int) -> list[tuple[str, _Job, tuple[int, float]]]: ...
def tune_outcome(job: Any, machine: Any,
                 last: _Layout) -> tuple[_Layout, float, float, int, float]: ...
def tune_simulate(
    job: Any, machine: Any, seed: int, start: _Layout, seconds: float, arena: float,
    interval: float, stop_after: float,
    decide: Optional[Callable[[tuple[Any, ...]], Any]] = None,
    context: Any = None,
) -> tuple[list[tuple[float, _Layout]], float, float, float, float]: ...
