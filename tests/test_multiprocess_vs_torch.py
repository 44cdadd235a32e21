"""Multi-process loading (num_workers > 0) against torch.utils.data, batch by batch.

Each test runs torch's DataLoader and ferroloader's with the same arguments
and seeds in this process and compares every batch exactly (types, dtypes,
shapes, strides, values), the state of the random generators afterwards, and
what the workers report about themselves (pids, get_worker_info, seeds).
Datasets and functions that workers run live in mp_helpers (importable by
spawned workers).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
import time
import warnings

import ferroloader
import mp_helpers as mh
import pytest
import torch
import torch.utils.data as tud
from helpers import FERRO, LIBS, TORCH, assert_same

# Every test runs with ferroloader's worker processes and again with its
# worker threads (worker_method="thread"), against torch's processes; the
# tests marked processes_only check what only a process has (its own pid,
# its own globals, a multiprocessing context, a signal).
processes_only = pytest.mark.processes_only


# the worker method of the running test (set by the fixture below)
_METHOD = ["multiprocessing"]


@pytest.fixture(autouse=True, params=["multiprocessing", "thread"])
def worker_method(request, monkeypatch):
    _METHOD[0] = request.param
    if request.param == "thread":
        if mh.SELFCHECK:
            pytest.skip("the self-check runs torch, which has no worker threads")
        marker = request.node.get_closest_marker("processes_only")
        if marker is not None:
            pytest.skip(f"a worker process's: {marker.args[0]}")
        init = ferroloader.DataLoader.__init__

        def threaded(self, *args, **kwargs):
            # (num_workers=0 loads in the main thread: no worker method)
            if kwargs.get("num_workers", args[5] if len(args) > 5 else 0):
                kwargs.setdefault("worker_method", "thread")
            init(self, *args, **kwargs)

        monkeypatch.setattr(ferroloader.DataLoader, "__init__", threaded)
    return request.param


def _compare(
    e: mh.Run, a: mh.Run, *, strip_pid: bool = False, what: str = "", warns: bool = True
) -> None:
    """ferroloader's run `a` reproduces torch's run `e`."""
    ee = mh.strip(e.epochs) if strip_pid else e.epochs
    aa = mh.strip(a.epochs) if strip_pid else a.epochs
    assert len(ee) == len(aa)
    for k, (be, ba) in enumerate(zip(ee, aa)):
        assert len(be) == len(ba), (
            f"{what} epoch {k}: torch yielded {len(be)} batches, ferroloader {len(ba)}"
        )
        for j, (x, y) in enumerate(zip(be, ba)):
            assert_same(x, y, f"{what} epoch {k} batch {j}")
    assert torch.equal(e.rng[0], a.rng[0]), (
        f"{what}: global torch RNG differs after the run: torch.rand(3) "
        f"{e.rng[0]} (torch) vs {a.rng[0]} (ferroloader)"
    )
    assert e.rng[1:] == a.rng[1:], f"{what}: python/numpy global RNG differs after the run"
    if e.generator_state is not None:
        assert torch.equal(e.generator_state, a.generator_state), (
            f"{what}: the loader's generator= was consumed differently"
        )
    expected = _as_threads(e.warnings) if _METHOD[0] == "thread" else e.warnings
    assert not warns or a.warnings == expected, (
        f"{what}: warnings differ:\n torch: {expected}\n ferroloader: {a.warnings}"
    )


_TOO_MANY = "worker processes in total."


def _as_threads(warned: list) -> list:
    """torch's warnings as worker threads give them: the warning of more workers than CPUs
    (torch's, at construction and at each iter()) once, naming worker threads."""
    out, seen = [], False
    for cls, text in warned:
        if _TOO_MANY in text:
            if seen:
                continue
            seen = True
            text = text.replace(_TOO_MANY, "worker threads in total.")
        out.append((cls, text))
    return out


def _both(make_dataset, **kw) -> tuple:
    e = mh.run_side(TORCH, make_dataset, **kw)
    a = mh.run_side(FERRO, make_dataset, **kw)
    return e, a


def _worker_pids(run: mh.Run) -> set:
    return mh.pids_in(run.epochs)


# --------------------------------------------------------------------------- #
# map-style: same batch sequence for every num_workers / prefetch_factor
# --------------------------------------------------------------------------- #

MATRIX = [(0, None)] + [(w, p) for w in (1, 2, 3) for p in (1, 2, 4)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("num_workers", "prefetch_factor"), MATRIX)
def test_map_batches_match_torch_for_workers_and_prefetch(num_workers, prefetch_factor):
    """For every num_workers/prefetch_factor, shuffled batches from out-of-order workers arrive
    in sampler order and equal both torch's and ferroloader's single-process batches."""
    def make(lib):
        return mh.JitterDataset(20, "dict")  # workers finish out of order

    kw = dict(batch_size=3, shuffle=True, num_workers=num_workers, seed=11)
    if prefetch_factor is not None:
        kw["prefetch_factor"] = prefetch_factor
    e, a = _both(make, **kw)
    _compare(e, a, what=f"num_workers={num_workers} prefetch_factor={prefetch_factor}")
    # ... and identical to ferroloader's own single-process loader.
    single = mh.run_side(FERRO, make, batch_size=3, shuffle=True, num_workers=0, seed=11)
    _compare(single, a, what="vs ferroloader num_workers=0", warns=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", mh.SAMPLE_KINDS)
def test_map_sample_kinds_match_torch(kind):
    """With two workers, every sample kind (int, float, tensor, numpy, str, dict, tuple,
    namedtuple, nested) collates to torch's batches."""
    e, a = _both(lambda lib: mh.MapDataset(11, kind), batch_size=4, num_workers=2)
    _compare(e, a, what=kind)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batch_size", [None, 1])
def test_map_without_auto_collation_matches_torch(batch_size):
    """batch_size=None: default_convert per sample; batch_size=1: collate of one."""
    e, a = _both(lambda lib: mh.MapDataset(7, "nested"), batch_size=batch_size, num_workers=2)
    _compare(e, a, what=f"batch_size={batch_size}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [1, 3])
def test_shuffle_with_global_seed_matches_torch(num_workers):
    """With 1 or 3 workers and only the global seed set, two shuffled epochs match torch's (in
    different orders) and leave the RNGs as torch's."""
    e, a = _both(
        lambda lib: mh.MapDataset(30, "int"),
        batch_size=4,
        shuffle=True,
        num_workers=num_workers,
        seed=1234,
        epochs=2,
    )
    _compare(e, a, what="shuffle+manual_seed")
    orders = [[int(x) for b in ep for x in b] for ep in e.epochs]
    assert orders[0] != orders[1], "test bug: both epochs in the same order"


@pytest.mark.timeout(60)
def test_shuffle_with_generator_matches_torch():
    """With two workers and a seeded generator=, two shuffled epochs match torch's and leave the
    generator in torch's state."""
    e, a = _both(
        lambda lib: mh.MapDataset(30, "tensor"),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        generator_seed=99,
        epochs=2,
    )
    _compare(e, a, what="shuffle+generator")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [1, 2])
def test_drop_last_matches_torch(num_workers):
    """With workers, shuffle and drop_last=True, the partial last batch is dropped and the full
    batches match torch's."""
    e, a = _both(
        lambda lib: mh.MapDataset(23, "tuple"),
        batch_size=5,
        shuffle=True,
        drop_last=True,
        num_workers=num_workers,
    )
    _compare(e, a, what="drop_last")
    assert len(a.epochs[0]) == 23 // 5


@pytest.mark.timeout(60)
def test_custom_sampler_and_batch_sampler_match_torch():
    """With two workers, a BatchSampler over a with-replacement RandomSampler passed as
    batch_sampler= gives torch's batches."""
    def run(lib):
        mh.seed_all(3)
        sampler = lib.RandomSampler(range(17), replacement=True, num_samples=13)
        bs = lib.BatchSampler(sampler, batch_size=4, drop_last=False)
        return list(lib.DataLoader(mh.MapDataset(17, "dict"), batch_sampler=bs, num_workers=2))

    assert_same(run(TORCH), run(FERRO))


@pytest.mark.timeout(60)
def test_global_rng_after_epoch_matches_torch():
    """The loader consumes the global generator exactly as torch (base seed and
    the sampler's seed), so code drawing after the epoch sees torch's values."""
    for shuffle in (False, True):
        e, a = _both(
            lambda lib: mh.MapDataset(9, "int"),
            batch_size=2,
            shuffle=shuffle,
            num_workers=2,
            seed=5,
        )
        _compare(e, a, what=f"shuffle={shuffle}")


@processes_only("it checks the collate ran in another process")
@pytest.mark.timeout(60)
def test_custom_collate_fn_runs_in_worker():
    """A custom collate_fn runs in the two workers, never the main process, and its batches
    match torch's apart from the pid."""
    e, a = _both(
        lambda lib: mh.MapDataset(10, "int"),
        batch_size=3,
        num_workers=2,
        collate_fn=mh.collate_with_pid,
    )
    _compare(e, a, strip_pid=True, what="collate_fn")
    pids = [b["pid"] for b in a.epochs[0]]
    assert os.getpid() not in pids, "custom collate_fn ran in the main process"
    assert len(set(pids)) == 2, f"expected the batches of 2 workers, got pids {pids}"


@processes_only("it checks __getitems__ ran in another process")
@pytest.mark.timeout(60)
def test_getitems_runs_in_worker():
    """With workers, __getitems__ builds every batch and runs in both workers, not the main
    process; batches match torch's apart from the pid."""
    e, a = _both(lambda lib: mh.GetitemsDataset(10), batch_size=4, num_workers=2)
    _compare(e, a, strip_pid=True, what="__getitems__")
    for b in a.epochs[0]:
        assert b["via"] == ["getitems"] * len(b["i"])
    pids = _worker_pids(a)
    assert os.getpid() not in pids, "__getitems__ ran in the main process"
    assert len(pids) == 2


@processes_only("each process has its own replica; threads share the dataset")
@pytest.mark.timeout(60)
def test_dataset_state_is_per_worker_replica():
    """Each worker has its own replica: per-replica call counters as torch's."""
    e, a = _both(lambda lib: mh.PidDataset(12), batch_size=2, num_workers=3)
    _compare(e, a, strip_pid=True, what="replica state")
    assert len(_worker_pids(a)) == 3
    assert os.getpid() not in _worker_pids(a)


@pytest.mark.timeout(60)
def test_waiting_for_a_batch_releases_the_gil():
    """While the main thread waits for a slow batch, other Python threads run."""
    for lib in (TORCH, FERRO):
        ticks = []
        stop = threading.Event()

        def spin(ticks=ticks, stop=stop):
            while not stop.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.001)

        it = iter(lib.DataLoader(mh.SlowDataset(2, 1.0), batch_size=1, num_workers=1))
        t = threading.Thread(target=spin, daemon=True)
        t.start()
        t0 = time.monotonic()
        assert int(next(it)) == 0
        t1 = time.monotonic()
        stop.set()
        t.join()
        del it
        during = [x for x in ticks if t0 + 0.2 <= x <= t1 - 0.2]
        assert t1 - t0 >= 0.8
        assert len(during) >= 50, (
            f"{lib.__name__}: another thread ran {len(during)} times in "
            f"{t1 - t0 - 0.4:.1f} s while the main thread waited (GIL held?)"
        )


@pytest.mark.timeout(60)
def test_persistent_workers_new_epoch_before_the_last_one_ended():
    """iter(loader) mid-epoch with persistent workers: the abandoned epoch's
    prefetched batches never leak into the new one (torch discards them)."""
    out = {}
    for name, lib in LIBS.items():
        mh.seed_all(4)
        loader = lib.DataLoader(
            mh.MapDataset(20, "int"),
            batch_size=2,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
        )
        it = iter(loader)
        first = [next(it) for _ in range(3)]
        second = list(loader)
        third = list(loader)
        out[name] = (first, second, third, torch.rand(3))
        del it, loader
    assert_same(out["torch"], out["ferroloader"])


# --------------------------------------------------------------------------- #
# in_order=False
# --------------------------------------------------------------------------- #


def _sorted_batches(batches: list) -> list:
    return sorted(batches, key=lambda b: int(b[0]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("num_workers", "prefetch_factor"), [(2, 1), (2, 2), (3, 4)])
def test_in_order_false_same_multiset_as_torch(num_workers, prefetch_factor):
    """With in_order=False, an epoch yields the same multiset of batches as torch's and leaves
    the global torch RNG in torch's state."""
    kw = dict(
        batch_size=2,
        shuffle=True,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        in_order=False,
        seed=8,
    )
    e, a = _both(lambda lib: mh.SlowDataset(21, 0.02, only=(0, 1, 8)), **kw)
    assert len(e.epochs[0]) == len(a.epochs[0])
    assert_same(_sorted_batches(e.epochs[0]), _sorted_batches(a.epochs[0]))
    assert torch.equal(e.rng[0], a.rng[0])


@pytest.mark.timeout(60)
def test_in_order_false_yields_ready_batches_first():
    """A slow first batch does not hold back the others (torch's behaviour)."""
    for lib in (TORCH, FERRO):
        loader = lib.DataLoader(
            mh.SlowDataset(8, 1.0, only=(0,)), batch_size=1, num_workers=2, in_order=False
        )
        order = [int(b) for b in loader]
        assert sorted(order) == list(range(8)), (lib.__name__, order)
        assert order[0] != 0, f"{lib.__name__}: in_order=False waited for the slow batch"
        in_order = [
            int(b)
            for b in lib.DataLoader(mh.SlowDataset(4, 0.3, only=(0,)), batch_size=1, num_workers=2)
        ]
        assert in_order == [0, 1, 2, 3], (lib.__name__, in_order)


# --------------------------------------------------------------------------- #
# prefetch depth
# --------------------------------------------------------------------------- #


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefetch_factor", [1, 2, 4])
def test_prefetch_depth_is_prefetch_factor_per_worker(tmp_path, prefetch_factor):
    """With the consumer stalled after the first batch, the workers have fetched
    about prefetch_factor batches each: at least num_workers * prefetch_factor
    (torch's meaning: batches loaded in advance), at most one more (torch
    hands out the next task when it yields a batch)."""
    nw, bs = 2, 2
    counts = {}
    for name, lib in LIBS.items():
        path = str(tmp_path / f"{name}.log")
        loader = lib.DataLoader(
            mh.FetchLogDataset(64, path),
            batch_size=bs,
            num_workers=nw,
            prefetch_factor=prefetch_factor,
        )
        it = iter(loader)
        next(it)
        lo, hi = nw * prefetch_factor * bs, (nw * prefetch_factor + 1) * bs
        mh.wait_until(lambda path=path, lo=lo: mh.count_lines(path) >= lo, 5.0)
        time.sleep(0.3)  # let any over-eager prefetch show up
        counts[name] = mh.count_lines(path)
        del it, loader
        assert lo <= counts[name] <= hi, (
            f"{name}: {counts[name]} samples fetched while the consumer held 1 batch; "
            f"expected between {lo} and {hi}"
        )
    assert counts["torch"] == counts["ferroloader"], counts


# --------------------------------------------------------------------------- #
# worker info, seeds, worker_init_fn
# --------------------------------------------------------------------------- #


@processes_only("info.dataset is a replica, the pid another (test_threads.py checks threads')")
@pytest.mark.timeout(60)
def test_get_worker_info_in_workers_matches_torch():
    """Inside each worker get_worker_info() gives torch's id, num_workers, replica dataset and
    seed base+id; the main process sees None and keeps its dataset unmutated."""
    nw = 3
    results = {}
    for name, lib in LIBS.items():
        ds = mh.WorkerInfoDataset(9, lib.get_worker_info)
        mh.seed_all(21)
        batches = list(lib.DataLoader(ds, batch_size=1, num_workers=nw))
        assert lib.get_worker_info() is None, f"{name}: get_worker_info() in main is not None"
        assert not hasattr(ds, "touched_by"), (
            f"{name}: the worker mutated the main process's dataset (not a copy)"
        )
        results[name] = batches
        ids = sorted({int(b["id"]) for b in batches})
        assert ids == list(range(nw)), f"{name}: worker ids {ids}"
        for b in batches:
            assert int(b["num_workers"]) == nw
            assert bool(b["dataset_is_self"]), f"{name}: info.dataset is not the replica"
            assert list(b["dataset_type"]) == ["WorkerInfoDataset"]
            assert int(b["pid"]) != os.getpid()
        seeds = {int(b["id"]): int(b["seed"]) for b in batches}
        base = seeds[0]
        assert seeds == {w: base + w for w in range(nw)}, f"{name}: seeds {seeds}"
    assert_same(mh.strip(results["torch"]), mh.strip(results["ferroloader"]))


@processes_only("the globals are seeded per process; threads get their own (test_threads.py)")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("seeding", ["manual_seed", "generator"])
def test_worker_seeds_match_torch(seeding):
    """torch.initial_seed(), random and numpy inside each worker equal torch's
    workers' for the same seed: the base seed is drawn from the same RNG and
    each worker seeds torch, random and numpy as torch does."""
    kw = dict(batch_size=2, num_workers=2, seed=77)
    if seeding == "generator":
        kw["generator_seed"] = 1234
    e = mh.run_side(TORCH, lambda lib: mh.RngDataset(8, lib.get_worker_info), **kw)
    a = mh.run_side(FERRO, lambda lib: mh.RngDataset(8, lib.get_worker_info), **kw)

    def firsts(run):
        out = {}
        for b in run.epochs[0]:
            wid = int(b["first"]["wid"][0])
            out[wid] = {k: v[0] for k, v in b["first"].items()}
        return dict(sorted(out.items()))

    fe, fa = firsts(e), firsts(a)
    assert sorted(fa) == [0, 1]
    assert_same(fe, fa, "first draws per worker")
    for wid, d in fa.items():
        assert int(d["torch_initial_seed"]) == int(fa[0]["torch_initial_seed"]) + wid
    assert torch.equal(e.rng[0], a.rng[0])
    if seeding == "generator":
        assert torch.equal(e.generator_state, a.generator_state)


@processes_only("it draws from the global generators, seeded per process only")
@pytest.mark.timeout(60)
def test_random_augmentation_batches_match_torch():
    """A dataset drawing random numbers per sample in the worker gives torch's
    batches bit for bit (same seeds, same round-robin dispatch)."""
    e, a = _both(
        lambda lib: mh.RngDataset(14, lib.get_worker_info),
        batch_size=3,
        num_workers=2,
        shuffle=True,
        seed=2024,
        epochs=2,
    )
    _compare(e, a, what="random augmentation")


@processes_only("it counts worker pids")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_worker_init_fn_once_per_worker(tmp_path, persistent):
    """worker_init_fn runs once per worker start, in a worker whose get_worker_info().id is its
    argument: every epoch, or once in all with persistent workers, as in torch."""
    nw = 3
    logs = {}
    for name, lib in LIBS.items():
        path = str(tmp_path / f"{name}.init")
        init = functools.partial(mh.record_init, path, lib.get_worker_info)
        loader = lib.DataLoader(
            mh.MapDataset(9, "int"),
            batch_size=2,
            num_workers=nw,
            worker_init_fn=init,
            persistent_workers=persistent,
        )
        first = list(loader)
        second = list(loader)
        assert_same(first, second)
        del loader
        log = mh.read_init_log(path)
        epochs = 1 if persistent else 2
        assert len(log) == nw * epochs, f"{name}: worker_init_fn calls {log}"
        assert sorted(w for w, _, _ in log) == sorted(list(range(nw)) * epochs)
        for wid, pid, info_id in log:
            assert info_id == wid, f"{name}: get_worker_info().id inside worker_init_fn"
            assert pid != os.getpid()
        assert len({pid for _, pid, _ in log}) == nw * epochs
        logs[name] = sorted((w, i) for w, _, i in log)
    assert logs["torch"] == logs["ferroloader"]


@pytest.mark.timeout(60)
def test_torch_get_worker_info_works_inside_ferroloader_workers():
    """Drop-in: a dataset written for torch shards with
    torch.utils.data.get_worker_info(); under ferroloader it must see its worker
    too (otherwise every worker yields every shard)."""
    info_fn = tud.get_worker_info

    def run(lib):
        return list(
            lib.DataLoader(mh.ShardedIterable([3, 4], info_fn), batch_size=2, num_workers=2)
        )

    assert_same(run(TORCH), run(FERRO))


# --------------------------------------------------------------------------- #
# persistent workers
# --------------------------------------------------------------------------- #


@processes_only("its samples count calls per replica")
@pytest.mark.timeout(60)
def test_persistent_workers_two_epochs_match_torch():
    """With persistent workers, three shuffled epochs are served by the same two worker
    processes, whose replica state carries over, and match torch's."""
    kw = dict(
        batch_size=2,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        seed=31,
        epochs=3,
    )
    e, a = _both(lambda lib: mh.PidDataset(10), **kw)
    # per-replica call counters continue across epochs, as torch's
    _compare(e, a, strip_pid=True, what="persistent_workers")
    pids = [mh.pids_in(ep) for ep in a.epochs]
    assert len(pids[0]) == 2 and os.getpid() not in pids[0]
    assert pids[0] == pids[1] == pids[2], f"workers replaced between epochs: {pids}"
    order = [[int(x) for b in ep for x in b["i"]] for ep in a.epochs]
    assert order[0] != order[1], "no new sampler pass for the second epoch"
    for o in order:
        assert sorted(o) == list(range(10))


@processes_only("it checks worker pids stay alive")
@pytest.mark.timeout(60)
def test_persistent_workers_alive_between_epochs():
    """Persistent workers stay alive after an epoch, and the same two processes serve the next
    one."""
    loader = FERRO.DataLoader(
        mh.PidDataset(6), batch_size=2, num_workers=2, persistent_workers=True
    )
    first = list(loader)
    pids = mh.pids_in(first)
    assert len(pids) == 2
    assert mh.alive(pids) and len(mh.alive(pids)) == 2, "persistent workers exited after epoch"
    second = list(loader)
    assert mh.pids_in(second) == pids


# --------------------------------------------------------------------------- #
# IterableDataset
# --------------------------------------------------------------------------- #

LENGTHS = [7, 2, 5]  # worker 1 runs out first


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize(
    ("batch_size", "drop_last"), [(1, False), (3, False), (3, True), (None, False)]
)
def test_iterable_sharded_order_matches_torch(num_workers, batch_size, drop_last):
    """Batches of an IterableDataset sharded unevenly over 1-3 workers interleave exactly as
    torch's, for every batch_size/drop_last, in both epochs."""
    lengths = LENGTHS[:num_workers]

    def make(lib):
        return mh.ShardedIterable(lengths, lib.get_worker_info)

    e, a = _both(
        make, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers, epochs=2
    )
    _compare(e, a, what=f"iterable nw={num_workers} bs={batch_size} drop_last={drop_last}")


@processes_only("it counts the pids that made the samples")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefetch_factor", [1, 3])
def test_iterable_dict_samples_with_prefetch_match_torch(prefetch_factor):
    """Dict samples from an IterableDataset sharded over three workers collate to torch's
    batches for prefetch_factor 1 and 3, every worker contributing."""
    def make(lib):
        return mh.ShardedIterable([4, 1, 6], lib.get_worker_info, kind="dict")

    e, a = _both(make, batch_size=2, num_workers=3, prefetch_factor=prefetch_factor)
    _compare(e, a, strip_pid=True, what="iterable dicts")
    assert len(_worker_pids(a)) == 3


@pytest.mark.timeout(60)
def test_iterable_length_warning_as_torch():
    """len() under-reports: torch's warning, with its multi-process advice."""

    def run(lib):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = lib.DataLoader(mh.SizedIterable(4, 3), batch_size=None, num_workers=2)
            assert len(loader) == 3
            batches = list(loader)
        return batches, [(w.category, str(w.message)) for w in caught]

    (eb, ew), (ab, aw) = run(TORCH), run(FERRO)
    assert_same(eb, ab)
    assert any("multiprocessing data-loading" in m for _, m in ew), "test bug: no warning"
    assert aw == ew


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [2, 3])
def test_iterable_without_sharding_duplicates_as_torch(num_workers):
    """An IterableDataset that does not shard is yielded in full by every worker, in torch's
    batch order."""
    e, a = _both(lambda lib: mh.UnshardedIterable(5), batch_size=2, num_workers=num_workers)
    _compare(e, a, what="unsharded iterable")
    flat = [int(x) for b in a.epochs[0] for x in b]
    assert sorted(flat) == sorted(list(range(5)) * num_workers)


@pytest.mark.timeout(60)
def test_iterable_persistent_workers_match_torch():
    """A sharded IterableDataset with persistent workers yields torch's batches in both epochs."""
    def make(lib):
        return mh.ShardedIterable([3, 1], lib.get_worker_info)

    e, a = _both(make, batch_size=2, num_workers=2, persistent_workers=True, epochs=2)
    _compare(e, a, what="iterable persistent")


# --------------------------------------------------------------------------- #
# multiprocessing_context
# --------------------------------------------------------------------------- #


def _context_run(lib, ctx, method, tmp_path, **kw):
    """Workers: 2 with fork, 1 with spawn/forkserver (each imports torch, ~2 s)."""
    path = str(tmp_path / f"{lib.__name__}-{method}.init")
    batches = list(
        lib.DataLoader(
            mh.MarkerDataset(5),
            batch_size=2,
            num_workers=2 if method == "fork" else 1,
            multiprocessing_context=ctx,
            worker_init_fn=functools.partial(mh.record_init, path, lib.get_worker_info),
            generator=torch.Generator().manual_seed(5),
            **kw,
        )
    )
    inits = sorted((w, i) for w, _, i in mh.read_init_log(path))
    return batches, inits


def _expected_marker(method: str) -> str:
    return "set-in-main" if method == "fork" else "imported"


@processes_only("a multiprocessing context starts processes")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_context_by_name(method, monkeypatch, tmp_path):
    """multiprocessing_context given by name starts workers with that method (only forked ones
    see the main process's module state), with torch's batches and worker_init_fn calls."""
    monkeypatch.setattr(mh, "MAIN_MARKER", "set-in-main")
    e, e_init = _context_run(TORCH, method, method, tmp_path)
    a, a_init = _context_run(FERRO, method, method, tmp_path)
    assert_same(e, a)
    assert a_init == e_init, "worker_init_fn calls differ"
    for b in a:
        assert list(b[1]) == [_expected_marker(method)] * len(b[1]), (
            f"workers were not started with {method!r}"
        )


@processes_only("a multiprocessing context starts processes")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_context_object(method, monkeypatch, tmp_path):
    """A context object; also a pickled custom collate_fn that runs in the worker."""
    monkeypatch.setattr(mh, "MAIN_MARKER", "set-in-main")
    ctx = multiprocessing.get_context(method)
    kw = dict(collate_fn=mh.collate_marker)
    e, e_init = _context_run(TORCH, ctx, method, tmp_path, **kw)
    a, a_init = _context_run(FERRO, ctx, method, tmp_path, **kw)
    assert_same(mh.strip(e), mh.strip(a))
    assert a_init == e_init, "worker_init_fn calls differ"
    for b in a:
        assert b["marker"] == _expected_marker(method), f"workers were not started with {ctx}"
        assert b["pid"] != os.getpid(), "collate_fn ran in the main process"


@processes_only("a multiprocessing context starts processes")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_dataset_holding_a_shared_value_reaches_spawned_workers(method):
    """A dataset holding a multiprocessing Value (with its lock) reaches a
    spawned worker, as with torch (it may be pickled only while the process
    starts), and the worker's reads count in the shared value."""
    got = {}
    for lib in (TORCH, FERRO):
        ds = mh.SharedCountDataset(6, method)
        loader = lib.DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context=method)
        got[lib.__name__] = ([b.tolist() for b in loader], ds.count.value)
    assert got[FERRO.__name__] == got[TORCH.__name__] == ([[0, 1], [2, 3], [4, 5]], 6)


# --------------------------------------------------------------------------- #
# pin_memory
# --------------------------------------------------------------------------- #


def _pin_run(lib, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(
            lib.DataLoader(
                mh.MapDataset(6, "dict"), batch_size=2, num_workers=2, pin_memory=True, **kw
            )
        )
    return batches, [(w.category, str(w.message)) for w in caught]


@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.accelerator.is_available(), reason="needs a machine without accelerator")
@pytest.mark.parametrize("pin_memory_device", ["", "cuda"])
def test_pin_memory_without_accelerator_warns_as_torch(pin_memory_device):
    """Without an accelerator, pin_memory=True (with pin_memory_device='cuda' too) emits torch's
    warnings and yields torch's unpinned batches."""
    kw = {"pin_memory_device": pin_memory_device} if pin_memory_device else {}
    from ferroloader.run.pinning import _PIN_DEVICE_DEPRECATED

    if pin_memory_device and not _PIN_DEVICE_DEPRECATED:
        # torch 2.6-2.8 pins on the device given, which is missing here, and
        # raises a RuntimeError (then its half-built iterator fails again in
        # __del__, a torch bug pytest reports, so torch is not run here);
        # ferroloader raises the RuntimeError too
        with pytest.raises(RuntimeError):
            _pin_run(FERRO, **kw)
        return
    eb, ew = _pin_run(TORCH, **kw)
    ab, aw = _pin_run(FERRO, **kw)
    assert ew, "test bug: torch did not warn"
    assert aw == ew, f"warnings differ:\n torch: {ew}\n ferroloader: {aw}"
    assert_same(eb, ab)
    for b in ab:
        assert not b["x"].is_pinned()


@pytest.mark.timeout(60)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_with_cuda_pins_batches():
    """With CUDA, pin_memory=True pins every batch tensor, collated ndarrays included, and
    yields torch's batches and warnings."""
    eb, ew = _pin_run(TORCH)
    ab, aw = _pin_run(FERRO)
    assert aw == ew
    assert_same(eb, ab)
    for b in ab:
        assert b["x"].is_pinned(), "batch tensor not pinned"
        assert b["arr"].is_pinned(), "collated ndarray not pinned"


@pytest.mark.timeout(60)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_honours_custom_batch_pin_memory_method():
    """With pin_memory=True, a custom batch type's own pin_memory() method is called and leaves
    its data pinned, as in torch."""
    out = {}
    for name, lib in LIBS.items():
        batches = list(
            lib.DataLoader(
                mh.MapDataset(6, "int"),
                batch_size=3,
                num_workers=2,
                pin_memory=True,
                collate_fn=mh.collate_pinnable,
            )
        )
        for b in batches:
            assert type(b) is mh.PinnableBatch, f"{name}: batch type {type(b)}"
            assert b.pinned_by_method, f"{name}: the batch's pin_memory() was not called"
            assert b.data.is_pinned()
        out[name] = [b.data for b in batches]
    assert_same(out["torch"], out["ferroloader"])


@pytest.mark.timeout(60)
def test_custom_collate_views_keep_torch_strides():
    """Tensors a custom collate_fn returns as views arrive with torch's
    strides and storage offsets, not made contiguous."""
    e, a = _both(lambda lib: mh.MapDataset(12, "tensor"), batch_size=4, num_workers=2,
                 collate_fn=mh.collate_strided)
    _compare(e, a, what="strided custom collate")
    batch = a.epochs[0][0]
    assert not batch["t"].is_contiguous()
    assert batch["s"].storage_offset() == e.epochs[0][0]["s"].storage_offset()
