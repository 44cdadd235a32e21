"""The model the tuner plans with: a layout's rate as a soft minimum of the
bounds the job's costs and the machine set (``bounds``, ``soft_min``),
the layouts a tuner may pick (``candidates``), what one interval measures
(``Measurement``), what the tuner knows of the machine (``Context``). The
arithmetic is the engine's (``src/tuning``); these are its Python faces,
for the simulator (``tuning.model``) and the tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import ferroloader._core as _core
from ferroloader.tuning.bounds import Layout

# the soft minimum's sharpness: at two equal bounds a rate is 2**(-1/6) (0.89)
# of them (queues fall short of the tightest bound near the knee)
SHARPNESS = 6.0
# an interval's rate, relative: the spread assumed with one measured
NOISE_PRIOR = 0.2


def key(layout: Layout) -> tuple[int, str, int, int]:
    """``layout`` as the engine takes it."""
    return (layout.num_workers, layout.worker_method, layout.worker_threads,
            layout.prefetch_factor)


def soft_min(bounds: list[float], sharpness: float = SHARPNESS) -> float:
    return _core.tune_soft_min(bounds, sharpness)


def bounds(cpu: float, wait: float, moving: float, gil: float, step: float, batch: int,
           cores: float, layout: Layout) -> list[float]:
    """The rates (samples per second) that bound ``layout``, from costs
    per sample: ``cpu`` seconds of CPU and ``wait`` seconds of waiting in
    a worker, ``moving`` seconds of the loop's CPU to take it from a worker
    process, the share ``gil`` of ``cpu`` that holds the GIL, the loop's
    ``step`` per batch of ``batch``, on ``cores`` cores."""
    return _core.tune_bounds(cpu, wait, moving, gil, step, batch, cores, key(layout))


def candidates(cap: int, processes: bool = True, threads: bool = True,
               inner: bool = True) -> list[Layout]:
    """The layouts a tuner may pick with at most ``cap`` workers: the main
    process, processes, threads, and processes of 2 or 4 threads, of
    every count to 64 and in steps of 4 % above (the model predicts each:
    the policy climbs no ladder)."""
    return [Layout(*t) for t in _core.tune_candidates(cap, processes, threads, inner)]


def _past_noise(ratios: Iterable[tuple[float, float]]) -> float:
    """The mean of ``(ratio, weight)`` pairs moved towards 1 by twice its
    standard error (an unknown spread, with one ratio, is taken as 20 %),
    within 0.5 and 1.5."""
    return _core.tune_past_noise(list(ratios))


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
