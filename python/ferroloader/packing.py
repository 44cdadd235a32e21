"""Moved: ``ferroloader.packing`` forwards to ``ferroloader.sources.packing``
and the rest of ``ferroloader._moved.MOVED['packing']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.sources.packing import *  # noqa: F403

__getattr__ = forward(__name__)
