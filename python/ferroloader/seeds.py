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

from typing import Any

import ferroloader._core as _core

_MASK = (1 << 64) - 1


# Each seed has one definition, the engine's (src/sampler/seeds.rs); these
# take any Python int, masked to the 64 bits the engine mixes.


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of a seeded loader's generator for ``epoch`` (0-based)."""
    return _core.epoch_seed(seed & _MASK, epoch & _MASK)


def sample_seed(seed: int, epoch: int, index: Any) -> int:
    """The seed set before ``dataset[index]`` in ``epoch`` with
    ``per_sample_seed=True``."""
    return _core.sample_seed(seed & _MASK, epoch & _MASK, index)


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
    with ``s`` (modulo 2**64). (``torch.manual_seed`` would also seed every
    accelerator's generators, at ~100x the cost; data workers draw on the
    CPU.) In a worker thread the global generators are every thread's: its
    own (``get_worker_info().rng``, ``torch.thread_safe_generator()``) are
    seeded instead. The engine runs the same before each sample with
    ``per_sample_seed=True`` (``_core.SampleSeeder``)."""
    _core.seed_everything(s & _MASK)


__all__ = [
    "block_seed",
    "derive",
    "epoch_seed",
    "sample_seed",
    "seed_everything",
    "shard_item_index",
    "shard_order_seed",
]
