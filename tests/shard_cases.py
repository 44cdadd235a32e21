"""Sharded datasets and the per-rank entry of the distributed sharding test.

At module level so they pickle by reference into workers and spawned ranks.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any, Iterator, Optional

import ferroloader as fl
import numpy as np
import torch

# Uneven shard sizes (one empty, one large): items of shard s are
# 1000 * s + offset.
LENS = [7, 1, 23, 3, 0, 5, 9, 2, 12, 4, 6, 1, 8]


def all_items(lens: list[int] = LENS) -> list[int]:
    return sorted(1000 * s + o for s, n in enumerate(lens) for o in range(n))


class Counted(fl.ShardedDataset):
    """Shard ``s`` holds ``lens[s]`` ints; ``known``: whether it says so."""

    def __init__(self, lens: list[int] = LENS, known: bool = True, delay: float = 0.0) -> None:
        self.lens = list(lens)
        self.known = known
        self.delay = delay

    def shards(self) -> list[int]:
        return list(range(len(self.lens)))

    def iter_shard(self, shard: int, start: int = 0) -> Iterator[int]:
        for o in range(start, self.lens[shard]):
            if self.delay:
                time.sleep(self.delay)
            yield 1000 * shard + o

    def shard_len(self, shard: int) -> Optional[int]:
        return self.lens[shard] if self.known else None


class Draws(Counted):
    """Items carry draws from torch, random and numpy made as they are read."""

    def iter_shard(self, shard: int, start: int = 0) -> Iterator[Any]:
        for o in range(start, self.lens[shard]):
            yield (
                1000 * shard + o,
                float(torch.rand(())),
                random.random(),
                float(np.random.rand()),
            )


def read_tar(path: str, start: int = 0) -> Iterator[dict[str, bytes]]:
    """A webdataset tar shard's samples (members ``key.ext`` grouped by
    key), from sample ``start`` on: the README's example reader."""
    import tarfile

    with tarfile.open(path) as tar:
        sample: dict[str, bytes] = {}
        key, n = None, 0
        for m in tar:
            k, ext = m.name.split(".", 1)
            if key is not None and k != key:
                if n >= start:
                    yield sample
                n, sample = n + 1, {}
            f = tar.extractfile(m)
            assert f is not None
            key, sample[ext] = k, f.read()
        if sample and n >= start:
            yield sample


def write_tar_shards(folder: str, sizes: list[int]) -> list[str]:
    """Tar shards in webdataset layout: sample ``i`` of shard ``s`` has
    members ``s-i.txt`` (its id) and ``s-i.cls`` (a label)."""
    import io
    import tarfile

    paths = []
    for s, n in enumerate(sizes):
        path = os.path.join(folder, f"shard-{s:03d}.tar")
        with tarfile.open(path, "w") as tar:
            for i in range(n):
                for ext, data in (("txt", f"{s}-{i}"), ("cls", str(i % 3))):
                    info = tarfile.TarInfo(f"{s}-{i}.{ext}")
                    raw = data.encode()
                    info.size = len(raw)
                    tar.addfile(info, io.BytesIO(raw))
        paths.append(path)
    return paths


def decode_samples(batch: list[dict[str, bytes]]) -> dict[str, Any]:
    return {
        "id": [s["txt"].decode() for s in batch],
        "label": torch.tensor([int(s["cls"]) for s in batch]),
    }


def flat(batches: list[Any]) -> list[int]:
    """The items of a list of batches (tensors of ints) as ints."""
    out: list[int] = []
    for b in batches:
        out.extend(int(x) for x in b)
    return out


def run_configs(configs: list[dict[str, Any]], epochs: int = 2) -> list[list[list[list[int]]]]:
    """Runs each loader config for ``epochs``; per config, per epoch, the
    batches as lists of ints."""
    out = []
    for c in configs:
        c = dict(c)
        ds = Counted(known=c.pop("known", True))
        mode = c.pop("mode")
        even = c.pop("even")
        loader = fl.DataLoader(
            ds, batch_size=3, shuffle=True, seed=7, sharding=fl.Sharding(mode=mode, even=even), **c
        )
        out.append([[[int(x) for x in b] for b in loader] for _ in range(epochs)])
    return out


def gloo_rank(
    rank: int, world: int, port: int, out_dir: str, configs: list[dict[str, Any]]
) -> None:
    """One rank of the distributed test: ranks come from torch.distributed
    (gloo over loopback); the results go to ``out_dir/rank<r>.json``."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        results = run_configs(configs)
        # the loader never joins a collective; this barrier is the test's own
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def write_int_shards(folder: str, lens: list[int]) -> list[str]:
    """Shard files of int64 items: shard ``s`` holds ``1000 * s + o`` for
    ``o`` in ``range(lens[s])``; their paths."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for s, n in enumerate(lens):
        p = os.path.join(folder, f"shard-{s:03d}.bin")
        (1000 * s + np.arange(n, dtype=np.int64)).tofile(p)
        paths.append(p)
    return paths


def ranges(lens: list[int], world: int, block: int) -> int:
    """The works the queue's list cuts ``lens`` into (the sharding page's
    rule): ranges of a 64th of a rank's share, at least 8 items, whole
    blocks (or the block shrunk to the range)."""
    unit = max(-(-sum(lens) // (64 * world)), 8)
    if unit >= block:
        unit = -(-unit // block) * block
    return sum(max(1, -(-n // unit)) for n in lens)
