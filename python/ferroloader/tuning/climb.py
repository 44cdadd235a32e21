"""The climbing policy that ``num_workers="auto"`` used before the
model-based one (``FERROLOADER_AUTOTUNE_POLICY=climb``): it climbs a ladder
of worker counts, keeps a step that gains 5 %, and stops where the loop is
fed or a step gains nothing. Kept beside the model for comparison. Its
steps are the engine's (``src/tuning/climb.rs``); ``Tuner`` keeps the
budgets and the changes that ``stats()`` shows, and the model-based tuner
builds on it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import ferroloader._core as _core
from ferroloader import _machine
from ferroloader._env import _INITIAL_ARENA
from ferroloader.tuning.bounds import (
    Autotune,
    AutotuneStats,
    Change,
    Layout,
    log,
)
from ferroloader.tuning.estimate import key


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
        # the climb's own state (the best and last layouts measured, how
        # nearly linear the last step was): the engine's
        self._climb = _core.ClimbPolicy(bool(bounds.prefetch))
        self.current: Optional[_Interval] = None
        # per process, the worst a worker's copy of this process can grow to
        self.per_process = _machine.private_dirty()
        # the fewest workers it may use (the main process: 0)
        self.min_workers = 0
        # when the workers' memory is read next (perf_counter; 0: at the
        # next interval): kept across epochs, since a short epoch's whole
        # length can be less than one read of a big worker's page tables
        self.next_memory_check = 0.0

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
        settled_wait = self.changes[-1].wait_after if self.changes else None
        bounds = (self.max_workers, self.cpu, self.ram, self.per_process, _INITIAL_ARENA,
                  self.processes_ok, self.threads_ok, self.inner_threads_ok, _machine.cores(),
                  self.mid_epoch)
        self._climb.settled = self.settled  # (the loader may have settled it)
        nxt, note, said = self._climb.observe((m.batches, m.wall, m.wait, m.cpu),
                                              key(self.layout), settled_wait, bounds)
        if note is not None:
            self.notes.append(note)
        for line in said:
            log.info("%s", line)
        self.settled = self._climb.settled
        return None if nxt is None else (Layout(*nxt[0]), nxt[1])

    def record(self, epoch: int, batch: int, after: Layout, reason: str) -> None:
        m = self.current or _Interval(0, 0.0, 0.0, 0.0)
        change = Change(epoch, batch, self.layout, after, reason, m.rate, m.wait_share)
        self.changes.append(change)
        log.info("%s", change)
        self.layout = after


__all__ = ["Tuner"]
