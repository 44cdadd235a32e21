"""Moved: ``ferroloader.table`` forwards to ``ferroloader.sources.table`` and
the rest of ``ferroloader._moved.MOVED['table']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.sources.table import *  # noqa: F403

__getattr__ = forward(__name__)
