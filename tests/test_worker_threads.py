"""Threads inside worker processes (``worker_threads=k``).

``num_workers=P, worker_threads=k`` runs ``P * k`` workers: worker ``i`` is a
thread of process ``i % P``. Each worker is one to the engine, the state and
``get_worker_info()``, so the batches equal torch's with ``P * k`` worker
processes (for map-style data: with any count); what threads share (the
process, its dataset replica, its global generators) is checked on its own.
"""

from __future__ import annotations

import functools
import os
import threading

import ferroloader
import mp_helpers as mh
import pytest
import shard_cases
import torch
import torch.utils.data as tud
from helpers import FERRO, TORCH, assert_same, ferro_only, time_limit
from test_threads import GeneratorDraws, SharedIterator


@pytest.fixture(autouse=True)
def _processes_end():
    """Every test leaves none of its worker processes behind."""
    before = mh.live_workers()
    yield
    assert mh.wait_until(lambda: not (mh.live_workers() - before), 20.0), "worker processes left"


# --------------------------------------------------------------------------- #
# same batches as torch with P * k worker processes
# --------------------------------------------------------------------------- #


@ferro_only
@time_limit(60)
@pytest.mark.parametrize(("procs", "threads", "prefetch"), [(1, 2, 2), (2, 2, 1), (1, 3, 3)])
def test_map_batches_match_torch(procs, threads, prefetch):
    """Shuffled batches from threads finishing out of order arrive in sampler
    order and equal torch's; the main process's generators after it too."""
    kw = dict(batch_size=3, shuffle=True, prefetch_factor=prefetch)
    e = mh.run_side(TORCH, lambda lib: mh.JitterDataset(20, "dict"), seed=11,
                    num_workers=procs * threads, **kw)
    a = mh.run_side(FERRO, lambda lib: mh.JitterDataset(20, "dict"), seed=11,
                    num_workers=procs, worker_threads=threads, **kw)
    assert_same(e.epochs, a.epochs)
    assert torch.equal(e.rng[0], a.rng[0]) and e.rng[1:] == a.rng[1:]


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("kind", ["dict", "tensor", "numpy", "nested"])
def test_sample_kinds_over_persistent_workers_match_torch(kind):
    kw = dict(batch_size=4, persistent_workers=True, epochs=2)
    e = mh.run_side(TORCH, lambda lib: mh.MapDataset(10, kind), num_workers=4, **kw)
    a = mh.run_side(FERRO, lambda lib: mh.MapDataset(10, kind), num_workers=2,
                    worker_threads=2, **kw)
    assert_same(e.epochs, a.epochs)


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("batch_size", [None, 2])
def test_iterable_sharded_with_get_worker_info_matches_torch(batch_size):
    """An iterable dataset sharding with torch's ``get_worker_info()`` sees
    ``P * k`` workers, each thread its own id: torch's batches with ``P * k``
    processes, in its order."""
    def run(lib, **kw):
        ds = mh.ShardedIterable([5, 3, 4, 2], tud.get_worker_info)
        return list(lib.DataLoader(ds, batch_size=batch_size, **kw))

    assert_same(run(TORCH, num_workers=4), run(FERRO, num_workers=2, worker_threads=2))


@ferro_only
@time_limit(60)
def test_workers_are_threads_of_processes_round_robin():
    """Worker ``i`` runs in process ``i % P``: two processes, each serving
    two worker ids, all sharing their process's replica; ``worker_init_fn``
    runs once per worker with its id, inside its thread."""
    ds = mh.WorkerInfoDataset(16, tud.get_worker_info)
    batches = list(FERRO.DataLoader(ds, batch_size=1, num_workers=2, worker_threads=2))
    pid_of = {}
    for b in batches:
        pid_of.setdefault(int(b["id"]), set()).add(int(b["pid"]))
        assert int(b["num_workers"]) == 4 and bool(b["dataset_is_self"])
    assert sorted(pid_of) == [0, 1, 2, 3]
    assert all(len(p) == 1 for p in pid_of.values())
    pid = {w: next(iter(p)) for w, p in pid_of.items()}
    assert pid[0] == pid[2] != pid[1] == pid[3] != os.getpid()
    seeds = {int(b["id"]): int(b["seed"]) for b in batches}
    assert seeds == {w: seeds[0] + w for w in range(4)}
    assert ferroloader.get_worker_info() is None


def _record_init(path, worker_id):
    info = tud.get_worker_info()
    with open(path, "a") as f:
        f.write(f"{worker_id} {info.id} {info.worker_method} {threading.get_ident()}\n")


@ferro_only
@time_limit(60)
def test_init_fn_runs_in_each_thread_with_its_record(tmp_path):
    log = tmp_path / "init"
    init = functools.partial(_record_init, str(log))
    list(FERRO.DataLoader(mh.MapDataset(8), batch_size=2, num_workers=2, worker_threads=3,
                          worker_init_fn=init))
    rows = [line.split() for line in log.read_text().splitlines()]
    assert sorted(int(r[0]) for r in rows) == list(range(6))
    assert all(r[0] == r[1] and r[2] == "thread" for r in rows)
    assert len({r[3] for r in rows}) >= 3  # threads of one process differ


@ferro_only
@time_limit(60)
@pytest.mark.skipif(not hasattr(torch, "thread_safe_generator"),
                    reason="this torch has no torch.thread_safe_generator (newer than 2.11)")
def test_thread_generators_draw_what_torchs_processes_draw():
    """Each thread's generators are seeded as torch seeds a worker process's
    globals: a dataset drawing from ``torch.thread_safe_generator()`` and the
    record's ``rng`` gets torch's batches with ``P * k`` processes."""
    kw = dict(batch_size=3, shuffle=True, epochs=2)
    e = mh.run_side(TORCH, lambda lib: GeneratorDraws(14), seed=5, num_workers=4, **kw)
    a = mh.run_side(FERRO, lambda lib: GeneratorDraws(14), seed=5, num_workers=2,
                    worker_threads=2, **kw)
    assert_same(e.epochs, a.epochs)


@ferro_only
@time_limit(60)
def test_spawned_processes_run_threads_too():
    """spawn pickles the dataset once per process; its threads share it."""
    kw = dict(batch_size=2, shuffle=True, generator_seed=1)
    e = mh.run_side(TORCH, lambda lib: mh.MapDataset(12, "dict"), num_workers=2, **kw)
    a = mh.run_side(FERRO, lambda lib: mh.MapDataset(12, "dict"), num_workers=1,
                    worker_threads=2, multiprocessing_context="spawn", **kw)
    assert_same(e.epochs, a.epochs)


# --------------------------------------------------------------------------- #
# state and sharding: P * k workers
# --------------------------------------------------------------------------- #


@ferro_only
@time_limit(90)
@pytest.mark.parametrize(("before", "after"), [((2, 2), (2, 2)), ((1, 2), (2, 1)),
                                               ((2, 1), (1, 2))])
def test_iterable_resume_with_as_many_workers_is_exact(before, after):
    """An iterable's position lives in its workers: a snapshot of ``P * k``
    workers resumes on any layout of as many (processes or threads), with
    exactly the rest of the uninterrupted epoch."""
    def loader(p, k):
        ds = mh.ShardedIterable([7, 5, 4, 6][: p * k], tud.get_worker_info)
        return FERRO.DataLoader(ds, batch_size=2, num_workers=p, worker_threads=k)

    whole = [b.tolist() for b in loader(*before)]
    first = loader(*before)
    it = iter(first)
    head = [next(it).tolist() for _ in range(3)]
    sd = first.state_dict()
    del it
    resumed = loader(*after)
    resumed.load_state_dict(sd)
    assert head + [b.tolist() for b in resumed] == whole


@ferro_only
@time_limit(60)
def test_iterable_resume_with_other_worker_count_is_refused():
    ds = mh.ShardedIterable([7, 5], tud.get_worker_info)
    first = FERRO.DataLoader(ds, batch_size=2, num_workers=1, worker_threads=2)
    it = iter(first)
    next(it)
    sd = first.state_dict()
    del it
    other = FERRO.DataLoader(ds, batch_size=2, num_workers=2, worker_threads=2)
    other.load_state_dict(sd)
    with pytest.raises(ferroloader.StateMismatchError,
                       match=r"saved with num_workers=2 .*num_workers=2 x worker_threads=2"):
        iter(other)


@ferro_only
@time_limit(90)
def test_map_resume_is_exact_across_layouts():
    kw = dict(batch_size=2, shuffle=True, seed=3)
    whole = [b.tolist() for b in FERRO.DataLoader(mh.MapDataset(22), num_workers=2, **kw)]
    first = FERRO.DataLoader(mh.MapDataset(22), num_workers=2, worker_threads=2, **kw)
    it = iter(first)
    head = [next(it).tolist() for _ in range(4)]
    sd = first.state_dict()
    del it
    resumed = FERRO.DataLoader(mh.MapDataset(22), num_workers=1, worker_threads=3, **kw)
    resumed.load_state_dict(sd)
    assert head + [b.tolist() for b in resumed] == whole


@ferro_only
@time_limit(90)
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_sharded_dataset_equals_processes(mode):
    ds = shard_cases.Counted()
    kw = dict(batch_size=3, shuffle=True, seed=4, sharding=ferroloader.Sharding(mode=mode))
    procs = list(FERRO.DataLoader(ds, num_workers=2, **kw))
    threads = list(FERRO.DataLoader(ds, num_workers=1, worker_threads=2, **kw))
    if mode == "static":
        assert_same(procs, threads)
    else:  # dynamic: shards go to whichever lane asks, the items are the same
        assert sorted(int(x) for b in procs for x in b) == sorted(
            int(x) for b in threads for x in b)


@ferro_only
@time_limit(60)
@pytest.mark.skipif(not hasattr(torch, "thread_safe_generator"),
                    reason="this torch has no torch.thread_safe_generator (newer than 2.11)")
def test_per_sample_seed_equals_processes():
    kw = dict(batch_size=3, shuffle=True, seed=9, per_sample_seed=True)
    procs = list(FERRO.DataLoader(GeneratorDraws(12), num_workers=2, **kw))
    threads = list(FERRO.DataLoader(GeneratorDraws(12), num_workers=1, worker_threads=3, **kw))
    assert_same(procs, threads)


# --------------------------------------------------------------------------- #
# faults and refusals
# --------------------------------------------------------------------------- #


@ferro_only
@time_limit(60)
def test_an_exception_names_the_thread_and_its_process():
    it = iter(FERRO.DataLoader(mh.FailingDataset(12, 5), batch_size=2, num_workers=1,
                               worker_threads=2))
    got = [next(it) for _ in range(2)]
    with pytest.raises(ValueError) as info:
        next(it)
    msg = str(info.value)
    assert "Caught ValueError in DataLoader worker 0 (a thread of worker process 0)" in msg
    assert "Traceback" in msg and "__getitem__" in msg
    assert len(got) + len(list(it)) == 5


@ferro_only
@time_limit(60)
def test_a_killed_process_ends_the_epoch_with_worker_died(tmp_path):
    """SIGKILL takes a process and both its threads: a WorkerDiedError, and
    the other process is ended."""
    stamp = str(tmp_path / "stamp")
    ds = mh.DyingDataset(40, 9, "sigkill", stamp)
    it = iter(FERRO.DataLoader(ds, batch_size=1, num_workers=2, worker_threads=2))
    with pytest.raises(ferroloader.WorkerDiedError, match=r"pid \d+"):
        list(it)
    del it


@ferro_only
@time_limit(60)
def test_timeout_raises_on_time():
    ds = mh.SlowDataset(8, 3.0, slow_from=2)
    it = iter(FERRO.DataLoader(ds, batch_size=2, num_workers=1, worker_threads=2, timeout=1.0))
    next(it)
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 1\.0 seconds"):
        next(it)
    del it


@ferro_only
@time_limit(60)
def test_a_dropped_iterator_mid_epoch_ends_its_processes():
    before = mh.live_workers()
    it = iter(FERRO.DataLoader(mh.MapDataset(400, "dict"), batch_size=2, num_workers=2,
                               worker_threads=2))
    next(it)
    assert len(mh.live_workers() - before) == 2  # two processes for four workers
    del it
    assert mh.wait_until(lambda: not (mh.live_workers() - before), 20.0)


@ferro_only
@time_limit(60)
def test_one_iterator_shared_by_two_threads_is_refused():
    with pytest.raises(RuntimeError, match="__iter__ must return a new iterator"):
        list(FERRO.DataLoader(SharedIterator(), batch_size=2, num_workers=1, worker_threads=2))


@ferro_only
@time_limit(60)
def test_a_stateful_dataset_is_refused_with_threads_in_a_process():
    class Stateful(mh.MapDataset):
        def state_dict(self):
            return {}

        def load_state_dict(self, sd):
            pass

    with pytest.raises(ferroloader.ConfigError, match="use worker_threads=1"):
        iter(FERRO.DataLoader(Stateful(4), num_workers=2, worker_threads=2))
    # one thread per process keeps a replica per worker, as before
    # (a local class reaches workers only by fork)
    loader = FERRO.DataLoader(Stateful(4), num_workers=2, worker_threads=1,
                              multiprocessing_context="fork")
    assert len(list(loader)) == 4


@ferro_only
@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_worker_threads_is_checked(bad):
    with pytest.raises(ValueError, match="worker_threads option should be a positive integer"):
        FERRO.DataLoader(mh.MapDataset(4), num_workers=1, worker_threads=bad)


@ferro_only
def test_worker_threads_needs_worker_processes():
    with pytest.raises(ferroloader.ConfigError, match="num_workers=0 starts none"):
        FERRO.DataLoader(mh.MapDataset(4), worker_threads=2)
    with pytest.raises(ferroloader.ConfigError, match="already threads"):
        FERRO.DataLoader(mh.MapDataset(4), num_workers=2, worker_method="thread",
                         worker_threads=2)
