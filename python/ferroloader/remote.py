"""Moved: ``ferroloader.remote`` forwards to ``ferroloader.sources.remote`` and
the rest of ``ferroloader._moved.MOVED['remote']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.sources.cache_settings import *  # noqa: F403
    from ferroloader.sources.remote import *  # noqa: F403

__getattr__ = forward(__name__)
