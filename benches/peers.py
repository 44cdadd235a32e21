"""The loaders users would pick instead, on the same jobs (``scripts/bench
--scenarios peers``): torch's ``DataLoader``, torchdata's ``nodes`` with
thread workers, SPDL's thread pipeline and Grain's process ``DataLoader``,
beside ferroloader's process workers and thread workers
(``worker_method="thread"``). Two workers (or threads) each, shuffled, whole
epochs, rounds interleaved.

Jobs (the datasets are module-level so that process workers unpickle them):

- ``records``: a dict of an f32[16] row and an int label, batch 256;
- ``images``: uint8 3x224x224 rows of a memory-mapped ``.npy`` file (each
  sample a read-only view), batch 32;
- ``jpeg``: PIL decoding of 256x256 JPEG files, batch 32.

Each peer is built the way its documentation builds a map-style job: nodes
batches indices and maps fetch-and-collate over the batches with
``ParallelMapper(method="thread")`` behind a ``Prefetcher``; SPDL pipes the
batches of indices through fetch-and-collate with ``concurrency=2`` on two
threads; Grain runs ``IndexSampler`` and ``Batch`` on two worker processes
over endless epochs, one iterator kept (its batches are numpy arrays). A
peer that is not installed is left out, with a note.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

RECORDS = 8192
RECORD_BATCH = 256
IMAGES = 256
IMAGE_BATCH = 32
JPEGS = 128
JPEG_SIZE = 256


class Records:
    """Sample i: ``{"x": f32[16], "label": i}``."""

    def __init__(self, n: int = RECORDS) -> None:
        self.rows = np.random.default_rng(0).standard_normal((n, 16), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return {"x": self.rows[i], "label": int(i)}


class MemmapImages:
    """Sample i: row i of a memory-mapped uint8 (N, 3, 224, 224) file, a
    read-only view (opened lazily, so workers map it themselves)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mm: Optional[np.ndarray] = None
        self.n = int(np.load(path, mmap_mode="r").shape[0])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if self._mm is None:
            self._mm = np.load(self.path, mmap_mode="r")
        return self._mm[i]

    def __getstate__(self) -> Dict[str, Any]:
        return {"path": self.path, "_mm": None, "n": self.n}


class JpegFiles:
    """Sample i: file i decoded by PIL, as an HxWx3 uint8 array."""

    def __init__(self, paths: List[str]) -> None:
        self.paths = list(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            return np.asarray(im.convert("RGB"))


def make_jpegs(root: str, n: int = JPEGS) -> List[str]:
    """``n`` JPEG files of JPEG_SIZE squared written under ``root``: smooth
    content with some noise (a realistic size)."""
    from PIL import Image

    rng = np.random.default_rng(2)
    paths = []
    yy, xx = np.mgrid[0:JPEG_SIZE, 0:JPEG_SIZE]
    for k in range(n):
        base = ((xx * (k % 7 + 1) + yy * 3) % 256).astype(np.uint8)
        img = np.stack([base, base[::-1], base.T], axis=-1)
        img = np.clip(img + rng.integers(0, 24, img.shape), 0, 255).astype(np.uint8)
        p = os.path.join(root, f"img{k:04d}.jpg")
        Image.fromarray(img).save(p, quality=90)
        paths.append(p)
    return paths


def make_data(root: str) -> Dict[str, Any]:
    """The three jobs' datasets over files written under ``root``."""
    rng = np.random.default_rng(1)
    mm_path = os.path.join(root, "images.npy")
    mm = np.lib.format.open_memmap(mm_path, mode="w+", dtype=np.uint8,
                                   shape=(IMAGES, 3, 224, 224))
    for k in range(IMAGES):
        mm[k] = rng.integers(0, 256, (3, 224, 224), dtype=np.uint8)
    mm.flush()
    del mm
    return {
        "records": (Records(), RECORD_BATCH),
        "images": (MemmapImages(mm_path), IMAGE_BATCH),
        "jpeg": (JpegFiles(make_jpegs(root)), IMAGE_BATCH),
    }


# --- the loaders, each a function returning one epoch's iterable -------------


def torch_like(lib: Any, ds: Any, batch: int, **kw: Any) -> Callable[[], Any]:
    loader = lib.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=2,
                            persistent_workers=True, **kw)
    return lambda: loader


def _fetch_collate(ds: Any) -> Callable[[List[int]], Any]:
    from torch.utils.data import default_collate

    return lambda idx: default_collate([ds[i] for i in idx])


def nodes_threads(ds: Any, batch: int) -> Callable[[], Any]:
    import torchdata.nodes as tn
    from torch.utils.data import RandomSampler

    node = tn.SamplerWrapper(RandomSampler(ds))
    node = tn.Batcher(node, batch_size=batch, drop_last=False)
    node = tn.ParallelMapper(node, map_fn=_fetch_collate(ds), num_workers=2, method="thread",
                             in_order=True)
    node = tn.Prefetcher(node, prefetch_factor=4)
    loader = tn.Loader(node)
    return lambda: loader


def spdl_threads(ds: Any, batch: int) -> Callable[[], Any]:
    from spdl.pipeline import PipelineBuilder

    fetch = _fetch_collate(ds)

    def epoch() -> Any:
        order = torch.randperm(len(ds)).tolist()
        batches = [order[k:k + batch] for k in range(0, len(order), batch)]
        pipeline = (
            PipelineBuilder()
            .add_source(batches)
            .pipe(fetch, concurrency=2, output_order="input")
            .add_sink(4)
            .build(num_threads=2)
        )

        def run() -> Any:
            with pipeline.auto_stop():
                yield from pipeline

        return run()

    return epoch


def grain_processes(ds: Any, batch: int) -> Callable[[], Any]:
    """One Grain loader over endless shuffled epochs, its iterator kept (its
    workers start once, as persistent workers do); an epoch is the next
    ``len(ds) / batch`` batches."""
    import itertools

    import grain

    sampler = grain.samplers.IndexSampler(
        num_records=len(ds), shuffle=True, seed=0, num_epochs=None,
        shard_options=grain.sharding.NoSharding(),
    )
    loader = grain.DataLoader(data_source=ds, sampler=sampler,
                              operations=[grain.transforms.Batch(batch)], worker_count=2)
    it = iter(loader)
    per_epoch = -(-len(ds) // batch)
    return lambda: itertools.islice(it, per_epoch)


def peers_available() -> Dict[str, Optional[str]]:
    """Each peer's import problem, or ``None`` where it is installed."""
    out: Dict[str, Optional[str]] = {}
    for name, module in (("torchdata nodes", "torchdata.nodes"), ("SPDL", "spdl.pipeline"),
                         ("Grain", "grain")):
        try:
            __import__(module)
            out[name] = None
        except Exception as e:  # an absent or broken install: left out, with its reason
            out[name] = f"{type(e).__name__}: {e}"
    return out


def loaders(fl: Any, tud: Any, ds: Any, batch: int) -> Dict[str, Callable[[], Any]]:
    """Every available loader for one job, by name."""
    have = peers_available()
    out: Dict[str, Callable[[], Any]] = {
        "torch": torch_like(tud, ds, batch),
        "ferroloader processes": torch_like(fl, ds, batch),
        "ferroloader threads": torch_like(fl, ds, batch, worker_method="thread"),
    }
    if have["torchdata nodes"] is None:
        out["torchdata nodes threads"] = nodes_threads(ds, batch)
    if have["SPDL"] is None:
        out["SPDL threads"] = spdl_threads(ds, batch)
    if have["Grain"] is None:
        out["Grain processes"] = grain_processes(ds, batch)
    return out


def tempdir() -> str:
    return tempfile.mkdtemp(prefix="ferroloader-peers-")
