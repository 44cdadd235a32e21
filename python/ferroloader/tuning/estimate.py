"""The model the tuner plans with: a layout's rate as a soft minimum of the
bounds the job's costs and the machine set (``bounds``, ``soft_min``),
the layouts a tuner may pick (``candidates``), what one interval measures
(``Measurement``), what the tuner knows of the machine (``Context``), and
the running estimates it keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ferroloader.tuning.bounds import Layout

# the soft minimum's sharpness: at two equal bounds a rate is 2**(-1/6) (0.89)
# of them (queues fall short of the tightest bound near the knee)
SHARPNESS = 6.0


# and between the workers' bound and the cores' for workers that only
# compute: 2**(-1/40) (0.98)
KNEE = 40.0


def soft_min(bounds: list[float], sharpness: float = SHARPNESS) -> float:
    finite = [b for b in bounds if math.isfinite(b)]
    if not finite:
        return math.inf
    if min(finite) <= 0:
        return 0.0
    return float(sum(b ** -sharpness for b in finite) ** (-1.0 / sharpness))


def bounds(cpu: float, wait: float, moving: float, gil: float, step: float, batch: int,
           cores: float, layout: Layout) -> list[float]:
    """The rates (samples per second) that bound ``layout``, from costs
    per sample: ``cpu`` seconds of CPU and ``wait`` seconds of waiting in
    a worker, ``moving`` seconds of the loop's CPU to take it from a worker
    process, the share ``gil`` of ``cpu`` that holds the GIL, the loop's
    ``step`` per batch of ``batch``, on ``cores`` cores."""
    if layout.num_workers == 0:
        return [batch / (batch * (cpu + wait) + step)] if cpu + wait + step > 0 else [math.inf]
    per = cpu + moving + step / batch
    # how many work at once, and the cores: queues form between them only
    # from when the workers wait (workers that only compute fill the cores
    # with none), so their knee is sharper the busier a worker is
    busy = cpu / (cpu + wait) if cpu + wait > 0 else 0.0
    out = [soft_min([layout.workers / (cpu + wait) if cpu + wait > 0 else math.inf,
                     cores / per if per > 0 else math.inf],
                    SHARPNESS + (KNEE - SHARPNESS) * busy ** 2)]
    shared = (layout.worker_method == "thread" and layout.num_workers > 1) \
        or layout.worker_threads > 1
    if gil * cpu > 0 and shared:
        # one process runs its threads' Python one at a time (one thread
        # alone is bounded by its own time already)
        out.append((layout.num_workers if layout.processes else 1) / (gil * cpu))
    loop = step + batch * moving
    out.append(batch / loop if loop > 0 else math.inf)
    return out


def candidates(cap: int, processes: bool = True, threads: bool = True,
               inner: bool = True) -> list[Layout]:
    """The layouts a tuner may pick with at most ``cap`` workers: the main
    process, processes, threads, and processes of 2 or 4 threads, of
    every count to 64 and in steps of 4 % above (the model predicts each:
    the policy climbs no ladder)."""
    out = [Layout(0)]
    counts, n = [], 1
    while n <= cap:
        # (every count to 64, then steps of 4 %)
        counts.append(n)
        n = n + 1 if n < 64 else math.ceil(n * 1.04)
    for n in counts:
        if processes:
            out.append(Layout(n, "multiprocessing"))
        if threads:
            out.append(Layout(n, "thread"))
        if inner:
            out += [Layout(n, "multiprocessing", k) for k in (2, 4) if n * k <= cap]
    return out


@dataclass(frozen=True)
class Measurement:
    """One interval on ``layout``: its seconds, the batches and samples the
    loop got, the seconds the loop spent in ``next()`` and the CPU seconds
    its thread spent there (loading, with no workers; taking the batches
    from the workers, with them), the workers' CPU seconds, the seconds
    spent in the dataset and the collate (summed over the workers, or the
    main thread's; 0 when not known), the workers' memory (summed PSS; 0
    when not read), the seconds the change to this layout
    cost (0 when none), and whether it is a whole epoch shorter than an
    interval (measured at its end: a decision is made on it)."""

    layout: Layout
    wall: float
    batches: int
    samples: int
    wait: float
    loop_cpu: float
    cpu: float = 0.0
    fetch: float = 0.0
    memory: int = 0
    start: float = 0.0
    epoch_end: bool = False

    @property
    def rate(self) -> float:
        return self.samples / self.wall if self.wall > 0 else 0.0

    @property
    def wait_share(self) -> float:
        return min(1.0, self.wait / self.wall) if self.wall > 0 else 0.0


@dataclass(frozen=True)
class Context:
    """What the policy knows before it measures: the cores, the budgets,
    each worker process's memory at its worst and each worker's arena, the
    methods allowed, the fewest workers, the batch size."""

    cores: float
    max_workers: int
    ram: float
    per_process: float
    per_worker: float
    cpu: Optional[float] = None
    processes: bool = True
    threads: bool = True
    inner: bool = True
    min_workers: int = 0
    batch: int = 1
    mid_epoch: bool = True


# an interval's rate, relative: the spread assumed with one measured, and
# the least assumed with more
NOISE_PRIOR = 0.2


NOISE_FLOOR = 0.05


def _measured(ms: list[Measurement]) -> float:
    return sum(m.samples for m in ms) / sum(m.wall for m in ms)


def _past_noise(ratios: list[tuple[float, float]]) -> float:
    """The mean of ``(ratio, weight)`` pairs moved towards 1 by twice its
    standard error (an unknown spread, with one ratio, is taken as 20 %),
    within 0.5 and 1.5."""
    if not ratios:
        return 1.0
    weight = sum(w for _, w in ratios)
    mean = sum(r * w for r, w in ratios) / weight
    n = len(ratios)
    spread = math.sqrt(sum(w * (r - mean) ** 2 for r, w in ratios) / weight * n / (n - 1)) \
        if n > 1 else NOISE_PRIOR
    # (a few intervals that happen to agree do not make the noise small)
    spread = max(spread, NOISE_FLOOR)
    off = max(0.0, abs(mean - 1.0) - 2.0 * spread / math.sqrt(n))
    return min(1.5, max(0.5, 1.0 + math.copysign(off, mean - 1.0)))


class _Avg:
    """A mean weighted by samples (``None`` until a value comes)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.weight = 0.0

    def add(self, value: float, weight: float) -> None:
        self.total += value * weight
        self.weight += weight

    @property
    def value(self) -> Optional[float]:
        return self.total / self.weight if self.weight > 0 else None
