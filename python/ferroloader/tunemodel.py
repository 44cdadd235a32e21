"""``ferroloader.tunemodel`` moved to ``ferroloader.tuning.model`` (the
package's map is in its ``__init__``); this path forwards to it, for the
code that imports it."""

from typing import Any

from ferroloader.tuning import model as _moved0
from ferroloader.tuning.model import *  # noqa: F403


def __getattr__(name: str) -> Any:
    for moved in (_moved0,):
        if hasattr(moved, name):
            return getattr(moved, name)
    raise AttributeError(f"module 'ferroloader.tunemodel' has no attribute {name!r}")


if __name__ == "__main__":
    _moved0.main()
