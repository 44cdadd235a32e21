"""Read-only numpy samples take the native collate, with no Python collate.

numpy exports a read-only array (a memory map opened with ``mode="r"``, a
``np.asarray`` of a PIL image, anything with ``writeable=False``) through
DLPack only as a versioned tensor (``__dlpack__(max_version=(1, 0))``); the
native stack reads it there and copies each sample once into the batch.
Whether torch's Python collate ran is seen with a profile hook on its module
(in this thread and in worker threads): the engine's collate of one process
or a worker thread, which is the code a worker process runs.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable

import ferroloader
import numpy as np
import pytest
import torch.utils.data as tud
from helpers import FERRO, TORCH, assert_same, ferro_only, time_limit

pytestmark = pytest.mark.filterwarnings(
    "ignore:The given NumPy array is not writable:UserWarning"
)

_COLLATE_PY = os.path.join("_utils", "collate.py")


def python_collate_calls(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``fn()`` and the functions of torch's collate module it called (in
    this thread and in threads started meanwhile)."""
    calls: list[str] = []

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.endswith(_COLLATE_PY):
            calls.append(frame.f_code.co_name)

    sys.setprofile(prof)
    threading.setprofile(prof)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return out, calls


class Samples(tud.Dataset):
    def __init__(self, make: Callable[[int], Any], n: int) -> None:
        self.make, self.n = make, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.make(i)


def _readonly(i: int) -> Any:
    a = np.arange(12, dtype=np.float32).reshape(3, 4) + i
    a.flags.writeable = False
    return {"x": a, "label": i}


def _image(i: int) -> Any:
    from PIL import Image

    rgb = np.full((6, 5, 3), i % 251, dtype=np.uint8)
    return np.asarray(Image.fromarray(rgb))


@pytest.fixture(scope="module")
def memmap_path(tmp_path_factory: Any) -> str:
    path = str(tmp_path_factory.mktemp("mm") / "images.npy")
    np.save(path, np.arange(10 * 3 * 4 * 4, dtype=np.uint8).reshape(10, 3, 4, 4))
    return path


def _sources(memmap_path: str) -> dict[str, Callable[[int], Any]]:
    mm = np.load(memmap_path, mmap_mode="r")
    return {"readonly": _readonly, "memmap": lambda i: mm[i], "pil": _image}


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("source", ["readonly", "memmap", "pil"])
@pytest.mark.parametrize("workers", [0, "thread"])
def test_readonly_arrays_take_the_native_collate(memmap_path, source, workers):
    make = _sources(memmap_path)[source]
    sample = make(0)
    arr = sample["x"] if isinstance(sample, dict) else sample
    assert not arr.flags.writeable, "test bug: the sample is writable"
    expected, torch_calls = python_collate_calls(
        lambda: list(TORCH.DataLoader(Samples(make, 10), batch_size=4))
    )
    assert torch_calls, "test bug: the hook does not see torch's collate"
    kw: dict[str, Any] = {}
    if workers == "thread":
        kw = dict(num_workers=2, worker_method="thread")
    got, calls = python_collate_calls(
        lambda: list(FERRO.DataLoader(Samples(make, 10), batch_size=4, **kw))
    )
    assert calls == [], f"torch's Python collate ran: {sorted(set(calls))}"
    assert_same(expected, got)


@ferro_only
@time_limit(60)
def test_readonly_arrays_with_process_workers_equal_torchs(memmap_path):
    """The same samples through process workers (the collate there is the
    one the thread test watched) give torch's batches."""
    mm_batches = []
    for lib in (TORCH, FERRO):
        mm = Samples(_sources(memmap_path)["memmap"], 10)
        ro = Samples(_readonly, 10)
        # (the memmap source is a closure: it reaches workers only by fork)
        mm_batches.append(
            [list(lib.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork"))
             for ds in (mm, ro)]
        )
    assert_same(mm_batches[0], mm_batches[1])


def test_default_collate_of_readonly_arrays_is_native():
    batch = [_readonly(i)["x"] for i in range(3)]
    out, calls = python_collate_calls(lambda: ferroloader.default_collate(batch))
    assert calls == []
    assert_same(tud.default_collate([_readonly(i)["x"] for i in range(3)]), out)
