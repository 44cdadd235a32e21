"""``ferroloader.shards`` moved to ``ferroloader.sources.shards`` and
``ferroloader.epoch.shards`` (the package's map is in its ``__init__``);
this path forwards to it, for the code that imports it."""

from typing import Any

from ferroloader.epoch import shards as _moved1
from ferroloader.epoch.shards import *  # noqa: F403
from ferroloader.sources import shards as _moved0
from ferroloader.sources.shards import *  # noqa: F403


def __getattr__(name: str) -> Any:
    for moved in (_moved0, _moved1,):
        if hasattr(moved, name):
            return getattr(moved, name)
    raise AttributeError(f"module 'ferroloader.shards' has no attribute {name!r}")
