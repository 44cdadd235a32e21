"""Datasets of the Ray tests (tests/test_ray.py): a module the cluster's
actors import (the tests put this folder on the cluster's PYTHONPATH)."""

from __future__ import annotations

import random
import time
from typing import Any, Iterator

import torch


class Drawn(torch.utils.data.Dataset):
    """Item ``i`` with a draw from each global generator (seeded per sample
    with ``per_sample_seed=True``); ``delay`` seconds per item."""

    def __init__(self, n: int = 40, delay: float = 0.0) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.delay:
            time.sleep(self.delay)
        return {"i": i, "x": torch.tensor([i, 2 * i], dtype=torch.float32),
                "r": random.randrange(1000), "t": int(torch.randint(1000, ()))}


def failing_init(worker_id: int) -> None:
    raise ValueError(f"worker_init_fn of worker {worker_id} refuses")


class Stream(torch.utils.data.IterableDataset):
    """A plain iterable (its replica lives in the worker)."""

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info is not None else (0, 1)
        yield from range(k, 30, n)


class WhoAmI(torch.utils.data.Dataset):
    """Item ``i`` with what ``get_worker_info()`` says in the worker and
    what ``worker_init_fn`` (``mark``) set there."""

    def __init__(self, n: int = 24) -> None:
        self.n = n
        self.mark = -1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int, int, int, int]:
        info = torch.utils.data.get_worker_info()
        return (i, info.id, info.num_workers, info.seed, info.dataset.mark)


def mark(worker_id: int) -> None:
    torch.utils.data.get_worker_info().dataset.mark = 100 + worker_id


class Sequences(torch.utils.data.Dataset):
    """Token id sequences of lengths 1 ... 90."""

    def __len__(self) -> int:
        return 60

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.arange(1 + (i * 37) % 90)


class ExitsAt(Drawn):
    """``Drawn``, whose process ends (``os._exit(3)``) at item ``at``."""

    def __init__(self, n: int = 40, at: int = 5) -> None:
        super().__init__(n)
        self.at = at

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == self.at:
            import os

            os._exit(3)
        return super().__getitem__(i)
