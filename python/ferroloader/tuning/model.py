"""A machine model for ``num_workers="auto"``: how fast a layout loads a
job on a machine of N cores, and a simulator that runs a tuning policy
against it in simulated time, with noise.

The tuner's policy (``ferroloader.tuning.policy.Policy``) is a pure state
machine: measurements in, a layout out. This module is what it is proven
against where users run it, 2 to 128 cores, which this project's 2-core
machine cannot show: thousands of simulated epochs take seconds.

A job is given by its costs per sample: CPU seconds in a worker, seconds
waiting (I/O), bytes, the share of its CPU that holds the GIL (which
serialises threads of one process), a worker process's memory and start
cost, the CPU per byte of moving a batch from a worker process to the
training loop, the training step's seconds per batch, and the noise of
one measured interval. A layout's rate is bounded by:

- concurrency: ``W`` workers, each taking ``cpu + wait`` per sample;
- the cores: ``cores / (cpu + moving + step / batch)`` (the loop's step
  takes a core for its share);
- the GIL: one process runs ``1 / (gil * cpu)`` samples per second of
  Python at most, however many threads it has;
- the loop: ``batch / (step + batch * moving)``;

combined as a soft minimum (queues make a rate fall short of its
tightest bound near the knee; between concurrency and the cores the knee
is sharper the more a worker computes, since queues there come from its
waiting). The simulator's rates also carry what a
policy cannot know up front: processes past the cores contend (caches,
context switches), and every measured interval is noisy.

>>> from ferroloader.tuning.bounds import Layout
>>> job = Job(cpu=0.004, batch=32)
>>> m = Machine(cores=8)
>>> round(rate(job, m, Layout(0)))
250
>>> 7 * 250 < rate(job, m, Layout(8)) < 8 * 250
True
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Optional

from ferroloader import _machine
from ferroloader.tuning import bounds as autotune
from ferroloader.tuning.bounds import Layout
from ferroloader.tuning.climb import Tuner
from ferroloader.tuning.policy import Context, Measurement, Policy, bounds, candidates, soft_min

MiB = 1 << 20


@dataclass(frozen=True)
class Job:
    """Costs per sample (seconds, bytes), the training step per batch, and
    the relative noise (standard deviation) of one measured interval."""

    cpu: float
    wait: float = 0.0
    bytes: float = 0.0
    gil: float = 1.0
    mem: float = 64 * MiB
    start: float = 0.5
    per_byte: float = 1e-10
    step: float = 0.0
    batch: int = 32
    noise: float = 0.1

    def moving(self, layout: Layout) -> float:
        """The loop's CPU seconds per sample to take a batch from a worker
        process (threads write where the loop reads)."""
        return self.per_byte * self.bytes if layout.processes else 0.0


@dataclass(frozen=True)
class Machine:
    """Cores, the RAM the loader may use, and the workers it may start."""

    cores: int
    ram: float = float(1 << 40)
    max_workers: int = 0

    @property
    def worker_cap(self) -> int:
        return self.max_workers or max(32, 4 * self.cores)


def contention(job: Job, machine: Machine, layout: Layout) -> float:
    """What processes past the cores lose (caches, switching): the share
    of the rate left. Threads contend less (one address space)."""
    busy = job.cpu / (job.cpu + job.wait) if job.cpu + job.wait > 0 else 0.0
    demand = layout.workers * busy
    over = max(0.0, demand / machine.cores - 1.0)
    return 1.0 / (1.0 + (0.04 if layout.processes else 0.01) * over)


def rate(job: Job, machine: Machine, layout: Layout) -> float:
    """The model's samples per second for ``layout``, without noise."""
    b = bounds(job.cpu, job.wait, job.moving(layout), job.gil, job.step, job.batch,
               machine.cores, layout)
    return soft_min(b) * contention(job, machine, layout)


def memory(job: Job, layout: Layout, arena: float) -> float:
    """The layout's RAM at its worst: each process's copy, each worker's arena."""
    return layout.processes * job.mem + layout.workers * arena


def start_cost(job: Job, machine: Machine, before: Layout, after: Layout) -> float:
    """Seconds without batches while a change takes effect: the batches in
    flight drain, the new workers start (processes side by side, as many
    at once as there are cores)."""
    if before.num_workers and after.num_workers and before.processes == after.processes \
            and before.worker_method == after.worker_method \
            and before.worker_threads == after.worker_threads:
        return 0.0  # (another prefetch depth: in place)
    starts = math.ceil(after.processes / machine.cores) * job.start if after.processes else 0.0
    return 0.05 + starts + 0.002 * after.workers


@dataclass
class Run:
    """A simulated run: every layout in force from its time on, the time
    of the last change, the memory of the largest layout tried, and the
    samples delivered."""

    layouts: list[tuple[float, Layout]] = field(default_factory=list)
    settled_at: float = 0.0
    peak_memory: float = 0.0
    samples: float = 0.0
    seconds: float = 0.0

    @property
    def final(self) -> Layout:
        return self.layouts[-1][1]


def simulate(policy: Callable[[Measurement], Optional[Layout]], start: Layout, job: Job,
             machine: Machine, seed: int, seconds: float = 600.0, arena: float = 4 * MiB,
             interval: float = 0.4, stop_after: float = 60.0) -> Run:
    """Runs ``policy`` (a measurement in, a new layout or ``None`` out)
    from ``start`` for ``seconds`` of simulated time, or until it has kept
    one layout for ``stop_after`` seconds. Each interval lasts at least
    ``interval`` seconds and two rounds of the workers' batches (one batch
    in the main process); its rate,
    waiting, CPU and memory carry the job's noise."""
    rng = random.Random(seed)
    t = 0.0
    layout = start
    run = Run(layouts=[(0.0, start)])
    last_change = 0.0
    pending_start = 0.0
    while t < seconds and t - last_change < stop_after:
        true = rate(job, machine, layout)
        # (two rounds of the workers' batches, which come in bursts; the
        # main process's come one by one)
        batches = max(2 * layout.workers or 1, math.ceil(interval * true / job.batch))
        samples = batches * job.batch
        # the rate carries the job's noise; what a worker's or the loop's
        # time per sample is (CPU seconds, seconds in the fetch) 5 %
        wall = samples / true * max(0.5, rng.gauss(1.0, job.noise))

        def steady() -> float:
            return max(0.5, rng.gauss(1.0, 0.05))

        # the loop: its step outside next(), in next() what it waits and
        # its CPU there (loading, or taking the batches from the workers)
        outside = batches * job.step * steady()
        if layout.num_workers == 0:
            # (the fetch's time is its CPU, measured with it, and its waiting)
            loop_cpu = samples * job.cpu * steady()
            fetch = loop_cpu + samples * job.wait * steady()
            wall = outside + fetch
            wait = fetch
            cpu = 0.0
        else:
            # (the interval lasts at least the loop's own time: its step
            # and taking the batches; the noise cannot make it shorter)
            loop_cpu = samples * job.moving(layout) * steady()
            wall = max(wall, outside + loop_cpu)
            wait = wall - outside
            busy = steady()
            cpu = samples * job.cpu * busy
            # a worker's time in the fetch: its CPU (longer where the cores
            # are taken) and its waiting, at most the whole interval
            taken = max(1.0, cpu / wall / machine.cores)
            fetch = min(layout.workers * wall,
                        samples * (job.cpu * taken * busy + job.wait * steady()))
        mem = memory(job, layout, arena)
        run.peak_memory = max(run.peak_memory, mem)
        m = Measurement(layout=layout, wall=wall, batches=batches, samples=samples, wait=wait,
                        loop_cpu=loop_cpu, cpu=cpu, fetch=fetch,
                        # (the PSS read: at most the worst case counted)
                        memory=int(mem * rng.uniform(0.6, 1.0)),
                        start=pending_start)
        pending_start = 0.0
        t += wall
        run.samples += samples
        nxt = policy(m)
        if nxt is not None and nxt != layout:
            cost = start_cost(job, machine, layout, nxt)
            t += cost
            pending_start = cost
            layout = nxt
            last_change = t
            run.layouts.append((t, layout))
    run.settled_at = last_change
    run.seconds = t
    return run


def layouts(machine: Machine, processes: bool = True, threads: bool = True,
            inner: bool = True) -> list[Layout]:
    """The layouts a tuner may pick on ``machine`` (``policy.candidates``)."""
    return candidates(machine.worker_cap, processes, threads, inner)


def best(job: Job, machine: Machine, candidates: list[Layout], arena: float = 4 * MiB) -> tuple[
        Layout, float]:
    """The fastest of ``candidates`` within the RAM budget, by the model."""
    fits = [lay for lay in candidates if memory(job, lay, arena) <= machine.ram]
    top = max(fits, key=lambda lay: rate(job, machine, lay))
    return top, rate(job, machine, top)


# --------------------------------------------------------------------------- #
# (job, machine) pairs drawn across kinds of jobs, and a policy's outcome on them
# --------------------------------------------------------------------------- #

KINDS = ("cpu", "wait", "memory", "transport")
ARENA = 64 * MiB  # each worker's arena, as the live tuner counts it


def draw(n: int, seed: int = 0) -> list[tuple[str, Job, Machine]]:
    """``n`` (kind, job, machine) pairs: CPU-, wait-, memory- and
    transport-bound jobs in turn, on 2 to 128 cores, half of them with a
    training step that hides the loading at its best, noise of 10-20 %."""
    rng = random.Random(seed)

    def logu(lo: float, hi: float) -> float:
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))

    out = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        cores = rng.choice((2, 4, 8, 12, 16, 32, 48, 64, 96, 128))
        batch = rng.choice((8, 16, 32, 64, 128, 256))
        job = dict(cpu=logu(5e-5, 2e-2), wait=0.0, bytes=logu(100, 2e4), gil=rng.uniform(0.3, 1.0),
                   mem=logu(50 * MiB, 400 * MiB), start=logu(0.2, 3.0), per_byte=1e-10,
                   batch=batch, noise=rng.uniform(0.1, 0.2))
        ram = float(1 << 40)
        if kind == "cpu":
            job["wait"] = job["cpu"] * rng.uniform(0.0, 0.1)
        elif kind == "wait":
            job["wait"] = logu(1e-3, 5e-2)
            job["cpu"] = logu(1e-5, 5e-4)
            job["gil"] = rng.uniform(0.6, 1.0)
        elif kind == "memory":
            job["mem"] = logu(300 * MiB, 3000 * MiB)
            ram = job["mem"] * rng.uniform(0.6, 6.0) + ARENA * rng.uniform(1, 8)
            if rng.random() < 0.5:
                job["wait"] = logu(1e-4, 5e-3)
        else:
            job["bytes"] = logu(2e5, 1.2e7)
            job["per_byte"] = rng.uniform(0.5e-10, 3e-10)
            job["cpu"] = logu(1e-4, 5e-3)
        machine = Machine(cores=cores, ram=ram)
        if rng.random() < 0.5:
            # a step that hides the loading: the loop wants 20-80 % of the
            # best layout's rate
            base = Job(**job)  # type: ignore[arg-type]
            _, top = best(base, machine, layouts(machine), ARENA)
            job["step"] = batch / (top * rng.uniform(0.2, 0.8))
        out.append((kind, Job(**job), machine))  # type: ignore[arg-type]
    return out


@dataclass
class Outcome:
    """A policy's run on one pair, against the model's best layout that
    fits the budget."""

    kind: str
    job: Job
    machine: Machine
    run: Run
    best: Layout
    best_rate: float
    ratio: float
    fewest: int
    telling: float  # seconds of intervals to tell fewest + 1 workers from under 0.95

    @property
    def hides(self) -> bool:
        return self.job.step > 0


def context(job: Job, machine: Machine) -> Context:
    return Context(cores=machine.cores, max_workers=machine.worker_cap, ram=machine.ram,
                   per_process=job.mem, per_worker=ARENA, batch=job.batch)


def run_policy(job: Job, machine: Machine, seed: int, **kw: object) -> Run:
    """``policy.Policy`` on one pair, from the main process."""
    policy = Policy(context(job, machine), Layout(0))

    def decide(m: Measurement) -> Optional[Layout]:
        nxt = policy.observe(m)
        return None if nxt is None else nxt[0]

    return simulate(decide, Layout(0), job, machine, seed, arena=ARENA, **kw)  # type: ignore[arg-type]


def run_climbing(job: Job, machine: Machine, seed: int, **kw: object) -> Run:
    """The climbing policy before this one (``autotune.Tuner``) on one
    pair, for the side-by-side: what it reads of the machine (cores,
    a process's memory, file descriptors) answers the model's."""

    saved = (_machine.cores, _machine.private_dirty, _machine.fd_room)
    _machine.cores = lambda: machine.cores
    _machine.private_dirty = lambda: int(job.mem)
    _machine.fd_room = lambda: 1 << 16
    try:
        bounds = autotune.Autotune(max_workers=machine.worker_cap,
                                   ram=int(min(machine.ram, 2**62)))
        tuner = Tuner(bounds, Layout(0), True, [])

        def decide(m: Measurement) -> Optional[Layout]:
            nxt = tuner.measured(m)
            if nxt is None:
                return None
            tuner.record(0, 0, nxt[0], nxt[1])
            return nxt[0]

        return simulate(decide, Layout(0), job, machine, seed, arena=ARENA,
                        **kw)  # type: ignore[arg-type]
    finally:
        _machine.cores, _machine.private_dirty, _machine.fd_room = saved


def outcome(kind: str, job: Job, machine: Machine, run: Run) -> Outcome:
    opts = [lay for lay in layouts(machine) if memory(job, lay, ARENA) <= machine.ram]
    top, top_rate = best(job, machine, opts, ARENA)
    fewest = min(lay.workers for lay in opts if rate(job, machine, lay) >= 0.95 * top_rate)
    return Outcome(kind, job, machine, run, top, top_rate,
                   rate(job, machine, run.final) / top_rate, fewest,
                   telling(job, machine, opts, top_rate, fewest))


def telling(job: Job, machine: Machine, opts: list[Layout], top_rate: float,
            fewest: int) -> float:
    """Seconds of measured intervals a policy needs to tell the fastest
    layout of at most ``fewest + 1`` workers from one under 0.95 of the
    best, at twice the standard error of the job's noise: ``(2 * noise /
    gap) ** 2`` intervals of that layout's length (0.4 s, or two rounds of
    its batches). Near the knee of many workers the gap is a fraction of a
    percent, and this runs to hours."""
    near_rate, near = max(((rate(job, machine, lay), lay) for lay in opts
                           if lay.workers <= fewest + 1), key=lambda pair: pair[0])
    gap = near_rate / top_rate - 0.95
    if gap <= 0:
        return math.inf
    length = max(0.4, 2 * max(1, near.workers) * job.batch / near_rate)
    return (2 * job.noise / gap) ** 2 * length


def evaluate(pairs: list[tuple[str, Job, Machine]],
             runner: Callable[[Job, Machine, int], Run] = run_policy) -> list[Outcome]:
    return [outcome(kind, job, machine, runner(job, machine, i))
            for i, (kind, job, machine) in enumerate(pairs)]


def summary(outs: list[Outcome]) -> dict[str, float]:
    """What the done-when asks of a policy over the pairs."""
    ratios = sorted(o.ratio for o in outs)
    hides = [o for o in outs if o.hides]
    settle = sorted(o.run.settled_at for o in outs)
    return {
        "pairs": len(outs),
        "at least 0.95 of the best": sum(r >= 0.95 for r in ratios) / len(ratios),
        "the worst": ratios[0],
        "median": ratios[len(ratios) // 2],
        "settled within 60 s": sum(t <= 60 for t in settle) / len(settle),
        "the latest settling (s)": settle[-1],
        "over the RAM budget": sum(o.run.peak_memory > o.machine.ram for o in outs),
        "step hides the loading": len(hides),
        "of those, more than 1 worker over the fewest that feed":
            sum(o.run.final.workers > o.fewest + 1 for o in hides),
        "... where the fewest are under 8":
            sum(o.run.final.workers > o.fewest + 1 for o in hides if o.fewest < 8),
        "... pairs with fewest under 8": sum(o.fewest < 8 for o in hides),
        "... where 60 s of intervals can tell the fewest + 1 from under 0.95":
            sum(o.run.final.workers > o.fewest + 1 for o in hides if o.telling <= 60),
        "... pairs where they can": sum(o.telling <= 60 for o in hides),
    }


SHARES = ("at least 0.95 of the best", "settled within 60 s")


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m ferroloader.tuning.model [PAIRS] [SEED]``: the model-based
    policy and the climbing one side by side on drawn pairs."""
    import sys
    import time

    args = sys.argv[1:] if argv is None else argv
    n = int(args[0]) if args else 240
    seed = int(args[1]) if len(args) > 1 else 1
    pairs = draw(n, seed)
    rows = {}
    for name, runner in (("model-based Policy", run_policy), ("climbing Tuner", run_climbing)):
        t = time.perf_counter()
        rows[name] = summary(evaluate(pairs, runner))
        rows[name]["simulation seconds"] = time.perf_counter() - t
    names = list(rows)
    print(f"| {n} pairs, seed {seed} | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for key in rows[names[0]]:
        cells = []
        for name in names:
            v = rows[name][key]
            cells.append(f"{v:.1%}" if key in SHARES else f"{v:.2f}" if isinstance(v, float)
                         else str(v))
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()


__all__ = ["Job", "Machine", "Outcome", "Run", "best", "draw", "evaluate", "layouts", "memory",
           "rate", "run_climbing", "run_policy", "simulate", "summary", "telling"]
