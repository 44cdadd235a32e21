"""Moved: ``ferroloader.state`` forwards to ``ferroloader.epoch.state`` and the
rest of ``ferroloader._moved.MOVED['state']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.epoch.state import *  # noqa: F403

__getattr__ = forward(__name__)
