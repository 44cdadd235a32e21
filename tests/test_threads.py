"""Thread workers (``worker_method="thread"``) against torch's process workers.

The same dataset runs through torch's loader (processes) and ferroloader's
with threads in this process; every batch is compared exactly. Threads share
the process, so what differs from processes is checked on its own: each
thread's ``get_worker_info()`` (torch's function too), the per-thread
generators that ``torch.thread_safe_generator()`` returns, faults ending
with no worker thread left, and what threads cannot share.
"""

from __future__ import annotations

import _thread
import functools
import gc
import signal
import subprocess
import sys
import threading
import time
import warnings

import ferroloader
import mp_helpers as mh
import pytest
import shard_cases
import torch
import torch.utils.data as tud
from helpers import FERRO, TORCH, assert_same, ferro_only, time_limit

THREAD = {"worker_method": "thread"}


def _threads_left() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("pt_data_worker")]


def _no_threads_left(timeout: float = 20.0) -> bool:
    return mh.wait_until(lambda: not _threads_left(), timeout)


@pytest.fixture(autouse=True)
def _threads_end():
    """Every test leaves no worker thread behind (bounded: a thread stuck
    in user code is given the test's own sleep to come back)."""
    yield
    assert _no_threads_left(), f"worker threads left running: {_threads_left()}"


# --------------------------------------------------------------------------- #
# same batches as torch's process workers
# --------------------------------------------------------------------------- #


@ferro_only
@time_limit(60)
@pytest.mark.parametrize(("num_workers", "prefetch_factor"), [(1, 2), (2, 1), (3, 4)])
def test_map_batches_match_torch(num_workers, prefetch_factor):
    """Shuffled batches from threads finishing out of order arrive in sampler
    order and equal torch's, for every worker count and prefetch depth; the
    global generators afterwards are torch's."""
    kw = dict(batch_size=3, shuffle=True, num_workers=num_workers,
              prefetch_factor=prefetch_factor)
    e = mh.run_side(TORCH, lambda lib: mh.JitterDataset(20, "dict"), seed=11, **kw)
    a = mh.run_side(FERRO, lambda lib: mh.JitterDataset(20, "dict"), seed=11, **kw, **THREAD)
    assert_same(e.epochs, a.epochs)
    assert torch.equal(e.rng[0], a.rng[0]) and e.rng[1:] == a.rng[1:]


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("kind", mh.SAMPLE_KINDS)
def test_sample_kinds_match_torch(kind):
    kw = dict(batch_size=4, num_workers=2, persistent_workers=True, epochs=2)
    e = mh.run_side(TORCH, lambda lib: mh.MapDataset(10, kind), **kw)
    a = mh.run_side(FERRO, lambda lib: mh.MapDataset(10, kind), **kw, **THREAD)
    assert_same(e.epochs, a.epochs)


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("batch_size", [None, 2])
def test_iterable_sharded_with_torchs_get_worker_info_matches_torch(batch_size):
    """An iterable dataset that shards with ``torch.utils.data.get_worker_info()``
    sees its own thread's record: each thread yields its shard only."""
    def run(lib, **extra):
        ds = mh.ShardedIterable([5, 3, 4], tud.get_worker_info)
        return list(lib.DataLoader(ds, batch_size=batch_size, num_workers=3, **extra))

    assert_same(run(TORCH), run(FERRO, **THREAD))
    assert tud.get_worker_info() is None


@ferro_only
@time_limit(60)
def test_each_thread_has_its_own_worker_info_and_init():
    """``get_worker_info()`` (both libraries' functions) inside a thread
    gives its id, the worker count, seed base+id and the dataset object
    itself (threads share it); ``worker_init_fn`` runs once per thread with
    its id; the main thread sees ``None``."""
    seen: list = []
    lock = threading.Lock()

    def init(wid):
        with lock:
            seen.append((wid, ferroloader.get_worker_info().id, tud.get_worker_info().id))

    ds = mh.WorkerInfoDataset(9, tud.get_worker_info)
    batches = list(FERRO.DataLoader(ds, batch_size=1, num_workers=3, worker_init_fn=init,
                                    **THREAD))
    assert sorted(seen) == [(w, w, w) for w in range(3)]
    seeds = {int(b["id"]): int(b["seed"]) for b in batches}
    assert sorted(seeds) == [0, 1, 2]
    assert seeds == {w: seeds[0] + w for w in range(3)}
    assert all(bool(b["dataset_is_self"]) for b in batches)
    assert ferroloader.get_worker_info() is None and tud.get_worker_info() is None


class IntraOpThreads(tud.Dataset):
    """Sample i: the intra-op thread count its worker runs torch with."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return torch.get_num_threads()


@ferro_only
@time_limit(60)
def test_worker_threads_run_torch_on_one_intra_op_thread_and_leave_the_process_count():
    """Each worker thread runs torch with one intra-op thread, as torch's
    worker processes do (each thread's transforms would otherwise start a
    team of the process's size, and the teams contend for the cores); the
    main thread's count, and that of threads started later, are as before."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        counts = FERRO.DataLoader(IntraOpThreads(), batch_size=2, num_workers=2, **THREAD)
        assert {int(c) for b in counts for c in b} == {1}
        assert torch.get_num_threads() == 3
        later: list = []
        t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert later == [3]
    finally:
        torch.set_num_threads(before)


class GeneratorDraws(tud.Dataset):
    """Draws from ``torch.thread_safe_generator()`` (``None`` in a process
    worker: the global generator) and from the worker's ``random``/``numpy``
    streams as the record's ``rng`` or the globals give them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        import random

        import numpy as np

        gen = torch.thread_safe_generator() if hasattr(torch, "thread_safe_generator") else None
        info = ferroloader.get_worker_info()
        rng = getattr(info, "rng", None) if info is not None else None
        py = rng.random_generator.random() if rng is not None else random.random()
        npv = rng.numpy_generator.rand() if rng is not None else np.random.rand()
        return {"i": i, "t": torch.rand(2, generator=gen), "py": py, "np": float(npv)}


@ferro_only
@time_limit(60)
@pytest.mark.skipif(not hasattr(torch, "thread_safe_generator"),
                    reason="this torch has no torch.thread_safe_generator (newer than 2.11)")
def test_thread_generators_draw_what_process_workers_draw_from_the_globals():
    """A thread's generators are seeded as a process worker seeds the global
    ones, so a dataset drawing from ``torch.thread_safe_generator()`` gets with
    threads exactly torch's batches with processes, over two epochs."""
    kw = dict(batch_size=3, num_workers=2, shuffle=True, epochs=2)
    e = mh.run_side(TORCH, lambda lib: GeneratorDraws(14), seed=5, **kw)
    a = mh.run_side(FERRO, lambda lib: GeneratorDraws(14), seed=5, **kw, **THREAD)
    assert_same(e.epochs, a.epochs)


@ferro_only
@time_limit(60)
@pytest.mark.skipif(not hasattr(torch, "thread_safe_generator"),
                    reason="this torch has no torch.thread_safe_generator (newer than 2.11)")
def test_per_sample_seed_with_threads_equals_processes():
    """``per_sample_seed=True`` seeds a thread's own generators before each
    sample: the batches equal process workers' (whose globals are seeded),
    for 2 and 3 threads alike."""
    kw = dict(batch_size=3, shuffle=True, seed=9, per_sample_seed=True)
    procs = list(FERRO.DataLoader(GeneratorDraws(12), num_workers=2, **kw))
    for nw in (2, 3):
        threads = list(FERRO.DataLoader(GeneratorDraws(12), num_workers=nw, **kw, **THREAD))
        assert_same(procs, threads)


@ferro_only
@time_limit(60)
def test_waiting_main_thread_lets_workers_run_and_stats_count():
    """Stage timings are counted for thread workers as for processes."""
    loader = FERRO.DataLoader(mh.MapDataset(24, "dict"), batch_size=4, num_workers=2, **THREAD)
    assert len(list(loader)) == 6
    assert loader.stats().batches == 6


# --------------------------------------------------------------------------- #
# state, sharding: one engine for both methods
# --------------------------------------------------------------------------- #


@ferro_only
@time_limit(90)
@pytest.mark.parametrize(("before", "after"), [("thread", "thread"),
                                               ("thread", "multiprocessing"),
                                               ("multiprocessing", "thread")])
def test_resume_across_methods_is_exact(before, after):
    """A snapshot taken mid-epoch with one method resumes with the other and
    yields exactly the rest of the uninterrupted epoch."""
    kw = dict(batch_size=2, shuffle=True, seed=3, num_workers=2)
    whole = [b.tolist() for b in FERRO.DataLoader(mh.MapDataset(22), **kw)]
    loader = FERRO.DataLoader(mh.MapDataset(22), worker_method=before, **kw)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(4)]
    sd = loader.state_dict()
    del it
    resumed = FERRO.DataLoader(mh.MapDataset(22), worker_method=after, **kw)
    resumed.load_state_dict(sd)
    rest = [b.tolist() for b in resumed]
    assert head + rest == whole


@ferro_only
@time_limit(90)
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_sharded_dataset_with_threads_equals_processes(mode):
    ds = shard_cases.Counted()
    kw = dict(batch_size=3, num_workers=2, shuffle=True, seed=4,
              sharding=ferroloader.Sharding(mode=mode))
    procs = list(FERRO.DataLoader(ds, **kw))
    threads = list(FERRO.DataLoader(ds, **kw, **THREAD))
    if mode == "static":
        assert_same(procs, threads)
    else:  # dynamic: shards go to whichever lane asks, the items are the same
        flat = sorted(int(x) for b in procs for x in b)
        assert flat == sorted(int(x) for b in threads for x in b)


# --------------------------------------------------------------------------- #
# faults
# --------------------------------------------------------------------------- #


@ferro_only
@time_limit(60)
def test_an_exception_is_reraised_with_the_threads_traceback():
    it = iter(FERRO.DataLoader(mh.FailingDataset(12, 5), batch_size=2, num_workers=2,
                               **THREAD))
    got = [next(it) for _ in range(2)]
    with pytest.raises(ValueError) as info:
        next(it)
    msg = str(info.value)
    assert "Caught ValueError in DataLoader worker thread 0" in msg
    assert "Traceback" in msg and "__getitem__" in msg
    # as with torch, the iterator goes on after the error
    rest = list(it)
    assert len(got) + len(rest) == 5


@ferro_only
@time_limit(60)
def test_timeout_raises_when_it_passes_and_the_stuck_thread_ends():
    # the stuck thread's batch comes at 5 s: the error (at 1 s) must come
    # well before it, with 3 s for a busy machine's scheduling
    ds = mh.SlowDataset(8, 5.0, slow_from=2)
    it = iter(FERRO.DataLoader(ds, batch_size=2, num_workers=2, timeout=1.0, **THREAD))
    next(it)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 1\.0 seconds"):
        next(it)
    assert time.monotonic() - t0 < 4.0, "the error waited for the stuck worker"
    del it


class _CallLog(mh.SlowDataset):
    """SlowDataset that notes when each ``__getitem__`` call began."""

    def __init__(self, n: int, delay: float) -> None:
        super().__init__(n, delay)
        self.began: list[float] = []

    def __getitem__(self, i: int) -> int:
        self.began.append(time.monotonic())
        return super().__getitem__(i)


@ferro_only
@time_limit(60)
def test_a_dropped_iterators_threads_run_none_of_their_queued_tasks():
    """Worker threads cannot be killed: once their iterator is dropped they
    finish the sample in hand and run none of the tasks queued for them
    (torch's workers fetch nothing once told to stop). Before, each thread
    went on through its queue: prefetch_factor more calls of the dataset."""
    ds = _CallLog(40, 0.5)
    it = iter(FERRO.DataLoader(ds, batch_size=1, num_workers=2, prefetch_factor=4, **THREAD))
    next(it)
    dropped = time.monotonic()
    del it
    assert _no_threads_left()
    after = [t for t in ds.began if t > dropped]
    # at most one call a thread, begun as the drop came (it had taken its
    # task already)
    assert len(after) <= 2, f"{len(after)} calls began after the drop"


@ferro_only
@time_limit(60)
def test_a_dropped_iterator_mid_epoch_ends_its_threads():
    loader = FERRO.DataLoader(mh.MapDataset(400, "dict"), batch_size=2, num_workers=3,
                              **THREAD)
    it = iter(loader)
    next(it)
    assert len(_threads_left()) == 3
    del it
    assert _no_threads_left()


@ferro_only
@time_limit(60)
def test_ctrl_c_in_the_training_loop_ends_the_threads():
    """Ctrl-C (SIGINT reaches the main thread) while it waits for a batch
    raises KeyboardInterrupt there; the iterator goes and its threads end."""
    it = iter(FERRO.DataLoader(mh.SlowDataset(20, 0.5), batch_size=1, num_workers=2,
                               **THREAD))
    # Python's own handler (a test before this one may have left another),
    # and no garbage of earlier tests whose __del__ could run, and swallow
    # the interrupt, while it is being delivered
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    gc.collect()
    timer = threading.Timer(0.3, _thread.interrupt_main)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            for _ in it:
                pass
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    del it
    assert _no_threads_left()


class ExitingDataset(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 3:
            raise SystemExit(4)
        return i


@ferro_only
@time_limit(60)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_ended_by_systemexit_is_a_worker_died_error():
    """``SystemExit`` ends a worker (torch wraps ``Exception``s only): for a
    thread that is a ``WorkerDiedError`` naming the thread, never a hang
    (the thread's exception goes to ``threading.excepthook``)."""
    it = iter(FERRO.DataLoader(ExitingDataset(), batch_size=2, num_workers=2, **THREAD))
    with pytest.raises(ferroloader.WorkerDiedError, match="worker thread 1 exited unexpectedly"):
        list(it)


class SharedIterator(tud.IterableDataset):
    """``__iter__`` returns the dataset itself: one iterator for all threads."""

    def __init__(self) -> None:
        self.k = 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        self.k += 1
        if self.k > 50:
            raise StopIteration
        return self.k


@ferro_only
@time_limit(60)
def test_one_iterator_shared_by_two_threads_is_refused():
    with pytest.raises(RuntimeError, match="__iter__ must return a new iterator"):
        list(FERRO.DataLoader(SharedIterator(), batch_size=2, num_workers=2, **THREAD))


@ferro_only
@time_limit(60)
def test_a_stateful_dataset_needs_processes():
    class Stateful(mh.MapDataset):
        def state_dict(self):
            return {}

        def load_state_dict(self, sd):
            pass

    with pytest.raises(ferroloader.ConfigError, match="worker_method='multiprocessing'"):
        iter(FERRO.DataLoader(Stateful(4), num_workers=2, **THREAD))


class HoldsSharedObjects(mh.MapDataset):
    """Holds what threads cannot share: an open file, a generator, a
    sqlite connection (reads go through them only to show they are used)."""

    def __init__(self, n, path):
        import random
        import sqlite3

        super().__init__(n)
        self.f = open(path, "rb")
        self.rng = random.Random(0)
        self.db = sqlite3.connect(":memory:")
        self.lock = threading.Lock()  # a lock is fine


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("layout", [dict(num_workers=2, worker_method="thread"),
                                    # (an open file and a connection reach a
                                    # worker process only by fork)
                                    dict(num_workers=1, worker_threads=2,
                                         multiprocessing_context="fork")])
def test_objects_threads_cannot_share_are_named_in_a_warning(tmp_path, layout):
    path = tmp_path / "data"
    path.write_bytes(b"x" * 16)
    ds = HoldsSharedObjects(4, str(path))
    try:
        with pytest.warns(ferroloader.ThreadSafetyWarning) as caught:
            assert len(list(FERRO.DataLoader(ds, batch_size=2, **layout))) == 2
        text = [str(w.message) for w in caught if w.category is ferroloader.ThreadSafetyWarning]
        assert len(text) == 3
        assert "'db' is a sqlite3 connection" in text[0]
        assert "'f' is an open file" in text[1] and "os.pread" in text[1]
        assert "'rng' is a random generator (Random)" in text[2]
        assert all(w.filename == __file__ for w in caught
                   if w.category is ferroloader.ThreadSafetyWarning)
    finally:
        ds.f.close()
        ds.db.close()


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("layout", [dict(num_workers=1, worker_method="thread"),
                                    # (an open file reaches a worker process
                                    # only by fork)
                                    dict(num_workers=2, multiprocessing_context="fork"),
                                    dict(num_workers=2, worker_method="thread")])
def test_no_thread_safety_warning_without_sharing_threads(tmp_path, layout):
    """One thread, worker processes (each its own replica), or a dataset
    holding nothing shared: no warning."""
    path = tmp_path / "data"
    path.write_bytes(b"x" * 16)
    ds = HoldsSharedObjects(4, str(path)) if "worker_method" not in layout or \
        layout["num_workers"] == 1 else mh.MapDataset(4)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ferroloader.ThreadSafetyWarning)
            assert len(list(FERRO.DataLoader(ds, batch_size=2, **layout))) == 2
    finally:
        if isinstance(ds, HoldsSharedObjects):
            ds.f.close()
            ds.db.close()


@ferro_only
def test_worker_method_is_checked():
    with pytest.raises(ValueError, match="worker_method option should be"):
        FERRO.DataLoader(mh.MapDataset(4), worker_method="threads")


@ferro_only
def test_thread_workers_need_num_workers():
    """worker_method='thread' with num_workers=0 (no worker to run as a thread) is refused
    at construction with a ValueError saying so, as worker_threads > 1 is."""
    with pytest.raises(ferroloader.ConfigError) as e:
        FERRO.DataLoader(mh.MapDataset(4), worker_method="thread")
    assert isinstance(e.value, ValueError)
    assert str(e.value) == (
        "worker_method='thread' runs num_workers worker threads, and num_workers=0 starts none "
        "(it loads in the main thread): set num_workers >= 1, or leave worker_method at its "
        "default"
    )
    with pytest.raises(ValueError, match="num_workers=0 starts none"):
        FERRO.DataLoader(mh.MapDataset(4), num_workers=0, worker_threads=2)


def _too_many_warnings(lib, **kw) -> list[str]:
    """The worker-count warnings of building a loader with one worker more than the CPUs and
    iterating it twice."""
    n = (torch._utils.cpu_count() or 1) + 1
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loader = lib.DataLoader(list(range(n)), num_workers=n, **kw)
        for _ in range(2):
            list(loader)
    return [str(w.message) for w in seen if "This DataLoader will create" in str(w.message)]


@ferro_only
@time_limit(60)
def test_too_many_worker_threads_are_warned_of_once_as_threads():
    """More worker threads than CPUs: torch's advice once per loader, naming them worker
    threads; worker processes keep torch's own warnings (text and count) exactly."""
    got = _too_many_warnings(FERRO, **THREAD)
    n = (torch._utils.cpu_count() or 1) + 1
    assert len(got) == 1, got
    assert got[0].startswith(f"This DataLoader will create {n} worker threads in total. ")
    assert "worker processes" not in got[0]
    assert _too_many_warnings(FERRO) == _too_many_warnings(TORCH)


@ferro_only
@time_limit(60)
def test_init_fn_errors_reach_the_loop_as_torch_words_them():
    init = functools.partial(mh.failing_init)
    it = iter(FERRO.DataLoader(mh.MapDataset(8), batch_size=2, num_workers=2,
                               worker_init_fn=init, **THREAD))
    with pytest.raises(ValueError, match="init failed in worker 1"):
        list(it)
    del it


class Plain(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n, self.scale = n, 3

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i * self.scale


def _dict_made(obj) -> bool:
    """Whether ``obj``'s attributes live in a dict object (read without
    making one: the garbage collector's view of what it holds)."""
    return any(type(r) is dict for r in gc.get_referents(obj))


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("layout", [dict(num_workers=2, worker_method="thread"),
                                    dict(num_workers="auto")])
def test_the_thread_lint_leaves_the_datasets_attributes_in_place(layout):
    """Reading a dataset's __dict__ (to name what threads cannot share)
    would move its attributes out of the object on CPython 3.11-3.12, and
    slow every attribute read of its __getitem__ for the object's life
    (10 % of a whole epoch of the autotune bench's strings job)."""
    probe = Plain(1)
    probe.__dict__  # noqa: B018 (what the lint must not do)
    if not _dict_made(probe):
        pytest.skip("this Python keeps the attributes in place when __dict__ is read")
    ds = Plain(8)
    assert not _dict_made(ds)
    assert [int(x) for b in FERRO.DataLoader(ds, batch_size=4, **layout) for x in b] == \
        [3 * i for i in range(8)]
    assert not _dict_made(ds)


@ferro_only
@time_limit(60)
def test_an_unsafe_attribute_is_named_once_the_dict_exists(tmp_path):
    """A dataset whose __dict__ was already read is still linted."""
    path = tmp_path / "data"
    path.write_bytes(b"x" * 16)
    ds = HoldsSharedObjects(4, str(path))
    ds.__dict__  # noqa: B018
    try:
        with pytest.warns(ferroloader.ThreadSafetyWarning, match="'f' is an open file"):
            list(FERRO.DataLoader(ds, batch_size=2, num_workers=2, worker_method="thread"))
    finally:
        ds.f.close()
        ds.db.close()


@ferro_only
@time_limit(60)
def test_slots_are_not_linted(tmp_path):
    """Attributes in __slots__ have no names in a __dict__: no warning, as
    before (the lint reads the instance's own dict)."""
    path = tmp_path / "data"
    path.write_bytes(b"x" * 16)

    class Slotted(torch.utils.data.Dataset):
        __slots__ = ("f",)

        def __init__(self, f):
            self.f = f

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i

    with open(path, "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("error", ferroloader.ThreadSafetyWarning)
        assert len(list(FERRO.DataLoader(Slotted(f), batch_size=2, num_workers=2,
                                         worker_method="thread"))) == 2


_EXIT_SCRIPT = """
import sys, torch, ferroloader

class DS:
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.tensor([i])

persistent, epochs, left = sys.argv[1] == "persistent", int(sys.argv[2]), sys.argv[3]
loader = ferroloader.DataLoader(DS(), batch_size=4, shuffle=True, num_workers=2,
                                persistent_workers=persistent, worker_method="thread")
for _ in range(epochs):
    for batch in loader:
        pass
if left == "midway":
    it = iter(loader)
    next(it)
print("done", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent,epochs,left", [
    ("persistent", 1, "whole"), ("persistent", 2, "midway"), ("fresh", 0, "midway"),
])
def test_the_interpreter_exits_cleanly_with_worker_threads_alive(tmp_path, persistent, epochs,
                                                                 left):
    """A script that ends with thread workers still alive (persistent
    workers, an epoch left midway) exits with status 0, as with torch: the
    workers are ended before the interpreter finalises. (They crashed it,
    SIGSEGV or abort, when woken during finalisation.)"""
    script = tmp_path / "exit_with_threads.py"
    script.write_text(_EXIT_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), persistent, str(epochs), left],
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "done"
