"""Thread workers: the peers (torchdata nodes, SPDL, Grain), the memory of an
epoch over Python strings, and threads inside worker processes (peers,
strings_mem, worker_threads)."""

from __future__ import annotations

import gc
import json
import os
from typing import Any, Callable, Dict, List, Tuple

import torch.utils.data as tud

from ..harness import PROGRESS, Check, Settings, epoch_step, import_ferro, probe_workers, timed_rate
from ..memory import TreeMemSampler, run_marked_child

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
