"""The climbing policy that ``num_workers="auto"`` used before the
model-based one (``FERROLOADER_AUTOTUNE_POLICY=climb``): it climbs a ladder
of worker counts, keeps a step that gains 5 %, and stops where the loop is
fed or a step gains nothing. Kept beside the model for comparison."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Optional

from ferroloader import _machine
from ferroloader._env import _INITIAL_ARENA
from ferroloader.tuning.bounds import (
    Autotune,
    AutotuneStats,
    Change,
    Layout,
    log,
)

# the worker counts the tuner climbs through
_LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


# a step is kept when the loop gets this much more (batches per second)
_GAIN = 1.05


# a change of method for as many workers is kept if it keeps this much
_LATERAL = 0.95


# the loop is fed when it waits less than this share of its time
_FED = 0.05


@dataclass
class _Interval:
    """One measurement as the climbing policy reads it: batches handed
    over, the wall time, the time the loop waited in ``next()``, and the
    loader's CPU seconds."""

    batches: int
    wall: float
    wait: float
    cpu: float

    @property
    def rate(self) -> float:
        return self.batches / self.wall if self.wall > 0 else 0.0

    @property
    def wait_share(self) -> float:
        return min(1.0, self.wait / self.wall) if self.wall > 0 else 0.0


class Tuner:
    """The policy, one per loader (it outlives epochs and iterators): from
    an interval's measurements on a layout, the next layout or none."""

    def __init__(self, bounds: Autotune, layout: Layout, mid_epoch: bool, notes: list[str]):
        self.bounds = bounds
        self.layout = layout
        self.mid_epoch = mid_epoch
        self.settled = False
        self.changes: list[Change] = []
        self.notes = notes
        self.threads_ok = "threads" in bounds.methods
        # (threads inside processes are processes too)
        self.inner_threads_ok = "threads_in_processes" in bounds.methods
        self.processes_ok = "processes" in bounds.methods or self.inner_threads_ok
        # the most workers the data can feed (lanes, shards, batches), and why
        self.cap: Optional[tuple[int, str]] = None
        self.read_budgets()
        # a layout forced from outside (tests): epoch ends are not measured
        self.forced = False
        # the fastest layout measured so far, to go back to
        self.best: Optional[tuple[Layout, _Interval]] = None
        # the layout measured last, which the next step is judged against
        self.prev: Optional[tuple[Layout, _Interval]] = None
        self.scaling = 0.0
        # processes or threads is decided on the first workers measured
        self.method_chosen = False
        self.current: Optional[_Interval] = None
        # per process, the worst a worker's copy of this process can grow to
        self.per_process = _machine.private_dirty()
        self.tried_prefetch = not bounds.prefetch
        # the fewest workers it may use (the main process: 0)
        self.min_workers = 0

    def read_budgets(self) -> None:
        """The bounds' budgets on this machine now, within the data's cap."""
        self.max_workers, self.cpu, self.ram = self.bounds.budgets()
        if self.cap is not None:
            self.max_workers = min(self.max_workers, self.cap[0])
        self.budgets_read = time.monotonic()

    def report(self) -> AutotuneStats:
        return AutotuneStats(self.layout, list(self.changes), self.settled, list(self.notes))

    def need(self, layout: Layout) -> int:
        """The RAM a layout may take: per worker process, this process's
        private memory (what a fork copies as it is touched); per worker,
        its arena."""
        return layout.processes * self.per_process + layout.workers * _INITIAL_ARENA

    def fits(self, layout: Layout) -> bool:
        return layout.workers <= self.max_workers and self.need(layout) <= self.ram

    def measured(self, m: Any) -> Optional[tuple[Layout, str]]:
        """An interval as the loader measures it (a ``policy.Measurement``,
        which this module cannot import): what the climbing policy reads
        of it."""
        return self.observe(_Interval(m.batches, m.wall, m.wait, m.cpu))

    def observe(self, m: _Interval) -> Optional[tuple[Layout, str]]:
        """An interval on the current layout: the next layout and why, or
        ``None`` to keep it."""
        before = self.changes[-1] if self.changes else None
        if before is not None and before.rate_after is None:
            before.rate_after, before.wait_after = m.rate, m.wait_share
        self.current = m
        if self.settled:
            return self._watch(m)
        best, prev = self.best, self.prev
        # the first workers in place of the main process pay for their
        # transport before they scale: they are judged with the next step
        first = prev is not None and prev[0].workers == 0 and self.layout.workers > 0
        # another method for as many workers need not gain, only not lose
        lateral = (
            prev is not None
            and prev[0].workers == self.layout.workers
            and prev[0].prefetch_factor == self.layout.prefetch_factor
        )
        # each step is judged against the one before it (the climb goes on
        # while the workers scale, even below the main process's rate)
        need = prev[1].rate * (_LATERAL if lateral else _GAIN) if prev is not None else 0.0
        if prev is not None and best is not None and not first and m.rate < need:
            if m.wait_share >= _FED or m.rate < prev[1].rate:
                # the step gained nothing (or took the loop's CPU): the best measured
                self.settled = True
                if m.rate >= best[1].rate:
                    return None
                return best[0], (
                    f"{self.layout} gained nothing over {prev[0]} "
                    f"({m.rate:.1f} vs {prev[1].rate:.1f} batches/s): back to {best[0]}"
                )
        if prev is not None and prev[0].workers and self.layout.workers and not first:
            # how nearly linear the step was
            self.scaling = (m.rate / max(prev[1].rate, 1e-9)) / (
                self.layout.workers / prev[0].workers)
        self.prev = (self.layout, m)
        if best is None or m.rate > best[1].rate:
            self.best = (self.layout, m)
        if m.wait_share < _FED:
            self.settled = True
            log.info("settled on %s: the loop waits %.1f%%", self.layout, 100 * m.wait_share)
            return None
        nxt = self._grow(m)
        if nxt is None:
            self.settled = True
        return nxt

    def _watch(self, m: _Interval) -> Optional[tuple[Layout, str]]:
        """Settled: starts climbing again if the loop waits much more than
        when it settled (the data got slower)."""
        base = self.changes[-1].wait_after if self.changes else None
        if m.wait_share > max(0.25, 2 * (base or 0.0) + 0.1) and self.mid_epoch:
            self.settled = False
            self.best = self.prev = None
        return None

    def _grow(self, m: _Interval) -> Optional[tuple[Layout, str]]:
        lay = self.layout
        why = f"the loop waits {m.wait_share:.0%}"
        if lay.num_workers == 0:
            method = "multiprocessing" if self.processes_ok else "thread"
            if m.wait_share > 0.9 and _machine.cores() > 1 and self.max_workers >= 2:
                # the loop only waits: one worker would not be faster than
                # the main process, two may
                two = Layout(2, method)
                if self.fits(two):
                    return two, why
            first = Layout(1, method)
            if self.fits(first):
                return first, why
            alt = Layout(1, "thread")
            if self.threads_ok and self.fits(alt):
                return alt, why + "; a process would not fit the RAM budget"
            self.notes.append("no worker fits the RAM budget: loading in the main process")
            return None
        busy = m.cpu / m.wall / max(lay.workers, 1) if m.wall > 0 else 1.0
        first_workers, self.method_chosen = not self.method_chosen, True
        if (
            first_workers
            and lay.worker_method == "multiprocessing"
            and lay.worker_threads == 1
            and busy < 0.5
            and self.threads_ok
        ):
            # its workers mostly wait (I/O): threads are cheaper to have many of
            return replace(lay, worker_method="thread"), (
                f"{why}; each worker is busy {busy:.0%} of the time (it waits): threads"
            )
        budget = self.cpu
        loop_share = 1.0 - m.wait_share  # the loop's own step
        if budget is None and loop_share > 0.1:
            # the loop computes: the cores it leaves (when it only waits, a
            # step past the cores is measured, and kept only if it gains)
            budget = max(_machine.cores() - loop_share, 0.5)
        if budget is not None and m.cpu / m.wall > budget * 0.9 and busy > 0.5:
            return self._prefetch(m, f"the CPU budget ({budget:.1f} cores) is used")
        target = _next_rung(lay.num_workers)
        if busy < 0.25:
            # its workers wait nearly all the time: four times as many
            target = max(target, 4 * lay.num_workers)
        elif self.scaling >= 0.8:
            # the last step scaled nearly linearly: a step to about as many
            # workers as would feed the loop, at most twice as many
            need = math.ceil(lay.num_workers / max(1.0 - m.wait_share, 0.125))
            target = min(max(target, need), 2 * lay.num_workers)
        if target * lay.worker_threads > self.max_workers:
            target = self.max_workers // lay.worker_threads
        cand = replace(lay, num_workers=target)
        if target <= lay.num_workers:
            return self._prefetch(m, f"max_workers={self.max_workers}")
        if self.cpu is not None and busy * cand.workers > self.cpu:
            return self._prefetch(m, f"{cand} would exceed cpu={self.cpu}")
        if not self.fits(cand):
            if lay.worker_method == "multiprocessing" and self.inner_threads_ok:
                inner = replace(lay, worker_threads=lay.worker_threads * 2)
                if lay.worker_threads < 4 and self.fits(inner):
                    return inner, f"{why}; more processes would not fit the RAM budget"
            if lay.worker_method == "multiprocessing" and self.threads_ok:
                alt = replace(lay, worker_method="thread", worker_threads=1,
                              num_workers=lay.workers + 1)
                if self.fits(alt):
                    return alt, f"{why}; more processes would not fit the RAM budget: threads"
            return self._prefetch(m, f"{cand} would exceed the budgets")
        return cand, why

    def _prefetch(self, m: _Interval, stop: str) -> Optional[tuple[Layout, str]]:
        log.info("stops growing: %s", stop)
        if self.tried_prefetch:
            return None
        self.tried_prefetch = True
        return replace(self.layout, prefetch_factor=4), f"{stop}; a deeper prefetch"

    def record(self, epoch: int, batch: int, after: Layout, reason: str) -> None:
        m = self.current or _Interval(0, 0.0, 0.0, 0.0)
        change = Change(epoch, batch, self.layout, after, reason, m.rate, m.wait_share)
        self.changes.append(change)
        log.info("%s", change)
        self.layout = after

    def memory_over(self, pids: list[int]) -> bool:
        """The worker processes' summed PSS is over 90 % of the budget."""
        return sum(_machine.pss(p) for p in pids) > 0.9 * self.ram


def _next_rung(n: int) -> int:
    for r in _LADDER:
        if r > n:
            return r
    return n * 2


__all__ = ["Tuner"]
