"""``ferroloader.table`` moved to ``ferroloader.sources.table`` (the package's
map is in its ``__init__``); this path forwards to it, for the code that
imports it."""

from typing import Any

from ferroloader.sources import table as _moved0
from ferroloader.sources.table import *  # noqa: F403


def __getattr__(name: str) -> Any:
    for moved in (_moved0,):
        if hasattr(moved, name):
            return getattr(moved, name)
    raise AttributeError(f"module 'ferroloader.table' has no attribute {name!r}")
