"""``num_workers="auto"``: the layout changes under a running epoch and no
batch changes; the tuner's policy on measured intervals; its bounds, stats,
state and errors.

The equality tests force changes from the test (``iterator._force``):
grow, shrink, switch between processes, threads and threads inside
processes, change the prefetch depth, every few batches, and compare every
batch with a fixed layout's."""

from __future__ import annotations

import logging
import os
import signal
import time

import ferroloader
import mp_helpers as mh
import pytest
import shard_cases
import torch
from ferroloader.seeds import epoch_seed
from ferroloader.tuning.bounds import Layout
from ferroloader.tuning.climb import Tuner, _Interval
from helpers import assert_same, ferro_only, time_limit
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = ferro_only

P, T = "multiprocessing", "thread"
LAYOUTS = [
    Layout(0),
    Layout(1),
    Layout(2),
    Layout(3, prefetch_factor=1),
    Layout(1, T),
    Layout(3, T),
    Layout(1, P, 2),
    Layout(2, P, 2, prefetch_factor=4),
    Layout(2, prefetch_factor=4),
]


@pytest.fixture(autouse=True)
def _processes_end():
    """Every test leaves none of its worker processes behind."""
    before = mh.live_workers()
    yield
    assert mh.wait_until(lambda: not (mh.live_workers() - before), 20.0), "worker processes left"


class Noisy(torch.utils.data.Dataset):
    """A sample with a random part: equal only when seeded per sample. It
    draws as torch asks of a dataset run in threads (its thread-safe
    generator: a worker thread's own, else the global one)."""

    def __len__(self) -> int:
        return 90

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.thread_safe_generator()
        return torch.tensor([float(i), torch.rand((), generator=g).item()])


class GlobalNoisy(Noisy):
    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i), torch.rand(()).item()])


def test_per_sample_seed_keeps_a_dataset_drawing_globally_to_processes():
    loader = ferroloader.DataLoader(GlobalNoisy(), batch_size=5, shuffle=True, seed=1,
                                    per_sample_seed=True, num_workers="auto")
    iter(loader)
    assert not loader._tuner.threads_ok and not loader._tuner.inner_threads_ok
    assert any("per_sample_seed" in n for n in loader.stats().autotune.notes)
    allowed = ferroloader.DataLoader(
        GlobalNoisy(), batch_size=5, shuffle=True, seed=1, per_sample_seed=True,
        num_workers=ferroloader.Autotune(methods=("processes", "threads")))
    iter(allowed)
    assert allowed._tuner.threads_ok


class Plain(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 90

    def __getitem__(self, i: int) -> dict:
        return {"i": i, "x": torch.full((3,), float(i))}


def _run(loader, schedule: dict[int, Layout], epochs: int = 2) -> list:
    """Every batch of ``epochs`` epochs; before batch ``k`` of each epoch,
    the layout ``schedule[k]`` is forced."""
    out = []
    for _ in range(epochs):
        it = iter(loader)
        k = 0
        while True:
            if k in schedule and hasattr(it, "_force"):
                it._force(schedule[k])
            try:
                out.append(next(it))
            except StopIteration:
                break
            k += 1
    return out


def _every(n: int, layouts: list[Layout] = LAYOUTS) -> dict[int, Layout]:
    return {1 + n * j: lay for j, lay in enumerate(layouts)}


MAP_CASES = {
    "shuffle_seed": dict(shuffle=True, seed=5),
    "shuffle_generator": dict(shuffle=True, generator=torch.Generator().manual_seed(3)),
    "global_rng": dict(shuffle=True),
    "weighted": dict(sampler=torch.utils.data.WeightedRandomSampler([1.0] * 90, 70,
                                                                    generator=torch.Generator())),
    "drop_last": dict(shuffle=True, seed=1, drop_last=True),
    "persistent": dict(shuffle=True, seed=2, persistent_workers=True),
}


def _case(case: str) -> dict:
    """The case's arguments, with fresh generators (each run its own)."""
    kw = MAP_CASES[case]
    if "generator" in kw:
        kw = dict(kw, generator=torch.Generator().manual_seed(3))
    if "sampler" in kw:
        kw = dict(kw, sampler=torch.utils.data.WeightedRandomSampler(
            [1.0] * 90, 70, generator=torch.Generator().manual_seed(9)))
    return kw


@time_limit(120)
@pytest.mark.parametrize("case", sorted(MAP_CASES))
def test_map_style_batches_equal_a_fixed_layout_while_it_changes(case):
    """Grow, shrink, threads, threads in processes, prefetch, every 4
    batches over two epochs: every batch equals a fixed 2-process layout's,
    and the global RNG ends where it does."""
    kw = _case(case)
    torch.manual_seed(0)
    fixed = ferroloader.DataLoader(Plain(), batch_size=4, num_workers=2, **kw)
    want = _run(fixed, {})
    after_fixed = torch.get_rng_state()
    kw = _case(case)
    torch.manual_seed(0)
    auto = ferroloader.DataLoader(Plain(), batch_size=4, num_workers="auto", **kw)
    got = _run(auto, _every(4))
    assert_same(want, got)
    assert torch.equal(after_fixed, torch.get_rng_state())
    changes = auto.stats().autotune.changes
    # (a force while draining replaces the one before)
    assert [c.reason for c in changes].count("forced") >= 3


@time_limit(120)
@pytest.mark.parametrize("seeded", [False, True])
def test_changes_over_a_large_permutation_keep_torchs_batches(seeded):
    """Threads, the main process, processes and back, over two epochs of a
    ``shuffle=True`` loader: every batch is torch's (with ``seed=``, torch's
    with a generator reseeded as the loader's own is), and the generators
    end where torch's do."""
    torch.manual_seed(4)
    gen = torch.Generator()
    reference = torch.utils.data.DataLoader(mh.Indices(), batch_size=2048, shuffle=True,
                                            generator=gen if seeded else None)
    want = []
    for e in range(2):
        gen.manual_seed(epoch_seed(6, e))
        want += list(reference)
    after_torch = torch.get_rng_state()
    torch.manual_seed(4)
    auto = ferroloader.DataLoader(mh.Indices(), batch_size=2048, shuffle=True, num_workers="auto",
                                  seed=6 if seeded else None)
    schedule = {3: Layout(2, T), 9: Layout(0), 15: Layout(1), 21: Layout(1, T)}
    got = _run(auto, schedule)
    assert_same(want, got)
    assert torch.equal(after_torch, torch.get_rng_state())
    if seeded:
        assert torch.equal(gen.get_state(), auto.generator.get_state())
    assert [c.reason for c in auto.stats().autotune.changes].count("forced") >= 6


@time_limit(120)
@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 34), st.sampled_from([Layout(0), Layout(1, T),
                                                             Layout(2, T), Layout(3, T)])),
                max_size=4),
       st.booleans())
def test_property_any_schedule_over_a_large_permutation_keeps_torchs_batches(schedule, seeded):
    """Changes at any batches of an epoch whose permutation each change
    takes over (threads and the main process: no process start per
    example): torch's batches, with the global generator, or ``seed=``'s
    against torch's with the generator the loader's own follows."""
    gen = torch.Generator().manual_seed(epoch_seed(3, 0))
    torch.manual_seed(8)
    want = list(torch.utils.data.DataLoader(mh.Indices(), batch_size=2048, shuffle=True,
                                            generator=gen if seeded else None))
    torch.manual_seed(8)
    auto = ferroloader.DataLoader(mh.Indices(), batch_size=2048, shuffle=True, num_workers="auto",
                                  seed=3 if seeded else None)
    assert_same(want, _run(auto, dict(schedule), epochs=1))


@time_limit(120)
@given(st.lists(st.tuples(st.integers(0, 20), st.sampled_from(LAYOUTS)), max_size=4))
def test_property_any_schedule_of_changes_keeps_the_batches(schedule):
    """Any layouts at any batches: the same batches as a fixed layout's,
    with per-sample seeding of a random sample."""
    make = lambda nw: ferroloader.DataLoader(  # noqa: E731
        Noisy(), batch_size=5, shuffle=True, seed=11, per_sample_seed=True, num_workers=nw)
    want = _run(make(0), {}, epochs=1)
    got = _run(make("auto"), dict(schedule), epochs=1)
    assert_same(want, got)


@time_limit(120)
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_sharded_batches_while_the_layout_changes(mode):
    """Static sharding: the batches of a fixed layout; dynamic: every item
    exactly once."""
    def make(nw):
        return ferroloader.DataLoader(
            shard_cases.Counted(), batch_size=3, shuffle=True, seed=4, num_workers=nw,
            sharding=ferroloader.Sharding(mode=mode))

    want = _run(make(2), {})
    got = _run(make("auto"), _every(3, [Layout(2), Layout(1), Layout(3, T), Layout(0),
                                        Layout(2, P, 2)]))
    if mode == "static":
        assert_same(want, got)
    else:
        half = len(shard_cases.all_items())
        items = shard_cases.flat(got)
        assert sorted(items[:half]) == sorted(shard_cases.all_items())
        assert sorted(items[half:]) == sorted(shard_cases.all_items())


@time_limit(120)
def test_mixture_batches_while_the_layout_changes():
    def make(nw):
        mix = ferroloader.Mixture({"a": Plain(), "b": torch.utils.data.Subset(Plain(), range(40))},
                                  weights={"a": 0.7, "b": 0.3}, seed=3)
        return ferroloader.DataLoader(mix, batch_size=4, num_workers=nw)

    want = _run(make(2), {})
    got = _run(make("auto"), _every(5))
    assert_same(want, got)


@time_limit(120)
def test_resume_after_changes_continues_the_epoch_and_the_layout():
    """A state taken after some changes: a new auto loader continues the
    same batches, and starts on the layout the tuning had reached."""
    make = lambda: ferroloader.DataLoader(  # noqa: E731
        Plain(), batch_size=4, shuffle=True, seed=8, num_workers="auto")
    want = _run(ferroloader.DataLoader(Plain(), batch_size=4, shuffle=True, seed=8), {}, 1)
    loader = make()
    it = iter(loader)
    got = [next(it)]
    it._force(Layout(2))
    got += [next(it) for _ in range(5)]
    it._force(Layout(1, T))
    got += [next(it) for _ in range(8)]  # (the 4 in flight drain first)
    sd = loader.state_dict()
    del it
    assert sd["autotune"]["num_workers"] == 1 and sd["autotune"]["worker_method"] == T
    resumed = make()
    resumed.load_state_dict(sd)
    it = iter(resumed)
    assert resumed.num_workers == 1 and resumed.worker_method == T
    got += list(it)
    assert_same(want, got)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        n, k = (1, 0) if info is None else (info.num_workers, info.id)
        return iter(range(k, 40, n))


@time_limit(60)
def test_an_iterable_dataset_changes_layout_only_between_epochs():
    loader = ferroloader.DataLoader(Stream(), batch_size=4, num_workers="auto")
    it = iter(loader)
    first = [next(it)]
    it._force(Layout(2))
    rest = list(it)
    # the first epoch stays in the main process: torch's batches for it
    assert_same([b for b in torch.utils.data.DataLoader(Stream(), batch_size=4)], first + rest)
    stats = loader.stats().autotune
    assert any("IterableDataset" in n for n in stats.notes)
    second = list(loader)
    assert loader.num_workers == 2
    want = list(torch.utils.data.DataLoader(Stream(), batch_size=4, num_workers=2))
    assert_same(want, second)


class WithFile(Plain):
    def __init__(self, path: str) -> None:
        self.f = open(path, "rb")  # (a thread-unsafe attribute)


@time_limit(60)
def test_a_dataset_that_cannot_run_in_threads_keeps_the_tuner_to_processes(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"x")
    ds = WithFile(str(path))
    loader = ferroloader.DataLoader(ds, batch_size=4, num_workers="auto")
    list(loader)
    tuner = loader._tuner
    assert not tuner.threads_ok and not tuner.inner_threads_ok
    assert any("'f'" in n and "no threads" in n for n in loader.stats().autotune.notes)
    ds.f.close()


class Slow(Plain):
    def __getitem__(self, i):
        time.sleep(0.02)
        return super().__getitem__(i)


@time_limit(60)
def test_a_worker_killed_while_the_tuner_resizes_is_named_and_nothing_hangs():
    loader = ferroloader.DataLoader(Slow(), batch_size=2, num_workers="auto")
    it = iter(loader)
    it._force(Layout(2))
    next(it)
    next(it)
    pids = [p.pid for p in it._workers]
    assert len(pids) == 2
    it._force(Layout(3))  # draining from here
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(RuntimeError, match=f"pid {pids[0]}|worker"):
        for _ in range(60):
            next(it)
    del it


def test_bad_bounds_are_clear_errors():
    with pytest.raises(ValueError, match="'auto'"):
        ferroloader.DataLoader(Plain(), num_workers="many")
    with pytest.raises(ValueError, match="methods"):
        ferroloader.Autotune(methods=("fibers",))
    with pytest.raises(ferroloader.ConfigError, match="worker_method"):
        ferroloader.DataLoader(Plain(), num_workers="auto", worker_method="thread")
    with pytest.raises(ferroloader.ConfigError, match="cpu=0"):
        ferroloader.Autotune(cpu=0)
    with pytest.raises(ferroloader.ConfigError, match="prefetch='yes'"):
        ferroloader.Autotune(prefetch="yes")
    tiny = ferroloader.DataLoader(Plain(), num_workers=ferroloader.Autotune(ram=1 << 20))
    with pytest.raises(ferroloader.ConfigError, match="one worker's need"):
        iter(tiny)


@time_limit(60)
def test_changes_are_logged_quietly_by_default(caplog):
    assert logging.getLogger("ferroloader.autotune").getEffectiveLevel() >= logging.WARNING
    loader = ferroloader.DataLoader(Plain(), batch_size=4, num_workers="auto")
    with caplog.at_level(logging.INFO, logger="ferroloader.autotune"):
        it = iter(loader)
        next(it)
        it._force(Layout(1))
        list(it)
    assert any("main process -> 1 process" in r.getMessage() for r in caplog.records)
    text = str(loader.stats())
    assert "autotune: 1 process" in text and "forced" in text


# --------------------------------------------------------------------------- #
# the policy, on measured intervals
# --------------------------------------------------------------------------- #


def _tuner(**bounds) -> Tuner:
    # (a model machine of 64 cores unless the test sets a budget)
    bounds.setdefault("cpu", 64)
    t = Tuner(ferroloader.Autotune(**bounds), Layout(), True, [])
    t.per_process = 100 << 20
    return t


def _feed(t: Tuner, rate_of, wait_of, busy: float = 1.0, rounds: int = 30) -> list[Layout]:
    """Runs the tuner on a model job: ``rate_of(layout)`` batches/s and the
    loop's waiting share ``wait_of(layout)``; the layouts it went through."""
    seen = [t.layout]
    for _ in range(rounds):
        lay = t.layout
        m = _Interval(int(rate_of(lay)), 1.0, wait_of(lay), busy * max(lay.workers, 1))
        nxt = t.observe(m)
        if nxt is not None:
            t.record(0, 0, nxt[0], nxt[1])
            seen.append(t.layout)
    return seen


def test_it_settles_on_the_smallest_layout_that_feeds_the_loop():
    # the loop needs 3 workers' worth; more would gain nothing
    rate = lambda lay: 100 * min(lay.workers, 3) + 50 * (lay.workers == 0)  # noqa: E731
    wait = lambda lay: max(0.02, 1 - rate(lay) / 300)  # noqa: E731
    t = _tuner(methods=("processes",))
    _feed(t, rate, wait)
    assert t.settled and t.layout.workers == 3


def test_it_goes_back_when_a_step_gains_nothing():
    rate = lambda lay: {0: 100, 1: 100, 2: 190}.get(lay.workers, 185)  # noqa: E731
    t = _tuner(methods=("processes",), prefetch=False)
    _feed(t, rate, lambda lay: 0.5)
    assert t.settled and t.layout.workers == 2
    assert "gained nothing" in t.changes[-1].reason


def test_workers_that_wait_become_threads_and_grow_past_the_cores():
    rate = lambda lay: 10 * max(lay.workers, 1)  # noqa: E731
    t = _tuner(max_workers=32)
    seen = _feed(t, rate, lambda lay: 0.9, busy=0.05, rounds=40)
    assert t.layout.worker_method == T and t.layout.workers == 32
    assert all(lay.workers <= 32 for lay in seen)


@pytest.mark.parametrize("ram_workers", [1, 2, 3])
def test_it_never_picks_a_layout_over_the_ram_budget(ram_workers):
    ram = ram_workers * ((100 << 20) + (64 << 20)) + (1 << 20)
    t = _tuner(ram=ram)
    seen = _feed(t, lambda lay: 10 * max(lay.workers, 1), lambda lay: 0.9)
    assert all(t.need(lay) <= ram for lay in seen)
    assert t.layout.processes <= ram_workers


def test_a_cpu_budget_stops_the_growth():
    t = _tuner(cpu=2, methods=("processes",), prefetch=False)
    assert t.cpu == 2
    _feed(t, lambda lay: 10 * max(lay.workers, 1), lambda lay: 0.9)
    assert t.layout.workers <= 2


@time_limit(60)
def test_stateful_dataloader_takes_auto_too():
    from ferroloader.stateful_dataloader import StatefulDataLoader

    def make(nw):
        torch.manual_seed(2)
        return StatefulDataLoader(Plain(), batch_size=4, shuffle=True, num_workers=nw)

    # (torchdata's loader draws its shuffle once more with workers than
    # without: auto keeps at least one worker, so its batches are those of
    # any worker count)
    want = _run(make(2), {}, 1)
    loader = make("auto")
    got = _run(loader, _every(4, [Layout(3), Layout(1, T), Layout(2, P, 2)]), 1)
    assert_same(want, got)
    assert any("StatefulDataLoader" in n for n in loader.stats().autotune.notes)
    with pytest.raises(ValueError, match="at least 1 worker"):
        iter(loader)._force(Layout(0))


@time_limit(60)
def test_the_next_epoch_starts_on_the_layout_reached():
    loader = ferroloader.DataLoader(Plain(), batch_size=4, num_workers="auto",
                                    persistent_workers=True)
    it = iter(loader)
    next(it)
    it._force(Layout(2, T))
    list(it)
    first = it._inner
    it = iter(loader)
    # the same persistent workers serve the next epoch
    assert loader.num_workers == 2 and loader.worker_method == T and it._inner is first
    assert len(list(it)) == len(loader)


@time_limit(60)
@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # (torch's, for 3 workers)
def test_persistent_workers_of_an_iterable_change_between_epochs():
    loader = ferroloader.DataLoader(Stream(), batch_size=4, num_workers="auto",
                                    persistent_workers=True)
    it = iter(loader)
    it._force(Layout(1))
    assert_same(list(torch.utils.data.DataLoader(Stream(), batch_size=4)), list(it))
    it = iter(loader)
    it._force(Layout(3))
    want = list(torch.utils.data.DataLoader(Stream(), batch_size=4, num_workers=1))
    assert_same(want, list(it))
    assert len(it._workers) == 1
    # the third epoch: the old persistent workers go, three new ones serve it
    want = list(torch.utils.data.DataLoader(Stream(), batch_size=4, num_workers=3))
    it = iter(loader)
    assert_same(want, list(it))
    assert len(it._workers) == 3


@time_limit(60)
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_a_change_at_the_end_of_a_ranks_budget_ends_the_epoch(mode):
    """Rank 0 of 2 with even batch counts: a change asked for in the last
    batches of its budget neither hangs nor changes the batches."""
    def make(nw):
        return ferroloader.DataLoader(
            shard_cases.Counted(), batch_size=3, num_workers=nw,
            sharding=ferroloader.Sharding(mode=mode, rank=0, world_size=2))

    want = _run(make(2), {}, 1)
    n = len(want)
    schedule = {0: Layout(2), n - 3: Layout(3), n - 2: Layout(1), n - 1: Layout(2, T)}
    got = _run(make("auto"), schedule, 2)
    if mode == "static":
        assert_same(want, got[:n])
    assert len(got) == 2 * n


@time_limit(60)
def test_a_layout_that_fails_to_start_goes_back_and_loses_nothing(monkeypatch):
    want = _run(ferroloader.DataLoader(Plain(), batch_size=4, shuffle=True, seed=3), {}, 1)
    loader = ferroloader.DataLoader(Plain(), batch_size=4, shuffle=True, seed=3,
                                    num_workers="auto")
    it = iter(loader)
    got = [next(it)]
    it._force(Layout(2))
    got += [next(it) for _ in range(3)]
    real = it._fixed_iter
    calls = []

    def failing():
        calls.append(loader.num_workers)
        if loader.num_workers == 3:
            raise OSError(24, "Too many open files")
        return real()

    it._fixed_iter = failing
    it._force(Layout(3))
    got += list(it)
    assert calls == [3, 2]  # tried, then back on the layout that ran
    assert_same(want, got)
    assert any("could not start" in n for n in loader.stats().autotune.notes)


class Counter(Plain):
    """A dataset with state (per worker replica): tuned between epochs."""

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        pass


@time_limit(60)
def test_new_persistent_workers_at_an_epoch_boundary_draw_no_base_seed():
    """The global generator ends each epoch where a fixed persistent
    layout's does: replacing the workers draws no new base seed."""
    def epochs(loader, force=None):
        out = []
        for e in range(3):
            it = iter(loader)
            if force and e == 0:
                it._force(force)
            out += [b["i"] for b in it]
            out.append(torch.get_rng_state())
        return out

    torch.manual_seed(5)
    want = epochs(ferroloader.DataLoader(Counter(), batch_size=4, shuffle=True,
                                         num_workers=2, persistent_workers=True))
    torch.manual_seed(5)
    auto = ferroloader.DataLoader(Counter(), batch_size=4, shuffle=True,
                                  num_workers=ferroloader.Autotune(max_workers=2),
                                  persistent_workers=True)
    auto._tuned_layout = Layout(1)
    # epoch 0 on 1 worker; at epoch 1, 2 new persistent workers (the dataset
    # has state: its layout changes between epochs)
    got = epochs(auto, force=Layout(2))
    assert auto.num_workers == 2
    assert_same(want, got)


@time_limit(60)
def test_a_state_taken_after_a_next_epoch_decision_resumes():
    loader = ferroloader.DataLoader(Stream(), batch_size=4, num_workers="auto")
    it = iter(loader)
    got = [next(it)]
    it._force(Layout(1))  # for the next epoch: this one stays in the main process
    got.append(next(it))
    sd = loader.state_dict()
    assert sd["autotune"]["num_workers"] == 0
    resumed = ferroloader.DataLoader(Stream(), batch_size=4, num_workers="auto")
    resumed.load_state_dict(sd)
    got += list(resumed)
    assert_same(list(torch.utils.data.DataLoader(Stream(), batch_size=4)), got)


def test_threads_in_processes_alone_start_with_a_process():
    t = _tuner(methods=("threads_in_processes",))
    nxt = t.observe(_Interval(10, 1.0, 0.9, 0.0))  # (the main process: it grows)
    assert nxt is not None and nxt[0].worker_method == P


def test_the_climb_goes_on_while_workers_scale_even_below_the_main_process():
    # (3 MB samples on 2 cores: one worker is slower than the main process,
    # two nearly match it, four beat it)
    rates = {0: 100, 1: 50, 2: 95, 3: 110, 4: 130}
    rate = lambda lay: rates.get(lay.workers, 125)  # noqa: E731
    t = _tuner(methods=("processes",), prefetch=False)
    _feed(t, rate, lambda lay: 0.95)
    assert t.settled and t.layout.workers == 4


def test_when_no_worker_layout_beats_the_main_process_it_goes_back_to_it():
    rate = lambda lay: 100 if lay.workers == 0 else min(40 + 20 * lay.workers, 90)  # noqa: E731
    t = _tuner(methods=("processes",), prefetch=False)
    _feed(t, rate, lambda lay: 0.95)
    assert t.settled and t.layout.workers == 0


@pytest.mark.parametrize("persistent", [False, True])
def test_epochs_shorter_than_an_interval_are_measured_whole(monkeypatch, persistent):
    """An epoch far shorter than a measuring interval is measured at its
    end, so the model-based tuner decides from the first epochs on (for
    the next). (Counted as the intervals the policy is given: of those it
    keeps, one under half its layout's median rate is a stall, which a
    loaded machine makes of a 16-batch epoch now and then.)"""
    from ferroloader.tuning import live

    monkeypatch.delenv("FERROLOADER_AUTOTUNE_POLICY", raising=False)
    given = []
    measured = live.ModelTuner.measured
    monkeypatch.setattr(live.ModelTuner, "measured",
                        lambda self, m: given.append(m) or measured(self, m))
    loader = ferroloader.DataLoader(torch.arange(64), batch_size=4, shuffle=True, seed=0,
                                    num_workers="auto", persistent_workers=persistent)
    fixed = ferroloader.DataLoader(torch.arange(64), batch_size=4, shuffle=True, seed=0)
    for _ in range(3):
        assert [b.tolist() for b in loader] == [b.tolist() for b in fixed]
    policy = loader._tuner.policy
    assert policy is not None and len(given) >= 3
    assert all(m.epoch_end for m in given[:3])
    assert sum(len(v) for v in policy.seen.values()) >= 1
    # (each from iter() on: every batch of the epoch, but where new workers
    # started for it, their first batch, counted as their start: workers
    # not persistent start at every epoch, persistent ones where the layout
    # changed): the first epoch of new persistent workers is their warm-up,
    # measured for their memory only (the next ones measure them warm)
    for m, before in zip(given[:3], [None, *given[:2]]):
        new = m.layout.num_workers > 0 and (
            not persistent or before is None or before.layout != m.layout)
        assert m.batches == (0 if new and persistent else 16 - new), (m, before)
        assert (m.start > 0) == new
        assert m.wall > 0 and 0 <= m.wait <= m.wall


@pytest.mark.parametrize("policy, kind", [(None, "ModelTuner"), ("model", "ModelTuner"),
                                          ("climb", "Tuner")])
def test_the_model_based_policy_decides_unless_the_climbing_one_is_asked_for(
        monkeypatch, policy, kind):
    if policy is None:
        monkeypatch.delenv("FERROLOADER_AUTOTUNE_POLICY", raising=False)
    else:
        monkeypatch.setenv("FERROLOADER_AUTOTUNE_POLICY", policy)
    loader = ferroloader.DataLoader(torch.arange(16), batch_size=4, num_workers="auto")
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
                                            [12, 13, 14, 15]]
    assert type(loader._tuner).__name__ == kind


def test_an_unknown_tuning_policy_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("FERROLOADER_AUTOTUNE_POLICY", "fastest")
    loader = ferroloader.DataLoader(torch.arange(16), batch_size=4, num_workers="auto")
    with pytest.raises(ferroloader.ConfigError, match="'model' or 'climb', got 'fastest'"):
        iter(loader)


@time_limit(90)
@pytest.mark.parametrize("mode, cap", [("static", 8), ("dynamic", 6)])
def test_it_never_plans_more_workers_than_the_data_can_feed(mode, cap):
    """Static sharding's 8 lanes (it went to 32 threads, 24 with nothing
    to read), a dynamic queue's 6 shards: the tuner's bound is the cap, it
    says why, and no change goes past it while a job that waits on I/O
    pushes it up."""
    from shard_cases import Counted

    ds = Counted([40] * 6, delay=0.002)
    loader = ferroloader.DataLoader(ds, batch_size=4, num_workers="auto",
                                    sharding=ferroloader.Sharding(mode=mode, lanes=8))
    for _ in range(3):
        it = iter(loader)
        assert it._tuner.max_workers <= cap
        assert sorted(int(v) for b in it for v in b) == [1000 * s + o for s in range(6)
                                                         for o in range(40)]
    report = loader.stats().autotune
    assert any(f"at most {cap} workers" in n for n in report.notes), report.notes
    assert all(c.after.workers <= cap for c in report.changes), str(report)


def test_a_workers_cpu_is_read_finer_than_a_clock_tick():
    """The tuner reads its worker processes' CPU over epochs of 25 ms: in
    /proc's ticks of 10 ms that was off by up to 40 %. Read from the
    threads' run time, it agrees with the process's own clock to a
    millisecond."""
    from ferroloader import _machine

    for _ in range(5):
        a, pa = _machine.cpu_seconds(os.getpid()), time.process_time()
        t = time.perf_counter()
        while time.perf_counter() - t < 0.013:
            pass
        b, pb = _machine.cpu_seconds(os.getpid()), time.process_time()
        assert abs((b - a) - (pb - pa)) < 0.002, (b - a, pb - pa)
