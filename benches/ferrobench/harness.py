"""The harness: checks and their rounds (ratios, medians, spread), timing,
the library under test, progress bars, the result table and the JSON output."""

from __future__ import annotations

import gc
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .datasets import IntDataset

# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


class Progress:
    """A progress bar per scenario (tqdm, when installed: the bench extra),
    ticked by every timing round; silent otherwise."""

    def __init__(self) -> None:
        self.bar: Any = None

    def start(self, name: str, title: str) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            print(f"-- {name}: {title} ...", flush=True)
            return
        self.bar = tqdm(desc=f"{name:<13}", unit=" rounds", leave=False, dynamic_ncols=True)

    def tick(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


PROGRESS = Progress()


# ferroloader's stats of the last loader a scenario timed (printed with it)
LAST_STATS: List[str] = []


@dataclass
class Check:
    """One ratio with a target: ferroloader's figure against a baseline's."""

    measure: str
    unit: str
    baseline_name: str
    target: float
    higher_is_better: bool = True
    baseline: List[float] = field(default_factory=list)
    ferro: List[float] = field(default_factory=list)
    note: str = ""

    def add(self, baseline: float, ferro: float) -> None:
        self.baseline.append(baseline)
        self.ferro.append(ferro)
        PROGRESS.tick()

    @property
    def ratios(self) -> List[float]:
        return [f / b if b > 0 else math.inf for b, f in zip(self.baseline, self.ferro)]

    @property
    def median_ratio(self) -> Optional[float]:
        r = self.ratios
        return statistics.median(r) if r else None

    @property
    def passed(self) -> Optional[bool]:
        m = self.median_ratio
        if m is None:
            return None
        if self.note.startswith("MISMATCH"):
            return False
        return m >= self.target if self.higher_is_better else m <= self.target

    def to_json(self) -> Dict[str, Any]:
        d = asdict(self)
        r = self.ratios
        d.update(
            ratios=r,
            median_ratio=self.median_ratio,
            spread=[min(r), max(r)] if r else None,
            median_baseline=statistics.median(self.baseline) if self.baseline else None,
            median_ferro=statistics.median(self.ferro) if self.ferro else None,
            passed=self.passed,
        )
        return d


@dataclass
class Scenario:
    name: str
    title: str
    status: str = "ok"  # ok | skipped | error
    note: str = ""
    checks: List[Check] = field(default_factory=list)
    seconds: float = 0.0
    # ferroloader's loader.stats() table for the scenario, when it has one
    stats: str = ""

    def to_json(self) -> Dict[str, Any]:
        primary = self.checks[0].median_ratio if self.checks and self.status == "ok" else None
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "note": self.note,
            "ratio": primary,
            "seconds": round(self.seconds, 2),
            "checks": [c.to_json() for c in self.checks],
            "stats": self.stats,
        }


class Skip(Exception):
    """Raised by a scenario to be reported as skipped."""


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------


@dataclass
class Settings:
    repeats: int
    quick: bool
    min_time: float  # seconds of work per timed measurement (whole epochs)


def _mw_unavailable(exc: BaseException) -> Skip:
    return Skip(f"skipped: ferroloader num_workers>0 not available: {exc}")


# ---------------------------------------------------------------------------
# Timing helpers
# ---------------------------------------------------------------------------


def timed_rate(step: Callable[[], float], min_time: float) -> float:
    """Run ``step`` (returns units of work done) until ``min_time`` elapsed; units/s."""
    gc.collect()
    units = 0.0
    t0 = time.perf_counter()
    while True:
        units += step()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time:
            return units / elapsed


def epoch_step(loader: Iterable[Any], units_per_epoch: float) -> Callable[[], float]:
    """A step that consumes one epoch of ``loader`` and reports ``units_per_epoch``."""

    def step() -> float:
        for _batch in loader:
            pass
        return units_per_epoch

    return step


def first_batch(loader: Iterable[Any]) -> Any:
    it = iter(loader)
    try:
        return next(it)
    finally:
        del it


def compare(a: Any, b: Any, path: str = "batch") -> Optional[str]:
    """None when ``a`` (torch) and ``b`` (ferroloader) are the same batch, else why not."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor):
            return f"{path}: torch gives Tensor, ferroloader gives {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        return None if torch.equal(a, b) else f"{path}: values differ"
    if isinstance(a, dict):
        if not isinstance(b, dict) or list(a) != list(b):
            return f"{path}: dict keys differ"
        for k in a:
            why = compare(a[k], b[k], f"{path}[{k!r}]")
            if why:
                return why
        return None
    if isinstance(a, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return f"{path}: {type(a).__name__}[{len(a)}] vs {type(b).__name__}"
        for i, (x, y) in enumerate(zip(a, b)):
            why = compare(x, y, f"{path}[{i}]")
            if why:
                return why
        return None
    return None if type(a) is type(b) and a == b else f"{path}: {a!r} vs {b!r}"


def check_same(check: Check, torch_batch: Any, ferro_batch: Any) -> None:
    why = compare(torch_batch, ferro_batch)
    if why:
        check.note = f"MISMATCH (outputs differ, comparison void): {why}"


# ---------------------------------------------------------------------------
# The library under test
# ---------------------------------------------------------------------------


def import_ferro() -> Any:
    import ferroloader

    for name in ("DataLoader", "TensorDataset", "default_collate"):
        if not hasattr(ferroloader, name):
            raise ImportError(f"ferroloader has no {name}")
    return ferroloader


def ferro_version(fl: Any) -> str:
    version = getattr(fl, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("ferroloader")
        except Exception:
            version = "?"
    return str(version)


_MW_PROBE: Dict[str, Optional[str]] = {}


def probe_workers(fl: Any) -> None:
    """Raise Skip if ferroloader's num_workers>0 raises NotImplementedError."""
    if "result" not in _MW_PROBE:
        try:
            first_batch(fl.DataLoader(IntDataset(8), batch_size=4, num_workers=2))
            _MW_PROBE["result"] = None
        except NotImplementedError as exc:
            _MW_PROBE["result"] = str(exc) or "NotImplementedError"
    if _MW_PROBE["result"] is not None:
        raise Skip(f"skipped: ferroloader num_workers>0 not available: {_MW_PROBE['result']}")


# ---------------------------------------------------------------------------
# Loader scenarios (shared shape)
# ---------------------------------------------------------------------------


def loader_pair(
    st: Settings,
    check: Check,
    make_torch: Callable[[], Iterable[Any]],
    make_ferro: Callable[[], Iterable[Any]],
    units_per_epoch: float,
    extra: Optional[List[Tuple[Check, Callable[[], float]]]] = None,
) -> None:
    """Warm up both loaders, then interleave torch, ferro (and extras) per round.

    ``extra`` pairs a second check with a rate function measured in the same
    round; its ratio is that round's ferroloader rate over the extra rate
    (``check.baseline`` holds the extra rate).
    """
    tl, fl = make_torch(), make_ferro()
    tb, fb = first_batch(tl), first_batch(fl)  # also starts persistent workers
    check_same(check, tb, fb)
    del tb, fb
    t_step, f_step = epoch_step(tl, units_per_epoch), epoch_step(fl, units_per_epoch)
    warm = st.min_time / 2
    timed_rate(t_step, warm)
    timed_rate(f_step, warm)
    for fn in (e[1] for e in extra or []):
        fn()
    for _ in range(st.repeats):
        t = timed_rate(t_step, st.min_time)
        f = timed_rate(f_step, st.min_time)
        check.add(t, f)
        for other, fn in extra or []:
            other.add(fn(), f)
    stats = getattr(fl, "stats", None)
    if stats is not None:
        LAST_STATS[:] = [str(stats())]
    del tl, fl, t_step, f_step
    gc.collect()


# --- num_workers=2 ----------------------------------------------------------


def mw_kwargs(**kw: Any) -> Dict[str, Any]:
    return dict(num_workers=2, persistent_workers=True, **kw)


def fmt_num(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def fmt_target(c: Check) -> str:
    return f"{'>=' if c.higher_is_better else '<='} {c.target:g}x"


def verdict(c: Check) -> str:
    if c.note.startswith("MISMATCH"):
        return "FAIL (mismatch)"
    return "PASS" if c.passed else "FAIL"


def print_scenario(s: Scenario) -> None:
    print(f"\n== {s.name}: {s.title} ({s.seconds:.1f} s)", flush=True)
    if s.status != "ok":
        print(f"   {s.note}", flush=True)
        return
    for c in s.checks:
        r = c.ratios
        print(
            f"   {c.measure}: ferroloader/{c.baseline_name} median {c.median_ratio:.2f}x "
            f"(spread {min(r):.2f}-{max(r):.2f}x, {len(r)} rounds)  "
            f"target {fmt_target(c)}  {verdict(c)}"
        )
        print(
            f"     context: {c.baseline_name} {fmt_num(statistics.median(c.baseline))} "
            f"{c.unit}, ferroloader {fmt_num(statistics.median(c.ferro))} {c.unit} (medians)"
        )
        print("     per-round ratios: " + " ".join(f"{x:.2f}" for x in r))
        if c.note:
            print(f"     note: {c.note}")
    if s.stats:
        print("   ferroloader's loader.stats() for this scenario:")
        for line in s.stats.splitlines():
            print("     " + line)
    sys.stdout.flush()


def print_table(results: List[Scenario]) -> None:
    head = (
        "scenario",
        "measure",
        "baseline",
        "baseline*",
        "ferroloader*",
        "ratio (median)",
        "spread",
        "target",
        "result",
    )
    rows: List[Tuple[str, ...]] = []
    for s in results:
        if s.status != "ok":
            rows.append((s.name, "-", "-", "-", "-", "-", "-", "-", s.status.upper()))
            continue
        for c in s.checks:
            r = c.ratios
            rows.append(
                (
                    s.name,
                    c.measure,
                    c.baseline_name,
                    f"{fmt_num(statistics.median(c.baseline))} {c.unit}",
                    f"{fmt_num(statistics.median(c.ferro))} {c.unit}",
                    f"{c.median_ratio:.2f}x",
                    f"{min(r):.2f}-{max(r):.2f}x",
                    fmt_target(c),
                    verdict(c),
                )
            )
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |"

    print("\nSummary: ratio = ferroloader / baseline, median of per-round ratios")
    print("(* absolute figures are context only: medians on a shared, noisy machine)")
    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))
    notes: Dict[str, List[str]] = {}
    for s in results:
        if s.status != "ok":
            first = s.note.strip().splitlines()[-1] if s.note.strip() else s.status
            notes.setdefault(first, []).append(s.name)
    for note, names in notes.items():
        print(f"  {', '.join(names)}: {note}")


def write_json(path: str, meta: Dict[str, Any], results: List[Scenario]) -> None:
    """The run's settings and every scenario's checks (rounds, ratios, medians)."""
    with open(path, "w") as f:
        json.dump(
            {"meta": meta, "scenarios": {s.name: s.to_json() for s in results}},
            f,
            indent=2,
        )
