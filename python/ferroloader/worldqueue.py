"""``ferroloader.worldqueue`` moved to ``ferroloader.epoch.world`` and
``ferroloader.sources.worldqueue`` (the package's map is in its
``__init__``); this path forwards to it, for the code that imports it."""

from typing import Any

from ferroloader.epoch import store as _moved2
from ferroloader.epoch import world as _moved0
from ferroloader.epoch.state import merge_states  # noqa: F401
from ferroloader.epoch.world import *  # noqa: F403
from ferroloader.sources import worldqueue as _moved1
from ferroloader.sources.worldqueue import *  # noqa: F403


def __getattr__(name: str) -> Any:
    for moved in (_moved0, _moved1, _moved2):
        if hasattr(moved, name):
            return getattr(moved, name)
    raise AttributeError(f"module 'ferroloader.worldqueue' has no attribute {name!r}")
