"""Faults in multi-process loading: a clear error, never a hang, nothing left behind.

Every test has a timeout (signal method: it fails that test and the run
goes on; see tests/test_suite_guard.py). Where torch defines the
outcome (exception types and messages, the timeout text) the test runs torch
too and compares; the rest are the properties issue 4 states (a dead worker
reported within a second, workers gone when the main process or an iterator
goes away, no zombie, no leaked fd, nothing in /dev/shm).
"""

from __future__ import annotations

import _thread
import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import mp_helpers as mh
import pytest
import torch
from helpers import FERRO, LIBS, TORCH, ferro_only, time_limit

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))





# --------------------------------------------------------------------------- #
# outcomes of an iteration that may raise
# --------------------------------------------------------------------------- #


def _forget_traceback(exc: BaseException) -> BaseException:
    """Drop the traceback frames of `exc` (and its context chain): they hold the
    iterator, whose workers must be shut down when the test lets go of it."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return exc


def _error_of(fn, expected=Exception) -> BaseException:
    """Call fn; return the exception it raised (without traceback frames)."""
    try:
        fn()
    except expected as exc:
        return _forget_traceback(exc)
    raise AssertionError(f"{fn} did not raise")


def _drain(it) -> list:
    """Iterate to the end, recording ('batch', b) or ('error', exception)."""
    out = []
    while True:
        try:
            out.append(("batch", next(it)))
        except StopIteration:
            return out
        except Exception as exc:
            out.append(("error", _forget_traceback(exc)))
            if len(out) > 100:
                return out


def _frames(msg: str, filename: str) -> list:
    """The traceback lines that point into `filename`, each with its source line."""
    lines = msg.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip().startswith("File ") and filename in line:
            out.append(line.strip())
            if i + 1 < len(lines):
                out.append(lines[i + 1].strip())
    return out


def _assert_same_worker_error(e: BaseException, a: BaseException) -> None:
    """Same type, same first line ('Caught X in DataLoader worker process N.'),
    the user's frames of the original traceback, the same last line."""
    assert type(a) is type(e), f"type {type(a).__name__} != torch's {type(e).__name__}: {a}"
    em, am = str(e), str(a)
    assert am.splitlines()[0] == em.splitlines()[0], (
        f"first line {am.splitlines()[0]!r} != torch's {em.splitlines()[0]!r}"
    )
    assert "Original Traceback (most recent call last):" in am, am
    assert am.rstrip().splitlines()[-1] == em.rstrip().splitlines()[-1], (
        f"last line {am.rstrip().splitlines()[-1]!r} != torch's {em.rstrip().splitlines()[-1]!r}"
    )
    user_frames = _frames(em, "mp_helpers.py")
    assert user_frames, f"test bug: torch's traceback has no user frame:\n{em}"
    for line in user_frames:
        assert line in am, f"worker traceback lacks {line!r}:\n{am}"


# --------------------------------------------------------------------------- #
# exceptions in user code
# --------------------------------------------------------------------------- #


@time_limit(60)
@pytest.mark.parametrize("kind", ["value", "key", "runtime", "twoarg"])
def test_worker_exception_reraised_as_torch(kind):
    """An exception in a worker's __getitem__ is re-raised with torch's type and message, and
    the loader works again for the next epoch."""
    errors = {}
    for name, lib in LIBS.items():
        ds = mh.FailingDataset(10, fail_at=5, kind=kind)
        loader = lib.DataLoader(ds, batch_size=2, num_workers=2)
        errors[name] = _error_of(lambda loader=loader: list(loader))
        # The loader still works: a new epoch (fresh workers) after the fault.
        ds.fail_at = None
        assert [b.tolist() for b in loader] == [[i, i + 1] for i in range(0, 10, 2)]
    e, a = errors["torch"], errors["ferroloader"]
    _assert_same_worker_error(e, a)
    assert "in DataLoader worker process 0" in str(a)  # batch [4, 5] is worker 0's
    if kind == "key":
        # torch's KeyErrorMessage: str() is the message itself, not its repr
        assert str(a).startswith("Caught KeyError"), repr(str(a))
    if kind == "twoarg":
        assert type(a) is RuntimeError


@time_limit(60)
def test_iteration_continues_after_worker_exception_as_torch():
    """torch yields the remaining batches after re-raising a worker's error."""
    outcomes = {}
    for name, lib in LIBS.items():
        ds = mh.FailingDataset(12, fail_at=3, kind="value")
        outcomes[name] = _drain(iter(lib.DataLoader(ds, batch_size=2, num_workers=3)))
    e, a = outcomes["torch"], outcomes["ferroloader"]
    assert [k for k, _ in a] == [k for k, _ in e]
    for (k, x), (_, y) in zip(e, a):
        if k == "batch":
            assert x.tolist() == y.tolist()
        else:
            _assert_same_worker_error(x, y)


@time_limit(60)
def test_iterable_dataset_exception_as_torch():
    """An exception in a replica's __iter__: re-raised as torch, then the
    other replicas go on (torch's order)."""
    outcomes = {}
    for name, lib in LIBS.items():
        ds = mh.FailingIterable(5, fail_worker=1, fail_after=2, info_fn=lib.get_worker_info)
        outcomes[name] = _drain(iter(lib.DataLoader(ds, batch_size=2, num_workers=2)))
    e, a = outcomes["torch"], outcomes["ferroloader"]
    assert "error" in [k for k, _ in e], "test bug: torch raised nothing"
    assert [k for k, _ in a] == [k for k, _ in e]
    for (k, x), (_, y) in zip(e, a):
        if k == "batch":
            assert x.tolist() == y.tolist()
        else:
            _assert_same_worker_error(x, y)


@time_limit(60)
def test_collate_fn_exception_as_torch():
    """An exception in collate_fn inside a worker gives the same sequence of batches and errors
    as torch."""
    outcomes = {}
    for name, lib in LIBS.items():
        loader = lib.DataLoader(
            mh.MapDataset(9, "int"), batch_size=3, num_workers=2, collate_fn=mh.failing_collate
        )
        outcomes[name] = _drain(iter(loader))
    e, a = outcomes["torch"], outcomes["ferroloader"]
    assert [k for k, _ in a] == [k for k, _ in e]
    for (k, x), (_, y) in zip(e, a):
        if k == "batch":
            assert x.tolist() == y.tolist()
        else:
            _assert_same_worker_error(x, y)


@time_limit(60)
def test_worker_init_fn_exception_as_torch():
    """An exception in worker_init_fn is re-raised as torch does, naming the worker."""
    errors = {}
    for name, lib in LIBS.items():
        loader = lib.DataLoader(
            mh.MapDataset(8, "int"), batch_size=2, num_workers=2, worker_init_fn=mh.failing_init
        )
        errors[name] = _error_of(lambda loader=loader: list(loader))
    _assert_same_worker_error(errors["torch"], errors["ferroloader"])
    assert "in DataLoader worker process 1" in str(errors["ferroloader"])


# --------------------------------------------------------------------------- #
# a worker dies
# --------------------------------------------------------------------------- #

DEATHS = [
    ("sigkill", r"Killed|SIGKILL|signal 9\b"),
    ("exit3", r"exit(ed)?\b.*\b3\b"),
    ("segv", r"Segmentation fault|SIGSEGV|signal 11\b"),
]


@ferro_only
@time_limit(60)
@pytest.mark.parametrize(("how", "pattern"), DEATHS, ids=[d[0] for d in DEATHS])
# (a fork server's worker is the server's child, not ours: how it ended
# reaches us another way)
@pytest.mark.parametrize("context", [None, "forkserver"])
def test_worker_death_raises_promptly(tmp_path, how, pattern, context):
    """A worker that dies mid-epoch (signal or exit) raises torch's RuntimeError naming it
    within a bounded time, with no worker left."""
    stamp = str(tmp_path / "death")
    ds = mh.DyingDataset(12, die_at=3, how=how, stamp=stamp)
    loader = FERRO.DataLoader(ds, batch_size=1, num_workers=2, multiprocessing_context=context)
    before = mh.spawned()
    got = []

    def consume():
        for b in loader:
            got.append(int(b))

    err = _error_of(consume, RuntimeError)
    t_raised = time.time()
    gc.collect()
    pid, t_death = mh.read_stamp(stamp)
    msg = str(err)
    assert str(pid) in msg, f"message does not name the worker's pid {pid}: {msg!r}"
    assert re.search(pattern, msg), f"message does not name the cause ({pattern}): {msg!r}"
    delay = t_raised - t_death
    assert delay < 2.0, f"the death was reported {delay:.2f} s after it happened"
    assert got == list(range(len(got))) and len(got) <= 3, got
    # The surviving worker is shut down and reaped; the dead one reaped too.
    left = mh.spawned() - before
    assert mh.wait_until(lambda: not mh.alive(left), 3.0), f"left behind: {mh.alive(left)}"
    # A new epoch works.
    ds.die_at = None
    assert [int(b) for b in loader] == list(range(12))


@time_limit(60)
def test_worker_death_while_main_waits_is_reported_not_hung(tmp_path):
    """The main process is blocked waiting for the dead worker's batch
    (the other worker is idle): a RuntimeError, not a hang."""
    stamp = str(tmp_path / "death")
    ds = mh.DyingDataset(4, die_at=0, how="sigkill", stamp=stamp)
    loader = FERRO.DataLoader(ds, batch_size=1, num_workers=1)
    t0 = time.monotonic()
    err = _error_of(lambda: list(loader), RuntimeError)
    assert time.monotonic() - t0 < 10
    pid, _ = mh.read_stamp(stamp)
    assert str(pid) in str(err)


# --------------------------------------------------------------------------- #
# the main process is SIGKILLed
# --------------------------------------------------------------------------- #

_CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    import mp_helpers as mh
    if mh.SELFCHECK:
        import torch.utils.data as lib
    else:
        import ferroloader as lib
    # (a __main__ guard: under forkserver, Python 3.14's default, and
    # spawn, the workers import this script)
    if __name__ == "__main__":
        if sys.argv[2] == "busy":
            ds = mh.SlowDataset(1000, 30.0)  # workers sit in user code
        else:
            ds = mh.TensorDataset(1000, 4096)  # workers idle, prefetch done
        loader = lib.DataLoader(ds, batch_size=4, num_workers=2)
        it = iter(loader)
        if sys.argv[2] == "idle":
            held = [next(it) for _ in range(3)]
        print("READY", flush=True)
        time.sleep(120)
    """
)


@ferro_only
@time_limit(240)  # a loaded CI machine may take a minute to import torch twice
@pytest.mark.parametrize("mode", ["idle", "busy"])
def test_workers_exit_when_main_process_is_killed(tmp_path, mode):
    """Workers exit when the main process is SIGKILLed, idle or busy, and leave nothing in
    /dev/shm."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    shm_before = mh.shm_names()
    tree: set = set()
    child = subprocess.Popen(
        [sys.executable, str(script), TESTS_DIR, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()
        assert line.strip() == "READY", f"child failed: {line!r} {child.stderr.read()}"
        assert mh.wait_until(lambda: len(mh.spawned(child.pid)) >= 2, 60.0)
        time.sleep(0.5)  # busy: the workers are inside __getitem__ now
        tree = mh.descendants_of(child.pid)
        assert len(tree) >= 2, tree
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        t_kill = time.monotonic()
        # Orphans are reparented to init (or a subreaper): a zombie is dead.
        # promptly on a quiet machine (well under a second); 15 s under load
        gone = mh.wait_until(lambda: not mh.alive(tree, zombie_is_dead=True), 15.0)
        assert gone, (
            f"workers still alive {time.monotonic() - t_kill:.1f} s after the main process "
            f"was killed: {mh.alive(tree, zombie_is_dead=True)}"
        )
        leaked = mh.new_shm(shm_before, mh.shm_names(), tree | {child.pid})
        assert not leaked, f"left in /dev/shm: {sorted(leaked)}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for p in mh.alive(tree | mh.descendants_of(child.pid), zombie_is_dead=True):
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if str(script).encode() in f.read():  # only what this test started
                        os.kill(p, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


# --------------------------------------------------------------------------- #
# an iterator dropped mid-epoch, KeyboardInterrupt, persistent workers dropped
# --------------------------------------------------------------------------- #


def _warm_up(lib) -> None:
    """One full epoch first, so that lazily created process-wide resources
    (e.g. multiprocessing's helper process) are not counted as leaks."""
    assert len(list(lib.DataLoader(mh.MapDataset(4, "int"), batch_size=2, num_workers=2))) == 2


def _assert_workers_gone(workers: set, fds_before: int, timeout: float) -> None:
    ok = mh.wait_until(lambda: not mh.alive(workers), timeout)
    assert ok, f"workers not reaped after {timeout} s (state Z = zombie): {mh.alive(workers)}"
    ok = mh.wait_until(lambda: mh.fd_count() <= fds_before, 1.0)
    assert ok, f"fds leaked: {mh.fd_count()} open, {fds_before} before"


@time_limit(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_dropped_iterator_shuts_workers_down(persistent):
    """An iterator dropped mid-epoch (persistent workers or not) ends its workers and closes
    their fds."""
    _warm_up(FERRO)
    gc.collect()
    children_before = mh.spawned()
    fds_before = mh.fd_count()
    loader = FERRO.DataLoader(
        mh.PidDataset(200), batch_size=2, num_workers=2, persistent_workers=persistent
    )
    it = iter(loader)
    batches = [next(it) for _ in range(6)]
    workers = mh.spawned() - children_before
    assert mh.pids_in(batches) <= workers and len(workers) >= 2, (workers, mh.pids_in(batches))
    del batches, it
    if persistent:
        del loader  # persistent workers live as long as the loader
    gc.collect()
    _assert_workers_gone(workers, fds_before, 3.0)


@time_limit(60)
def test_exhausted_iterator_leaves_nothing_behind():
    """An epoch run to its end leaves no worker process and no extra fd behind."""
    _warm_up(FERRO)
    gc.collect()
    children_before = mh.spawned()
    fds_before = mh.fd_count()
    seen = set()
    for b in FERRO.DataLoader(mh.PidDataset(20), batch_size=2, num_workers=2):
        seen |= mh.pids_in(b)
        seen |= mh.spawned() - children_before
    del b  # a held batch may legitimately keep its memory (and fd) alive
    gc.collect()
    _assert_workers_gone(seen, fds_before, 3.0)


@time_limit(60)
@pytest.mark.parametrize(
    "how",
    [
        "sigint",
        # interrupt_main() sets Python's flag without a signal (no EINTR): the
        # wait must look at pending signals by itself (torch notices only at
        # its 5 s status check).
        pytest.param("interrupt_main", marks=ferro_only),
    ],
)
def test_keyboard_interrupt_while_waiting(how):
    """A KeyboardInterrupt arrives while the main process is blocked in
    next(it): it comes promptly (the wait is interruptible), and the workers
    are shut down once the iterator is dropped."""
    _warm_up(FERRO)
    gc.collect()
    children_before = mh.spawned()
    fds_before = mh.fd_count()
    it = iter(FERRO.DataLoader(mh.SlowDataset(8, 2.0), batch_size=1, num_workers=2))
    workers = mh.spawned() - children_before
    fired = []

    def fire():
        fired.append(time.monotonic())
        if how == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            _thread.interrupt_main()

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, fire)
    caught = None
    try:
        timer.start()
        next(it)
        time.sleep(10)  # a late interrupt lands here, never outside the test
    except KeyboardInterrupt:
        caught = time.monotonic()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert fired, "the timer did not fire"
    assert caught is not None, "no KeyboardInterrupt"
    assert caught - fired[0] < 1.0, f"KeyboardInterrupt came {caught - fired[0]:.2f} s late"
    del it
    gc.collect()
    _assert_workers_gone(workers, fds_before, 4.0)


# --------------------------------------------------------------------------- #
# timeout=
# --------------------------------------------------------------------------- #


@time_limit(60)
@pytest.mark.parametrize("timeout", [1, 0.5])
def test_timeout_raises_torch_error(timeout):
    """timeout= raises torch's RuntimeError with torch's message when a batch is late."""
    results = {}
    for name, lib in LIBS.items():
        loader = lib.DataLoader(
            # the late batch comes 4 s after the timeout: the error must
            # come before it, with 3 s for a busy machine's scheduling
            mh.SlowDataset(4, timeout + 4.0, slow_from=1),
            batch_size=1,
            num_workers=1,
            timeout=timeout,
        )
        it = iter(loader)
        assert int(next(it)) == 0
        t0 = time.monotonic()
        err = _error_of(lambda it=it: next(it), RuntimeError)
        elapsed = time.monotonic() - t0
        results[name] = (str(err), elapsed)
        del it
        gc.collect()
    (e_msg, _), (a_msg, a_elapsed) = results["torch"], results["ferroloader"]
    assert e_msg == f"DataLoader timed out after {timeout} seconds"
    assert a_msg == e_msg
    assert timeout * 0.9 <= a_elapsed < timeout + 3.0, f"timed out after {a_elapsed:.2f} s"


@time_limit(60)
@ferro_only
def test_timeout_error_comes_when_the_timeout_passes_even_as_the_iterator_goes():
    """The iterator whose next() timed out is often dropped while the error
    is raised (nothing else refers to it); its stuck worker is not waited
    for (it would not answer), so the error comes when the timeout passes,
    not after a teardown's grace period (5 s)."""
    loader = FERRO.DataLoader(mh.SlowDataset(4, 60.0), batch_size=1, num_workers=1, timeout=1)
    before = mh.spawned()  # a fork server of an earlier test stays
    holder = [iter(loader)]
    workers = mh.spawned() - before
    assert workers, "test bug: no worker process seen"

    def pull() -> None:
        it = holder.pop()
        next(it)  # the only reference: dropped as the error leaves

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
        pull()
    elapsed = time.monotonic() - t0
    assert elapsed < 1 + 2.5, f"the error came after {elapsed:.2f} s"
    assert mh.wait_until(lambda: not mh.alive(workers), 10.0), "the worker was not reaped"


@time_limit(60)
def test_timeout_not_raised_when_batches_arrive_in_time():
    """timeout= does not fire while batches arrive in time; all batches come out in order."""
    for lib in (TORCH, FERRO):
        loader = lib.DataLoader(mh.SlowDataset(6, 0.05), batch_size=1, num_workers=2, timeout=2)
        assert [int(b) for b in loader] == list(range(6))


@ferro_only
@time_limit(60)
def test_iterator_in_a_reference_cycle_is_collected():
    """A dataset that keeps its own loader iterator forms a cycle through the
    engine's objects; the cycle collector must see it (``__traverse__``), so
    the iterator is freed and its workers shut down."""
    before = mh.spawned()  # forkservers etc. of earlier tests
    ds = mh.MapDataset(100)
    it = iter(FERRO.DataLoader(ds, batch_size=4, num_workers=2))
    next(it)
    workers = mh.spawned() - before
    assert len(workers) == 2
    ds.keep = it
    del it, ds
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and workers & mh.spawned():
        time.sleep(0.05)
    assert not workers & mh.spawned(), "workers of a collected iterator stayed"


# --------------------------------------------------------------------------- #
# errors while a worker sets up reach the loop with their type and traceback
# --------------------------------------------------------------------------- #


class _HoldsALambda(torch.utils.data.Dataset):
    """A dataset that does not pickle (a lambda attribute)."""

    def __init__(self) -> None:
        self.f = lambda i: i

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return self.f(i)


@time_limit(120)
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_an_unpicklable_dataset_gets_torchs_hint_and_error(context):
    """A dataset that spawn or forkserver cannot pickle: torch's warning (the pickle error,
    the start method, set_start_method('fork')), then the pickle error itself, as torch."""
    import warnings

    got = {}
    for lib in (TORCH, FERRO):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(Exception) as e:
                list(lib.DataLoader(_HoldsALambda(), num_workers=1,
                                    multiprocessing_context=context))
        hints = [str(w.message) for w in seen if "pickle error" in str(w.message)]
        # (Python 3.14 names the object, at its address)
        got[lib] = (type(e.value), re.sub(r" at 0x[0-9a-f]+", "", str(e.value)), hints)
    want = got[TORCH]
    assert want[2] and "set_start_method('fork')" in want[2][0], "test bug: torch gave no hint"
    assert got[FERRO] == want


@time_limit(120)
@ferro_only
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_dataset_that_fails_to_unpickle_in_a_worker_is_reraised(context):
    """Under spawn and forkserver the worker rebuilds the dataset: an error
    there is the worker's exception (torch's wrapper, the original type,
    message and traceback), not 'exited unexpectedly ... details are lost'.
    ferroloader's StatefulDataLoader raises it from iter(), as torchdata."""
    for cls in (FERRO.DataLoader, FERRO.StatefulDataLoader):
        loader = cls(mh.RefusesToUnpickle(), batch_size=2, num_workers=1,
                     multiprocessing_context=context)
        with pytest.raises(ValueError, match="cannot be rebuilt here") as e:
            list(loader)
        assert "Caught ValueError in DataLoader worker process 0" in str(e.value)
        assert "__setstate__" in str(e.value), "the worker's traceback"


@time_limit(120)
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_tensors_reach_every_spawned_worker(context):
    """Each worker gets its own pickle of the dataset: a tensor's shared
    storage is handed over once per pickle, so one pickle for all workers
    would reach only the first."""
    ds = torch.utils.data.TensorDataset(torch.arange(20.0), torch.arange(20))
    results = [
        [b[1].tolist() for b in lib.DataLoader(ds, batch_size=5, num_workers=2,
                                               multiprocessing_context=context)]
        for lib in (TORCH, FERRO)
    ]
    assert results[0] == results[1] == [list(range(k, k + 5)) for k in range(0, 20, 5)]


@time_limit(120)
@ferro_only
def test_a_table_file_gone_before_a_spawned_worker_opens_it(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is a test extra")
    import pyarrow.ipc as ipc

    path = tmp_path / "t.arrow"
    t = pa.table({"x": list(range(10))})
    with ipc.new_file(str(path), t.schema) as w:
        w.write_table(t)
    ds = FERRO.TableDataset(str(path))
    os.remove(path)  # this process keeps its mapping; a new one cannot open it
    loader = FERRO.DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(FileNotFoundError, match="worker process 0"):
        list(loader)
