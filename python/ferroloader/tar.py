"""Moved: ``ferroloader.tar`` forwards to ``ferroloader.sources.tar`` and the
rest of ``ferroloader._moved.MOVED['tar']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.sources.tar import *  # noqa: F403

__getattr__ = forward(__name__)
