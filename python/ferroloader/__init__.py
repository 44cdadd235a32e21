"""ferroloader: a drop-in replacement for ``torch.utils.data`` with a Rust engine.

Change ``from torch.utils.data import DataLoader`` to
``from ferroloader import DataLoader`` and get the same batches.

The package, by its seams (imports run down this list only; the test
command checks it, ``tests/test_layers.py``):

- the public face: this module, ``dataloader`` (``DataLoader``),
  ``stateful_dataloader``, ``patch``;
- ``tuning``: ``num_workers="auto"`` (its bounds, policy, machine model and
  live tuner);
- ``run``: an epoch running, the iterators over the engine's, pinning;
- ``hosts``: where workers run (processes, threads, Ray actors), behind
  ``hosts.start_workers``;
- ``epoch``: an epoch's plan and state (the record, the index stream or
  lanes, the job's shared queue, mixtures, snapshot and resume);
- torch's names: ``sampler``, ``distributed``, ``dataset``, ``collate``,
  ``worker``, ``datapipes``;
- ``sources``: what an epoch reads (shards and their options, the shard
  cache, tar and table shards, packing, map-style data through the queue);
- the ground: ``errors``, ``seeds``, ``stats``, the settings, the compiled
  ``_core``.

Modules that moved keep their old paths (``ferroloader.ray``,
``ferroloader.tunemodel``, ...; ``ferroloader._moved``) as forwarding modules.
"""

import importlib
from typing import Any

from ferroloader._core import __version__
from ferroloader._moved import MOVED
from ferroloader.collate import (
    collate,
    default_collate,
    default_collate_fn_map,
    default_convert,
)
from ferroloader.dataloader import DataLoader
from ferroloader.datapipes import (
    DataChunk,
    DFIterDataPipe,
    IterDataPipe,
    MapDataPipe,
    _DatasetKind,
    argument_validation,
    functional_datapipe,
    guaranteed_datapipes_determinism,
    non_deterministic,
    runtime_validation,
    runtime_validation_disabled,
)
from ferroloader.dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from ferroloader.distributed import DistributedSampler
from ferroloader.epoch.mixture import Mixture, MixtureBatchSampler
from ferroloader.epoch.state import merge_states
from ferroloader.errors import (
    CacheBudgetWarning,
    ConfigError,
    FerroloaderError,
    InternalError,
    ProtocolError,
    RayWorkerLost,
    RebuiltAsTorchWarning,
    ShardQueueError,
    SharedMemoryError,
    SharedMemoryLimitError,
    StateMismatchError,
    ThreadSafetyWarning,
    WorkerDiedError,
    WorkerTimeoutError,
)
from ferroloader.hosts.ray import RayWorkers
from ferroloader.patch import Patch, patch
from ferroloader.sampler import (
    BatchSampler,
    ElasticBatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from ferroloader.sources.packing import PackedLoader, Packing
from ferroloader.sources.remote import CacheStats, ShardCache
from ferroloader.sources.shards import FileShards, ShardedDataset, Sharding
from ferroloader.sources.table import TableDataset, TableShards
from ferroloader.sources.tar import TarShards
from ferroloader.sources.worldqueue import DynamicDistributedSampler, QueueStats
from ferroloader.stateful_dataloader import Stateful, StatefulDataLoader
from ferroloader.stats import LoaderStats, WorkerStats
from ferroloader.tuning.bounds import Autotune
from ferroloader.worker import get_worker_info

__all__ = [
    "Autotune",
    "BatchSampler",
    "CacheBudgetWarning",
    "CacheStats",
    "ChainDataset",
    "ConcatDataset",
    "ConfigError",
    "DFIterDataPipe",
    "DataChunk",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "DynamicDistributedSampler",
    "ElasticBatchSampler",
    "FerroloaderError",
    "FileShards",
    "InternalError",
    "IterDataPipe",
    "IterableDataset",
    "LoaderStats",
    "MapDataPipe",
    "Mixture",
    "MixtureBatchSampler",
    "PackedLoader",
    "Packing",
    "Patch",
    "ProtocolError",
    "QueueStats",
    "RandomSampler",
    "RayWorkerLost",
    "RayWorkers",
    "RebuiltAsTorchWarning",
    "Sampler",
    "SequentialSampler",
    "ShardCache",
    "ShardQueueError",
    "ShardedDataset",
    "Sharding",
    "SharedMemoryError",
    "SharedMemoryLimitError",
    "StackDataset",
    "StateMismatchError",
    "Stateful",
    "StatefulDataLoader",
    "Subset",
    "SubsetRandomSampler",
    "TableDataset",
    "TableShards",
    "TarShards",
    "TensorDataset",
    "ThreadSafetyWarning",
    "WeightedRandomSampler",
    "WorkerDiedError",
    "WorkerStats",
    "WorkerTimeoutError",
    "_DatasetKind",
    "__version__",
    "argument_validation",
    "collate",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "functional_datapipe",
    "get_worker_info",
    "guaranteed_datapipes_determinism",
    "merge_states",
    "non_deterministic",
    "patch",
    "random_split",
    "runtime_validation",
    "runtime_validation_disabled",
]

def __getattr__(name: str) -> Any:
    # ``ferroloader.ray`` and the other old paths, imported on first use
    if name in MOVED:
        return importlib.import_module(f"ferroloader.{name}")
    raise AttributeError(f"module 'ferroloader' has no attribute {name!r}")
