"""Time to first batch with fork, spawn and forkserver (ttfb_w2)."""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import time
from typing import Any, List

import torch.utils.data as tud

from .. import BENCHES
from ..datasets import IntDataset
from ..harness import Check, Settings, probe_workers


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
from ferrobench.datasets import IntDataset
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

    def run(lib: str) -> List[float]:
        proc = subprocess.run(
            [sys.executable, "-c", _FORKSERVER_CHILD, lib, BENCHES],
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
