"""``num_workers="auto"`` against a grid of fixed layouts on six jobs
(autotune): JPEG decoding with a random crop, a pure-Python dict, I/O waits,
3 MB samples, 2 million Python strings under a RAM budget, and a training
loop with a 20 ms step; then the same strings read with a 0.2 ms wait under
the budget (g), and epochs of about 0.05 s from their third (h)."""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.utils.data as tud

from ..datasets import Repeat
from ..harness import PROGRESS, Check, Settings, probe_workers
from ..memory import _mem_kib
from .threads import StringsDataset

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class JpegCrop:
    """(a) PIL decoding and a random 224 crop (drawn from ``random``)."""

    def __init__(self, paths: List[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            a = np.asarray(im.convert("RGB"))
        y, x = random.randrange(a.shape[0] - 223), random.randrange(a.shape[1] - 223)
        return np.ascontiguousarray(a[y:y + 224, x:x + 224])


class PyDict:
    """(b) a pure-Python ``__getitem__`` building a dict (about 50 us)."""

    def __init__(self, iters: int) -> None:
        self.iters = iters

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> Dict[str, Any]:
        acc = 0
        for k in range(self.iters):
            acc = (acc * 31 + k + i) % 1000003
        return {"id": i, "value": float(acc), "tokens": [acc % 97, acc % 89, acc % 83]}


class IoWait:
    """(c) 5 ms of waiting per sample, as a remote read would."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.005)
        return torch.full((64,), i, dtype=torch.int32)


class Large:
    """(d) 3 MB float32 arrays."""

    def __init__(self) -> None:
        self.arrays = [np.full((3, 512, 512), k, dtype=np.float32) for k in range(8)]

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.arrays[i % 8])


class CpuSample:
    """(f)'s data: about 0.4 ms of pure Python per sample."""

    def __init__(self, iters: int) -> None:
        self.iters = iters

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> torch.Tensor:
        acc = 0
        for k in range(self.iters):
            acc = (acc + k * i) % 65521
        return torch.tensor([acc, i])


def _calibrate(make: Callable[[int], Any], seconds: float) -> int:
    """Iterations for which one sample takes about ``seconds``."""
    iters = 1000
    while True:
        ds = make(iters)
        t = time.perf_counter()
        for i in range(50):
            ds[i]
        per = (time.perf_counter() - t) / 50
        if per > 2e-5:
            return max(1, int(iters * seconds / per))
        iters *= 4


def _busy(seconds: float) -> None:
    """A training step that takes a core for ``seconds``."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


class Job:
    def __init__(self, name: str, ds: Any, batch: int, epoch: int, layouts: List[Tuple],
                 step: float = 0.0, ram: Optional[int] = None) -> None:
        self.name, self.ds, self.batch, self.epoch = name, ds, batch, epoch
        self.layouts, self.step, self.ram = layouts, step, ram


def _loader(lib: Any, job: Job, n: int, workers: Any, **kw: Any) -> Any:
    extra = {"persistent_workers": True} if workers != 0 else {}
    return lib.DataLoader(Repeat(job.ds, n), batch_size=job.batch, shuffle=True,
                          num_workers=workers, **extra, **kw)


def _epoch(loader: Any, step: float, waits: Optional[List[float]] = None) -> int:
    k = 0
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            return k
        if waits is not None:
            waits.append(time.perf_counter() - t)
        k += 1
        if step:
            _busy(step)


def _rate(loader: Any, job: Job, seconds: float) -> float:
    """Samples per second over whole epochs after one warm-up epoch."""
    _epoch(loader, job.step)
    done, t = 0, time.perf_counter()
    while True:
        done += _epoch(loader, job.step) * job.batch
        if time.perf_counter() - t >= seconds:
            return done / (time.perf_counter() - t)


def _fixed(fl: Any, job: Job, layout: Tuple, seconds: float) -> float:
    nw, method, k, pf = layout
    kw: Dict[str, Any] = {}
    if nw:
        kw = {"worker_method": method, "worker_threads": k, "prefetch_factor": pf}
    loader = _loader(fl, job, job.epoch, nw, **kw)
    try:
        return _rate(loader, job, seconds)
    finally:
        del loader


class _PeakWorkers:
    """Samples the summed PSS of this process's children (the workers)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.05):
            try:
                with open(f"/proc/{me}/task/{me}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                kids = []
            self.peak = max(self.peak, sum(_mem_kib(p)[1] for p in kids) * 1024)

    def __enter__(self) -> _PeakWorkers:
        if self.enabled:
            self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.enabled:
            self._t.join()


def _jobs(st: Settings, root: str) -> List[Job]:
    import peers

    q = st.quick
    peers.make_jpegs(root, 32 if q else 128)
    paths = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".jpg"))
    procs = [(n, "multiprocessing", 1, 2) for n in (0, 1, 2, 4)]
    threads = [(n, "thread", 1, 2) for n in (1, 2, 4)]
    inner = [(1, "multiprocessing", 2, 2), (2, "multiprocessing", 2, 2),
             (1, "multiprocessing", 4, 2)]
    many = [(n, m, 1, 2) for n in (8, 16, 32) for m in ("multiprocessing", "thread")]
    cpu = _calibrate(CpuSample, 4e-4)
    return [
        Job("a: JPEG decode + crop", JpegCrop(paths), 32, 256 if q else 1024,
            procs + threads + inner),
        Job("b: pure-Python dict", PyDict(_calibrate(PyDict, 5e-5)), 64,
            2048 if q else 16384, procs + threads),
        Job("c: I/O 5 ms per sample", IoWait(), 16, 256 if q else 1024,
            procs + threads + many),
        Job("d: 3 MB samples", Large(), 8, 64 if q else 512, procs + threads),
        Job("f: 20 ms training step", CpuSample(cpu), 32, 640 if q else 3200,
            procs + threads, step=0.02),
    ]


def _strings_job(st: Settings) -> Job:
    from ferroloader._machine import private_dirty as _private_dirty

    ds = StringsDataset(200_000 if st.quick else 2_000_000)
    need = _private_dirty()
    # two forked workers may each copy this process's written memory: the
    # budget holds one and a half of them
    job = Job("e: 2M strings, RAM budget", ds, 256, len(ds), [], ram=int(1.5 * need))
    job.layouts = [(0, "multiprocessing", 1, 2), (1, "multiprocessing", 1, 2),
                   (1, "thread", 1, 2), (2, "thread", 1, 2), (4, "thread", 1, 2)]
    return job


class WaitingStrings:
    """(g) (e)'s strings, each read after 0.2 ms of waiting (a remote
    lookup): threads hide the waits, and the budget rules processes out."""

    def __init__(self, items: StringsDataset) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> int:
        time.sleep(2e-4)
        return self.items[i]


def _waiting_job(strings: Job, st: Settings) -> Job:
    # (an epoch of 256 batches, 13 s in torch's main process: 32 threads
    # hold 64 batches in flight, and a shorter epoch is their warm-up)
    layouts = [(0, "multiprocessing", 1, 2), *[(n, "thread", 1, 2) for n in (8, 16, 32)]]
    return Job("g: 2M strings, 0.2 ms waits, RAM budget", WaitingStrings(strings.ds), 256,
               16384 if st.quick else 65536, layouts, ram=strings.ram)


class Images:
    """(h) 3x224x224 uint8 images from memory: an epoch of 2,000 takes
    about 0.05 s."""

    def __init__(self, n: int) -> None:
        self.a = np.random.default_rng(0).integers(0, 255, (n, 3, 224, 224), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.a)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.a[i])


def _epochs(fl: Any, ds: Any, workers: Any, epochs: int) -> float:
    """Samples per second over epochs 3 to ``epochs`` of one loader (for
    ``"auto"``, its changes printed)."""
    kw: Dict[str, Any] = {}
    if isinstance(workers, tuple):
        nw, method, k, pf = workers
        kw = {"worker_method": method, "worker_threads": k, "prefetch_factor": pf} if nw else {}
        workers = nw
    extra = {"persistent_workers": True} if workers != 0 else {}
    loader = fl.DataLoader(ds, batch_size=32, shuffle=True, num_workers=workers, **extra, **kw)
    done, t = 0, 0.0
    for e in range(epochs):
        if e == 2:
            t = time.perf_counter()
        k = _epoch(loader, 0.0)
        if e >= 2:
            done += k * 32
    rate = done / (time.perf_counter() - t)
    if workers == "auto":
        print("    " + str(loader.stats().autotune).replace("\n", "\n    "))
    del loader
    return rate


def _short_epochs(st: Settings, fl: Any) -> List[Check]:
    """(h): a grid of fixed layouts, then the best of it and ``"auto"``
    alternated, each a fresh loader of 12 epochs measured from the third."""
    ds = Images(500 if st.quick else 2000)
    epochs = 12
    grid = {lay: _epochs(fl, ds, lay, epochs) for lay in
            [(0, "multiprocessing", 1, 2), (1, "multiprocessing", 1, 2),
             (2, "multiprocessing", 1, 2), (2, "thread", 1, 2)]}
    best_layout = max(grid, key=lambda k: grid[k])
    c = Check("h: epochs of 0.05 s: auto from its third epoch", "samples/s",
              "the best fixed layout's", 0.95)
    for r in range(max(1, min(st.repeats, 5))):
        pair = [("fixed", best_layout), ("auto", "auto")]
        got = {kind: _epochs(fl, ds, spec, epochs) for kind, spec in pair[r % 2:] + pair[:r % 2]}
        c.add(got["fixed"], got["auto"])
        PROGRESS.tick()
    c.note = f"best fixed {best_layout} {grid[best_layout]:.0f}/s"
    print(f"  h: {c.note}")
    print("    grid: " + ", ".join(f"{k}: {v:.0f}" for k, v in grid.items()))
    return [c]


def _long(fl: Any, job: Job, n: int, workers: Any) -> Tuple[float, float, Any, int]:
    """One epoch of ``n`` samples on a fresh loader: its rate (from
    ``iter()`` on, warm-up included), its rate over the epoch's second half
    (steady), the loader, and the peak summed PSS of its workers."""
    kw: Dict[str, Any] = {}
    if isinstance(workers, tuple):
        nw, method, k, pf = workers
        kw = {"worker_method": method, "worker_threads": k, "prefetch_factor": pf} if nw else {}
        workers = nw
    stamps: List[float] = []
    # (reading the workers' memory takes CPU from them: only under a budget)
    with _PeakWorkers(enabled=bool(job.ram)) as peak:
        loader = _loader(fl, job, n, workers, **kw)
        t = time.perf_counter()
        for _batch in loader:
            stamps.append(time.perf_counter())
            if job.step:
                _busy(job.step)
    whole = len(stamps) * job.batch / (stamps[-1] - t)
    half = len(stamps) // 2
    steady = (len(stamps) - half - 1) * job.batch / (stamps[-1] - stamps[half])
    return whole, steady, loader, peak.peak


_POLICY = "FERROLOADER_AUTOTUNE_POLICY"


def _predictions(loader: Any, grid: Dict[Any, float]) -> Dict[Any, float]:
    """The model-based policy's prediction of each grid layout, as it
    stands after ``loader``'s epoch (corrected by what it measured); none
    where another policy ran."""
    from ferroloader.tuning.bounds import Layout

    policy = getattr(getattr(loader, "_tuner", None), "policy", None)
    if policy is None:
        return {}
    return {lay: float(policy.predict(Layout(*lay))) for lay in grid}


def bounds_of(fl: Any, job: Job) -> Any:
    return fl.Autotune(ram=job.ram) if job.ram else "auto"


def sc_autotune(st: Settings, fl: Any) -> List[Check]:
    """Per job: the best of a grid of fixed layouts (B), then ``"auto"``:
    its first epoch from nothing against B, its steady rate against B, and
    against torch's ``num_workers=0`` and ``num_workers=os.cpu_count()``;
    both against ``"auto"`` with the climbing policy it replaced."""
    probe_workers(fl)
    seconds = 0.5 if st.quick else 1.5
    checks: List[Check] = []
    with tempfile.TemporaryDirectory() as root:
        jobs = _jobs(st, root)
        jobs.insert(4, None)  # type: ignore[arg-type]  # (e), built when its turn comes
        jobs.append(None)  # type: ignore[arg-type]  # (g), on (e)'s strings
        strings: Optional[Job] = None
        for job in jobs:
            if job is None:
                job = _strings_job(st) if strings is None else _waiting_job(strings, st)
                strings = strings or job
            grid = {}
            for layout in job.layouts:
                if job.ram and layout[0] and layout[1] == "multiprocessing":
                    from ferroloader._machine import private_dirty as _private_dirty

                    if layout[0] * (_private_dirty() + (64 << 20)) > job.ram:
                        continue
                grid[layout] = _fixed(fl, job, layout, seconds)
                PROGRESS.tick()
            best_layout = max(grid, key=lambda k: grid[k])
            best = grid[best_layout]
            torch0 = _rate(_loader(tud, job, job.epoch, 0), job, seconds)
            torch_n = _rate(_loader(tud, job, job.epoch, CORES), job, seconds)
            # auto and the best fixed layout, each over one long epoch (about
            # 15 s at B) from nothing: auto's starts in the main process
            n = max(job.epoch, int(best * 15) // job.batch * job.batch)
            c = Check(f"{job.name}: auto, second half of an epoch", "samples/s",
                      "the best fixed layout's", 0.95)
            w = Check(f"{job.name}: auto, a whole epoch from nothing", "samples/s",
                      "the best fixed layout's", 0.9)
            t0 = Check(f"{job.name}: auto steady", "samples/s", "torch num_workers=0", 1.0)
            tn = Check(f"{job.name}: auto steady", "samples/s", f"torch num_workers={CORES}", 1.0)
            # the model-based policy (auto's own) against the climbing one
            # it replaced, side by side
            cs = Check(f"{job.name}: auto, second half of an epoch", "samples/s",
                       "auto with the climbing policy", 0.95)
            cw = Check(f"{job.name}: auto, a whole epoch from nothing", "samples/s",
                       "auto with the climbing policy", 0.95)
            settled, peak = [], 0
            knee: List[Dict[Any, float]] = []  # the model's prediction of each grid layout
            # rounds interleaved, which goes first rotating (the machine drifts)
            kinds = ["fixed", "auto", "climb"]
            for r in range(max(1, min(st.repeats, 3))):
                order = kinds[r % 3:] + kinds[:r % 3]
                got = {}
                for kind in order:
                    spec = best_layout if kind == "fixed" else bounds_of(fl, job)
                    saved = os.environ.pop(_POLICY, None)
                    if kind == "climb":
                        os.environ[_POLICY] = "climb"
                    try:
                        whole, steady, loader, p = _long(fl, job, n, spec)
                    finally:
                        os.environ.pop(_POLICY, None)
                        if saved is not None:
                            os.environ[_POLICY] = saved
                    got[kind] = (whole, steady)
                    if kind == "auto":
                        stats = loader.stats().autotune
                        settled.append(f"{stats.layout} after {len(stats.changes)} changes")
                        peak = max(peak, p)
                        knee.append(_predictions(loader, grid))
                    del loader
                c.add(got["fixed"][1], got["auto"][1])
                w.add(got["fixed"][0], got["auto"][0])
                cs.add(got["climb"][1], got["auto"][1])
                cw.add(got["climb"][0], got["auto"][0])
                t0.add(torch0, got["auto"][1])
                tn.add(torch_n, got["auto"][1])
            note = (f"best fixed {best_layout} {best:.0f}/s; auto settled on "
                    f"{'; '.join(settled)}; torch nw=0 {torch0:.0f}/s, nw={CORES} "
                    f"{torch_n:.0f}/s")
            c.note = note
            checks += [c, w, t0, tn, cs, cw]
            if job.ram:
                m = Check(f"{job.name}: peak summed PSS of auto's workers", "MiB", "the budget",
                          1.0, higher_is_better=False)
                m.add(job.ram / 2**20, peak / 2**20)
                checks.append(m)
            if job.step:
                fed = [lay for lay in grid if lay[0] and grid[lay] >= 0.95 * best]
                smallest = min((lay[0] * lay[2] for lay in fed), default=1)
                u = Check(f"{job.name}: auto's workers", "workers",
                          "smallest layout that feeds the loop, plus one", 1.0,
                          higher_is_better=False)
                u.add(smallest + 1, max(stats.layout.workers, 0))
                checks.append(u)
            print(f"  {job.name}: {note}")
            print("    grid: " + ", ".join(f"{k}: {v:.0f}" for k, v in grid.items()))
            # the knee against this machine: each grid layout measured, and
            # the model's prediction of it after auto's epoch (its last round)
            if knee and knee[-1]:
                print("    model / measured: " + ", ".join(
                    f"{k}: {knee[-1][k] / grid[k]:.2f}" for k in grid if k in knee[-1]))
            print("    " + str(stats).replace("\n", "\n    "))
    return checks + _short_epochs(st, fl)
