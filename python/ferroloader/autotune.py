"""``num_workers="auto"``: the loader picks and changes its own layout
while it runs, and no batch changes.

A layout is how many workers, processes or threads, threads inside each
worker process, and the prefetch depth. A map-style loader's batches do
not depend on it, and its state resumes on any worker count, so the loader
can change it between two batches of an epoch: it holds back new tasks,
hands over the batches in flight, takes its own ``state_dict()`` (nothing
pending, so nothing is read twice), and continues the epoch from that state
on the new layout. A prefetch change needs no restart at all.

The tuner measures, over short intervals, what the training loop sees (its
batches per second, its share of time waiting in ``next()``, its own step)
and what the layout costs (the workers' CPU from ``/proc``, their memory as
PSS), and climbs a ladder of worker counts: it keeps a step when the loop
gets at least 5 % more batches per second, and stops at the smallest layout
under which the loop waits less than 5 % of its time, or when a step gains
nothing, or a budget (CPU, RAM, ``max_workers``) would be crossed. Workers
that mostly wait (I/O) become threads; a dataset that cannot run in threads
keeps it to processes, and the stats say why.

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
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional

import torch.utils.data.dataloader as _tdl

from ferroloader import state
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
            training loop leaves: all of this process's CPUs less the share
            of one the loop's own step takes (measured).
        ram: bytes the loader may use, as the summed PSS of its worker
            processes (a forked worker is counted at the worst its copies
            of this process's memory can grow to). Default: half of the
            machine's available memory when ``iter()`` is called.
        methods: the layouts it may pick from: ``"processes"``,
            ``"threads"`` (worker threads of this process),
            ``"threads_in_processes"`` (``worker_threads`` > 1).
        prefetch: whether it may change ``prefetch_factor`` (2 or 4).

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
        methods = METHODS if methods is None else methods
        if max_workers is not None and (
            isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 0
        ):
            raise ValueError(f"max_workers should be a non-negative int, got {max_workers!r}")
        if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, (int, float))):
            raise TypeError(f"cpu should be a number of cores, got {cpu!r}")
        if ram is not None and (isinstance(ram, bool) or not isinstance(ram, int)):
            raise TypeError(f"ram should be a number of bytes (an int), got {ram!r}")
        methods = tuple(methods)
        unknown = [m for m in methods if m not in METHODS]
        if unknown or not methods:
            raise ValueError(f"methods should be some of {METHODS}, got {methods!r}")
        self.max_workers = max_workers
        self.cpu = cpu
        self.ram = ram
        self.methods = methods
        self.prefetch = bool(prefetch)

    def __repr__(self) -> str:
        return (
            f"Autotune(max_workers={self.max_workers}, cpu={self.cpu}, ram={self.ram}, "
            f"methods={self.methods}, prefetch={self.prefetch})"
        )

    def budgets(self) -> tuple[int, Optional[float], int]:
        """``(max_workers, cpu, ram)`` on this machine, checked: an
        impossible budget is a ``ConfigError`` (raised at ``iter()``)."""
        cores = _cores()
        if self.cpu is not None and self.cpu <= 0:
            raise ConfigError(
                f"Autotune(cpu={self.cpu}): the loader needs some CPU; give a positive number "
                f"of cores (this process may use {cores})"
            )
        ram = self.ram if self.ram is not None else _available_memory() // 2
        if ram < _INITIAL_ARENA:
            raise ConfigError(
                f"Autotune(ram={ram}): below one worker's need, its shared-memory arena of "
                f"{_INITIAL_ARENA} bytes; give at least that, or num_workers=0"
            )
        top = self.max_workers if self.max_workers is not None else max(32, 4 * cores)
        return min(top, _fd_room()), self.cpu, ram


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
    """One measurement: batches handed over, the wall time, the time the
    loop waited in ``next()``, and the loader's CPU seconds."""

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
        self.max_workers, self.cpu, self.ram = bounds.budgets()
        # the fastest layout measured so far, to go back to
        self.best: Optional[tuple[Layout, _Interval]] = None
        # the layout measured last, which the next step is judged against
        self.prev: Optional[tuple[Layout, _Interval]] = None
        self.scaling = 0.0
        self.current: Optional[_Interval] = None
        # per process, the worst a worker's copy of this process can grow to
        self.per_process = _private_dirty()
        self.tried_prefetch = not bounds.prefetch
        # the fewest workers it may use (the main process: 0)
        self.min_workers = 0

    def report(self) -> AutotuneStats:
        return AutotuneStats(self.layout, list(self.changes), self.settled, list(self.notes))

    def need(self, layout: Layout) -> int:
        """The RAM a layout may take: per worker process, this process's
        private memory (what a fork copies as it is touched); per worker,
        its arena."""
        return layout.processes * self.per_process + layout.workers * _INITIAL_ARENA

    def fits(self, layout: Layout) -> bool:
        return layout.workers <= self.max_workers and self.need(layout) <= self.ram

    def observe(self, m: _Interval, loop_share: float) -> Optional[tuple[Layout, str]]:
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
        nxt = self._grow(m, loop_share)
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

    def _grow(self, m: _Interval, loop_share: float) -> Optional[tuple[Layout, str]]:
        lay = self.layout
        why = f"the loop waits {m.wait_share:.0%}"
        if lay.num_workers == 0:
            method = "multiprocessing" if self.processes_ok else "thread"
            if m.wait_share > 0.9 and _cores() > 1 and self.max_workers >= 2:
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
        if (
            lay.worker_method == "multiprocessing"
            and lay.worker_threads == 1
            and busy < 0.5
            and self.threads_ok
            and lay.num_workers == 1
        ):
            # its workers mostly wait (I/O): threads are cheaper to have many of
            return replace(lay, worker_method="thread"), (
                f"{why}; each worker is busy {busy:.0%} of the time (it waits): threads"
            )
        budget = self.cpu
        if budget is None and loop_share > 0.1:
            # the loop computes: the cores it leaves (when it only waits, a
            # step past the cores is measured, and kept only if it gains)
            budget = max(_cores() - loop_share, 0.5)
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
        return sum(_pss(p) for p in pids) > 0.9 * self.ram


def _fd_room() -> int:
    """The workers the process's file-descriptor limit leaves room for
    (about six descriptors each, and the ones open now)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return 1 << 16
        return max(1, (soft - len(os.listdir("/proc/self/fd")) - 16) // 6)
    except (ImportError, OSError, ValueError):
        return 1 << 16


def _next_rung(n: int) -> int:
    for r in _LADDER:
        if r > n:
            return r
    return n * 2


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def _rollup(pid: Any, key: str) -> int:
    """A field of ``/proc/PID/smaps_rollup``, in bytes (0 if unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _private_dirty() -> int:
    """This process's private, written memory: what a forked worker's
    copy can grow to as it touches the objects (their reference counts)."""
    return _rollup("self", "Private_Dirty:")


def _pss(pid: int) -> int:
    return _rollup(pid, "Pss:")


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: Any) -> float:
    """User and system CPU seconds of a process (``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return 0.0


class _Meter:
    """The loader's CPU: its worker processes', or for worker threads this
    process's less the training loop's thread."""

    def __init__(self, it: Any) -> None:
        self.pids = [p.pid for p in getattr(it, "_procs", ()) if hasattr(p, "pid")]
        self.threads = not self.pids and bool(getattr(it, "_procs", ()))
        self.last = self.read()

    def read(self) -> float:
        if self.pids:
            return sum(_cpu_seconds(p) for p in self.pids)
        if self.threads:
            return _cpu_seconds("self") - time.thread_time()
        return 0.0

    def delta(self) -> float:
        now = self.read()
        d, self.last = max(0.0, now - self.last), now
        return d


def mid_epoch_ok(loader: Any) -> Optional[str]:
    """Why the layout can change only between epochs, or ``None`` when it
    can change between any two batches."""
    if loader._dataset_kind == _tdl._DatasetKind.Iterable and not loader._sharded():
        return (
            "an IterableDataset shards itself by get_worker_info(): its layout changes "
            "only between epochs"
        )
    if getattr(loader, "pin_memory", False):
        return "pin_memory=True: the layout changes only between epochs"
    from ferroloader._epoch import stateful

    if stateful(loader.dataset):
        return (
            "the dataset keeps a state per worker replica (state_dict): its layout changes "
            "only between epochs"
        )
    return None


def threads_refusal(loader: Any) -> Optional[str]:
    """Why worker threads cannot serve this loader's dataset, or ``None``."""
    from ferroloader._epoch import stateful
    from ferroloader._launch import _thread_unsafe_attributes

    if stateful(loader.dataset):
        return "the dataset keeps a state per worker replica (state_dict): no threads"
    if loader.per_sample_seed and not loader.autotune.methods_given:
        return (
            "per_sample_seed=True: worker threads seed their own generators "
            "(torch.thread_safe_generator()), and a dataset drawing from the global ones "
            "would get other draws: no threads (name them in Autotune(methods=...) to allow)"
        )
    found = _thread_unsafe_attributes(loader.dataset)
    if found:
        name, problem = found[0]
        return f"the dataset's attribute {name!r} is {problem}: no threads"
    return None


def apply(loader: Any, layout: Layout) -> None:
    """Sets the loader's layout attributes (read by the next epoch start)."""
    loader._layout_in_force = layout
    loader.num_workers = layout.num_workers
    loader.worker_method = layout.worker_method if layout.num_workers else "multiprocessing"
    loader.worker_threads = layout.worker_threads if layout.num_workers else 1
    loader.prefetch_factor = layout.prefetch_factor if layout.num_workers else None


class AutoIter:
    """The iterator of a ``num_workers="auto"`` loader: a fixed-layout
    iterator underneath, replaced between two batches when the tuner says."""

    def __init__(self, loader: Any, fixed_iter: Any) -> None:
        self._loader = loader
        self._fixed_iter = fixed_iter
        tuner: Optional[Tuner] = loader._tuner
        if tuner is None:
            bounds = loader.autotune
            notes: list[str] = []
            why = threads_refusal(loader)
            if why is not None and "threads" in bounds.methods:
                notes.append(why)
                bounds = Autotune(bounds.max_workers, bounds.cpu, bounds.ram, ["processes"],
                                  bounds.prefetch)
            why = mid_epoch_ok(loader)
            if why is not None:
                notes.append(why)
            if loader._auto_min_workers:
                notes.append(
                    "StatefulDataLoader draws its shuffle once more with workers than without "
                    "(as torchdata does): at least one worker, so that no change alters the order"
                )
            start = loader._tuned_layout or Layout(loader._auto_min_workers)
            tuner = Tuner(bounds, start, why is None, notes)
            tuner.min_workers = loader._auto_min_workers
            loader._tuner = tuner
        else:
            tuner.max_workers, tuner.cpu, tuner.ram = tuner.bounds.budgets()
        self._tuner = tuner
        if loader._tuned_layout is not None:
            tuner.layout = loader._tuned_layout
        if loader._iterator is not None and inner_layout(loader) != tuner.layout:
            # persistent workers of another layout: they go, new ones start,
            # on their base seed (torch draws none for persistent workers)
            old = loader._epoch
            _close(loader._iterator)
            loader._iterator = None
            if old is not None and old.base_seed is not None and not loader._resume_extra:
                loader._resume_extra = {"base_seed": int(old.base_seed)}
        apply(loader, tuner.layout)
        self._inner = fixed_iter()
        self._start()
        self._pending: Optional[tuple[Layout, str]] = None
        self._handed = 0
        self._decided = False  # the next epoch's layout is chosen

    def _start(self) -> None:
        self._meter = _Meter(self._inner)
        self._t0 = time.perf_counter()
        self._batches = 0
        self._waited = 0.0
        self._warm = max(1, self._tuner.layout.workers)  # batches before measuring
        self._next_memory_check = 0.0

    def __iter__(self) -> AutoIter:
        return self

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        # torch's iterator attributes (_workers, _shutdown_workers, ...)
        return getattr(self.__dict__["_inner"], name)

    def _force(self, layout: Layout) -> None:
        """Changes the layout before the next batch, or where the layout
        changes only between epochs, at the next epoch (for tests)."""
        if layout.num_workers < self._tuner.min_workers:
            raise ValueError(f"this loader keeps at least {self._tuner.min_workers} worker")
        if self._tuner.mid_epoch:
            self._pending = (layout, "forced")
        else:
            self._loader._tuned_layout = layout
            self._tuner.record(self._epoch_number(), self._handed, layout, "forced (next epoch)")

    def __next__(self) -> Any:
        t = time.perf_counter()
        while True:
            if self._pending is not None and self._drained():
                self._switch()
            try:
                batch = next(self._inner)
            except StopIteration:
                if self._pending is not None and self._drained_not_ended():
                    self._switch()  # nothing more comes from it: go on on the new layout
                    continue
                self._epoch_end()
                raise
            break
        now = time.perf_counter()
        self._handed += 1
        if self._warm > 0:
            self._warm -= 1
            if self._warm == 0:
                self._t0, self._batches, self._waited = now, 0, 0.0
                self._meter.delta()
            return batch
        self._batches += 1
        self._waited += now - t
        if (
            self._pending is None
            and not self._decided
            and self._batches >= 2 * max(1, self._tuner.layout.workers)
        ):
            wall = now - self._t0
            if wall >= _MIN_INTERVAL:
                self._measure(wall)
        return batch

    def _measure(self, wall: float) -> None:
        m = _Interval(self._batches, wall, self._waited, self._meter.delta())
        self._t0, self._batches, self._waited = time.perf_counter(), 0, 0.0
        tuner = self._tuner
        loop_share = max(0.0, 1.0 - m.wait_share)
        decided = tuner.observe(m, loop_share)
        now = time.perf_counter()
        if decided is None and self._meter.pids and now >= self._next_memory_check:
            # (reading the workers' PSS walks their page tables: every 2 s)
            self._next_memory_check = now + 2.0
            over = tuner.memory_over(self._meter.pids)
        else:
            over = False
        if over:
            lay = tuner.layout
            smaller = replace(lay, num_workers=max(lay.num_workers // 2, tuner.min_workers))
            if tuner.threads_ok:
                smaller = replace(lay, worker_method="thread", worker_threads=1)
            decided = smaller, "the workers' memory is near the RAM budget"
            tuner.settled = True
        if decided is not None:
            layout, reason = decided
            if tuner.mid_epoch:
                self._pending = decided
            else:
                self._loader._tuned_layout = layout
                tuner.record(self._epoch_number(), self._handed, layout, reason + " (next epoch)")
                # (what follows in this epoch still runs the old layout)
                self._decided = True

    def _epoch_number(self) -> int:
        return int(self._loader._epochs_started) - 1

    def _drained_not_ended(self) -> bool:
        inner = self._inner
        return bool(getattr(inner, "_held", False)) and not inner._position[2]

    def _drained(self) -> bool:
        """Holds back new tasks; true once nothing is in flight."""
        inner = self._inner
        if not hasattr(inner, "_hold"):
            return True
        assert self._pending is not None
        layout = self._pending[0]
        current = inner_layout(self._loader)
        if layout == current or _only_prefetch(current, layout):
            return True  # (no restart: nothing to drain)
        if not inner._held:
            inner._hold(True)
        return bool(inner._in_flight == 0)

    def _switch(self) -> None:
        assert self._pending is not None
        layout, reason = self._pending
        self._pending = None
        tuner = self._tuner
        loader = self._loader
        inner = self._inner
        current = inner_layout(loader)
        if layout == current:
            # (asked again for the layout in force, e.g. while draining)
            if getattr(inner, "_held", False):
                inner._hold(False)
            return
        tuner.record(self._epoch_number(), self._handed, layout, reason)
        if _only_prefetch(current, layout) and hasattr(inner, "_set_prefetch_factor"):
            inner._set_prefetch_factor(layout.prefetch_factor)
            if inner._held:
                inner._hold(False)
            apply(loader, layout)
            loader._tuned_layout = layout
            self._start()
            return
        snap = state.snapshot(loader)
        _close(inner)
        try:
            self._restart(layout, snap)
        except Exception as e:
            # (e.g. out of file descriptors): back on the layout that ran,
            # from the same state; if that fails too, its error is raised
            tuner.notes.append(f"{layout} could not start ({e!r}): back to {current}")
            tuner.record(self._epoch_number(), self._handed, current, "the new layout failed")
            tuner.settled = True
            self._restart(current, snap)

    def _restart(self, layout: Layout, snap: dict[str, Any]) -> None:
        """The epoch continues from ``snap`` on ``layout``."""
        loader = self._loader
        apply(loader, layout)
        loader._tuned_layout = layout
        state.load(loader, snap)
        self._inner = self._fixed_iter()
        self._start()

    def _epoch_end(self) -> None:
        self._loader._tuned_layout = self._tuner.layout


def inner_layout(loader: Any) -> Layout:
    """The layout in force: the one last applied, else what the loader's
    attributes say."""
    applied = getattr(loader, "_layout_in_force", None)
    if applied is not None:
        return applied
    return Layout(
        loader.num_workers,
        loader.worker_method,
        loader.worker_threads,
        loader.prefetch_factor or 2,
    )


def _only_prefetch(a: Layout, b: Layout) -> bool:
    return a.num_workers > 0 and replace(a, prefetch_factor=b.prefetch_factor) == b


def _close(it: Any) -> None:
    from ferroloader._iterators import _harvest_stats

    rec = getattr(it, "_epoch_record", None)
    if rec is not None:
        state.detach(rec, it)
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    _harvest_stats(it)


__all__ = ["Autotune", "AutotuneStats", "Change", "Layout"]
