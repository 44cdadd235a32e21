"""``ferroloader.mixture`` moved to ``ferroloader.epoch.mixture`` (the
package's map is in its ``__init__``); this path forwards to it, for the
code that imports it."""

from typing import Any

from ferroloader.epoch import mixture as _moved0
from ferroloader.epoch.mixture import *  # noqa: F403


def __getattr__(name: str) -> Any:
    for moved in (_moved0,):
        if hasattr(moved, name):
            return getattr(moved, name)
    raise AttributeError(f"module 'ferroloader.mixture' has no attribute {name!r}")
