"""``ferroloader.autotune`` moved to ``ferroloader.tuning.bounds`` and
``ferroloader.tuning.climb`` (the package's map is in its ``__init__``);
this path forwards to it, for the code that imports it."""

from typing import Any

from ferroloader.tuning import bounds as _moved0
from ferroloader.tuning import climb as _moved1
from ferroloader.tuning.bounds import *  # noqa: F403
from ferroloader.tuning.climb import *  # noqa: F403


def __getattr__(name: str) -> Any:
    for moved in (_moved0, _moved1,):
        if hasattr(moved, name):
            return getattr(moved, name)
    raise AttributeError(f"module 'ferroloader.autotune' has no attribute {name!r}")
