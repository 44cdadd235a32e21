"""``num_workers="auto"``: the loader picks and changes its own layout
while it runs, and no batch changes.

A layout is how many workers, processes or threads, threads inside each
worker process, and the prefetch depth. A map-style loader's batches do
not depend on it, and its state resumes on any worker count, so the loader
can change it between two batches of an epoch: it holds back new tasks,
hands over the batches in flight, takes its own ``state_dict()`` (nothing
pending, so nothing is read twice), and continues the epoch from that state
on the new layout. A prefetch change needs no restart at all.

The tuner (``ModelTuner``) measures, over short intervals, what the
training loop sees (its batches and samples, its time and CPU in
``next()``) and what the layout costs (the workers' CPU from ``/proc``,
their memory as PSS), and hands them to ``Policy``, a pure state machine:
it estimates the job's costs per sample, predicts every layout's rate
with a model of the machine (``ferroloader.tunemodel`` proves it in
simulated time) and goes to the fewest workers predicted near the best,
within the budgets (CPU, RAM, ``max_workers``). Workers that mostly wait
(I/O) become threads; a dataset that cannot run in threads keeps it to
processes, and the stats say why.

With ``FERROLOADER_AUTOTUNE_POLICY=climb``, ``Tuner``, the climbing
policy it replaced, decides instead: it climbs a ladder of worker counts,
keeps a step when the loop gets at least 5 % more batches per second,
and stops at the smallest layout under which the loop waits less than
5 % of its time, or when a step gains nothing.

>>> import ferroloader, torch
>>> loader = ferroloader.DataLoader(torch.arange(64), batch_size=8, num_workers="auto")
>>> sorted(int(v) for b in loader for v in b) == list(range(64))
True
>>> loader.stats().autotune.layout.num_workers >= 0
True
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional

from ferroloader import _machine
from ferroloader._env import _INITIAL_ARENA
from ferroloader.errors import ConfigError

log = logging.getLogger("ferroloader.autotune")

METHODS = ("processes", "threads", "threads_in_processes")
# the worker counts the tuner climbs through
_LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
# a step is kept when the loop gets this much more (batches per second)
_GAIN = 1.05
# a change of method for as many workers is kept if it keeps this much
_LATERAL = 0.95
# the loop is fed when it waits less than this share of its time
_FED = 0.05
# an interval lasts at least this long, and two rounds of the workers' batches
_MIN_INTERVAL = 0.4


@dataclass(frozen=True)
class Layout:
    """Where the loader's work runs: ``num_workers`` workers (processes or
    threads, ``worker_method``), ``worker_threads`` threads inside each
    worker process, and ``prefetch_factor`` batches in flight per worker."""

    num_workers: int = 0
    worker_method: str = "multiprocessing"
    worker_threads: int = 1
    prefetch_factor: int = 2

    @property
    def workers(self) -> int:
        return self.num_workers * self.worker_threads

    @property
    def processes(self) -> int:
        return self.num_workers if self.worker_method == "multiprocessing" else 0

    def __str__(self) -> str:
        if self.num_workers == 0:
            return "main process"
        kind = "thread" if self.worker_method == "thread" else "process"
        plural = "" if self.num_workers == 1 else "es" if kind == "process" else "s"
        text = f"{self.num_workers} {kind}{plural}"
        if self.worker_threads > 1:
            text += f" x {self.worker_threads} threads"
        return f"{text}, prefetch {self.prefetch_factor}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "worker_method": self.worker_method,
            "worker_threads": self.worker_threads,
            "prefetch_factor": self.prefetch_factor,
        }


@dataclass
class Change:
    """One layout change: when (epoch, batches handed over in it), from
    what to what, why, and the loop's rate (batches per second) and waiting
    share measured before it and, once measured, after it."""

    epoch: int
    batch: int
    before: Layout
    after: Layout
    reason: str
    rate_before: float
    wait_before: float
    rate_after: Optional[float] = None
    wait_after: Optional[float] = None

    def __str__(self) -> str:
        after = "" if self.rate_after is None else (
            f" -> {self.rate_after:.1f}/s, waiting {self.wait_after:.0%}"
        )
        return (
            f"epoch {self.epoch} batch {self.batch}: {self.before} -> {self.after} "
            f"({self.reason}; {self.rate_before:.1f} batches/s, waiting "
            f"{self.wait_before:.0%}{after})"
        )


@dataclass
class AutotuneStats:
    """What ``loader.stats().autotune`` shows: the layout in force, every
    change with its reason and measurements, whether the tuner has settled,
    and what kept it from a method (e.g. why not threads)."""

    layout: Layout
    changes: list[Change] = field(default_factory=list)
    settled: bool = False
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"autotune: {self.layout} ({'settled' if self.settled else 'tuning'})"]
        lines += [f"  {c}" for c in self.changes]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class Autotune:
    """The bounds of ``num_workers="auto"``; pass it as ``num_workers=``.

    Args:
        max_workers: at most this many workers (threads inside processes
            count one each). Default: 4 per core, at least 32.
        cpu: cores the loader's workers may use. Default: the cores the
            training loop leaves while it computes (this process's CPUs less
            the share of one its step takes, measured); while it only waits,
            a step past the cores is measured and kept only if it gains.
        ram: bytes the loader may use, as the summed PSS of its worker
            processes (a forked worker is counted at the worst its copies
            of this process's memory can grow to). Default: half of the
            machine's available memory when ``iter()`` is called.
        methods: the layouts it may pick from: ``"processes"``,
            ``"threads"`` (worker threads of this process),
            ``"threads_in_processes"`` (``worker_threads`` > 1).
        prefetch: whether it may change ``prefetch_factor`` (2 or 4; the
            model-based policy keeps 2).

    >>> import ferroloader
    >>> ferroloader.Autotune(max_workers=8, methods=("processes",))
    Autotune(max_workers=8, cpu=None, ram=None, methods=('processes',), prefetch=True)
    """

    def __init__(
        self,
        max_workers: Optional[int] = None,
        cpu: Optional[float] = None,
        ram: Optional[int] = None,
        methods: Optional[Iterable[str]] = None,
        prefetch: bool = True,
    ) -> None:
        # (methods given by the user are kept where the default would drop
        # threads: see threads_refusal)
        self.methods_given = methods is not None

        def fail(arg: str, forms: str, value: Any) -> ConfigError:
            return ConfigError(f"Autotune {arg} should be {forms}, but got {arg}={value!r}")

        if max_workers is not None and (
            isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 0
        ):
            raise fail("max_workers", "a non-negative int (or None: 4 per core, at least 32)",
                       max_workers)
        if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, (int, float))
                                or not 0 < cpu < float("inf")):
            raise fail("cpu", "a positive number of cores (or None: measured)", cpu)
        if ram is not None and (isinstance(ram, bool) or not isinstance(ram, int) or ram < 1):
            raise fail("ram", "a positive int, bytes (or None: half the available memory)", ram)
        if isinstance(methods, str) or (methods is not None
                                        and not isinstance(methods, Iterable)):
            raise fail("methods", f"a sequence of some of {METHODS}, such as ('{methods}',)"
                       if isinstance(methods, str) else f"a sequence of some of {METHODS}",
                       methods)
        methods = tuple(METHODS if methods is None else methods)
        unknown = [m for m in methods if m not in METHODS]
        if unknown or not methods:
            raise fail("methods", f"a non-empty sequence of some of {METHODS}", methods)
        if not isinstance(prefetch, bool):
            raise fail("prefetch", "True or False", prefetch)
        self.max_workers = max_workers
        self.cpu = cpu
        self.ram = ram
        self.methods = methods
        self.prefetch = prefetch

    def __repr__(self) -> str:
        return (
            f"Autotune(max_workers={self.max_workers}, cpu={self.cpu}, ram={self.ram}, "
            f"methods={self.methods}, prefetch={self.prefetch})"
        )

    def budgets(self) -> tuple[int, Optional[float], int]:
        """``(max_workers, cpu, ram)`` on this machine, checked: an
        impossible budget is a ``ConfigError`` (raised at ``iter()``)."""
        cores = _machine.cores()
        if self.cpu is not None and self.cpu <= 0:
            raise ConfigError(
                f"Autotune(cpu={self.cpu}): the loader needs some CPU; give a positive number "
                f"of cores (this process may use {cores})"
            )
        ram = self.ram if self.ram is not None else _machine.available_memory() // 2
        if ram < _INITIAL_ARENA:
            raise ConfigError(
                f"Autotune(ram={ram}): below one worker's need, its shared-memory arena of "
                f"{_INITIAL_ARENA} bytes; give at least that, or num_workers=0"
            )
        top = self.max_workers if self.max_workers is not None else max(32, 4 * cores)
        return min(top, _machine.fd_room()), self.cpu, ram


def of(num_workers: Any) -> Optional[Autotune]:
    """The bounds ``num_workers=`` asks for: ``"auto"`` or an ``Autotune``;
    ``None`` for a fixed count. Another string is a ``ValueError``."""
    if isinstance(num_workers, Autotune):
        return num_workers
    if isinstance(num_workers, str):
        if num_workers == "auto":
            return Autotune()
        raise ValueError(
            f"num_workers should be an int, 'auto' or a ferroloader.Autotune, got {num_workers!r}"
        )
    return None


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
        """An interval as the loader measures it (a ``tunepolicy.Measurement``,
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


__all__ = ["Autotune", "AutotuneStats", "Change", "Layout", "Tuner"]
