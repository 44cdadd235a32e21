"""ferroloader: a drop-in replacement for ``torch.utils.data`` with a Rust engine.

Change ``from torch.utils.data import DataLoader`` to
``from ferroloader import DataLoader`` and get the same batches.
"""

from ferroloader._core import __version__
from ferroloader.autotune import Autotune
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
from ferroloader.mixture import Mixture, MixtureBatchSampler
from ferroloader.packing import PackedLoader, Packing
from ferroloader.patch import Patch, patch
from ferroloader.ray import RayWorkers
from ferroloader.remote import CacheStats, ShardCache
from ferroloader.sampler import (
    BatchSampler,
    ElasticBatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from ferroloader.shards import FileShards, ShardedDataset, Sharding
from ferroloader.stateful_dataloader import Stateful, StatefulDataLoader
from ferroloader.stats import LoaderStats, WorkerStats
from ferroloader.table import TableDataset, TableShards
from ferroloader.tar import TarShards
from ferroloader.worker import get_worker_info
from ferroloader.worldqueue import DynamicDistributedSampler, QueueStats, merge_states

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
