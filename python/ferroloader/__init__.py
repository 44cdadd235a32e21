"""ferroloader: a drop-in replacement for ``torch.utils.data`` with a Rust engine.

Change ``from torch.utils.data import DataLoader`` to
``from ferroloader import DataLoader`` and get the same batches.
"""

from ferroloader._core import __version__
from ferroloader.collate import (
    collate,
    default_collate,
    default_collate_fn_map,
    default_convert,
)
from ferroloader.dataloader import DataLoader
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
    ConfigError,
    FerroloaderError,
    InternalError,
    ProtocolError,
    SharedMemoryError,
    SharedMemoryLimitError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from ferroloader.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from ferroloader.shards import ElasticBatchSampler, FileShards, ShardedDataset, Sharding
from ferroloader.table import TableDataset, TableShards
from ferroloader.worker import get_worker_info

__all__ = [
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "ConfigError",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "ElasticBatchSampler",
    "FerroloaderError",
    "FileShards",
    "InternalError",
    "IterableDataset",
    "ProtocolError",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "ShardedDataset",
    "Sharding",
    "SharedMemoryError",
    "SharedMemoryLimitError",
    "StackDataset",
    "Subset",
    "SubsetRandomSampler",
    "TableDataset",
    "TableShards",
    "TensorDataset",
    "WeightedRandomSampler",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "__version__",
    "collate",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "get_worker_info",
    "random_split",
]
