"""Determinism control: ``DataLoader(seed=S)`` and ``per_sample_seed=True``.

The seeds are fixed functions of plain integers, so they are the same in
every process, for every ``num_workers``, and after a resume:

- ``epoch_seed(S, epoch)`` seeds the loader's private generator at the start
  of each epoch (0-based): it decides the shuffle order and the workers'
  base seed, and nothing else draws from it.
- ``sample_seed(S, epoch, index)`` seeds torch's CPU generator, ``random``
  and ``numpy`` right before ``dataset[index]`` when ``per_sample_seed=True``
  (in a worker thread: the thread's own three, ``get_worker_info().rng``);
  for item ``offset`` of shard ``s`` of a sharded dataset, ``index`` is
  ``shard_item_index(s, offset) = s * 2**40 + offset``.
- A sharded epoch's shard order is ``torch.randperm(n_shards,
  generator=torch.Generator().manual_seed(shard_order_seed(root)))`` and
  block ``b`` of shard ``s`` is read in the order of ``torch.randperm(len,
  generator=...manual_seed(block_seed(root, s, b)))``, where ``root`` is
  ``epoch_seed(S, epoch)`` (``S`` is 0 when the loader has no ``seed=``).

Both mix their inputs with SplitMix64's finaliser (Steele, Lea and Flood,
2014) and keep 63 bits, a valid seed for all three generators (``numpy``
takes the low 32 bits).
"""

from __future__ import annotations

import operator
import random
import zlib
from typing import Any, Optional

import torch
import torch.utils.data as _tud

from ferroloader import _core
from ferroloader.worker import worker_local

_MASK = (1 << 64) - 1


def _as_int(index: Any) -> int:
    try:
        return operator.index(index)
    except TypeError:
        # keys that are not integers (a sampler may yield any hashable):
        # a digest of their repr, the same in every process
        return zlib.crc32(repr(index).encode())


# Each seed has one definition, the engine's (src/sampler/seeds.rs); these
# take any Python int, masked to the 64 bits the engine mixes.


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of a seeded loader's generator for ``epoch`` (0-based)."""
    return _core.epoch_seed(seed & _MASK, epoch & _MASK)


def sample_seed(seed: int, epoch: int, index: Any) -> int:
    """The seed set before ``dataset[index]`` in ``epoch`` with
    ``per_sample_seed=True``."""
    return _core.sample_seed(seed & _MASK, epoch & _MASK, _as_int(index) & _MASK)


def derive(root: int, *parts: int) -> int:
    """Folds each part into ``root`` (``mix(h ^ mix(part))``), 63 bits."""
    return _core.derive(root & _MASK, [p & _MASK for p in parts])


def shard_order_seed(root: int) -> int:
    """The seed of a sharded epoch's shard order, from the epoch's root."""
    return _core.shard_order_seed(root & _MASK)


def block_seed(root: int, shard: int, block: int) -> int:
    """The seed of the order of block ``block`` of shard ``shard``."""
    return _core.block_seed(root & _MASK, shard, block & _MASK)


def shard_item_index(shard: int, offset: int) -> int:
    """The index that stands for item ``offset`` of shard ``shard`` in
    ``sample_seed``."""
    return _core.shard_item_index(shard & _MASK, offset & _MASK)


def seed_everything(s: int) -> None:
    """Seeds torch's CPU generator, ``random`` and ``numpy`` (low 32 bits)
    with ``s``. (``torch.manual_seed`` would also seed every accelerator's
    generators, at ~100x the cost; data workers draw on the CPU.) In a
    worker thread the global generators are every thread's: its own
    (``get_worker_info().rng``, ``torch.thread_safe_generator()``) are
    seeded instead."""
    info = worker_local.info
    if info is not None:
        rng = info.rng
        rng.torch_generator.manual_seed(s)
        rng.random_generator.seed(s)
        if rng.numpy_generator is not None:
            rng.numpy_generator.seed(s & 0xFFFFFFFF)
        return
    torch.default_generator.manual_seed(s)
    random.seed(s)
    try:
        import numpy as np

        np.random.seed(s & 0xFFFFFFFF)
    except ImportError:  # pragma: no cover - numpy comes with torch's wheels
        pass


def _rng_states() -> tuple[Any, ...]:
    import numpy as np

    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _set_rng_states(states: tuple[Any, ...]) -> None:
    import numpy as np

    torch.set_rng_state(states[0])
    random.setstate(states[1])
    np.random.set_state(states[2])


class SeededDataset(_tud.Dataset):
    """A map-style dataset whose ``__getitem__(i)`` runs right after
    ``seed_everything(sample_seed(seed, epoch, i))``. In the main process the
    loader calls ``save()`` before and ``restore()`` after each batch, so a
    seeded loader leaves the global generators untouched."""

    def __init__(self, dataset: Any, seed: int, epoch: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = epoch
        self._started = False
        self._saved: Optional[tuple[Any, ...]] = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        seed_everything(sample_seed(self.seed, self.epoch, index))
        return self.dataset[index]

    def save(self) -> None:
        self._saved = _rng_states()

    def restore(self) -> None:
        if self._saved is not None:
            _set_rng_states(self._saved)
            self._saved = None

    def start_epoch(self) -> None:
        """Called by a worker at the start of every epoch it serves: the
        first is the one it was started for, later ones (persistent
        workers) follow it."""
        if self._started:
            self.epoch += 1
        self._started = True


class ShardSeeder:
    """``per_sample_seed=True`` for a sharded dataset: called with
    ``(shard, offset)`` right before each item is drawn. ``save()`` and
    ``restore()`` keep the global generators untouched in the main process;
    ``start_epoch()`` counts a persistent worker's epochs."""

    def __init__(self, seed: int, epoch: int) -> None:
        self.seed = seed
        self.epoch = epoch
        self._started = False
        self._saved: Optional[tuple[Any, ...]] = None

    def __call__(self, shard: int, offset: int) -> None:
        seed_everything(sample_seed(self.seed, self.epoch, shard_item_index(shard, offset)))

    def save(self) -> None:
        self._saved = _rng_states()

    def restore(self) -> None:
        if self._saved is not None:
            _set_rng_states(self._saved)
            self._saved = None

    def start_epoch(self) -> None:
        if self._started:
            self.epoch += 1
        self._started = True


__all__ = [
    "block_seed",
    "derive",
    "epoch_seed",
    "sample_seed",
    "seed_everything",
    "shard_item_index",
    "shard_order_seed",
]
