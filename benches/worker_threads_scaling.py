"""Threads inside worker processes (``worker_threads=k``) against process
workers alone, on PIL JPEG decoding (benches/peers.py's JPEG job, 256 files):
``python benches/worker_threads_scaling.py [P,k ...]`` on a machine with
more cores than this project's 2. For each layout, the rate (images/s, about
2 s after a warm-up epoch) and the process tree's peak summed PSS over one
more epoch; each layout in a fresh loader, one after another."""

from __future__ import annotations

import os
import sys
import time

import ferroloader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # beside this file
from ferrobench.memory import TreeMemSampler

DEFAULT = ["1,1", "1,2", "2,1", "2,2", "4,1", "4,2", "4,4", "8,1", "8,2", "16,1"]


def measure(ds: peers.JpegFiles, p: int, k: int) -> tuple[float, float]:
    loader = ferroloader.DataLoader(ds, batch_size=peers.IMAGE_BATCH, shuffle=True,
                                    num_workers=p, worker_threads=k, persistent_workers=True)
    for _ in loader:  # starts the workers
        pass
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 2.0:
        for _ in loader:
            pass
        n += len(ds)
    rate = n / (time.perf_counter() - t0)
    sampler = TreeMemSampler()
    sampler.start()
    try:
        for _ in loader:
            pass
    finally:
        sampler.stop()
    del loader
    return rate, sampler.peak_pss / 1024


def main() -> None:
    layouts = [tuple(int(x) for x in a.split(",")) for a in (sys.argv[1:] or DEFAULT)]
    ds = peers.JpegFiles(peers.make_jpegs(peers.tempdir(), 256))
    print(f"{os.cpu_count()} cores; PIL JPEG decoding 256x256, batch {peers.IMAGE_BATCH}")
    for p, k in layouts:
        rate, pss = measure(ds, p, k)
        print(f"{p} processes x {k} threads ({p * k} workers): {rate:,.0f} images/s, "
              f"peak summed PSS {pss:,.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
