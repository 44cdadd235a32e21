"""Thread workers: the peers (torchdata nodes, SPDL, Grain), the memory of an
epoch over Python strings, and threads inside worker processes (peers,
strings_mem, worker_threads)."""

from __future__ import annotations

import gc
import json
import os
import time
from typing import Any, Dict, List, Tuple

import torch.utils.data as tud

from ..datasets import Repeat
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


PEER_MARK = "@@PEER@@"
# the whole epoch from nothing: this many samples (the JPEGs repeated), so
# that the epoch lasts seconds, as a real one does
FIRST_EPOCH = 4096


def peer_child(arg: str, quick: bool) -> None:
    """A fresh process: ``mode|loader|job|root``. ``steady``: the loader
    (``peers.loader``) alone in its process, a warm-up epoch, then its rate
    over whole epochs. ``first``: a new ferroloader loader's first epoch of
    ``FIRST_EPOCH`` samples, timed from ``iter()`` to its last batch (worker
    start and tuning included)."""
    import peers

    mode, name, job, root = arg.split("|", 3)
    fl = import_ferro()
    ds, batch = peers.open_job(root, job)
    if mode == "first":
        ds = Repeat(ds, 512 if quick else FIRST_EPOCH)
        loader = fl.DataLoader(ds, batch_size=batch, shuffle=True, **peers.FERRO_KW[name])
        t = time.perf_counter()
        for _batch in loader:
            pass
        rate = len(ds) / (time.perf_counter() - t)
    else:
        make = peers.loader(name, fl, tud, ds, batch)
        units = float(len(ds))

        def step() -> float:
            for _batch in make():
                pass
            return units

        step()  # starts persistent workers, warms caches and arenas
        rate = timed_rate(step, 0.3 if quick else 1.5)
    print(PEER_MARK + json.dumps({"rate": rate}), flush=True)


def _best(rates: Dict[str, List[float]], names: Tuple[str, ...], k: int) -> float:
    """Round ``k``'s best of the layouts ``names`` (those that ran)."""
    return max(rates[n][k] for n in names if n in rates)


# each library's layouts: a library is judged by its best
_FERRO = ("ferroloader processes", "ferroloader threads")
_PEERS = {"torch": ("torch",),
          "torchdata nodes": ("torchdata nodes threads", "torchdata nodes processes"),
          "SPDL": ("SPDL threads",), "Grain": ("Grain processes",)}
_BEST_FIXED = "ferroloader's best fixed layout"


def _job_checks(job: str, rates: Dict[str, List[float]], rounds: int) -> List[Check]:
    """A job's rows: ferroloader's best layout against each library's best,
    threads against torchdata's threads, processes against torch, and
    ``"auto"`` against ferroloader's best fixed layout."""
    checks = []
    for peer, names in _PEERS.items():
        ran = tuple(n for n in names if n in rates)
        if not ran:
            continue
        c = Check(f"{job}: ferroloader's best layout", "samples/s", f"{peer}'s best", 1.0)
        for k in range(rounds):
            c.add(_best(rates, ran, k), _best(rates, _FERRO, k))
        if len(ran) > 1:
            c.note = "each round's best of " + " and ".join(ran)
        checks.append(c)
    pairs = [("ferroloader threads", "torchdata nodes threads", 1.0),
             ("ferroloader processes", "torch", 1.0),
             ("ferroloader auto", _BEST_FIXED, 0.95)]
    for mine, base, target in pairs:
        if mine not in rates or (base != _BEST_FIXED and base not in rates):
            continue
        c = Check(f"{job}: {mine}", "samples/s", base, target)
        for k in range(rounds):
            c.add(_best(rates, _FERRO, k) if base == _BEST_FIXED else rates[base][k],
                  rates[mine][k])
        if mine == "ferroloader auto":
            c.note = "from its second epoch on; processes / threads: " + ", ".join(
                f"{p / t:.2f}" for p, t in zip(rates[_FERRO[0]], rates[_FERRO[1]]))
        checks.append(c)
    return checks


def sc_peers(st: Settings, fl: Any) -> List[Check]:
    """Records, memory-mapped images, JPEG decoding and two torchvision
    training pipelines, 2 workers or threads each: ferroloader's process
    and thread workers and ``"auto"`` against torch, torchdata ``nodes``
    (threads, processes), SPDL threads and Grain processes
    (benches/peers.py), each loader alone in a fresh process, rounds
    interleaved; and on JPEG, ``"auto"``'s first epoch from nothing against
    the fixed layouts'."""
    import shutil

    import peers

    probe_workers(fl)
    have = peers.peers_available()
    missing = {k: v for k, v in have.items() if v is not None}
    names = peers.available(have)
    jobs = [j for j in peers.JOBS if peers.job_missing(j) is None]
    missing.update({j: str(peers.job_missing(j)) for j in peers.JOBS if j not in jobs})
    # (a fresh process per loader and round: minutes a round; 3 rounds,
    # one in a --quick pass)
    rounds = 1 if st.quick else min(st.repeats, 3)
    root = peers.tempdir()
    checks: List[Check] = []
    try:
        peers.make_files(root, 64 if st.quick else peers.JPEGS)
        rates: Dict[str, Dict[str, List[float]]] = {j: {n: [] for n in names} for j in jobs}
        first = ("ferroloader processes", "ferroloader threads", "ferroloader auto")
        firsts: Dict[str, List[float]] = {n: [] for n in first}

        def child(mode: str, name: str, job: str) -> float:
            out = run_marked_child("--_peer-child", f"{mode}|{name}|{job}|{root}", PEER_MARK,
                                   st.quick, 600)
            return float(out["rate"])

        for _ in range(rounds):
            for job in jobs:
                for name in names:
                    rates[job][name].append(child("steady", name, job))
            for name in first:
                firsts[name].append(child("first", name, "jpeg"))
            PROGRESS.tick()
        for job in jobs:
            checks += _job_checks(job, rates[job], rounds)
        c = Check("jpeg: ferroloader auto, a whole epoch from nothing", "samples/s",
                  _BEST_FIXED + ", the same", 0.95)
        for k in range(rounds):
            c.add(_best(firsts, _FERRO, k), firsts["ferroloader auto"][k])
        c.note = f"{FIRST_EPOCH} samples on a new loader: worker start and tuning included"
        checks.append(c)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if missing and checks:
        checks[0].note = "left out: " + "; ".join(f"{k} ({v})" for k, v in missing.items())
    return checks
