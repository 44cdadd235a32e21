"""The machine model (``ferroloader.tuning.model``) and the model-based policy
(``tunepolicy.Policy``) run against it in simulated time: the model's
bounds, the simulator's determinism, and what the policy must never do
whatever it measures (read a clock or ``/proc``, cross the RAM budget)."""

from __future__ import annotations

import builtins
import dataclasses
import os
import time

import pytest
from ferroloader.tuning import model as tm
from ferroloader.tuning.bounds import Layout
from ferroloader.tuning.policy import Context, Measurement, Policy
from hypothesis import given, settings
from hypothesis import strategies as st


def test_the_main_process_loads_and_steps_in_turn():
    job = tm.Job(cpu=0.001, wait=0.002, step=0.05, batch=10)
    assert tm.rate(job, tm.Machine(cores=8), Layout(0)) == pytest.approx(10 / (10 * 0.003 + 0.05))


def test_threads_of_one_process_share_its_gil_and_processes_do_not():
    job = tm.Job(cpu=0.001, gil=1.0, batch=32)
    m = tm.Machine(cores=16)
    # pure Python in threads: no faster than one worker
    assert tm.rate(job, m, Layout(8, "thread")) <= 1000
    assert tm.rate(job, m, Layout(8)) > 6 * 1000
    released = tm.Job(cpu=0.001, gil=0.1, batch=32)
    assert tm.rate(released, m, Layout(8, "thread")) > 6 * 1000


def test_a_batch_moved_from_worker_processes_costs_the_loop_and_threads_do_not():
    job = tm.Job(cpu=0.0005, bytes=8e6, per_byte=2e-10, gil=0.2, batch=8)
    m = tm.Machine(cores=64)
    # the loop takes 1.6 ms a sample from processes: at most 625 a second
    assert tm.rate(job, m, Layout(32)) < 625
    assert tm.rate(job, m, Layout(32, "thread")) > 2 * 625


def test_the_simulation_is_deterministic_for_a_seed():
    pairs = tm.draw(12, seed=3)
    a = [(o.run.layouts, o.run.settled_at) for o in tm.evaluate(pairs)]
    b = [(o.run.layouts, o.run.settled_at) for o in tm.evaluate(pairs)]
    assert a == b


def test_the_policy_reads_no_clock_and_no_file(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the policy read the machine")

    for name in ("perf_counter", "monotonic", "time", "thread_time", "process_time"):
        monkeypatch.setattr(time, name, refuse)
    monkeypatch.setattr(os, "times", refuse)
    monkeypatch.setattr(builtins, "open", refuse)
    for _kind, job, machine in tm.draw(8, seed=5):
        tm.run_policy(job, machine, seed=1)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_the_policy_never_goes_over_the_ram_budget(seed):
    # (one of each kind in four draws: memory-bound ones have tight budgets)
    _kind, job, machine = tm.draw(4, seed=seed)[seed % 4]
    run = tm.run_policy(job, machine, seed=seed)
    policy = Policy(tm.context(job, machine), Layout(0))
    for _, lay in run.layouts:
        assert policy.need(lay) <= machine.ram
    assert run.peak_memory <= machine.ram


def test_memory_over_what_was_counted_moves_to_a_layout_that_fits():
    ctx = Context(cores=8, max_workers=32, ram=1000.0, per_process=200.0, per_worker=10.0,
                  batch=8)
    p = Policy(ctx, Layout(4))
    m = Measurement(Layout(4), wall=1.0, batches=10, samples=80, wait=0.9, loop_cpu=0.01,
                    cpu=2.0, memory=990)
    nxt = p.observe(m)
    assert nxt is not None and "memory" in nxt[1]
    assert p.need(nxt[0]) <= ctx.ram and nxt[0].processes < 4


def test_a_warm_up_measured_for_its_memory_only_is_checked_against_the_budget():
    """New persistent workers' first short epoch is measured for their
    memory only (no batches: its rate is their warm-up's): over the
    budget, it moves to a layout that fits; under it, it decides nothing
    and teaches no rate."""
    ctx = Context(cores=8, max_workers=32, ram=1000.0, per_process=200.0, per_worker=10.0,
                  batch=8)
    for memory, moves in [(990, True), (500, False)]:
        p = Policy(ctx, Layout(4))
        nxt = p.observe(Measurement(Layout(4), wall=0.02, batches=0, samples=0, wait=0.0,
                                    loop_cpu=0.0, cpu=0.0, memory=memory, start=0.05,
                                    epoch_end=True))
        assert (nxt is not None) == moves, nxt
        if moves:
            assert "memory" in nxt[1] and p.need(nxt[0]) <= ctx.ram
        assert p.seen == {}


def test_the_model_based_policy_beats_the_climbing_one_on_drawn_pairs():
    """Side by side on the same pairs (the climbing Tuner is what the live
    loader ran before): more pairs at 0.95 of the best, a better worst."""
    pairs = tm.draw(24, seed=11)
    new = tm.summary(tm.evaluate(pairs))
    old = tm.summary(tm.evaluate(pairs, tm.run_climbing))
    assert new["at least 0.95 of the best"] >= old["at least 0.95 of the best"]
    assert new["the worst"] > old["the worst"]
    assert new["over the RAM budget"] == old["over the RAM budget"] == 0


@given(st.lists(st.floats(0.5, 1.5), min_size=1, max_size=12), st.floats(0.01, 0.3))
@settings(max_examples=50, deadline=None)
def test_a_correction_lies_between_the_measured_mean_and_one(values, spread):
    """Past the noise: the correction never goes beyond what the intervals
    measured, never crosses 1, and one interval alone moves it only by
    what lies past twice the assumed spread."""
    from ferroloader.tuning.estimate import NOISE_PRIOR, _past_noise

    ratios = [(v, 1.0) for v in values]
    mean = sum(values) / len(values)
    got = _past_noise(ratios)
    assert min(mean, 1.0) - 1e-9 <= got <= max(mean, 1.0) + 1e-9
    if len(values) == 1:
        assert got == pytest.approx(1.0 + max(0.0, abs(mean - 1) - 2 * NOISE_PRIOR)
                                    * (1 if mean > 1 else -1))


def test_a_shortfall_that_the_loop_explains_is_not_read_as_the_gil():
    """Threads inside a process whose batches cost the loop more than the
    GIL could hold them back: measured short of their bound (noise), the
    share the GIL would need is over all of the CPU, so the prior stays
    and threads are still predicted by it."""
    ctx = Context(cores=48, max_workers=64, ram=float(1 << 40), per_process=1 << 26,
                  per_worker=1 << 22, batch=256)
    policy = Policy(ctx, Layout(0))
    n = 256 * 8
    # the main process: 1.33e-4 s of CPU a sample, nothing waited
    for _ in range(2):
        policy.observe(Measurement(Layout(0), wall=n * 1.33e-4, batches=8, samples=n,
                                   wait=n * 1.33e-4, loop_cpu=n * 1.33e-4))
    probe = Layout(1, "multiprocessing", 4)
    # one process of 4 threads: the loop spends 1.87e-4 s a sample taking
    # its batches, so it gets ~5.3k samples/s; measured 20 % short (noise,
    # or anything else the model does not know)
    for rate in (4300.0, 4200.0):
        wall = n / rate
        policy.observe(Measurement(probe, wall=wall, batches=8, samples=n, wait=0.9 * wall,
                                   loop_cpu=n * 1.87e-4, cpu=n * 1.33e-4))
    assert policy.gil < 0.5


@pytest.mark.parametrize("ram, first", [(float(1 << 40), Layout(2)),
                                         (1.5 * (1 << 30), Layout(2, "thread"))])
def test_a_cpu_bound_job_leaves_the_main_process_for_workers_with_a_gil_each(ram, first):
    """Out of the main process on the GIL's prior, a CPU-bound job goes to
    processes of one thread each (threads may fall short by the GIL); where
    the budget holds one process only, to threads: one process of two
    threads shares a GIL as they do and costs a fork. (Live, 2M strings
    under a budget went to 1 process x 2 threads first, and the fork of a
    750 MiB process and its teardown cost a tenth of the epoch.)"""
    ctx = Context(cores=2, max_workers=32, ram=ram, per_process=1 << 30, per_worker=1 << 20,
                  batch=256)
    policy = Policy(ctx, Layout(0))
    n = 256 * 600
    nxt = None
    for _ in range(2):  # (0.65 us of CPU a sample, nothing waited)
        nxt = policy.observe(Measurement(Layout(0), wall=n * 6.5e-7, batches=600, samples=n,
                                         wait=n * 6.4e-7, loop_cpu=n * 6.4e-7))
    assert nxt is not None and nxt[0] == first, nxt


def test_short_epochs_that_measure_alike_do_not_move_the_layout_about():
    """Epochs of 25 ms, each measured whole and each a decision: where the
    worker layouts measure alike (within a tenth, as one epoch's noise
    is), the policy keeps the first that measured so, rather than visit
    every near-equal layout the model predicts a few percent over it (each
    move costs an epoch or two of new workers warming up). Live, on 2,000
    images an epoch, it had made 4-6 moves in 12 epochs, for 0.61 of the
    best from the third epoch; here it went on to 2 threads, measured as
    2 processes had."""
    ctx = Context(cores=2, max_workers=32, ram=float(1 << 40), per_process=1 << 26,
                  per_worker=1 << 22, batch=32)
    policy = Policy(ctx, Layout(0))
    layout, moves = Layout(0), []
    for epoch in range(12):
        rate = 70_000.0 if layout.workers == 0 else 85_000.0 * (1.0 + 0.04 * (epoch % 3 - 1))
        wall = 2016 / rate
        busy = layout.workers == 0
        nxt = policy.observe(Measurement(
            layout, wall=wall, batches=63, samples=2016, wait=0.97 * wall,
            loop_cpu=0.97 * wall if busy else 0.1 * wall, cpu=0.0 if busy else 2016 * 2.4e-5,
            epoch_end=True))
        if nxt is not None:
            moves.append((epoch, nxt[0]))
            layout = nxt[0]
    assert layout.workers > 0, moves
    assert len(moves) == 1, moves  # (out of the main process, and kept)


def _cores_giving(layout: Layout, epoch: int, cores: float) -> Measurement:
    """An epoch of 25 ms measured whole on 2 cores of which the workers
    get ``cores`` whatever their layout (the loop, the epochs' ends, the
    memory's bandwidth): 14.5 us a sample in the main process, 20 in a
    worker (as 2,000 images an epoch measured live)."""
    noise = 1.0 + 0.04 * (epoch % 3 - 1)
    busy = layout.workers == 0
    rate = (63_000.0 if busy else min(layout.workers, cores) / 2.0e-5) * noise
    wall = 2016 / rate
    return Measurement(layout, wall=wall, batches=63, samples=2016, wait=0.97 * wall,
                       loop_cpu=2016 * (1.45e-5 if busy else 1e-6),
                       cpu=0.0 if busy else 2016 * 2.0e-5, epoch_end=True)


_SHORT_CTX = Context(cores=2, max_workers=32, ram=float(1 << 40), per_process=1 << 26,
                     per_worker=1 << 22, batch=32)


def test_short_epochs_move_out_of_the_main_process_to_no_more_workers_than_cores():
    """On whole short epochs the first move takes the fewest workers
    within a tenth of the best predicted, as the keeping does: it had
    taken 3 processes on 2 cores (predicted a few percent over 2 by the
    knee), measured 0.82 of 2 processes, and kept them."""
    policy = Policy(_SHORT_CTX, Layout(0))
    layout, moves = Layout(0), []
    for epoch in range(12):
        nxt = policy.observe(_cores_giving(layout, epoch, 1.65))
        if nxt is not None:
            moves.append((epoch, nxt[0]))
            layout = nxt[0]
    assert len(moves) == 1, moves
    assert 0 < layout.workers <= 2, moves


@pytest.mark.parametrize("cores", [1.5, 1.65, 1.8])
def test_short_epochs_do_not_move_to_a_kind_for_not_having_measured_it(cores):
    """On 2 processes that measured short of the model (the cores give
    less than it says), a kind not measured yet is predicted with that
    shortfall: the policy stays. It had gone on to 3 threads, and to 4
    processes x 2 threads and back, each move a start of every worker
    (0.5 of the best from the third epoch, live)."""
    policy = Policy(_SHORT_CTX, Layout(0))
    policy.observe(_cores_giving(Layout(0), 0, cores))
    layout, moves = Layout(2), []
    for epoch in range(1, 12):
        nxt = policy.observe(_cores_giving(layout, epoch, cores))
        if nxt is not None:
            moves.append((epoch, nxt[0]))
            layout = nxt[0]
    assert moves == []


def test_short_epochs_judge_workers_on_two_epochs():
    """New worker processes' second epoch still faults in the pages of
    the dataset their first did not touch: live, it ran at 51k samples/s
    where the main process had run 67k and the next epochs ran 90k. On
    that one epoch the policy went back to the main process and stayed
    (0.62 of the best from the third epoch); on two it keeps them."""
    policy = Policy(_SHORT_CTX, Layout(0))

    def epoch(layout: Layout, rate: float, cpu: float) -> Measurement:
        wall = 2016 / rate
        busy = layout.workers == 0
        return Measurement(layout, wall=wall, batches=63, samples=2016, wait=0.97 * wall,
                           loop_cpu=2016 * 1.45e-5 if busy else 2016 * 1e-6,
                           cpu=0.0 if busy else cpu * 2016, epoch_end=True)

    nxt = policy.observe(epoch(Layout(0), 67_000.0, 0.0))
    assert nxt is not None and nxt[0].workers == 2, nxt
    layout, moves = nxt[0], []
    for i, rate in enumerate([51_000.0, 90_000.0, 88_000.0, 92_000.0, 90_000.0]):
        nxt = policy.observe(epoch(layout, rate, 2.0e-5 * (1.6 if i == 0 else 1.0)))
        if nxt is not None:
            moves.append(nxt)
            layout = nxt[0]
    assert layout.workers == 2 and moves == [], moves


@pytest.mark.parametrize("module", ["tuning.bounds", "tuning.model", "tuning.policy"])
def test_the_modules_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"ferroloader.{module}"))
    assert result.attempted > 0 and result.failed == 0


def test_a_gil_share_learnt_after_settling_is_acted_on_at_once():
    """Threads chosen on the GIL's prior (a probe of 4 waiting threads
    cannot show it) turn out held by it once hundreds run: the policy moves
    to processes of threads on the next interval, not after the settled
    cadence and the late gain, and within the minute. (A pair drawn by
    ``tm.draw(240, 3)``, where it stayed on 378 threads at 0.85 of the best.)"""
    kind, job, machine = tm.draw(240, 3)[33]
    out = tm.outcome(kind, job, machine, tm.run_policy(job, machine, seed=33))
    threads = [lay for _, lay in out.run.layouts if lay.worker_method == "thread"]
    assert any(lay.workers > 100 for lay in threads), "the pair no longer shows the case"
    assert out.run.final.processes and out.ratio >= 0.9
    assert out.run.settled_at <= 60


def test_processes_the_ram_holds_no_more_of_try_threads_inside_once():
    """A memory-bound job whose budget holds 3 processes: a noisy probe of
    4 threads in one process read the GIL's share as 1, so threads inside
    the 3 processes were never kept (0.81 of the best). Before settling on
    the processes it tries them with 2 threads each, once, and keeps what
    measures better. (A pair drawn by ``tm.draw(240, 4)``.)"""
    job = tm.Job(cpu=0.010361, wait=0.0, bytes=4123.7, gil=0.81193, mem=1648.75e6,
                 start=2.6387, per_byte=1e-10, step=0.0, batch=128, noise=0.18785)
    machine = tm.Machine(cores=16, ram=6367.7e6)
    out = tm.outcome("memory", job, machine, tm.run_policy(job, machine, seed=30))
    policy = Policy(tm.context(job, machine), Layout(0))
    assert not policy.fits(Layout(4)), "the budget should hold 3 processes at most"
    kinds = [(lay.processes, lay.worker_threads) for _, lay in out.run.layouts]
    assert (3, 2) in kinds or out.run.final.worker_threads > 1
    assert out.ratio >= 0.9
    assert out.run.settled_at <= 60


def test_a_gil_share_read_from_a_shortfall_near_the_loops_bound_is_measured_again():
    """A transport-bound job whose step hides the loading: 2 threads feed
    the loop, but their first noisy intervals fell 9 % short of it, which
    read as a GIL share of 0.96 (it is 0.40). One thread was then kept
    (0.87 of the best) and the threads never run again. Before settling it
    measures them once more and keeps them. (A pair drawn by
    ``tm.draw(240, 6)``.) Since a tie goes to processes while the GIL's
    share is the prior, the policy measures 2 processes first and then
    goes to 2 threads: they must be measured, and kept, either way."""
    job = tm.Job(cpu=0.00026639, wait=0.0, bytes=2729223.1, gil=0.40257, mem=215.256e6,
                 start=0.62342, per_byte=1.16423e-10, step=0.0040731, batch=16, noise=0.16923)
    machine = tm.Machine(cores=16)
    out = tm.outcome("transport", job, machine, tm.run_policy(job, machine, seed=179))
    assert any(lay == Layout(2, "thread") for _, lay in out.run.layouts)
    assert out.run.final.workers >= 2
    assert out.ratio >= 0.95
    assert out.run.settled_at <= 60


def test_a_fed_loop_does_not_move_for_a_few_workers_less_when_batches_take_seconds():
    """Samples that wait 46 ms each in batches of 128: an interval on 427
    threads is 16 s. They fed the loop, but a noisy interval put them
    2.6 % under the best, and it moved to 416 workers in 104 new
    processes, settling at 66 s. Where the loop is fed, a move to fewer
    workers must leave out at least 5 % of them. (A pair drawn by
    ``tm.draw(240, 8)``.)"""
    job = tm.Job(cpu=1.6308e-05, wait=0.045712, bytes=2453.8, gil=0.69497, mem=310.03e6,
                 start=0.37017, per_byte=1e-10, step=0.018196, batch=128, noise=0.17469)
    machine = tm.Machine(cores=128)
    out = tm.outcome("wait", job, machine, tm.run_policy(job, machine, seed=121))
    assert out.run.settled_at <= 60
    assert out.ratio >= 0.95


def test_a_kind_measured_short_on_a_probes_two_intervals_is_tried_once_more():
    """A CPU-bound job on 8 cores whose step hides the loading: the probe's
    two intervals of 4 processes came 18 % under the model by the noise,
    which corrected every layout of processes down, and it settled on 6
    processes x 2 threads (12 workers, 0.96 of the best) where 7 processes
    feed the loop. Before settling it measures the plan without that
    correction once. (A pair drawn by ``tm.draw(240, 2)``.)"""
    job = tm.Job(cpu=0.011696, wait=0.00062820, bytes=13017.0, gil=0.87980, mem=62.015e6,
                 start=1.3828, per_byte=1e-10, step=0.017712, batch=8, noise=0.15194)
    machine = tm.Machine(cores=8)
    out = tm.outcome("cpu", job, machine, tm.run_policy(job, machine, seed=112))
    assert out.run.final.worker_threads == 1 and out.run.final.processes
    assert out.run.final.workers <= out.fewest + 1
    assert out.ratio >= 0.95
    assert out.run.settled_at <= 60


def _pair(shape: str, seed: int, i: int) -> tm.Outcome:
    """Pair ``i`` of ``tm.draw(240, seed)`` on a machine of ``shape``, run."""
    kind, job, machine = tm.draw(240, seed)[i]
    machine = dataclasses.replace(machine, shape=shape)
    return tm.outcome(kind, job, machine, tm.run_policy(job, machine, seed=i))


def test_a_climb_that_measured_more_goes_on_where_the_model_said_it_would_not():
    """On a closed queueing network (the family's ``queue`` member) each
    worker more gives a little more long past where the model's knee
    stops: 2 processes on 2 cores measured short of the model, a climb to
    3 measured 29 % more, and the model, whose cores bound 3 processes
    already reached, said 5 could give no more. The policy stopped there
    at 0.70 of the best. A climb whose step measured more past the noise
    goes on whatever the model said: to 5 processes, at 0.83.
    (Pair 79 of ``tm.draw(240, 1)``; the best is 32 threads, whose
    shortfall at 2 was read as the GIL's, which is left as it is.)"""
    out = _pair("queue", 1, 79)
    procs = [lay.workers for _, lay in out.run.layouts if lay.processes]
    assert 3 in procs, "the pair no longer shows the case"
    assert out.run.final.processes and out.run.final.workers >= 5
    assert out.ratio >= 0.8
    assert out.run.settled_at <= 60


def test_workers_that_only_compute_are_not_climbed_to_past_twice_the_cores():
    """A CPU-bound job on 12 cores settled on 13 processes; then a
    neighbour took 6 of the cores. The rate fell to 0.4 of what it was,
    the policy started over on the 6 or 7 cores the workers still got,
    13 processes measured short of the model, and a softer knee explained
    it: climbs went on to 20 and 30 processes, 0.87 of the best (7), for
    processes past the cores contend. Workers that only compute, where
    the cores bound them, get nothing from more than twice the cores on
    a knee of any shape: no climb goes there. (Pair 200 of
    ``tm.draw(240, 2)`` on the ``shift`` member.)"""
    out = _pair("shift", 2, 200)
    assert out.machine.cores == 12 and out.job.wait < 0.1 * out.job.cpu
    after = [lay.workers for t, lay in out.run.layouts if t > tm.SHIFT_AT]
    assert max(after, default=13) <= 2 * 7 + 2
    assert out.ratio >= 0.95


def test_threads_inside_processes_short_of_the_model_try_as_many_processes():
    """A waiting job on 128 cores: 100 processes of 4 threads each fed the
    loop short of the model (0.88 of the best, 502 processes, on a GIL
    that convoys), and the trial of as many workers of the other kind
    never came: past 64 the candidates' counts step by 4 %, and there are
    no 400 processes, only 394. The trial takes the nearest count.
    (Pair 53 of ``tm.draw(240, 1)`` on the ``convoy`` member.)"""
    out = _pair("convoy", 1, 53)
    seen = [lay for _, lay in out.run.layouts]
    assert Layout(100, "multiprocessing", 4) in seen
    assert Layout(394) in seen
    assert out.ratio >= 0.95


def test_threads_far_short_of_the_model_try_processes_after_the_exploring_time():
    """A waiting job on 2 cores whose batches take seconds: by the time 31
    threads had two intervals, the 45 s in which the policy explores were
    spent. They measured 0.57 of the model (a GIL that convoys), a softer
    knee explained it as well, and the policy kept them: 0.56 of the best.
    A layout that far short of the model, past the noise, has the other
    kind measured once, late or not: 31 processes, at 0.99. (Pair 41 of
    ``tm.draw(240, 4)`` on the ``convoy`` member.)"""
    out = _pair("convoy", 4, 41)
    assert any(lay == Layout(31, "thread") for _, lay in out.run.layouts)
    assert out.run.final == Layout(31)
    assert out.ratio >= 0.95
    # (31 processes start 2 at a time on 2 cores: 25 s of starts)
    assert out.run.settled_at <= 90


def test_one_worker_far_short_of_the_model_climbs_after_the_exploring_time():
    """A CPU-bound job on 2 cores whose batches of 256 take 3 s in the
    loop: on a queueing network one worker overlaps nothing with the loop
    (0.53 of the best, where the model said it would feed it), and by the
    time the other kind had two intervals of 11 s the exploring time was
    spent. Where the other kind was measured already, the late trial is
    one more worker of the kind in force: 2 threads, at 0.72, settled
    within the minute. (Pair 156 of ``tm.draw(240, 3)`` on the ``queue``
    member.)"""
    out = _pair("queue", 3, 156)
    seen = [lay for _, lay in out.run.layouts]
    assert Layout(1) in seen and Layout(1, "thread") in seen
    assert out.run.final.workers >= 2
    assert out.ratio >= 0.7
    assert out.run.settled_at <= 60


def test_telling_the_fewest_from_one_under_the_mark_takes_longer_the_more_workers_feed():
    """Where a loop needs few workers, one more is a large step in the rate
    and seconds of intervals tell it; where it needs a hundred, one is a
    fraction of a percent and no 60 s of noisy intervals can."""
    machine = tm.Machine(cores=128)
    few = tm.Job(cpu=0.004, step=0.032, batch=32, noise=0.15)  # about 4 workers feed it
    many = tm.Job(cpu=0.004, wait=0.1, step=0.032, batch=32, noise=0.15)  # about 100
    told = []
    for job in (few, many):
        out = tm.outcome("cpu", job, machine, tm.Run(layouts=[(0.0, Layout(1))]))
        told.append((out.fewest, out.telling))
    (f_few, t_few), (f_many, t_many) = told
    assert f_few < 8 < 64 < f_many
    assert t_few <= 60 < 10 * 60 < t_many


def test_the_policy_is_judged_on_a_family_of_machines_not_by_its_own_formula():
    """The same pairs on a machine of each shape (a sharper and a softer
    knee, a convoying GIL, hard contention, heavy-tailed noise, a neighbour
    arriving mid-run): each member's best layout is its own, the policy
    stays within the RAM budget on every one, and the members judge it
    differently (a machine shaped otherwise than the model is where it
    misses: docs/performance.md has the 240-pair table)."""
    pairs = tm.draw(24, seed=11)
    outs = tm.family(pairs)
    assert set(outs) == set(tm.SHAPES)
    for shape, got in outs.items():
        assert len(got) == 24 and all(o.machine.shape == shape for o in got)
        assert all(o.run.peak_memory <= o.machine.ram for o in got), shape
    tops = {shape: [o.best_rate for o in got] for shape, got in outs.items()}
    for shape in ("sharp", "soft", "convoy", "shift"):
        assert tops[shape] != tops["model"], shape
    assert all(s >= m * (1 - 1e-9) for s, m in zip(tops["sharp"], tops["model"]))
    assert all(s <= m * (1 + 1e-9) for s, m in zip(tops["soft"], tops["model"]))
    # (the shift halves the cores: the best it ends with is slower)
    assert sum(tops["shift"]) < sum(tops["model"])
    with pytest.raises(ValueError, match="not a machine shape; the shapes are model, sharp"):
        tm.rate(pairs[0][1], tm.Machine(8, shape="bumpy"), Layout(2))


def test_the_policy_is_judged_on_every_member_of_the_family():
    """The policy on 24 pairs per member, each against that machine's own
    best: a floor under what the 240-pair table in docs/performance.md
    shows (at least 0.95 of the best on 18 pairs in 24 of every member,
    0.8 at worst, settled within 60 s of the start or of the machine's
    change on all but 2), so that a change that loses a member fails
    here. (On this draw: 19 to 24 pairs, 0.82 at worst.)"""
    outs = tm.family(tm.draw(24, seed=11))
    for shape, got in outs.items():
        ratios = sorted(o.ratio for o in got)
        assert sum(r >= 0.95 for r in ratios) >= 18, (shape, ratios)
        assert ratios[0] >= 0.8, (shape, ratios)
        late = [tm.settled_after(o) for o in got if tm.settled_after(o) > 60]
        assert len(late) <= 2, (shape, late)


def test_the_family_table_counts_the_misses_no_minute_of_intervals_can_tell(capsys):
    """``python -m ferroloader.tuning.model --family`` prints, per member,
    the share at 0.95 of the best and, of the pairs under it, those where
    60 s of intervals cannot tell the fewest workers near the best from a
    layout under 0.95 (a frugal policy's limit, not its choice): never
    more than the misses, and some on the queueing member, whose knee is
    the softest."""
    tm.main(["--family", "24", "11"])
    rows = {}
    for line in capsys.readouterr().out.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    shares = [float(c.rstrip("%")) / 100 for c in rows["at least 0.95 of the best"]]
    untold = [int(c) for c in rows["of the misses, pairs 60 s of intervals cannot tell"]]
    assert len(untold) == len(tm.SHAPES)
    for share, n in zip(shares, untold):
        assert 0 <= n <= round((1 - share) * 24)
    assert untold[tm.SHAPES.index("queue")] > 0


def test_a_machine_that_changes_is_judged_from_its_change():
    """On a machine a neighbour takes half the cores of after SHIFT_AT
    seconds, the same fixed layout loads about half as fast after it, and
    a run's settling counts from the change when it settled after it."""
    job = tm.Job(cpu=0.004, batch=32, noise=0.05)
    rates: list[tuple[float, float]] = []
    clock = [0.0]

    def keep(m: object) -> None:
        clock[0] += m.wall  # type: ignore[attr-defined]
        rates.append((clock[0], m.samples / m.wall))  # type: ignore[attr-defined]
        return None

    tm.simulate(keep, Layout(8), job, tm.Machine(8, shape="shift"), seed=3, seconds=40.0,
                stop_after=1e9)
    before = [r for t, r in rates if t < tm.SHIFT_AT]
    after = [r for t, r in rates if t > tm.SHIFT_AT + 1]
    assert 0.4 < (sum(after) / len(after)) / (sum(before) / len(before)) < 0.6
    o = tm.outcome("cpu", job, tm.Machine(8, shape="shift"),
                   tm.Run([(0.0, Layout(0)), (70.0, Layout(4))], 70.0))
    assert tm.settled_after(o) == 70.0 - tm.SHIFT_AT
