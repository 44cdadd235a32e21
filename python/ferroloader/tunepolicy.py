"""``ferroloader.tunepolicy`` moved to ``ferroloader.tuning.policy`` (the
package's map is in its ``__init__``); this path forwards to it, for the
code that imports it."""

from typing import Any

from ferroloader.tuning import policy as _moved0
from ferroloader.tuning.policy import *  # noqa: F403


def __getattr__(name: str) -> Any:
    for moved in (_moved0,):
        if hasattr(moved, name):
            return getattr(moved, name)
    raise AttributeError(f"module 'ferroloader.tunepolicy' has no attribute {name!r}")
