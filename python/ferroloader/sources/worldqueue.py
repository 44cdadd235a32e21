"""Map-style data through the job's shared queue
(``DynamicDistributedSampler``: blocks of indices as shards), and what the
queue did for a rank (``QueueStats``). The queue itself is the epoch's
(``ferroloader.epoch.world``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ferroloader.errors import ConfigError
from ferroloader.sources.shards import ShardedDataset, Sharding


@dataclass
class QueueStats:
    """What the shared queue did for this rank: works (shards or parts of
    them) and items it claimed, the seconds its claims spent on the store,
    and the items the epochs' even counts held back (read first in the
    next epoch). ``DataLoader.stats().queue`` gives them.

    >>> import ferroloader
    >>> print(ferroloader.QueueStats(shards=3, items=40, waited=0.002))
    shard queue: 3 works claimed (40 items), 0.002 s on the store, 0 items held back
    """

    shards: int = 0
    items: int = 0
    waited: float = 0.0
    held_back: int = 0

    def __add__(self, other: QueueStats) -> QueueStats:
        return QueueStats(self.shards + other.shards, self.items + other.items,
                          self.waited + other.waited, self.held_back + other.held_back)

    def __str__(self) -> str:
        return (
            f"shard queue: {self.shards} works claimed ({self.items} items), "
            f"{self.waited:.3f} s on the store, {self.held_back} items held back"
        )


class DynamicDistributedSampler:
    """``DistributedSampler``'s job through the job's shared queue: a
    map-style dataset's indices in blocks of ``block``, claimed by the
    ranks as they read, so a rank that runs faster reads more blocks.
    ``DataLoader(dataset, sampler=DynamicDistributedSampler(dataset))``
    reads the dataset as shards of ``block`` consecutive indices
    (``ferroloader.worldqueue.Blocks``) with ``Sharding(mode="dynamic",
    across="world")``: with ``shuffle=True`` the blocks come in a seeded
    order and each block's indices in a seeded order of their own; every
    index is read once per epoch by one rank (``even=False``), or every rank
    yields the same number of batches and what that holds back is read first
    in the next epoch (``even=True``, the default). ``seed``, ``store``,
    ``name``, ``rank`` and ``num_replicas`` as ``Sharding`` takes them
    (``seed`` is the loader's seed). It resumes, as every shared queue
    does, from every rank's state on any number of ranks.

    >>> import torch, torch.distributed as dist, ferroloader
    >>> store = dist.HashStore()  # one rank here; a job's store across ranks
    >>> ds = torch.arange(10)
    >>> sampler = ferroloader.DynamicDistributedSampler(ds, block=4, store=store, rank=0,
    ...                                                 num_replicas=1)
    >>> loader = ferroloader.DataLoader(ds, batch_size=5, sampler=sampler)
    >>> sorted(int(i) for b in loader for i in b)
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """

    def __init__(self, dataset: Any, *, block: int = 64, shuffle: bool = True, seed: int = 0,
                 even: bool = True, store: Any = None, name: Optional[str] = None,
                 rank: Optional[int] = None, num_replicas: Optional[int] = None) -> None:
        def fail(arg: str, forms: str, value: Any) -> ConfigError:
            return ConfigError(f"DynamicDistributedSampler {arg} should be {forms}, but got "
                               f"{arg}={value!r}")

        if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block < 2**63:
            raise fail("block", "a positive int (below 2**63)", block)
        for arg, flag in (("shuffle", shuffle), ("even", even)):
            if not isinstance(flag, bool):
                raise fail(arg, "True or False", flag)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise fail("seed", "an int", seed)
        for arg, value in (("rank", rank), ("num_replicas", num_replicas)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise fail(arg, "an int (or None: from torch.distributed)", value)
        if num_replicas is not None and num_replicas < 1:
            raise fail("num_replicas", "a positive int", num_replicas)
        if rank is not None and num_replicas is not None and not 0 <= rank < num_replicas:
            raise fail("rank", f"in [0, {num_replicas - 1}]", rank)
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise fail("dataset", "a map-style dataset (with __len__ and __getitem__)", dataset)
        self.dataset = dataset
        self.block = block
        self.shuffle = shuffle
        self.seed = seed
        self.sharding = Sharding(mode="dynamic", across="world", shuffle_block=block,
                                 even=even, store=store, name=name, rank=rank,
                                 world_size=num_replicas)

    def __len__(self) -> int:
        return len(self.dataset)

    def as_shards(self, dataset: Any, batch_sampler: Any, sharding: Any, shuffle: Any,
                  seed: Optional[int]) -> tuple[Blocks, Sharding, bool, int]:
        """What ``DataLoader(dataset, sampler=self)`` reads: ``dataset`` as
        shards of ``block`` indices with this sampler's sharding and shuffle
        (the loader's ``dataset`` is then that view; its ``.dataset`` the one
        given), and the loader's seed (its own, or this sampler's)."""
        if batch_sampler is not None or sharding is not None or shuffle:
            raise ConfigError(
                "DynamicDistributedSampler decides the order and the sharding itself: "
                "leave batch_sampler, sharding and shuffle unset (its shuffle= and block= "
                "say how it shuffles)"
            )
        return (Blocks(dataset, self.block), self.sharding, self.shuffle,
                self.seed if seed is None else seed)

    def __iter__(self) -> Any:
        raise TypeError(
            "DynamicDistributedSampler is read by ferroloader.DataLoader (it claims blocks "
            "through the job's store as the loader reads them); torch's DataLoader cannot "
            "iterate it"
        )


class Blocks(ShardedDataset[Any]):
    """A map-style ``dataset`` as shards of ``block`` consecutive indices:
    shard ``s`` is ``dataset[s * block]``, ``dataset[s * block + 1]``, ...
    (how ``DynamicDistributedSampler`` reads it)."""

    def __init__(self, dataset: Any, block: int) -> None:
        self.dataset = dataset
        self.block = block
        self.n = len(dataset)

    def shards(self) -> list[int]:
        return list(range(-(-self.n // self.block)))

    def iter_shard(self, shard: int, start: int = 0) -> Any:
        ds = self.dataset
        return (ds[i] for i in range(shard * self.block + start,
                                     min(self.n, (shard + 1) * self.block)))

    def shard_len(self, shard: int) -> int:
        return max(0, min(self.n, (shard + 1) * self.block) - shard * self.block)

    def __len__(self) -> int:
        return self.n


__all__ = ["Blocks", "DynamicDistributedSampler", "QueueStats"]
