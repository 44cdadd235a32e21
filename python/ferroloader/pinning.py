"""``ferroloader.pinning`` moved to ``ferroloader.run.pinning`` (the package's
map is in its ``__init__``); this path forwards to it, for the code that
imports it."""

from typing import Any

from ferroloader.run import pinning as _moved0
from ferroloader.run.pinning import *  # noqa: F403


def __getattr__(name: str) -> Any:
    for moved in (_moved0,):
        if hasattr(moved, name):
            return getattr(moved, name)
    raise AttributeError(f"module 'ferroloader.pinning' has no attribute {name!r}")
