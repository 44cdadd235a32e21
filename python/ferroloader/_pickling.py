"""The picklers of the record codec (``src/python/codec.rs``): objects the
engine does not encode natively travel pickled, with their tensors and
arrays taken out as leaves through ``persistent_id`` / ``persistent_load``.

They are subclasses that define those hooks as methods: since Python 3.13
the C ``Pickler``'s ``persistent_id`` can no longer be set on an instance.
"""

from __future__ import annotations

import pickle
from typing import IO, Any, Callable, Optional


class LeafPickler(pickle.Pickler):
    """Pickles with ``collector(obj)`` deciding which objects become leaves
    (their number is the persistent id; ``None``: pickled as usual)."""

    def __init__(self, file: IO[bytes], protocol: int, collector: Callable[[Any], Optional[int]]):
        super().__init__(file, protocol)
        self._collector = collector

    def persistent_id(self, obj: Any) -> Optional[int]:
        return self._collector(obj)


class LeafUnpickler(pickle.Unpickler):
    """Unpickles with ``loader(id)`` giving leaf ``id``."""

    def __init__(self, file: IO[bytes], loader: Callable[[Any], Any]):
        super().__init__(file)
        self._loader = loader

    def persistent_load(self, pid: Any) -> Any:
        return self._loader(pid)
