"""Moved: ``ferroloader.pinning`` forwards to ``ferroloader.run.pinning`` and
the rest of ``ferroloader._moved.MOVED['pinning']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.run.pinning import *  # noqa: F403

__getattr__ = forward(__name__)
