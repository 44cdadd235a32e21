"""Snapshot and resume, and per-sample seeding (state_w2, seeds_w2)."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable, Dict, List, Optional

from ..datasets import CpuDataset, IntDataset, calibrate_cpu_iters
from ..harness import Check, Settings, epoch_step, loader_pair, mw_kwargs, probe_workers, timed_rate


def _first_batch_ms(make: Callable[[], Any], state: Optional[Dict[str, Any]]) -> float:
    """ms from building a loader (loading `state` into it, if given) to its
    first batch."""
    t0 = time.perf_counter()
    loader = make()
    if state is not None:
        loader.load_state_dict(state)
    it = iter(loader)
    next(it)
    ms = (time.perf_counter() - t0) * 1e3
    del it, loader
    gc.collect()
    return ms


def sc_state_w2(st: Settings, fl: Any) -> List[Check]:
    """Snapshot cost (no torch counterpart: measured against a budget and
    against ferroloader's own fresh epoch)."""
    probe_workers(fl)
    n = 4096 if st.quick else 65536
    snap = Check("state_dict() mid-epoch", "us", "1 ms budget", target=1.0)
    snap.higher_is_better = False
    snap8 = Check("state_dict() mid-epoch, 8 workers", "us", "1 ms budget", target=1.0)
    snap8.higher_is_better = False
    # the resume contract (issue 19): within 1.1x of a fresh epoch's first batch
    resume = Check("ms to first batch after load_state_dict", "ms", "fresh epoch", target=1.1)
    resume.higher_is_better = False

    def make() -> Any:
        return fl.DataLoader(IntDataset(n), batch_size=64, shuffle=True, num_workers=2)

    for _ in range(st.repeats):
        loader = make()
        it = iter(loader)
        for _ in range(n // 64 // 2):
            next(it)
        calls = 200
        t0 = time.perf_counter()
        for _ in range(calls):
            sd = loader.state_dict()
        snap.add(1000.0, (time.perf_counter() - t0) / calls * 1e6)
        del it, loader
        gc.collect()

        # 8 workers (more than this machine's cores: the snapshot does not
        # wait on any of them)
        many = fl.DataLoader(IntDataset(n), batch_size=64, shuffle=True, num_workers=8)
        it = iter(many)
        for _ in range(16):
            next(it)
        t0 = time.perf_counter()
        for _ in range(calls):
            many.state_dict()
        snap8.add(1000.0, (time.perf_counter() - t0) / calls * 1e6)
        del it, many
        gc.collect()

        # pairs in alternating order, so neither side always runs first
        # (one pair is two worker start-ups: a single one is noise)
        for k in range(3 if st.quick else 6):
            pair = [_first_batch_ms(make, None), _first_batch_ms(make, sd)]
            if k % 2:
                pair = [_first_batch_ms(make, sd), _first_batch_ms(make, None)][::-1]
            resume.add(pair[0], pair[1])
    return [snap, snap8, resume]


def sc_seeds_w2(st: Settings, fl: Any) -> List[Check]:
    """The cost of per-sample seeding (ferroloader against itself)."""
    probe_workers(fl)
    iters = calibrate_cpu_iters(0.5e-3)
    n = 128 if st.quick else 1024
    check = Check("samples/s, per_sample_seed", "samples/s", "unseeded", target=0.9)
    loader_pair(
        st,
        check,
        lambda: fl.DataLoader(CpuDataset(n, iters), batch_size=32, **mw_kwargs()),
        lambda: fl.DataLoader(
            CpuDataset(n, iters), batch_size=32, seed=0, per_sample_seed=True, **mw_kwargs()
        ),
        n,
    )
    # the absolute cost, on samples that cost nothing (nw=0)
    m = 2048 if st.quick else 16384
    plain = epoch_step(fl.DataLoader(IntDataset(m), batch_size=64), m)
    seeded = epoch_step(
        fl.DataLoader(IntDataset(m), batch_size=64, seed=0, per_sample_seed=True), m
    )
    rates = [(timed_rate(plain, st.min_time), timed_rate(seeded, st.min_time)) for _ in range(3)]
    added = statistics.median(1e6 / s - 1e6 / p for p, s in rates)
    check.note = f"adds {added:.1f} us per sample (median, Python-int dataset, nw=0)"
    return [check]
