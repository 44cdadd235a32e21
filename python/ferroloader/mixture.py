"""Moved: ``ferroloader.mixture`` forwards to ``ferroloader.epoch.mixture`` and
the rest of ``ferroloader._moved.MOVED['mixture']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.epoch.mixture import *  # noqa: F403

__getattr__ = forward(__name__)
