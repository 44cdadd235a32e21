"""The loaders users would pick instead, on the same jobs (``scripts/bench
--scenarios peers``): torch's ``DataLoader``, torchdata's ``nodes`` with
thread and with process workers, SPDL's thread pipeline and Grain's process
``DataLoader``, beside ferroloader's process workers, thread workers
(``worker_method="thread"``) and ``num_workers="auto"``. Two workers (or
threads) each, shuffled, rounds interleaved; each loader runs alone in a
fresh process (``benches/ferrobench/scenarios/threads.py``), since in one
process a peer's workers go on filling their buffers while another loader
is timed (Grain's do) and the arenas filled last run slower.

Jobs (the datasets are module-level so that process workers unpickle them):

- ``records``: a dict of an f32[16] row and an int label, batch 256;
- ``images``: uint8 3x224x224 rows of a memory-mapped ``.npy`` file (each
  sample a read-only view), batch 32;
- ``jpeg``: PIL decoding of 256x256 JPEG files, batch 32;
- ``vision_pil``: an ImageNet training pipeline: PIL decode, then
  torchvision's v2 ``RandomResizedCrop(224)``, ``RandomHorizontalFlip``,
  ``ToImage``, ``ToDtype(float32, scale=True)``, ``Normalize``, batch 32;
- ``vision_decode``: the same transforms after
  ``torchvision.io.decode_jpeg`` of the bytes the dataset reads, batch 32.

Each peer is built the way its documentation builds a map-style job: nodes
batches indices and maps fetch-and-collate over the batches with
``ParallelMapper`` (``method="thread"`` or ``"process"``, the processes from
a fork server) behind a ``Prefetcher``, over endless epochs, one iterator
kept (its workers start once); SPDL pipes the batches of indices through fetch-and-collate
with ``concurrency=2`` on two threads; Grain runs ``IndexSampler`` and
``Batch`` on two worker processes over endless epochs, one iterator kept
(its batches are numpy arrays). A peer that is not installed is left out,
with a note.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import default_collate

RECORDS = 8192
RECORD_BATCH = 256
IMAGES = 256
IMAGE_BATCH = 32
JPEGS = 512
JPEG_SIZE = 256
# ImageNet's channel statistics, as every torchvision training recipe uses
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


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


def _v2(decoded: bool) -> Any:
    """The training transforms of torchvision's reference recipe (v2)."""
    from torchvision.transforms import v2

    head = [] if decoded else [v2.ToImage()]
    return v2.Compose([
        v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(), *head,
        v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD),
    ])


class _Vision:
    """Sample i: file i decoded (``_decode``), through the v2 training
    transforms: a float32 3x224x224 tensor."""

    decoded = False  # whether _decode gives a tensor (else a PIL image)

    def __init__(self, paths: List[str]) -> None:
        self.paths = list(paths)
        self.transform = _v2(self.decoded)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        out: torch.Tensor = self.transform(self._decode(self.paths[i]))
        return out

    def _decode(self, path: str) -> Any:
        raise NotImplementedError


class VisionPil(_Vision):
    """PIL decoding, then the v2 transforms."""

    def _decode(self, path: str) -> Any:
        from PIL import Image

        with Image.open(path) as im:
            return im.convert("RGB")


class VisionDecode(_Vision):
    """``torchvision.io.decode_jpeg`` of the file's bytes, then the v2
    transforms."""

    decoded = True

    def _decode(self, path: str) -> Any:
        from torchvision.io import decode_jpeg

        with open(path, "rb") as f:
            data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        return decode_jpeg(data)


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


JOBS = ("records", "images", "jpeg", "vision_pil", "vision_decode")


def make_files(root: str, jpegs: int = JPEGS) -> None:
    """The jobs' files under ``root``: the images' ``.npy`` and the JPEGs."""
    rng = np.random.default_rng(1)
    mm = np.lib.format.open_memmap(os.path.join(root, "images.npy"), mode="w+",
                                   dtype=np.uint8, shape=(IMAGES, 3, 224, 224))
    for k in range(IMAGES):
        mm[k] = rng.integers(0, 256, (3, 224, 224), dtype=np.uint8)
    mm.flush()
    del mm
    make_jpegs(root, jpegs)


def job_missing(job: str) -> Optional[str]:
    """Why a job cannot run here (torchvision absent), or ``None``."""
    if job.startswith("vision"):
        try:
            import torchvision.io
            import torchvision.transforms.v2  # noqa: F401
        except Exception as e:  # absent or broken: the job is left out, with its reason
            return f"torchvision: {type(e).__name__}: {e}"
    return None


def open_job(root: str, job: str) -> Tuple[Any, int]:
    """A job's dataset over the files ``make_files`` wrote, and its batch."""
    if job == "records":
        return Records(), RECORD_BATCH
    if job == "images":
        return MemmapImages(os.path.join(root, "images.npy")), IMAGE_BATCH
    paths = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".jpg"))
    kinds = {"jpeg": JpegFiles, "vision_pil": VisionPil, "vision_decode": VisionDecode}
    return kinds[job](paths), IMAGE_BATCH


def make_data(root: str, jobs: Tuple[str, ...] = ("records", "images", "jpeg"),
              jpegs: int = JPEGS) -> Dict[str, Tuple[Any, int]]:
    """Writes the files under ``root`` and opens ``jobs``: name to
    (dataset, batch)."""
    make_files(root, jpegs)
    return {job: open_job(root, job) for job in jobs}


# --- the loaders, each a function returning one epoch's iterable -------------


def torch_like(lib: Any, ds: Any, batch: int, **kw: Any) -> Callable[[], Any]:
    loader = lib.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=2,
                            persistent_workers=True, **kw)
    return lambda: loader


class FetchCollate:
    """Fetch a batch's samples and collate them (a class, so that process
    workers unpickle it)."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __call__(self, idx: List[int]) -> Any:
        return default_collate([self.ds[i] for i in idx])


def nodes_workers(ds: Any, batch: int, method: str = "thread") -> Callable[[], Any]:
    """torchdata nodes over endless shuffled epochs, one iterator kept (its
    workers start once, as persistent workers do: a ``Loader`` started again
    starts its workers again); an epoch is the next ``len(ds) / batch``
    batches."""
    import itertools

    import torchdata.nodes as tn
    from torch.utils.data import RandomSampler

    # (without replacement past len(ds): one permutation after another)
    node = tn.SamplerWrapper(RandomSampler(ds, num_samples=len(ds) * 10**6))
    node = tn.Batcher(node, batch_size=batch, drop_last=False)
    # (processes from a fork server: forked from this process, whose
    # threads hold locks, a worker can hang)
    context = "forkserver" if method == "process" else None
    node = tn.ParallelMapper(node, map_fn=FetchCollate(ds), num_workers=2, method=method,
                             in_order=True, multiprocessing_context=context)
    node = tn.Prefetcher(node, prefetch_factor=4)
    it = iter(tn.Loader(node))
    per_epoch = -(-len(ds) // batch)
    return lambda: itertools.islice(it, per_epoch)


def spdl_threads(ds: Any, batch: int) -> Callable[[], Any]:
    from spdl.pipeline import PipelineBuilder

    fetch = FetchCollate(ds)

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


LOADERS = ("torch", "ferroloader processes", "ferroloader threads", "ferroloader auto",
           "torchdata nodes threads", "torchdata nodes processes", "SPDL threads",
           "Grain processes")
_NEEDS = {"torchdata nodes threads": "torchdata nodes",
          "torchdata nodes processes": "torchdata nodes", "SPDL threads": "SPDL",
          "Grain processes": "Grain"}


def available(have: Dict[str, Optional[str]]) -> List[str]:
    """The loaders whose library is installed (``have``: peers_available())."""
    return [n for n in LOADERS if n not in _NEEDS or have[_NEEDS[n]] is None]


# ferroloader's loaders: their arguments beyond the job's
FERRO_KW: Dict[str, Dict[str, Any]] = {
    "ferroloader processes": {"num_workers": 2},
    "ferroloader threads": {"num_workers": 2, "worker_method": "thread"},
    "ferroloader auto": {"num_workers": "auto"},
}


def loader(name: str, fl: Any, tud: Any, ds: Any, batch: int) -> Callable[[], Any]:
    """One loader by name: a function returning one epoch's iterable."""
    if name == "torch":
        return torch_like(tud, ds, batch)
    if name in FERRO_KW:
        ours = fl.DataLoader(ds, batch_size=batch, shuffle=True, persistent_workers=True,
                             **FERRO_KW[name])
        return lambda: ours
    if name == "torchdata nodes threads":
        return nodes_workers(ds, batch, "thread")
    if name == "torchdata nodes processes":
        return nodes_workers(ds, batch, "process")
    if name == "SPDL threads":
        return spdl_threads(ds, batch)
    if name == "Grain processes":
        return grain_processes(ds, batch)
    raise ValueError(f"no loader {name!r}: one of {LOADERS}")


def tempdir() -> str:
    return tempfile.mkdtemp(prefix="ferroloader-peers-")
