"""Moved: ``ferroloader.tunemodel`` forwards to ``ferroloader.tuning.model``
and the rest of ``ferroloader._moved.MOVED['tunemodel']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.tuning.model import *  # noqa: F403

__getattr__ = forward(__name__)

if __name__ == "__main__":
    from ferroloader.tuning.model import main

    main()
