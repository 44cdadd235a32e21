#!/usr/bin/env python3
"""Side-by-side bench: ``torch.utils.data`` against ``ferroloader`` in one run.

Every scenario times the two libraries on the same data, interleaved (torch,
ferroloader, torch, ferroloader, ... for ``--repeats`` rounds) after one
warm-up each, and reports the ratio ferroloader/torch as the **median of the
per-round ratios** with its spread (min-max). The machines this runs on are
shared and noisy (identical code measured against itself varies by up to
20 %), so the ratios are the result; absolute rates are printed as context only.

Scenarios (``--scenarios``, comma-separated; default all):

=============  ==========================================================  =========
name           what                                                        target
=============  ==========================================================  =========
int64          map-style dataset -> Python int, batch 64, num_workers=0    >= 2x
tensords       TensorDataset (N,32) f32 + i64 labels, batch 256, nw=0      >= 5x
collate        default_collate of 64 dicts of small tensors/ndarrays       >= 2x
int64_w2       Python-int dataset, batch 64, num_workers=2                 >= 10x,
               (and ferroloader nw=2 no slower than its own nw=0)          >= 1x
dict40_w2      samples = dicts of 40 small tensors, batch 16, nw=2         >= 5x
image_w2       samples 3x224x224 f32, batch 32, nw=2, MB/s                 >= 1.5x,
               (and ferroloader >= half a one-thread memcpy of the batch)  >= 0.5x
image_w2_rss   peak PSS/RSS of the process tree for the image_w2 job       <= 1x
cpu_w2         pure-Python CPU-bound __getitem__ (~0.5 ms), nw=2           >= 0.9x
ttfb_w2        time to first batch, nw=2, with fork and with spawn;        <= 1x
               with forkserver in a fresh interpreter: the first epoch    <= 1x
               and the later ones (a new loader per epoch)               <= 0.5x
state_w2       state_dict() mid-epoch, nw=2 and nw=8, against a 1 ms       <= 1x
               budget;
               load_state_dict() + first batch against a fresh epoch's     <= 1.1x
seeds_w2       per_sample_seed=True against unseeded, ~0.5 ms samples,    >= 0.9x
               nw=2 (the note gives the microseconds added per sample)
shards_w2      a ShardedDataset with one shard as large as its 16 small    >= 1.3x
               ones together, ~0.2 ms items, nw=2: dynamic sharding's
               epoch rate against static's
gpu            (CUDA only; skipped without) images 3x224x224, batch 64,
               4 and 8 workers: GB/s reaching the GPU with pin_memory=True  >= 3x,
               against torch's, and against ferroloader's pin=False;       >= 1x
               steps/s of a loop with a ~8.5 ms GPU step against the step  >= 0.95x
               alone on a batch already on the GPU
scaling        throughput against num_workers (1, 2, 4, ... up to the      (curve)
               machine's cores) on the image and CPU-bound jobs, torch and
               ferroloader; --png PATH draws it (default
               bench-results/scaling.png; needs matplotlib, the bench extra)
peers          records (dict of f32[16] + label, batch 256), uint8 images  >= 1x
               from a memory map (batch 32) and PIL-decoded JPEGs (batch
               32), 2 workers or threads each, shuffled: ferroloader's
               threads (worker_method="thread") against torchdata nodes
               threads, SPDL threads and its own processes (also each
               loader alone in a fresh process); its processes against
               torch, nodes threads and Grain processes
strings_mem    summed PSS growth of a 2-worker shuffled epoch over 2 million <= 0.1x
               Python strings with worker threads, against the dataset's
               size; their peak against process workers'                  <= 0.8x
worker_threads PIL JPEG decoding (256x256, batch 32), worker_threads=2:     >= 1.2x
               1 process x 2 threads against 1 process; 2 x 2 against 2   >= 1x
               processes; 2 x 2 against 4 processes (as many workers),    >= 0.9x
               its peak summed PSS against theirs                         <= 1x
packing        20,000 token sequences (geometric lengths, mean 150) packed    >= 1x
               into batches of 8 x 2048 rows, tokens/s: Packing (first and
               best fit) against Grain's FirstFit/BestFitPackIterDataset
table          TableDataset, 1M rows x (8 numeric + 1 string), batch       >= 10x,
               256, shuffled, nw=0, rows/s: numeric columns against torch
               over a per-row pyarrow dataset and over HF datasets'
               with_format("torch"); against a hand-written __getitems__   >= 1x
               with pyarrow take; with the string column against per-row   >= 1x
table_w2       the same with num_workers=2
table_mem      peak summed PSS of a 2-worker epoch over a memory-mapped    <= 1.1x
               Arrow IPC file of 1 GB, against the file's size plus the
               batches in flight
=============  ==========================================================  =========

The ``*_w2`` scenarios are skipped with a note while ferroloader raises
``NotImplementedError`` for ``num_workers > 0``.

Exit status: 0 when the report was produced, whether or not targets were met;
non-zero only when the bench itself (or a library under test) crashed.

Usage::

    python benches/bench_vs_torch.py [--repeats 7] [--scenarios a,b] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.utils.data as tud

# ---------------------------------------------------------------------------
# Datasets. Module-level classes so that spawned workers can unpickle them.
# ---------------------------------------------------------------------------


class IntDataset:
    """Map-style dataset whose items are Python ints."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class CycleDataset:
    """Map-style dataset cycling over a fixed list of prebuilt samples."""

    def __init__(self, samples: Sequence[Any], n: int) -> None:
        self.samples = list(samples)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        return self.samples[index % len(self.samples)]


class CpuDataset:
    """Pure-Python CPU-bound ``__getitem__`` (``iters`` loop steps, calibrated)."""

    def __init__(self, n: int, iters: int) -> None:
        self.n = n
        self.iters = iters

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        acc = index
        for k in range(self.iters):
            acc = (acc * 31 + k) & 0xFFFFFFFF
        return acc


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


# --- num_workers=0 ----------------------------------------------------------


def sc_int64(st: Settings, fl: Any) -> List[Check]:
    n = 2048 if st.quick else 65536
    check = Check("samples/s", "samples/s", "torch", target=2.0)
    loader_pair(
        st,
        check,
        lambda: tud.DataLoader(IntDataset(n), batch_size=64),
        lambda: fl.DataLoader(IntDataset(n), batch_size=64),
        n,
    )
    return [check]


def sc_tensords(st: Settings, fl: Any) -> List[Check]:
    n = 4096 if st.quick else 65536
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 32, generator=gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    check = Check("samples/s", "samples/s", "torch", target=5.0)
    loader_pair(
        st,
        check,
        lambda: tud.DataLoader(tud.TensorDataset(x, y), batch_size=256),
        lambda: fl.DataLoader(fl.TensorDataset(x, y), batch_size=256),
        n,
    )
    return [check]


def collate_samples(n: int = 64) -> List[Dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [
        {
            "a": torch.from_numpy(rng.standard_normal(8, dtype=np.float32)),
            "b": torch.from_numpy(rng.integers(0, 100, (3, 4), dtype=np.int64)),
            "c": rng.standard_normal(16, dtype=np.float32),
            "d": rng.integers(0, 100, 4, dtype=np.int64),
        }
        for _ in range(n)
    ]


def sc_collate(st: Settings, fl: Any) -> List[Check]:
    batch = collate_samples(64)
    check = Check("samples/s", "samples/s", "torch", target=2.0)
    t_fn, f_fn = tud.default_collate, fl.default_collate
    check_same(check, t_fn(batch), f_fn(batch))

    def t_step() -> float:
        for _ in range(20):
            t_fn(batch)
        return 20 * len(batch)

    def f_step() -> float:
        for _ in range(20):
            f_fn(batch)
        return 20 * len(batch)

    timed_rate(t_step, st.min_time / 2)
    timed_rate(f_step, st.min_time / 2)
    for _ in range(st.repeats):
        check.add(timed_rate(t_step, st.min_time), timed_rate(f_step, st.min_time))
    return [check]


# --- num_workers=2 ----------------------------------------------------------


def mw_kwargs(**kw: Any) -> Dict[str, Any]:
    return dict(num_workers=2, persistent_workers=True, **kw)


def sc_int64_w2(st: Settings, fl: Any) -> List[Check]:
    probe_workers(fl)
    # The full size even with --quick: an epoch of 32 batches measures the
    # epoch restart, not the pipeline, and the nw=0 comparison turns to noise.
    n = 16384
    check = Check("samples/s", "samples/s", "torch", target=10.0)
    own = Check("samples/s", "samples/s", "ferroloader nw=0", target=1.0)
    f0 = fl.DataLoader(IntDataset(n), batch_size=64)
    f0_step = epoch_step(f0, n)
    loader_pair(
        st,
        check,
        lambda: tud.DataLoader(IntDataset(n), batch_size=64, **mw_kwargs()),
        lambda: fl.DataLoader(IntDataset(n), batch_size=64, **mw_kwargs()),
        n,
        extra=[(own, lambda: timed_rate(f0_step, st.min_time))],
    )
    return [check, own]


def sc_dict40_w2(st: Settings, fl: Any) -> List[Check]:
    probe_workers(fl)
    n = 128 if st.quick else 512
    gen = torch.Generator().manual_seed(0)
    samples = [
        {
            f"k{j:02d}": (
                torch.randn(8, generator=gen)
                if j % 2 == 0
                else torch.randint(0, 100, (2, 2), generator=gen)
            )
            for j in range(40)
        }
        for _ in range(64)
    ]
    check = Check("samples/s", "samples/s", "torch", target=5.0)
    loader_pair(
        st,
        check,
        lambda: tud.DataLoader(CycleDataset(samples, n), batch_size=16, **mw_kwargs()),
        lambda: fl.DataLoader(CycleDataset(samples, n), batch_size=16, **mw_kwargs()),
        n,
    )
    return [check]


IMAGE_SHAPE = (3, 224, 224)
IMAGE_BATCH = 32


def image_samples() -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(IMAGE_SHAPE, generator=gen) for _ in range(4)]


def memcpy_rate(nbytes: int, min_time: float) -> Callable[[], float]:
    """MB/s of a one-thread copy of ``nbytes`` between two preallocated arrays."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)

    def step() -> float:
        np.copyto(dst, src)
        return nbytes / 1e6

    return lambda: timed_rate(step, min_time)


def sc_image_w2(st: Settings, fl: Any) -> List[Check]:
    probe_workers(fl)
    n = IMAGE_BATCH * (2 if st.quick else 8)
    sample_bytes = math.prod(IMAGE_SHAPE) * 4
    samples = image_samples()
    check = Check("MB/s", "MB/s", "torch", target=1.5)
    vs_copy = Check("MB/s", "MB/s", "memcpy of batch", target=0.5)
    loader_pair(
        st,
        check,
        lambda: tud.DataLoader(CycleDataset(samples, n), batch_size=IMAGE_BATCH, **mw_kwargs()),
        lambda: fl.DataLoader(CycleDataset(samples, n), batch_size=IMAGE_BATCH, **mw_kwargs()),
        n * sample_bytes / 1e6,
        extra=[(vs_copy, memcpy_rate(IMAGE_BATCH * sample_bytes, st.min_time))],
    )
    return [check, vs_copy]


def sc_cpu_w2(st: Settings, fl: Any) -> List[Check]:
    probe_workers(fl)
    iters = calibrate_cpu_iters(0.5e-3)
    n = 128 if st.quick else 1024
    check = Check("samples/s", "samples/s", "torch", target=0.9)
    check.note = f"__getitem__ = {iters} loop steps (~0.5 ms here)"
    loader_pair(
        st,
        check,
        lambda: tud.DataLoader(CpuDataset(n, iters), batch_size=32, **mw_kwargs()),
        lambda: fl.DataLoader(CpuDataset(n, iters), batch_size=32, **mw_kwargs()),
        n,
    )
    return [check]


def calibrate_cpu_iters(seconds: float) -> int:
    ds = CpuDataset(1, 20000)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        ds[0]
        best = min(best, time.perf_counter() - t0)
    return max(1, round(20000 * seconds / best))


def sc_ttfb_w2(st: Settings, fl: Any) -> List[Check]:
    probe_workers(fl)
    n = 4096
    checks = []
    rounds = {"fork": st.repeats, "spawn": max(2, min(st.repeats, 3))}
    for ctx, nrounds in rounds.items():
        check = Check(f"ms to first batch ({ctx})", "ms", "torch", target=1.0)
        check.higher_is_better = False
        if ctx == "spawn":
            check.note = f"{nrounds} rounds (a spawned interpreter imports torch)"

        def ttfb(lib: Any, ctx: str = ctx) -> float:
            gc.collect()
            t0 = time.perf_counter()
            loader = lib.DataLoader(
                IntDataset(n), batch_size=64, num_workers=2, multiprocessing_context=ctx
            )
            it = iter(loader)
            next(it)
            dt = time.perf_counter() - t0  # worker shutdown below is not timed
            del it, loader
            gc.collect()
            return dt * 1e3

        for _ in range(nrounds):
            t = ttfb(tud)
            check.add(t, ttfb(fl))
        checks.append(check)
    checks.extend(forkserver_ttfb(st))
    return checks


# A fresh interpreter whose main module is not a file (as in a notebook,
# pytest or python -c): three loaders in turn, as three epochs without
# persistent workers, each timed from construction to its first batch.
_FORKSERVER_CHILD = """
import json, multiprocessing as mp, sys, time
sys.path.insert(0, sys.argv[2])
import torch
if sys.argv[1] == "torch":
    import torch.utils.data as lib
else:
    import ferroloader as lib
from bench_vs_torch import IntDataset
ctx = mp.get_context("forkserver")
out = []
for _ in range(3):
    t0 = time.perf_counter()
    loader = lib.DataLoader(IntDataset(4096), batch_size=64, num_workers=2,
                            multiprocessing_context=ctx)
    it = iter(loader)
    next(it)
    out.append((time.perf_counter() - t0) * 1e3)
    del it, loader
print(json.dumps(out))
"""


def forkserver_ttfb(st: Settings) -> List[Check]:
    """Time to first batch with forkserver, each library in its own fresh
    interpreter: the first epoch (the fork server starts) and the later
    ones (workers forked from the running server)."""
    first = Check("ms to first batch (forkserver, first epoch)", "ms", "torch", target=1.0)
    later = Check("ms to first batch (forkserver, later epochs)", "ms", "torch", target=0.5)
    first.higher_is_better = later.higher_is_better = False
    here = os.path.dirname(os.path.abspath(__file__))

    def run(lib: str) -> List[float]:
        proc = subprocess.run(
            [sys.executable, "-c", _FORKSERVER_CHILD, lib, here],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"forkserver child ({lib}) failed:\n{proc.stderr[-2000:]}")
        return [float(x) for x in json.loads(proc.stdout.strip().splitlines()[-1])]

    for _ in range(max(2, min(st.repeats, 3))):
        t, f = run("torch"), run("ferroloader")
        first.add(t[0], f[0])
        later.add(statistics.mean(t[1:]), statistics.mean(f[1:]))
    note = "a fresh `python -c` interpreter per library and round (main is not a file)"
    first.note = later.note = note
    return [first, later]


def _first_batch_ms(make: Callable[[], Any], state: Optional[Dict[str, Any]]) -> float:
    """ms from building a loader (loading `state` into it, if given) to its
    first batch."""
    t0 = time.perf_counter()
    loader = make()
    if state is not None:
        loader.load_state_dict(state)
    it = iter(loader)
    next(it)
    ms = (time.perf_counter() - t0) * 1e3
    del it, loader
    gc.collect()
    return ms


def sc_state_w2(st: Settings, fl: Any) -> List[Check]:
    """Snapshot cost (no torch counterpart: measured against a budget and
    against ferroloader's own fresh epoch)."""
    probe_workers(fl)
    n = 4096 if st.quick else 65536
    snap = Check("state_dict() mid-epoch", "us", "1 ms budget", target=1.0)
    snap.higher_is_better = False
    snap8 = Check("state_dict() mid-epoch, 8 workers", "us", "1 ms budget", target=1.0)
    snap8.higher_is_better = False
    # the resume contract (issue 19): within 1.1x of a fresh epoch's first batch
    resume = Check("ms to first batch after load_state_dict", "ms", "fresh epoch", target=1.1)
    resume.higher_is_better = False

    def make() -> Any:
        return fl.DataLoader(IntDataset(n), batch_size=64, shuffle=True, num_workers=2)

    for _ in range(st.repeats):
        loader = make()
        it = iter(loader)
        for _ in range(n // 64 // 2):
            next(it)
        calls = 200
        t0 = time.perf_counter()
        for _ in range(calls):
            sd = loader.state_dict()
        snap.add(1000.0, (time.perf_counter() - t0) / calls * 1e6)
        del it, loader
        gc.collect()

        # 8 workers (more than this machine's cores: the snapshot does not
        # wait on any of them)
        many = fl.DataLoader(IntDataset(n), batch_size=64, shuffle=True, num_workers=8)
        it = iter(many)
        for _ in range(16):
            next(it)
        t0 = time.perf_counter()
        for _ in range(calls):
            many.state_dict()
        snap8.add(1000.0, (time.perf_counter() - t0) / calls * 1e6)
        del it, many
        gc.collect()

        # pairs in alternating order, so neither side always runs first
        # (one pair is two worker start-ups: a single one is noise)
        for k in range(3 if st.quick else 6):
            pair = [_first_batch_ms(make, None), _first_batch_ms(make, sd)]
            if k % 2:
                pair = [_first_batch_ms(make, sd), _first_batch_ms(make, None)][::-1]
            resume.add(pair[0], pair[1])
    return [snap, snap8, resume]


def sc_seeds_w2(st: Settings, fl: Any) -> List[Check]:
    """The cost of per-sample seeding (ferroloader against itself)."""
    probe_workers(fl)
    iters = calibrate_cpu_iters(0.5e-3)
    n = 128 if st.quick else 1024
    check = Check("samples/s, per_sample_seed", "samples/s", "unseeded", target=0.9)
    loader_pair(
        st,
        check,
        lambda: fl.DataLoader(CpuDataset(n, iters), batch_size=32, **mw_kwargs()),
        lambda: fl.DataLoader(
            CpuDataset(n, iters), batch_size=32, seed=0, per_sample_seed=True, **mw_kwargs()
        ),
        n,
    )
    # the absolute cost, on samples that cost nothing (nw=0)
    m = 2048 if st.quick else 16384
    plain = epoch_step(fl.DataLoader(IntDataset(m), batch_size=64), m)
    seeded = epoch_step(
        fl.DataLoader(IntDataset(m), batch_size=64, seed=0, per_sample_seed=True), m
    )
    rates = [(timed_rate(plain, st.min_time), timed_rate(seeded, st.min_time)) for _ in range(3)]
    added = statistics.median(1e6 / s - 1e6 / p for p, s in rates)
    check.note = f"adds {added:.1f} us per sample (median, Python-int dataset, nw=0)"
    return [check]


def _cpu_shards(fl: Any) -> Any:
    """A ShardedDataset class whose items cost ``iters`` loop steps each
    (made here: ferroloader is imported only when a run asks for it)."""

    class CpuShards(fl.ShardedDataset):
        def __init__(self, lens: List[int], iters: int) -> None:
            self.lens = lens
            self.iters = iters

        def shards(self) -> List[int]:
            return list(range(len(self.lens)))

        def iter_shard(self, shard: int, start: int = 0) -> Iterable[int]:
            ds = CpuDataset(0, self.iters)
            return (ds[1000 * shard + o] for o in range(start, self.lens[shard]))

        def shard_len(self, shard: int) -> int:
            return self.lens[shard]

    return CpuShards


def sc_shards_w2(st: Settings, fl: Any) -> List[Check]:
    """Dynamic against static sharding on uneven shards (ferroloader
    against itself): one shard holds as many items as the 16 others
    together, so static lanes end with one worker reading it alone."""
    probe_workers(fl)
    iters = calibrate_cpu_iters(0.2e-3)
    per_small = 24 if st.quick else 96
    lens = [16 * per_small] + [per_small] * 16
    n = sum(lens)
    cls = _cpu_shards(fl)
    check = Check("samples/s, dynamic sharding", "samples/s", "static sharding", target=1.3)

    def make(mode: str) -> Any:
        return fl.DataLoader(
            cls(lens, iters),
            batch_size=16,
            shuffle=True,
            seed=0,
            sharding=fl.Sharding(mode=mode),
            **mw_kwargs(),
        )

    static, dynamic = make("static"), make("dynamic")
    s_step, d_step = epoch_step(static, n), epoch_step(dynamic, n)
    s_step()  # warm: starts the persistent workers
    d_step()
    for _ in range(st.repeats):
        check.add(timed_rate(s_step, st.min_time), timed_rate(d_step, st.min_time))
    del static, dynamic, s_step, d_step
    gc.collect()
    return [check]


# --- the GPU: pinned batches and the training loop's clock ---------------------

GPU_BATCH = 64


def gpu_step_fn(ms: float) -> Tuple[Callable[[torch.Tensor], None], float]:
    """A GPU step of about ``ms`` milliseconds (matmuls on one stream),
    calibrated here; returns it and its measured time."""
    a = torch.randn(2048, 2048, device="cuda")

    def make(k: int) -> Callable[[torch.Tensor], None]:
        def step(batch: torch.Tensor) -> None:
            x = a
            for _ in range(k):
                x = x @ a
                x = x / x.norm()
            batch.sum()  # the step reads its batch

        return step

    one = make(1)
    one(torch.empty(1, device="cuda"))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        one(torch.empty(1, device="cuda"))
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 20 * 1e3
    k = max(1, round(ms / per))
    step = make(k)
    step(torch.empty(1, device="cuda"))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        step(torch.empty(1, device="cuda"))
    torch.cuda.synchronize()
    return step, (time.perf_counter() - t0) / 10 * 1e3


def sc_gpu(st: Settings, fl: Any) -> List[Check]:
    """GB/s reaching the GPU (each batch copied with non_blocking=True) with
    and without pin_memory, and steps/s of a loop with a fixed GPU step
    (the copy of the next batch on a side stream), torch and ferroloader
    side by side; images 3x224x224 f32, batch 64, persistent workers,
    prefetch_factor 4."""
    if not torch.cuda.is_available():
        raise Skip("no CUDA device here: the GPU scenario needs one")
    probe_workers(fl)
    cores = os.cpu_count() or 1
    counts = [w for w in (4, 8) if w <= cores] or [min(2, cores)]
    samples = image_samples()
    batches = 8 if st.quick else 48
    n = GPU_BATCH * batches
    gbytes = n * math.prod(IMAGE_SHAPE) * 4 / 1e9
    step, step_ms = gpu_step_fn(8.5)
    checks: List[Check] = []

    def make(lib: Any, nw: int, pin: bool) -> Any:
        return lib.DataLoader(
            CycleDataset(samples, n),
            batch_size=GPU_BATCH,
            num_workers=nw,
            pin_memory=pin,
            persistent_workers=True,
            prefetch_factor=4,
        )

    def copy_epoch(loader: Any) -> Callable[[], float]:
        def run() -> float:
            for b in loader:
                b.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            return gbytes

        return run

    copy_stream = torch.cuda.Stream()

    def train_epoch(loader: Any) -> Callable[[], float]:
        """A training loop that hides the copy as users do (timm's and
        apex's prefetchers): batch k+1 is copied on a side stream while the
        step of batch k runs; the step's stream waits for the copy."""

        def run() -> float:
            it = iter(loader)

            def fetch() -> Optional[torch.Tensor]:
                b = next(it, None)
                if b is None:
                    return None
                with torch.cuda.stream(copy_stream):
                    return b.to("cuda", non_blocking=True)

            nxt, done = fetch(), 0
            while nxt is not None:
                torch.cuda.current_stream().wait_stream(copy_stream)
                cur = nxt
                cur.record_stream(torch.cuda.current_stream())
                nxt = fetch()
                step(cur)
                done += 1
            torch.cuda.synchronize()
            return float(done)

        return run

    on_gpu = samples[0].to("cuda").expand(GPU_BATCH, *IMAGE_SHAPE).contiguous()

    def alone() -> float:
        for _ in range(batches):
            step(on_gpu)
        torch.cuda.synchronize()
        return float(batches)

    for nw in counts:
        rates: Dict[Tuple[str, bool], float] = {}
        pinned = Check(f"GB/s to the GPU, pin_memory=True, {nw} workers", "GB/s", "torch", 3.0)
        own = Check(
            f"GB/s to the GPU, {nw} workers, pin_memory=True", "GB/s", "own pin=False", 1.0
        )
        steps = Check(
            f"steps/s with a {step_ms:.1f} ms GPU step, {nw} workers, pinned",
            "steps/s",
            "the step alone",
            0.95,
        )
        loaders = {
            (name, pin): make(lib, nw, pin)
            for name, lib in (("torch", tud), ("ferroloader", fl))
            for pin in (False, True)
        }
        for loader in loaders.values():
            copy_epoch(loader)()  # starts the workers, warms the arenas
        for _ in range(st.repeats):
            for key, loader in loaders.items():
                rates[key] = timed_rate(copy_epoch(loader), st.min_time)
            pinned.add(rates[("torch", True)], rates[("ferroloader", True)])
            own.add(rates[("ferroloader", False)], rates[("ferroloader", True)])
            steps.add(
                timed_rate(alone, st.min_time),
                timed_rate(train_epoch(loaders[("ferroloader", True)]), st.min_time),
            )
        torch_steps = timed_rate(train_epoch(loaders[("torch", True)]), st.min_time)
        pinned.note = (
            f"pin_memory=False: torch {rates[('torch', False)]:.1f}, "
            f"ferroloader {rates[('ferroloader', False)]:.1f} GB/s"
        )
        steps.note = f"torch's loader, same loop: {torch_steps:.1f} steps/s"
        checks += [pinned, own, steps]
        del loaders
        gc.collect()
    return checks


# --- scaling with num_workers -------------------------------------------------

SCALING: Dict[str, Dict[str, List[Tuple[int, float]]]] = {}


def worker_counts() -> List[int]:
    cores = os.cpu_count() or 1
    counts, w = [], 1
    while w < cores:
        counts.append(w)
        w *= 2
    return [*counts, cores]


def sc_scaling(st: Settings, fl: Any) -> List[Check]:
    """Throughput against num_workers, both libraries, on the image job
    (MB/s) and the CPU-bound one (samples/s); one check per job at the
    largest count, and the curves kept for --png."""
    probe_workers(fl)
    samples = image_samples()
    sample_bytes = math.prod(IMAGE_SHAPE) * 4
    iters = calibrate_cpu_iters(0.5e-3)
    jobs = {
        "image (MB/s)": (
            lambda lib, nw: lib.DataLoader(
                CycleDataset(samples, IMAGE_BATCH * 8),
                batch_size=IMAGE_BATCH,
                num_workers=nw,
                persistent_workers=True,
            ),
            IMAGE_BATCH * 8 * sample_bytes / 1e6,
        ),
        "CPU-bound (samples/s)": (
            lambda lib, nw: lib.DataLoader(
                CpuDataset(512, iters), batch_size=32, num_workers=nw, persistent_workers=True
            ),
            512.0,
        ),
    }
    checks = []
    rounds = max(1, st.repeats // 2)
    for job, (make, units) in jobs.items():
        curves: Dict[str, List[Tuple[int, float]]] = {"torch": [], "ferroloader": []}
        check = Check(f"{job} at the most workers", job.split("(")[1][:-1], "torch", target=1.0)
        for nw in worker_counts():
            tl, fl_ = make(tud, nw), make(fl, nw)
            t_step, f_step = epoch_step(tl, units), epoch_step(fl_, units)
            t_step()
            f_step()
            t_rates, f_rates = [], []
            for _ in range(rounds):
                t_rates.append(timed_rate(t_step, st.min_time))
                f_rates.append(timed_rate(f_step, st.min_time))
                PROGRESS.tick()
            curves["torch"].append((nw, statistics.median(t_rates)))
            curves["ferroloader"].append((nw, statistics.median(f_rates)))
            del tl, fl_, t_step, f_step
            gc.collect()
        # the check's rounds are those at the largest count
        check.baseline, check.ferro = t_rates, f_rates
        check.note = "; ".join(
            f"{nw} workers: torch {fmt_num(t)}, ferroloader {fmt_num(f)}"
            for (nw, t), (_, f) in zip(curves["torch"], curves["ferroloader"])
        )
        SCALING[job] = curves
        checks.append(check)
    return checks


def write_scaling_png(path: str, meta: Dict[str, Any]) -> Optional[str]:
    """Draws the scaling curves; the reason when it cannot."""
    if not SCALING:
        return "no scaling results (run the scaling scenario)"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    fig, axes = plt.subplots(1, len(SCALING), figsize=(5.5 * len(SCALING), 4))
    if len(SCALING) == 1:
        axes = [axes]
    for ax, (job, curves) in zip(axes, SCALING.items()):
        for lib, style in (("torch", "o--"), ("ferroloader", "s-")):
            xs = [nw for nw, _ in curves[lib]]
            ax.plot(xs, [r for _, r in curves[lib]], style, label=lib)
        ax.set_xlabel("num_workers")
        ax.set_ylabel(job)
        ax.set_xticks(xs)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"ferroloader vs torch.utils.data: throughput against num_workers "
        f"({meta['cpus']} CPUs, torch {meta['torch']})",
        fontsize=10,
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# --- tables (TableDataset) ---------------------------------------------------

TABLE_BATCH = 256


def _pa() -> Any:
    try:
        import pyarrow as pa
    except ImportError as e:
        raise Skip("skipped: needs pyarrow (pip install -e '.[test]')") from e
    return pa


def make_bench_table(rows: int, text: bool = True) -> Any:
    """8 numeric columns (int64 and float32 in turn) and a string column."""
    pa = _pa()
    rng = np.random.default_rng(0)
    cols: Dict[str, Any] = {}
    for k in range(8):
        if k % 2:
            cols[f"f{k}"] = pa.array(rng.random(rows, dtype=np.float32))
        else:
            cols[f"i{k}"] = pa.array(rng.integers(0, 1 << 30, rows, dtype=np.int64))
    if text:
        cols["text"] = pa.array([f"token-{v}" for v in rng.integers(0, 10**6, rows)])
    return pa.table(cols)


class ArrowRows(tud.Dataset):
    """The natural per-row dataset over a pyarrow table."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return self.table.slice(i, 1).to_pylist()[0]


class ArrowTake(ArrowRows):
    """What a careful user writes today: one pyarrow ``take`` per batch
    (used with an identity collate_fn)."""

    def __getitems__(self, indices: List[int]) -> Dict[str, Any]:
        sub = self.table.take(indices)
        out: Dict[str, Any] = {}
        for name in sub.column_names:
            col = sub.column(name)
            if col.type.equals(self.table.schema.field(name).type) and name != "text":
                out[name] = torch.from_numpy(col.to_numpy())
            else:
                out[name] = col.to_pylist()
        return out


def _identity(batch: Any) -> Any:
    return batch


def batches_step(make: Callable[[], Iterable[Any]], n: int, rows: int) -> Callable[[], float]:
    """A step of ``n`` batches of a loader kept across steps (a new epoch
    when one ends); reports the rows read."""
    state: Dict[str, Any] = {"loader": make(), "it": None}

    def step() -> float:
        for _ in range(n):
            try:
                if state["it"] is None:
                    raise StopIteration
                next(state["it"])
            except StopIteration:
                state["it"] = iter(state["loader"])
                next(state["it"])
        return float(n * rows)

    return step


def _table_checks(st: Settings, fl: Any, nw: int) -> List[Check]:
    pa = _pa()
    rows = 50_000 if st.quick else 1_000_000
    table = make_bench_table(rows)
    numeric = [c for c in table.column_names if c != "text"]
    kw: Dict[str, Any] = dict(batch_size=TABLE_BATCH, shuffle=True)
    if nw:
        kw.update(num_workers=nw, persistent_workers=True)
    n = 2 if st.quick else 16
    ours = batches_step(
        lambda: fl.DataLoader(fl.TableDataset(table, numeric), **kw), n, TABLE_BATCH
    )
    ours_text = batches_step(lambda: fl.DataLoader(fl.TableDataset(table), **kw), n, TABLE_BATCH)
    per_row = batches_step(
        lambda: tud.DataLoader(ArrowRows(table.select(numeric)), **kw), n, TABLE_BATCH
    )
    per_row_text = batches_step(lambda: tud.DataLoader(ArrowRows(table), **kw), n, TABLE_BATCH)
    take = batches_step(
        lambda: tud.DataLoader(ArrowTake(table.select(numeric)), collate_fn=_identity, **kw),
        n,
        TABLE_BATCH,
    )
    steps: List[Tuple[Check, Callable[[], float], Callable[[], float]]] = [
        (Check("rows/s, numeric", "rows/s", "torch, per-row pyarrow", target=10.0), per_row, ours),
        (Check("rows/s, numeric", "rows/s", "torch, __getitems__ take", target=1.0), take, ours),
        (
            Check("rows/s, with a string column", "rows/s", "torch, per-row pyarrow", target=1.0),
            per_row_text,
            ours_text,
        ),
    ]
    try:
        import datasets

        hf = datasets.Dataset(table.select(numeric)).with_format("torch")
        hf_step = batches_step(lambda: tud.DataLoader(hf, **kw), n, TABLE_BATCH)
        steps.insert(
            1,
            (
                Check("rows/s, numeric", "rows/s", "torch, HF with_format", target=10.0),
                hf_step,
                ours,
            ),
        )
    except ImportError:
        pass
    del pa
    for _, base, mine in steps:  # warm: workers started, pages touched
        base()
        mine()
    for _ in range(st.repeats):
        for check, base, mine in steps:
            check.add(timed_rate(base, st.min_time), timed_rate(mine, st.min_time))
    return [c for c, _, _ in steps]


def sc_table(st: Settings, fl: Any) -> List[Check]:
    return _table_checks(st, fl, 0)


def sc_table_w2(st: Settings, fl: Any) -> List[Check]:
    probe_workers(fl)
    return _table_checks(st, fl, 2)


TABLE_MEM_MARK = "@@TABLEMEM@@"


def _file_pss_kib(pid: int, path: str) -> int:
    """PSS of ``pid``'s mappings of ``path`` (KiB)."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if not line[0].isupper() or line.split()[0].count("-") == 1:
                    inside = line.rstrip().endswith(path)
                elif inside and line.startswith("Pss:"):
                    total += int(line.split()[1])
    except (OSError, ValueError):
        pass
    return total


def table_mem_child(path: str) -> None:
    """Fresh process: one shuffled 2-worker epoch over the IPC file; prints
    the peak summed PSS of the process tree, and the PSS of the file's
    mappings summed over the tree at the epoch's end."""
    fl = import_ferro()
    gc.collect()
    base = TreeMemSampler()
    base.sample()
    sampler = TreeMemSampler(interval=0.05)
    sampler.start()
    try:
        ds = fl.TableDataset(path)
        loader = fl.DataLoader(ds, batch_size=4096, shuffle=True, num_workers=2)
        it = iter(loader)
        rows = 0
        file_pss = 0
        for b in it:
            rows += len(b["i0"])
            if rows >= len(ds) - 4096:
                file_pss = sum(_file_pss_kib(p, path) for p in _tree(os.getpid()))
        del it, loader
    finally:
        sampler.stop()
    result = {
        "base_pss_kib": base.peak_pss,
        "peak_pss_kib": sampler.peak_pss,
        "file_pss_kib": file_pss,
        "rows": rows,
    }
    print(TABLE_MEM_MARK + json.dumps(result), flush=True)


def _table_mem_run(path: str) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--_table-mem-child", path]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(TABLE_MEM_MARK)), None)
    if line is None:
        raise RuntimeError(f"table memory child failed:\n{proc.stderr[-3000:]}")
    out: Dict[str, Any] = json.loads(line[len(TABLE_MEM_MARK) :])
    return out


def _write_ipc(path: str, rows: int) -> None:
    pa = _pa()
    schema = make_bench_table(1, text=False).schema
    chunk = 1 << 20
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for start in range(0, rows, chunk):
            writer.write_table(make_bench_table(min(chunk, rows - start), text=False))


def sc_table_mem(st: Settings, fl: Any) -> List[Check]:
    """Workers share a memory-mapped table's pages (no copy per worker):
    the job's memory beyond the same job over a tiny file (the workers' own
    interpreters) stays near the file's size plus the batches in flight."""
    probe_workers(fl)
    import tempfile

    size = (64 if st.quick else 1024) << 20
    rows = size // 48  # 4 int64 and 4 float32 columns
    check = Check("peak tree PSS, table's share", "MiB", "file + batches in flight", target=1.1)
    check.higher_is_better = False
    with tempfile.TemporaryDirectory() as tmp:
        path, tiny = os.path.join(tmp, "table.arrow"), os.path.join(tmp, "tiny.arrow")
        _write_ipc(path, rows)
        _write_ipc(tiny, 4096 * 4)
        file_mib = os.path.getsize(path) / 2**20
        # in flight: prefetch_factor 2 x 2 workers, and the batch in use
        in_flight = 5 * 4096 * 48 / 2**20
        notes = []
        for _ in range(2 if st.quick else 1):
            small, big = _table_mem_run(tiny), _table_mem_run(path)
            share = (big["peak_pss_kib"] - small["peak_pss_kib"]) / 1024
            check.add(file_mib + in_flight, share)
            notes.append(
                f"whole job {(big['peak_pss_kib'] - big['base_pss_kib']) / 1024:.0f} MiB, "
                f"the file's mappings {big['file_pss_kib'] / 1024:.0f} MiB"
            )
        check.note = f"file {file_mib:.0f} MiB ({rows:,} rows); " + "; ".join(notes)
    return [check]


# --- peak memory of the process tree, measured in fresh child processes -----

RSS_MARK = "@@RSS@@"


def _children(pid: int) -> List[int]:
    kids: List[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
        return kids
    except OSError:
        pass
    for entry in os.listdir("/proc"):  # fallback: scan parents
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def _tree(pid: int) -> List[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def _mem_kib(pid: int) -> Tuple[int, int]:
    """(RSS, PSS) of one process in KiB; PSS falls back to RSS."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                    break
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                    break
    except (OSError, ValueError):
        pass
    return rss, pss or rss


class TreeMemSampler(threading.Thread):
    """Samples the summed RSS and PSS of this process and its descendants."""

    def __init__(self, interval: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak_rss = self.peak_pss = 0
        self.max_procs = 0
        self._stop_event = threading.Event()

    def sample(self) -> None:
        pids = _tree(os.getpid())
        mems = [_mem_kib(p) for p in pids]
        self.peak_rss = max(self.peak_rss, sum(m[0] for m in mems))
        self.peak_pss = max(self.peak_pss, sum(m[1] for m in mems))
        self.max_procs = max(self.max_procs, len(pids))

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.sample()


def rss_child(lib_name: str, quick: bool) -> None:
    """Entry of the fresh child process: run the image_w2 job once, print peaks."""
    lib: Any = tud if lib_name == "torch" else import_ferro()
    samples = image_samples()
    n = IMAGE_BATCH * (2 if quick else 16)
    gc.collect()
    base = TreeMemSampler()
    base.sample()
    result: Dict[str, Any] = {"base_rss_kib": base.peak_rss, "base_pss_kib": base.peak_pss}
    sampler = TreeMemSampler()
    sampler.start()
    try:
        loader = lib.DataLoader(CycleDataset(samples, n), batch_size=IMAGE_BATCH, num_workers=2)
        batches = 0
        for _batch in loader:
            batches += 1
        del loader
        result.update(batches=batches)
    except NotImplementedError as exc:
        result.update(not_implemented=str(exc) or "NotImplementedError")
    finally:
        sampler.stop()
    result.update(
        peak_rss_kib=sampler.peak_rss, peak_pss_kib=sampler.peak_pss, procs=sampler.max_procs
    )
    print(RSS_MARK + json.dumps(result), flush=True)


def run_marked_child(flag: str, arg: str, mark: str, quick: bool, timeout: int) -> Dict[str, Any]:
    """Runs this file as ``flag arg`` in a fresh process; the JSON it prints
    after ``mark``."""
    cmd = [sys.executable, os.path.abspath(__file__), flag, arg]
    if quick:
        cmd.append("--quick")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(mark):
            out: Dict[str, Any] = json.loads(line[len(mark) :])
            return out
    raise RuntimeError(
        f"child {flag} {arg} failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}"
    )


def run_rss_child(lib_name: str, quick: bool) -> Dict[str, Any]:
    out = run_marked_child("--_rss-child", lib_name, RSS_MARK, quick, 300)
    if "not_implemented" in out:
        raise Skip("skipped: ferroloader num_workers>0 not available: " + out["not_implemented"])
    return out


def sc_image_w2_rss(st: Settings, fl: Any) -> List[Check]:
    probe_workers(fl)
    pss = Check("peak tree PSS", "MiB", "torch", target=1.0, higher_is_better=False)
    rss = Check("peak tree RSS (sum)", "MiB", "torch", target=1.0, higher_is_better=False)
    rounds = 2
    pss.note = f"fresh process per run, {rounds} rounds; RSS sum counts shared pages twice"
    for _ in range(rounds):
        t = run_rss_child("torch", st.quick)
        f = run_rss_child("ferro", st.quick)
        pss.add(t["peak_pss_kib"] / 1024, f["peak_pss_kib"] / 1024)
        rss.add(t["peak_rss_kib"] / 1024, f["peak_rss_kib"] / 1024)
    return [pss, rss]


# --- copy-on-read: a dataset of Python strings, threads against processes -----

STRINGS_MARK = "@@STRINGS@@"


class StringsDataset:
    """Holds ``n`` Python strings (file names); a sample is one's length. A
    forked worker that reads a string writes its reference count, copying
    the page it lies on (pytorch issue 13246); a thread shares the pages."""

    def __init__(self, n: int) -> None:
        self.items = [f"/data/train/images/{i:09d}.jpg" for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> int:
        return len(self.items[i])


def strings_child(kind: str, quick: bool) -> None:
    """A fresh process: builds the strings, runs one shuffled 2-worker epoch
    with ``kind`` (torch, processes, threads), prints the dataset's PSS and
    the process tree's PSS growth during the epoch."""
    lib: Any = tud if kind == "torch" else import_ferro()
    gc.collect()
    before = TreeMemSampler()
    before.sample()
    ds = StringsDataset(200_000 if quick else 2_000_000)
    gc.collect()
    built = TreeMemSampler()
    built.sample()
    extra = {"worker_method": "thread"} if kind == "threads" else {}
    sampler = TreeMemSampler()
    sampler.start()
    try:
        loader = lib.DataLoader(ds, batch_size=256, shuffle=True, num_workers=2, **extra)
        for _batch in loader:
            pass
        del loader
    finally:
        sampler.stop()
    result = {
        "dataset_kib": built.peak_pss - before.peak_pss,
        "growth_kib": sampler.peak_pss - built.peak_pss,
        "peak_pss_kib": sampler.peak_pss,
    }
    print(STRINGS_MARK + json.dumps(result), flush=True)


def run_strings_child(kind: str, quick: bool) -> Dict[str, Any]:
    return run_marked_child("--_strings-child", kind, STRINGS_MARK, quick, 600)


def sc_strings_mem(st: Settings, fl: Any) -> List[Check]:
    """Summed PSS growth of one shuffled 2-worker epoch over a dataset of 2
    million Python strings: thread workers against the dataset's size (and
    their peak against process workers'), torch's and ferroloader's process
    workers in the note. Fresh processes, interleaved."""
    probe_workers(fl)
    growth = Check("threads: PSS growth in the epoch / the dataset's PSS", "x",
                   "the dataset", target=0.1, higher_is_better=False)
    peak = Check("threads: peak summed PSS", "MiB", "own processes", target=0.8,
                 higher_is_better=False)
    notes = []
    for _ in range(2):
        t = run_strings_child("torch", st.quick)
        p = run_strings_child("processes", st.quick)
        th = run_strings_child("threads", st.quick)
        growth.add(1.0, th["growth_kib"] / th["dataset_kib"])
        peak.add(p["peak_pss_kib"] / 1024, th["peak_pss_kib"] / 1024)
        notes.append(
            f"dataset {th['dataset_kib'] / 1024:.0f} MiB; growth: threads "
            f"{th['growth_kib'] / 1024:.1f} MiB, processes {p['growth_kib'] / 1024:.0f} MiB "
            f"({p['growth_kib'] / p['dataset_kib']:.0%}), torch "
            f"{t['growth_kib'] / 1024:.0f} MiB ({t['growth_kib'] / t['dataset_kib']:.0%})"
        )
    growth.note = "; ".join(notes)
    return [growth, peak]


# --- threads inside worker processes: worker_threads=k on JPEG decoding ------

THREADS_MARK = "@@WORKER_THREADS@@"
# (processes, threads per process): the layouts compared, each in a fresh process
WT_LAYOUTS = [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]


def worker_threads_child(arg: str, quick: bool) -> None:
    """A fresh process: one layout ``P,k,root`` over the JPEG files under
    ``root``; a warm-up epoch, epochs for at least the bench's time, then
    one with the process tree's summed PSS sampled (its peak)."""
    import peers

    p, k, root = arg.split(",", 2)
    fl = import_ferro()
    paths = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".jpg"))
    ds = peers.JpegFiles(paths)
    loader = fl.DataLoader(ds, batch_size=peers.IMAGE_BATCH, shuffle=True,
                           num_workers=int(p), worker_threads=int(k), persistent_workers=True)
    step = epoch_step(loader, float(len(ds)))
    step()
    # the rate without the memory sampler (reading every process's smaps
    # takes CPU from the workers), then an epoch sampled for its peak
    rate = timed_rate(step, 1.0 if quick else 3.0)
    sampler = TreeMemSampler()
    sampler.start()
    try:
        step()
    finally:
        sampler.stop()
    del loader, step
    print(THREADS_MARK + json.dumps({"rate": rate, "peak_pss_kib": sampler.peak_pss}),
          flush=True)


def sc_worker_threads(st: Settings, fl: Any) -> List[Check]:
    """PIL JPEG decoding (which releases the GIL) with ``worker_threads=2``
    against as many processes with one thread each, and against as many
    workers as processes (rate and the process tree's peak summed PSS).
    Fresh processes per layout, rounds interleaved."""
    import shutil

    import peers

    probe_workers(fl)
    root = peers.tempdir()
    try:
        peers.make_jpegs(root, 64 if st.quick else 256)
        runs: Dict[Tuple[int, int], List[Dict[str, Any]]] = {lay: [] for lay in WT_LAYOUTS}
        for _ in range(st.repeats):
            for p, k in WT_LAYOUTS:
                runs[(p, k)].append(run_marked_child(
                    "--_worker-threads-child", f"{p},{k},{root}", THREADS_MARK, st.quick, 600))
            PROGRESS.tick()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def rates(lay: Tuple[int, int]) -> List[float]:
        return [r["rate"] for r in runs[lay]]

    one = Check("jpeg: 1 process x 2 threads", "images/s", "1 process", target=1.2)
    one.baseline, one.ferro = rates((1, 1)), rates((1, 2))
    two = Check("jpeg: 2 processes x 2 threads", "images/s", "2 processes", target=1.0)
    two.baseline, two.ferro = rates((2, 1)), rates((2, 2))
    if (os.cpu_count() or 1) <= 2:
        two.note = "2 processes already fill this machine's cores: no gain to be had"
    same = Check("jpeg: 2 processes x 2 threads", "images/s", "4 processes (as many workers)",
                 target=0.9)
    same.baseline, same.ferro = rates((4, 1)), rates((2, 2))
    mem = Check("jpeg: peak summed PSS, 2 processes x 2 threads", "MiB",
                "4 processes (as many workers)", target=1.0, higher_is_better=False)
    mem.baseline = [r["peak_pss_kib"] / 1024 for r in runs[(4, 1)]]
    mem.ferro = [r["peak_pss_kib"] / 1024 for r in runs[(2, 2)]]
    mem.note = "1 process x 2 threads against 2 processes: " + ", ".join(
        f"{a['peak_pss_kib'] / b['peak_pss_kib']:.2f}x" for a, b in zip(runs[(1, 2)], runs[(2, 1)]))
    return [one, two, same, mem]


# --- the peers: torchdata nodes, SPDL, Grain; ferroloader's threads -----------


METHOD_MARK = "@@METHOD@@"


def method_child(arg: str, quick: bool) -> None:
    """A fresh process: ``method,job,root``: one ferroloader loader (2
    workers of ``method``) over the peers job's files under ``root``, alone
    in its process; a warm-up epoch, then its rate."""
    import peers

    method, job, root = arg.split(",", 2)
    fl = import_ferro()
    if job == "images":
        ds: Any = peers.MemmapImages(os.path.join(root, "images.npy"))
    else:
        ds = peers.JpegFiles(sorted(
            os.path.join(root, f) for f in os.listdir(root) if f.endswith(".jpg")))
    loader = fl.DataLoader(ds, batch_size=peers.IMAGE_BATCH, shuffle=True, num_workers=2,
                           persistent_workers=True, worker_method=method)
    step = epoch_step(loader, float(len(ds)))
    step()
    rate = timed_rate(step, 1.0 if quick else 3.0)
    print(METHOD_MARK + json.dumps({"rate": rate}), flush=True)


def alone_checks(st: Settings, root: str) -> List[Check]:
    """Thread workers against process workers on images and JPEG, each
    loader alone in a fresh process, rounds interleaved: in one process the
    loader whose arenas were filled last runs about 0.8x the others,
    whichever its method (measured with two loaders of one method), which
    biases the in-process rows against the later one."""
    checks = []
    for job in ("images", "jpeg"):
        c = Check(f"{job}: ferroloader threads, each loader alone", "samples/s",
                  "ferroloader processes, alone", 1.0)
        for _ in range(st.repeats):
            rates = [run_marked_child("--_method-child", f"{m},{job},{root}", METHOD_MARK,
                                      st.quick, 600)["rate"]
                     for m in ("multiprocessing", "thread")]
            c.add(rates[0], rates[1])
        checks.append(c)
    return checks


def sc_peers(st: Settings, fl: Any) -> List[Check]:
    """Records, memory-mapped images and JPEG decoding, 2 workers or threads
    each: ferroloader's thread and process workers against torch, torchdata
    ``nodes`` threads, SPDL threads and Grain processes (benches/peers.py)."""
    import shutil

    import peers

    probe_workers(fl)
    missing = {k: v for k, v in peers.peers_available().items() if v is not None}
    root = peers.tempdir()
    checks: List[Check] = []
    try:
        for job, (ds, batch) in peers.make_data(root).items():
            makers = peers.loaders(fl, tud, ds, batch)
            units = float(len(ds))

            def step(make: Callable[[], Any], units: float) -> Callable[[], float]:
                def run() -> float:
                    for _ in make():
                        pass
                    return units

                return run

            steps = {name: step(m, units) for name, m in makers.items()}
            for s in steps.values():
                s()  # starts persistent workers, warms caches and arenas
            rates: Dict[str, List[float]] = {name: [] for name in steps}
            for _ in range(st.repeats):
                for name, s in steps.items():
                    rates[name].append(timed_rate(s, st.min_time))
                PROGRESS.tick()
            pairs = [
                ("ferroloader threads", "torchdata nodes threads", 1.0),
                ("ferroloader threads", "SPDL threads", 1.0),
                ("ferroloader threads", "ferroloader processes", 1.0),
                ("ferroloader processes", "torch", 1.0),
                ("ferroloader processes", "torchdata nodes threads", 1.0),
                ("ferroloader processes", "Grain processes", 1.0),
            ]
            for mine, base, target in pairs:
                if mine not in rates or base not in rates:
                    continue
                c = Check(f"{job}: {mine}", "samples/s", base, target)
                c.baseline, c.ferro = rates[base], rates[mine]
                if job == "records" and base == "ferroloader processes":
                    c.note = "Python-bound on a GIL build: threads share one interpreter"
                checks.append(c)
            del makers, steps
            gc.collect()
        checks += alone_checks(st, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if missing and checks:
        checks[0].note = "left out: " + "; ".join(f"{k} ({v})" for k, v in missing.items())
    return checks


# --- packing: sequences into rows, against Grain's packers --------------------


def sc_packing(st: Settings, fl: Any) -> List[Check]:
    """Token sequences (geometric lengths, mean 150, at most 2048) packed
    into batches of 8 rows of 2048, in one process: ferroloader's
    ``Packing`` through a loader (ragged collate, then the packer) against
    Grain's ``FirstFitPackIterDataset`` / ``BestFitPackIterDataset`` (bins
    unshuffled), which place the same rows. Tokens per second."""
    try:
        import grain
        from grain import experimental
    except ImportError as e:
        raise Skip(f"skipped: grain is not installed ({e})") from None
    rng = np.random.default_rng(0)
    lens = np.minimum(rng.geometric(1 / 150, 2_000 if st.quick else 20_000), 2048)
    seqs = [rng.integers(0, 50_000, n).astype(np.int64) for n in lens]
    tokens = float(lens.sum())
    checks = []
    for method, cls in (("first_fit", experimental.FirstFitPackIterDataset),
                        ("best_fit", experimental.BestFitPackIterDataset)):
        packing = fl.Packing(seq_len=2048, rows=8, method=method)

        def ours(packing: Any = packing) -> float:
            loader = fl.DataLoader(seqs, batch_size=256, collate_fn=packing.collate)
            for _ in packing.wrap(loader):
                pass
            return tokens

        def theirs(cls: Any = cls) -> float:
            source = grain.MapDataset.source([{"tokens": s} for s in seqs]).to_iter_dataset()
            for _ in cls(source, length_struct={"tokens": 2048}, num_packing_bins=8,
                         shuffle_bins=False):
                pass
            return tokens

        c = Check(f"{method}, 8 x 2048 rows", "tokens/s", "Grain", 1.0)
        for _ in range(st.repeats):
            c.add(timed_rate(theirs, st.min_time), timed_rate(ours, st.min_time))
        checks.append(c)
    return checks


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------

SCENARIOS: Dict[str, Tuple[str, Callable[[Settings, Any], List[Check]]]] = {
    "int64": ("map-style Python int, batch 64, num_workers=0", sc_int64),
    "tensords": ("TensorDataset (N,32) f32 + i64, batch 256, num_workers=0", sc_tensords),
    "collate": ("default_collate of 64 dicts (2 tensors, 2 ndarrays)", sc_collate),
    "int64_w2": ("map-style Python int, batch 64, num_workers=2", sc_int64_w2),
    "dict40_w2": ("dicts of 40 small tensors, batch 16, num_workers=2", sc_dict40_w2),
    "image_w2": ("3x224x224 f32 samples, batch 32, num_workers=2", sc_image_w2),
    "image_w2_rss": ("peak memory of the process tree, image_w2 job", sc_image_w2_rss),
    "cpu_w2": ("pure-Python ~0.5 ms __getitem__, batch 32, num_workers=2", sc_cpu_w2),
    "ttfb_w2": ("time to first batch, num_workers=2, fork, spawn and forkserver", sc_ttfb_w2),
    "state_w2": ("snapshot and resume, num_workers=2", sc_state_w2),
    "seeds_w2": ("per-sample seeding, ~0.5 ms samples, num_workers=2", sc_seeds_w2),
    "shards_w2": ("dynamic vs static sharding, uneven shards, num_workers=2", sc_shards_w2),
    "scaling": ("throughput against num_workers, image and CPU-bound jobs", sc_scaling),
    "gpu": ("batches to the GPU with pin_memory, and a loop with a GPU step", sc_gpu),
    "peers": ("records, memmap images, JPEG: threads and processes against the peers", sc_peers),
    "strings_mem": ("memory of an epoch over 2M Python strings, threads vs processes",
                    sc_strings_mem),
    "worker_threads": ("JPEG decoding with threads inside worker processes (worker_threads=2)",
                       sc_worker_threads),
    "packing": ("sequences packed into 8 x 2048 rows, against Grain's packers", sc_packing),
    "table": ("TableDataset, 8 numeric + 1 string column, batch 256, nw=0", sc_table),
    "table_w2": ("TableDataset, 8 numeric + 1 string column, batch 256, nw=2", sc_table_w2),
    "table_mem": ("memory of a 2-worker job over a memory-mapped 1 GB Arrow file", sc_table_mem),
}


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


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Side-by-side bench of torch.utils.data vs ferroloader (ratios, one run)."
    )
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 7)")
    p.add_argument(
        "--scenarios",
        default="all",
        help="comma-separated subset of: " + ",".join(SCENARIOS) + " (default all)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds (smoke test)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--png",
        metavar="PATH",
        default="bench-results/scaling.png",
        help="where the scaling scenario's picture goes (default bench-results/scaling.png)",
    )
    p.add_argument("--min-time", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--_rss-child", dest="rss_child", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--_table-mem-child", dest="table_mem_child", default=None, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--_strings-child", dest="strings_child", default=None, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--_worker-threads-child", dest="worker_threads_child", default=None,
        help=argparse.SUPPRESS,
    )
    p.add_argument("--_method-child", dest="method_child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 7
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.scenarios == "all":
        args.scenarios = list(SCENARIOS)
    else:
        args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
        unknown = [s for s in args.scenarios if s not in SCENARIOS]
        if unknown:
            p.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child, args.quick)
        return 0
    if args.table_mem_child:
        table_mem_child(args.table_mem_child)
        return 0
    if args.strings_child:
        strings_child(args.strings_child, args.quick)
        return 0
    if args.worker_threads_child:
        worker_threads_child(args.worker_threads_child, args.quick)
        return 0
    if args.method_child:
        method_child(args.method_child, args.quick)
        return 0
    st = Settings(
        repeats=args.repeats,
        quick=args.quick,
        min_time=args.min_time or (0.02 if args.quick else 0.25),
    )
    fl = import_ferro()
    meta = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "ferroloader": ferro_version(fl),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "repeats": st.repeats,
        "quick": st.quick,
        "min_time_s": st.min_time,
        "argv": sys.argv[1:],
    }
    print(
        "ferroloader vs torch.utils.data, interleaved rounds (torch, ferroloader, ...); "
        f"{st.repeats} rounds, >= {st.min_time} s of work per timing"
    )
    print(
        "  "
        + ", ".join(f"{k} {meta[k]}" for k in ("python", "torch", "numpy", "ferroloader", "cpus"))
    )
    print("  ratios are the result; absolute figures are context (shared, noisy machine)")

    results: List[Scenario] = []
    crashed = False
    t_all = time.perf_counter()
    for name in args.scenarios:
        title, fn = SCENARIOS[name]
        sc = Scenario(name, title)
        t0 = time.perf_counter()
        LAST_STATS.clear()
        PROGRESS.start(name, title)
        try:
            sc.checks = fn(st, fl)
            sc.stats = LAST_STATS[0] if LAST_STATS else ""
        except Skip as exc:
            sc.status, sc.note = "skipped", str(exc)
        except NotImplementedError as exc:
            if name.endswith(("_w2", "_rss")):
                sc.status, sc.note = "skipped", str(_mw_unavailable(exc))
            else:
                crashed = True
                sc.status, sc.note = "error", traceback.format_exc()
        except Exception:
            crashed = True
            sc.status, sc.note = "error", traceback.format_exc()
        PROGRESS.stop()
        sc.seconds = time.perf_counter() - t0
        gc.collect()
        print_scenario(sc)
        results.append(sc)

    print_table(results)
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"meta": meta, "scenarios": {s.name: s.to_json() for s in results}},
                f,
                indent=2,
            )
        print(f"results written to {args.json}")
    if "scaling" in args.scenarios:
        why_not = write_scaling_png(args.png, meta)
        print(
            f"scaling picture: {why_not}" if why_not else f"scaling picture written to {args.png}"
        )
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
