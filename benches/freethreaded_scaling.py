"""Thread workers at 1 and 2 threads, on the interpreter that runs this file:
``python benches/freethreaded_scaling.py`` with the GIL build (.venv) and
with free-threaded CPython 3.14t (scripts/freethreaded builds one and runs
this). Two datasets whose ``__getitem__`` holds the interpreter: ``pure``
does Python arithmetic, ``numpy`` small numpy operations (too small for
numpy to release the GIL). With the GIL, 2 threads can do no more Python
work than 1; without it they can, up to the machine's cores (2 here) less
what the main thread's ``next()`` needs. Prints samples/s per point and
the 2-thread/1-thread ratio; one timed run of about ``--seconds`` each.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from typing import Any

import ferroloader
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from thread_scaling import rate  # beside this file


class PureDataset:
    """Python arithmetic per sample, then 16 float32s and a label."""

    def __init__(self, n: int, work: int) -> None:
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        acc = [0.0] * 16
        x = float(i)
        for k in range(self.work):
            x = (x * 1.000001 + k) % 1000.0
            acc[k & 15] += x
        return {"x": np.asarray(acc, dtype=np.float32), "y": i % 10}


class NumpyDataset:
    """Small numpy operations per sample (each holds the interpreter)."""

    def __init__(self, n: int, work: int) -> None:
        self.n, self.work = n, work
        self.base = np.linspace(0.0, 1.0, 64, dtype=np.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        v = self.base + np.float32(i)
        for _ in range(self.work // 100):
            v = np.sin(v) * np.float32(0.5) + v.mean()
        return {"x": v[:16].copy(), "y": i % 10}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2048, help="dataset length")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--work", type=int, default=2000, help="loop steps per sample")
    p.add_argument("--seconds", type=float, default=2.0, help="timed run per point")
    args = p.parse_args()

    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    ft = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    print(
        f"python {sys.version.split()[0]} free-threaded build={ft} GIL enabled={gil} "
        f"ferroloader {ferroloader.__file__}",
        flush=True,
    )
    for name, cls in (("pure", PureDataset), ("numpy", NumpyDataset)):
        ds = cls(args.samples, args.work)
        rates = {}
        for nw in (1, 2):
            loader = ferroloader.DataLoader(
                ds,
                batch_size=args.batch_size,
                num_workers=nw,
                worker_method="thread",
                persistent_workers=True,
            )
            rates[nw] = rate(loader, len(ds), args.seconds)
            del loader
            print(f"  {name:5s} threads={nw}: {rates[nw]:10,.0f} samples/s", flush=True)
        print(f"  {name:5s} 2/1 threads: {rates[2] / rates[1]:.2f}x", flush=True)
    # Still the same after the run: an extension that asks for the GIL
    # would have turned it back on at import.
    print(f"GIL enabled at the end: {getattr(sys, '_is_gil_enabled', lambda: True)()}")


if __name__ == "__main__":
    main()
