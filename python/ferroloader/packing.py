"""``ferroloader.packing`` moved to ``ferroloader.sources.packing`` (the
package's map is in its ``__init__``); this path forwards to it, for the
code that imports it."""

from typing import Any

from ferroloader.sources import packing as _moved0
from ferroloader.sources.packing import *  # noqa: F403


def __getattr__(name: str) -> Any:
    for moved in (_moved0,):
        if hasattr(moved, name):
            return getattr(moved, name)
    raise AttributeError(f"module 'ferroloader.packing' has no attribute {name!r}")
