"""Images: 3x224x224 f32 samples with 2 workers, their memory, and the
throughput against num_workers with its picture (image_w2, image_w2_rss,
scaling)."""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch.utils.data as tud

from ..datasets import (
    IMAGE_BATCH,
    IMAGE_SHAPE,
    CpuDataset,
    CycleDataset,
    calibrate_cpu_iters,
    image_samples,
)
from ..harness import (
    PROGRESS,
    Check,
    Settings,
    Skip,
    epoch_step,
    fmt_num,
    import_ferro,
    loader_pair,
    mw_kwargs,
    probe_workers,
    timed_rate,
)
from ..memory import TreeMemSampler, run_marked_child


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


# --- peak memory of the process tree, measured in fresh child processes -----

RSS_MARK = "@@RSS@@"


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
