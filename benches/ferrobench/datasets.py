"""The datasets the scenarios share, and their sizes. Module-level classes so
that spawned workers can unpickle them."""

from __future__ import annotations

import math
import time
from typing import Any, List, Sequence

import torch

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


class Repeat:
    """``n`` samples over a base dataset (sample i is ``base[i % len]``):
    the epoch's length without more data."""

    def __init__(self, base: Any, n: int) -> None:
        self.base, self.n = base, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.base[i % len(self.base)]


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


def calibrate_cpu_iters(seconds: float) -> int:
    ds = CpuDataset(1, 20000)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        ds[0]
        best = min(best, time.perf_counter() - t0)
    return max(1, round(20000 * seconds / best))


IMAGE_SHAPE = (3, 224, 224)


IMAGE_BATCH = 32


def image_samples() -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(IMAGE_SHAPE, generator=gen) for _ in range(4)]
