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
with a model of the machine (``ferroloader.tuning.model`` proves it in
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
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from ferroloader import _machine
from ferroloader._env import _INITIAL_ARENA
from ferroloader.errors import ConfigError

log = logging.getLogger("ferroloader.autotune")

METHODS = ("processes", "threads", "threads_in_processes")
# an interval lasts at least this long, and two rounds of the workers' batches
_MIN_INTERVAL = 0.4
# in the main process batches come one at a time, each measured whole: a
# quarter of it (the simulator's main-process intervals are too)
_MAIN_INTERVAL = _MIN_INTERVAL / 4


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


__all__ = ["Autotune", "AutotuneStats", "Change", "Layout"]


def check_loader_args(loader: Any) -> None:
    """What torch accepted for the one worker its checks saw, and
    ``num_workers="auto"`` cannot honour: it starts in the main process
    and may return there, and it sets the prefetch depth itself."""
    if loader.timeout != 0:
        raise ConfigError(
            f"timeout={loader.timeout!r} bounds the wait for a worker's batch, and "
            "num_workers='auto' loads in the main process too (where torch refuses a timeout): "
            "give a fixed num_workers with timeout=, or leave timeout at 0"
        )
    prefetch = loader.prefetch_factor
    if not isinstance(prefetch, int) or prefetch < 1:
        # (torch refuses it at iter() with workers; the tuner would meet it
        # only once it chose workers, mid-epoch)
        raise ConfigError(
            f"prefetch_factor={prefetch!r} cannot be the starting prefetch depth of "
            "num_workers='auto': give a positive integer, or leave it unset"
        )
