"""pin_memory=True without a GPU: both pin paths, checked against torch.

A fake accelerator makes torch and ferroloader take their pin paths with
the same stand-in for ``Tensor.pin_memory`` (a copy, or the tensor itself
where the fake CUDA runtime registered its memory), so batches, errors and
the thread that pinned can be compared with torch's in one run. The pinned
arenas run over ``_core._FakeCudaRuntime``, a model of the CUDA runtime
whose streams queue asynchronous copies that read host memory only when the
test runs the stream: a record reused too early shows up as a torn batch.
The CUDA tests at the end check the real thing and skip without CUDA.
"""

from __future__ import annotations

import gc
import os
import threading
from typing import Any, Callable, Optional

import ferroloader
import mp_helpers as mh
import pytest
import torch
import torch.utils.data as tud
from ferroloader import _core
from ferroloader.run import pinning
from helpers import FERRO, TORCH, assert_same, ferro_only, needs_test_doubles, time_limit

PIN_THREAD = "pt_data_pin"


class PinLog:
    """The stand-in for ``Tensor.pin_memory``: records which thread pinned
    and whether it copied; memory the fake runtime registered is pinned
    already (torch's ``pin_memory`` returns such a tensor itself)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, bool, float]] = []
        self.runtime: Optional[_core._FakeCudaRuntime] = None
        self.fail_on: Optional[float] = None

    def registered(self, t: torch.Tensor) -> bool:
        if self.runtime is None:
            return False
        p, n = t.data_ptr(), t.nbytes
        return any(a <= p and p + n <= a + length for a, length in self.runtime.registered)

    def pin(self, t: torch.Tensor, device: Any = None) -> torch.Tensor:
        first = float(t.flatten()[0]) if t.numel() else float("nan")
        if self.fail_on is not None and first == self.fail_on:
            raise ValueError(f"cannot pin the batch starting with {first}")
        in_place = self.registered(t)
        with self.lock:
            self.calls.append((threading.current_thread().name, not in_place, first))
        return t if in_place else t.clone()

    def count(self) -> int:
        with self.lock:
            return len(self.calls)

    def threads(self) -> set[str]:
        with self.lock:
            return {name for name, _, _ in self.calls}

    def copies(self) -> int:
        with self.lock:
            return sum(copied for _, copied, _ in self.calls)

    def clear(self) -> None:
        with self.lock:
            self.calls.clear()


@pytest.fixture
def fake_accelerator(monkeypatch):
    """torch sees an accelerator ("cuda") and pins with :class:`PinLog`."""
    log = PinLog()
    # On a CUDA machine the real runtime would register the arenas and no
    # batch would reach the stand-in: these tests are the pin thread's and
    # the fake runtime's (the CUDA tests at the end check the real one).
    monkeypatch.setenv("FERROLOADER_DISABLE", "cuda-register")
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda")
    )
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda i: None)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, device=None: log.pin(t, device))
    yield log


@pytest.fixture
def fake_cuda(fake_accelerator, monkeypatch):
    """Pinned arenas over the fake CUDA runtime; yields ``(runtime, log)``."""
    needs_test_doubles()
    rt = _core._FakeCudaRuntime()
    fake_accelerator.runtime = rt
    arena = lambda device: _checked(_core._fake_pin_arena(rt, _current(rt)))  # noqa: E731
    monkeypatch.setattr(pinning, "_arena", arena)
    yield rt, fake_accelerator


def _checked(arena: Any) -> Any:
    """``arena``, or ``None`` when its runtime refuses to register memory
    (what ``pinning._cuda_arena`` checks of the real runtime)."""
    return arena if arena.check() is None else None


def _current(rt: _core._FakeCudaRuntime) -> Callable[[], Any]:
    return lambda: [rt.current] if rt.current is not None else []


class Blocks(tud.Dataset):
    """Sample i: a float tensor of `size` copies of i (a torn copy is seen)."""

    def __init__(self, n: int, size: int = 4096) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((self.size,), float(i))


def _outcomes(it: Any, limit: int = 100) -> list:
    """Every next() of `it` until StopIteration: batches, or the error's type
    and first line (iteration goes on after an error, as in torch)."""
    out: list = []
    for _ in range(limit):
        try:
            out.append(("batch", next(it)))
        except StopIteration:
            return out
        except Exception as e:
            out.append(("error", type(e), str(e).splitlines()[0]))
    raise AssertionError("did not stop")


def _expected_block(k: int, batch: int, size: int) -> torch.Tensor:
    return torch.arange(k * batch, k * batch + batch, dtype=torch.float32)[:, None].expand(
        batch, size
    )


# --------------------------------------------------------------------------- #
# the pin thread (no registration possible)
# --------------------------------------------------------------------------- #


@ferro_only
@time_limit(120)
@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
@pytest.mark.parametrize("kind", ["dict", "tuple"])
def test_pin_thread_gives_torchs_batches_pinned_off_the_training_loop(
    fake_accelerator, kind, method
):
    """Without registration, batches equal torch's pinned batches and are
    pinned on a thread named as torch's, never on the training loop's (with
    worker processes and with worker threads)."""
    ds = mh.MapDataset(12, kind)
    expected = list(TORCH.DataLoader(ds, batch_size=2, num_workers=2, pin_memory=True))
    assert fake_accelerator.count() and "MainThread" not in fake_accelerator.threads(), (
        "test bug: torch did not pin on its thread"
    )
    fake_accelerator.clear()
    loader = FERRO.DataLoader(ds, batch_size=2, num_workers=2, pin_memory=True,
                              worker_method=method)
    it = iter(loader)
    assert type(it).__name__ == "_PinnedMultiProcessIter"
    got = list(it)
    assert_same(expected, got)
    assert fake_accelerator.threads() == {PIN_THREAD}
    assert fake_accelerator.copies() > 0
    stats = loader.stats()
    assert stats.batches == 6 and stats.pin > 0


@ferro_only
@time_limit(120)
def test_a_custom_batch_pin_memory_method_runs_on_the_pin_thread(fake_accelerator):
    """A collate_fn's batch type with its own pin_memory() is pinned by that
    method, on the pin thread, with torch's results."""
    kw = dict(batch_size=3, num_workers=2, pin_memory=True, collate_fn=mh.collate_pinnable)
    expected = list(TORCH.DataLoader(list(range(9)), **kw))
    fake_accelerator.clear()
    got = list(FERRO.DataLoader(list(range(9)), **kw))
    assert [b.data.tolist() for b in got] == [b.data.tolist() for b in expected]
    assert all(b.pinned_by_method for b in got)
    assert fake_accelerator.threads() == {PIN_THREAD}


class PinFails:
    """A batch type whose pin_memory() fails for the batch holding `bad`."""

    def __init__(self, data: torch.Tensor, bad: int) -> None:
        self.data, self.bad = data, bad

    def pin_memory(self) -> PinFails:
        if self.bad in self.data.tolist():
            raise KeyError(f"batch {self.data.tolist()} cannot be pinned")
        return self


def _collate_failing_pin(batch: list) -> PinFails:
    return PinFails(torch.tensor(batch), 4)


@ferro_only
@time_limit(120)
def test_pin_errors_are_raised_as_torchs_pin_thread_raises_them(fake_accelerator):
    """An error while pinning is re-raised with torch's type and message
    ("Caught KeyError in pin memory thread for device 0."), and the epoch
    goes on with the next batches, as in torch."""
    kw = dict(batch_size=2, num_workers=2, pin_memory=True, collate_fn=_collate_failing_pin)
    expected = _outcomes(iter(TORCH.DataLoader(list(range(10)), **kw)))
    got = _outcomes(iter(FERRO.DataLoader(list(range(10)), **kw)))
    assert [o[1:] for o in got if o[0] == "error"] == [
        o[1:] for o in expected if o[0] == "error"
    ]
    assert [o[1:] for o in expected if o[0] == "error"] == [
        (KeyError, "Caught KeyError in pin memory thread for device 0.")
    ]
    assert [o[1].data.tolist() for o in got if o[0] == "batch"] == [
        o[1].data.tolist() for o in expected if o[0] == "batch"
    ]


@ferro_only
@time_limit(120)
def test_the_pin_thread_pins_the_next_batch_during_the_training_step(fake_accelerator):
    """While the training loop holds batch k (and does not call next()),
    batch k+1 gets pinned: a waiting batch is pinned ahead, not inside
    next()."""
    it = iter(FERRO.DataLoader(Blocks(8, 16), batch_size=1, num_workers=2, pin_memory=True))
    for k in range(6):
        b = next(it)
        assert float(b[0, 0]) == k
        assert mh.wait_until(lambda k=k: fake_accelerator.count() >= k + 2, timeout=20), (
            f"batch {k + 1} was not pinned while the loop held batch {k}"
        )
    assert fake_accelerator.threads() == {PIN_THREAD}
    del it


@ferro_only
@time_limit(180)
@pytest.mark.parametrize("iterable", [False, True])
def test_a_snapshot_with_batches_pinned_ahead_resumes_exactly(fake_accelerator, iterable):
    """state_dict() taken while the pin thread holds batches not yet handed
    over counts only those handed over: a resumed loader yields exactly the
    rest of the uninterrupted epoch."""
    if iterable:
        ds: Any = mh.ShardedIterable([13, 9], ferroloader.get_worker_info)
        kw: dict = dict(batch_size=2, num_workers=2)
    else:
        ds = mh.MapDataset(24)
        kw = dict(batch_size=2, num_workers=2, shuffle=True, seed=5)
    whole = [b.tolist() for b in FERRO.DataLoader(ds, **kw)]
    loader = FERRO.DataLoader(ds, pin_memory=True, **kw)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(4)]
    # the thread has pinned ahead of the loop by now
    assert mh.wait_until(lambda: fake_accelerator.count() >= 6, timeout=20)
    state = loader.state_dict()
    del it
    again = FERRO.DataLoader(ds, pin_memory=True, **kw)
    again.load_state_dict(state)
    tail = [b.tolist() for b in again]
    assert head + tail == whole


@ferro_only
@time_limit(180)
def test_pin_thread_with_breaks_persistent_epochs_and_a_dropped_iterator(fake_accelerator):
    """A break mid-epoch, then whole epochs on persistent workers; a dropped
    loader ends its workers and its pin thread."""
    loader = FERRO.DataLoader(
        Blocks(10, 8), batch_size=2, num_workers=2, pin_memory=True, persistent_workers=True
    )
    for i, _ in enumerate(loader):
        if i == 1:
            break
    for _ in range(2):
        assert [float(b[0, 0]) for b in loader] == [0.0, 2.0, 4.0, 6.0, 8.0]
    workers = {w.pid for w in loader._iterator._procs}
    assert len(workers) == 2
    del loader, _
    gc.collect()
    assert mh.wait_until(lambda: not mh.alive(workers, zombie_is_dead=True), 20)
    assert mh.wait_until(
        lambda: not any(t.name == PIN_THREAD for t in threading.enumerate()), 20
    ), "a pin thread outlived its loader"


@ferro_only
@time_limit(120)
def test_pin_thread_reraises_worker_errors_and_names_a_dead_worker(fake_accelerator, tmp_path):
    """A worker's exception reaches the loop with its type and torch's
    message; a killed worker raises WorkerDiedError, not a hang."""
    kw = dict(batch_size=1, num_workers=2, pin_memory=True)
    expected = _outcomes(iter(TORCH.DataLoader(mh.FailingDataset(6, 3), **kw)))
    got = _outcomes(iter(FERRO.DataLoader(mh.FailingDataset(6, 3), **kw)))
    assert [o[1:] for o in got if o[0] == "error"] == [
        o[1:] for o in expected if o[0] == "error"
    ]
    assert len(got) == len(expected) == 6
    ds = mh.DyingDataset(8, die_at=3, how="sigkill", stamp=str(tmp_path / "stamp"))
    with pytest.raises(ferroloader.WorkerDiedError):
        list(FERRO.DataLoader(ds, **kw))


# --------------------------------------------------------------------------- #
# pinned arenas (the fake CUDA runtime)
# --------------------------------------------------------------------------- #


@ferro_only
@time_limit(120)
@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_registered_arenas_pin_batches_where_they_lie(fake_cuda, method):
    """With registration, batches equal torch's, their tensors lie in
    registered memory and pin_memory copies nothing; each worker's arena is
    registered once, not per batch or per epoch (worker threads' arenas as
    worker processes')."""
    rt, log = fake_cuda
    ds = mh.MapDataset(16, "dict")
    expected = list(TORCH.DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True))
    log.clear()
    loader = FERRO.DataLoader(
        ds, batch_size=4, num_workers=2, pin_memory=True, persistent_workers=True,
        worker_method=method,
    )
    got = list(loader)
    assert_same(expected, got)
    for b in got:
        assert log.registered(b["x"]) and log.registered(b["arr"])
    assert log.copies() == 0, "a registered batch was copied"
    assert log.threads() == {"MainThread"}
    # one page is registered once by the check before the arenas
    segments = [c for c in rt.register_calls if c[1] > 4096]
    assert len(segments) == 2, rt.register_calls
    calls = len(rt.register_calls)
    assert_same(expected, list(loader))
    assert len(rt.register_calls) == calls, "an epoch registered again"
    del loader, got, b
    gc.collect()


def _copy_every_batch(rt, it, stream: int, run_at: int, join: bool = False):
    """Queues an asynchronous copy of each batch on `stream`, drops the
    batch at once (then, with `join`, makes the default stream wait for
    `stream`, as a prefetcher does before using the copy), and runs the
    streams after batch `run_at`. Returns the batches whose copy read
    something else than the batch."""
    ops = []
    k = -1
    # not enumerate(): its result tuple keeps the last batch alive
    for b in it:
        k += 1
        ops.append((k, rt.copy_async(b.data_ptr(), b.nbytes, stream)))
        del b
        if join:
            rt.wait_stream(0, stream)
        if k == run_at:
            rt.run(stream)
            rt.run(0)
    torn = []
    for k, op in ops[: run_at + 1]:
        raw = rt.result(op)
        got = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(4, -1)
        if not torch.equal(got, _expected_block(k, 4, got.shape[1])):
            torn.append(k)
    return torn


@ferro_only
@time_limit(120)
@pytest.mark.parametrize("guard", [True, False])
def test_the_reuse_guard_keeps_a_record_until_its_copy_has_run(fake_cuda, monkeypatch, guard):
    """An asynchronous copy queued from a batch that is dropped at once reads
    that batch when its stream runs later: the record waits for the copy.
    With the guard off (only for this test), the same copies read batches
    written later into the reused records: the test would catch the bug."""
    rt, _ = fake_cuda
    monkeypatch.setattr(
        pinning,
        "_arena",
        lambda device: _checked(_core._fake_pin_arena(rt, _current(rt), guard=guard)),
    )

    def run() -> list:
        rt.current = (0, 7)
        loader = FERRO.DataLoader(Blocks(64), batch_size=4, num_workers=1, pin_memory=True)
        it = iter(loader)
        rt.current = (0, 0)

        class Taker:
            def __iter__(self):
                while True:
                    rt.current = (0, 7)  # next() runs with stream 7 current
                    try:
                        b = next(it)
                    except StopIteration:
                        return
                    rt.current = (0, 0)
                    yield b

        torn = _copy_every_batch(rt, Taker(), stream=7, run_at=12)
        rt.run(0)
        return torn

    torn = run()
    if guard:
        assert torn == [], f"copies of batches {torn} read reused records"
        # fences are taken where the pin thread freed records between two
        # next() calls (13 on a quiet machine, 12 under load); a run where
        # none was (a starved pin thread) did not test the guard: run again
        for _ in range(3):
            if rt.fences > 0:
                break
            torn = run()
            assert torn == [], f"copies of batches {torn} read reused records"
        assert rt.fences > 0
    else:
        assert len(torn) >= 6, f"test bug: without the guard only {torn} tore"


@ferro_only
@time_limit(120)
def test_the_guard_covers_a_side_stream_joined_before_the_next_batch(fake_cuda):
    """timm's and apex's prefetchers call next() on the default stream, copy
    on a side stream, drop the CPU batch, and make the default stream wait
    for the side stream before their next next(): the fence taken then on
    the default stream covers the copy."""
    rt, _ = fake_cuda
    rt.current = (0, 0)
    it = iter(FERRO.DataLoader(Blocks(64), batch_size=4, num_workers=1, pin_memory=True))
    torn = _copy_every_batch(rt, it, stream=9, run_at=12, join=True)
    assert torn == []


@ferro_only
@time_limit(120)
def test_arenas_are_unregistered_only_after_the_last_held_batch_and_its_copy(fake_cuda):
    """Held batches keep their segments registered after the loader is
    gone; dropping them unregisters every segment once their copies ran."""
    rt, _ = fake_cuda
    rt.current = (0, 3)
    held = list(FERRO.DataLoader(Blocks(32), batch_size=4, num_workers=2, pin_memory=True))
    for b in held:
        rt.copy_async(b.data_ptr(), b.nbytes, 3)
    gc.collect()
    # the arenas' segments (the one-page check before them comes and goes)
    segments = sorted(a for a, n in rt.register_calls if n > 4096)
    assert len(segments) == 2

    def unregistered() -> list:
        return sorted(a for a in rt.unregister_calls if a in segments)

    assert unregistered() == [], "unregistered under held batches"
    del held, b
    gc.collect()
    assert unregistered() == [], "unregistered before the copies ran"
    rt.run(3)
    assert mh.wait_until(lambda: unregistered() == segments, 20), (rt.unregister_calls, segments)


@ferro_only
@time_limit(120)
def test_a_runtime_that_refuses_registration_falls_back_to_the_pin_thread(fake_cuda):
    """Where shared memory cannot be registered, batches are pinned (copied)
    on the pin thread, with torch's results."""
    rt, log = fake_cuda
    rt.fail_registration(True)
    ds = mh.MapDataset(8, "dict")
    expected = list(TORCH.DataLoader(ds, batch_size=2, num_workers=2, pin_memory=True))
    log.clear()
    it = iter(FERRO.DataLoader(ds, batch_size=2, num_workers=2, pin_memory=True))
    assert type(it).__name__ == "_PinnedMultiProcessIter"
    assert_same(expected, list(it))
    assert log.threads() == {PIN_THREAD} and log.copies() > 0


@ferro_only
@time_limit(120)
def test_a_custom_collate_over_registered_arenas_pins_on_the_thread_without_copying(fake_cuda):
    """A custom batch type's pin_memory() runs on the pin thread; its tensors
    lie in registered memory, so nothing is copied."""
    _, log = fake_cuda
    kw = dict(batch_size=3, num_workers=2, pin_memory=True, collate_fn=mh.collate_pinnable)
    got = list(FERRO.DataLoader(list(range(9)), **kw))
    assert [b.data.tolist() for b in got] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert all(b.pinned_by_method and log.registered(b.data) for b in got)
    assert log.threads() == {PIN_THREAD} and log.copies() == 0


def test_pinning_without_an_accelerator_stays_torchs():
    """No accelerator: no arena, no thread (torch warns and does not pin)."""
    if torch.accelerator.is_available():
        pytest.skip("needs a machine without accelerator")
    loader = FERRO.DataLoader(list(range(4)), batch_size=2, pin_memory=True)
    with pytest.warns(UserWarning, match="no accelerator is found"):
        pin = pinning.settings(loader)
    assert pinning.plan(loader, pin) == (None, False)


def test_the_cuda_runtime_is_found_only_where_torch_loaded_it():
    """The runtime library is looked up in the process's own mappings."""
    path = pinning.cuda_runtime_path()
    if path is not None:
        assert "libcudart.so" in path and os.path.exists(path)
    with pytest.raises(ferroloader.ConfigError, match="nonexistent"):
        _core.PinArena.cuda("/nonexistent/libcudart.so.12", lambda: None)


# --------------------------------------------------------------------------- #
# the real thing
# --------------------------------------------------------------------------- #

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
@time_limit(180)
def test_cuda_batches_are_pinned_in_place_and_equal_torchs():
    """With CUDA, multi-process batches are pinned where they lie (a
    registered arena, no copy: their storage is the arena's), equal torch's,
    and copy to the GPU with non_blocking=True correctly."""
    ds = mh.MapDataset(32, "dict")
    expected = list(TORCH.DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True))
    if pinning.cuda_runtime_path() is None:
        pytest.skip("torch's CUDA runtime is not a separate libcudart.so here: no registration")
    loader = FERRO.DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True)
    it = iter(loader)
    assert type(it).__name__ == "_MultiProcessIter", "registration failed here"
    got = list(it)
    assert_same(expected, got)
    counts = it._pin_counts
    # segments registered, none failed, no record released without a fence
    assert counts is not None and counts[0] >= 2 and counts[2] == 0 and counts[5] == 0, counts
    for b in got:
        assert b["x"].is_pinned() and b["arr"].is_pinned()
        assert torch.equal(b["x"].to("cuda", non_blocking=True).cpu(), b["x"])


@needs_cuda
@time_limit(180)
def test_cuda_reuse_guard_under_a_slow_stream():
    """Copies queued behind a long GPU kernel on a side stream, each CPU
    batch dropped at once: every copy still reads its own batch."""
    stream = torch.cuda.Stream()
    size = 1 << 18
    loader = FERRO.DataLoader(Blocks(96, size), batch_size=4, num_workers=2, pin_memory=True)
    outs = []
    big = torch.randn(4096, 4096, device="cuda")
    with torch.cuda.stream(stream):
        for k, b in enumerate(loader):
            if k % 8 == 0:
                for _ in range(8):
                    big = big @ big  # keeps the stream busy while batches are freed
                    big = big / big.norm()
            outs.append(b.to("cuda", non_blocking=True))
            del b
    torch.cuda.synchronize()
    for k, o in enumerate(outs):
        assert torch.equal(o.cpu(), _expected_block(k, 4, size)), f"batch {k} torn"


@needs_cuda
@time_limit(180)
def test_cuda_custom_batch_pin_memory_and_registration_refused(monkeypatch):
    """A custom batch type's pin_memory() leaves its data pinned; with
    registration disabled, batches are still pinned (by the pin thread)."""
    kw = dict(batch_size=3, num_workers=2, pin_memory=True, collate_fn=mh.collate_pinnable)
    got = list(FERRO.DataLoader(list(range(9)), **kw))
    assert all(b.pinned_by_method and b.data.is_pinned() for b in got)
    monkeypatch.setenv("FERROLOADER_DISABLE", "cuda-register")
    it = iter(FERRO.DataLoader(mh.MapDataset(8, "dict"), batch_size=2, num_workers=2,
                               pin_memory=True))
    assert type(it).__name__ == "_PinnedMultiProcessIter"
    assert all(b["x"].is_pinned() for b in it)


@ferro_only
@time_limit(120)
def test_a_pin_error_over_registered_arenas_reads_as_torchs_pin_thread_error(fake_cuda):
    """Over registered arenas batches are pinned on the training loop's
    thread (by the engine, in next()); an error there is re-raised as
    torch's pin thread re-raises it, and the epoch goes on."""
    _, log = fake_cuda
    log.fail_on = 4.0  # the second batch
    kw = dict(batch_size=4, num_workers=2, pin_memory=True)
    expected = _outcomes(iter(TORCH.DataLoader(torch.arange(12.0), **kw)))
    got = _outcomes(iter(FERRO.DataLoader(torch.arange(12.0), **kw)))
    errors = [o[1:] for o in expected if o[0] == "error"]
    assert errors == [(ValueError, "Caught ValueError in pin memory thread for device 0.")]
    assert [o[1:] for o in got if o[0] == "error"] == errors
    assert [o[1].tolist() for o in got if o[0] == "batch"] == [
        o[1].tolist() for o in expected if o[0] == "batch"
    ]
    assert "MainThread" in log.threads(), "the batches were not pinned inline"
