"""Thread workers against process workers (and torch) at 2 to 16 workers on
the peers jobs (benches/peers.py): ``python benches/thread_scaling.py`` on a
machine with more cores than this project's 2. Rates in samples/s, one
measurement of about 1.5 s per point."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import ferroloader
import torch.utils.data as tud

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # beside this file


def rate(loader: Any, units: int, seconds: float = 1.5) -> float:
    for _ in loader:  # starts the persistent workers
        pass
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in loader:
            pass
        n += units
    return n / (time.perf_counter() - t0)


def main() -> None:
    data = peers.make_data(peers.tempdir(), jpegs=128)
    kinds = (
        ("torch", tud, {}),
        ("processes", ferroloader, {}),
        ("threads", ferroloader, {"worker_method": "thread"}),
    )
    for job in ("images", "jpeg", "records"):
        ds, batch = data[job]
        for nw in (2, 4, 8, 16):
            row = {}
            for name, lib, kw in kinds:
                loader = lib.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=nw,
                                        persistent_workers=True, **kw)
                row[name] = rate(loader, len(ds))
                del loader
            print(f"{job} nw={nw}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in row.items())
                  + f"; threads/processes {row['threads'] / row['processes']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
