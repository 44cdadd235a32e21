"""Batches to the GPU with pin_memory, and a loop with a GPU step (gpu)."""

from __future__ import annotations

import gc
import math
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.utils.data as tud

from ..datasets import IMAGE_SHAPE, CycleDataset, image_samples
from ..harness import Check, Settings, Skip, probe_workers, timed_rate

# --- the GPU: pinned batches and the training loop's clock ---------------------

GPU_BATCH = 64


def gpu_step_fn(ms: float) -> Tuple[Callable[[torch.Tensor], None], float]:
    """A GPU step of about ``ms`` milliseconds (matmuls on one stream),
    calibrated here; returns it and its measured time."""
    a = torch.randn(2048, 2048, device="cuda")

    def make(k: int) -> Callable[[torch.Tensor], None]:
        def step(batch: torch.Tensor) -> None:
            x = a
            for _ in range(k):
                x = x @ a
                x = x / x.norm()
            batch.sum()  # the step reads its batch

        return step

    def ms_per_call(f: Any, reps: int) -> float:
        f(torch.empty(1, device="cuda"))  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            f(torch.empty(1, device="cuda"))
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps * 1e3

    k = max(1, round(ms / ms_per_call(make(1), 20)))
    step = make(k)
    return step, ms_per_call(step, 10)


def sc_gpu(st: Settings, fl: Any) -> List[Check]:
    """GB/s reaching the GPU (each batch copied with non_blocking=True) with
    and without pin_memory, and steps/s of a loop with a fixed GPU step
    (the copy of the next batch on a side stream), torch and ferroloader
    side by side; images 3x224x224 f32, batch 64, persistent workers,
    prefetch_factor 4."""
    if not torch.cuda.is_available():
        raise Skip("no CUDA device here: the GPU scenario needs one")
    probe_workers(fl)
    cores = os.cpu_count() or 1
    counts = [w for w in (4, 8) if w <= cores] or [min(2, cores)]
    samples = image_samples()
    batches = 8 if st.quick else 48
    n = GPU_BATCH * batches
    gbytes = n * math.prod(IMAGE_SHAPE) * 4 / 1e9
    step, step_ms = gpu_step_fn(8.5)
    checks: List[Check] = []

    def make(lib: Any, nw: int, pin: bool) -> Any:
        return lib.DataLoader(
            CycleDataset(samples, n),
            batch_size=GPU_BATCH,
            num_workers=nw,
            pin_memory=pin,
            persistent_workers=True,
            prefetch_factor=4,
        )

    def copy_epoch(loader: Any) -> Callable[[], float]:
        def run() -> float:
            for b in loader:
                b.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            return gbytes

        return run

    copy_stream = torch.cuda.Stream()

    def train_epoch(loader: Any) -> Callable[[], float]:
        """A training loop that hides the copy as users do (timm's and
        apex's prefetchers): batch k+1 is copied on a side stream while the
        step of batch k runs; the step's stream waits for the copy."""

        def run() -> float:
            it = iter(loader)

            def fetch() -> Optional[torch.Tensor]:
                b = next(it, None)
                if b is None:
                    return None
                with torch.cuda.stream(copy_stream):
                    return b.to("cuda", non_blocking=True)

            nxt, done = fetch(), 0
            while nxt is not None:
                torch.cuda.current_stream().wait_stream(copy_stream)
                cur = nxt
                cur.record_stream(torch.cuda.current_stream())
                nxt = fetch()
                step(cur)
                done += 1
            torch.cuda.synchronize()
            return float(done)

        return run

    on_gpu = samples[0].to("cuda").expand(GPU_BATCH, *IMAGE_SHAPE).contiguous()

    def alone() -> float:
        for _ in range(batches):
            step(on_gpu)
        torch.cuda.synchronize()
        return float(batches)

    for nw in counts:
        rates: Dict[Tuple[str, bool], float] = {}
        pinned = Check(f"GB/s to the GPU, pin_memory=True, {nw} workers", "GB/s", "torch", 3.0)
        own = Check(
            f"GB/s to the GPU, {nw} workers, pin_memory=True", "GB/s", "own pin=False", 1.0
        )
        steps = Check(
            f"steps/s with a {step_ms:.1f} ms GPU step, {nw} workers, pinned",
            "steps/s",
            "the step alone",
            0.95,
        )
        loaders = {
            (name, pin): make(lib, nw, pin)
            for name, lib in (("torch", tud), ("ferroloader", fl))
            for pin in (False, True)
        }
        for loader in loaders.values():
            copy_epoch(loader)()  # starts the workers, warms the arenas
        for _ in range(st.repeats):
            for key, loader in loaders.items():
                rates[key] = timed_rate(copy_epoch(loader), st.min_time)
            pinned.add(rates[("torch", True)], rates[("ferroloader", True)])
            own.add(rates[("ferroloader", False)], rates[("ferroloader", True)])
            steps.add(
                timed_rate(alone, st.min_time),
                timed_rate(train_epoch(loaders[("ferroloader", True)]), st.min_time),
            )
        torch_steps = timed_rate(train_epoch(loaders[("torch", True)]), st.min_time)
        pinned.note = (
            f"pin_memory=False: torch {rates[('torch', False)]:.1f}, "
            f"ferroloader {rates[('ferroloader', False)]:.1f} GB/s"
        )
        steps.note = f"torch's loader, same loop: {torch_steps:.1f} steps/s"
        checks += [pinned, own, steps]
        del loaders
        gc.collect()
    return checks
