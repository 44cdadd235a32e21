"""Records: Python ints, TensorDataset, collate, dicts of small tensors and
CPU-bound samples, with num_workers=0 and 2 (int64, tensords, collate,
int64_w2, dict40_w2, cpu_w2)."""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import torch
import torch.utils.data as tud

from ..datasets import CpuDataset, CycleDataset, IntDataset, calibrate_cpu_iters
from ..harness import (
    Check,
    Settings,
    check_same,
    epoch_step,
    loader_pair,
    mw_kwargs,
    probe_workers,
    timed_rate,
)

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
