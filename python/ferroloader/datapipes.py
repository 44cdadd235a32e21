"""The DataPipe names of ``torch.utils.data`` (deprecated in torch), so that
ferroloader exports every name torch's module does. They are torch's own
objects: a DataPipe given to ferroloader's ``DataLoader`` runs on torch's
iterators, which carry DataPipe sharding and seeding."""

from __future__ import annotations

from torch.utils.data import (
    DataChunk,
    DFIterDataPipe,
    IterDataPipe,
    MapDataPipe,
    argument_validation,
    functional_datapipe,
    guaranteed_datapipes_determinism,
    non_deterministic,
    runtime_validation,
    runtime_validation_disabled,
)
from torch.utils.data.dataloader import _DatasetKind

__all__ = [
    "DFIterDataPipe",
    "DataChunk",
    "IterDataPipe",
    "MapDataPipe",
    "_DatasetKind",
    "argument_validation",
    "functional_datapipe",
    "guaranteed_datapipes_determinism",
    "non_deterministic",
    "runtime_validation",
    "runtime_validation_disabled",
]
