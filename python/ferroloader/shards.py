"""Moved: ``ferroloader.shards`` forwards to ``ferroloader.sources.shards`` and
the rest of ``ferroloader._moved.MOVED['shards']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.epoch.shards import *  # noqa: F403
    from ferroloader.sources.remote import *  # noqa: F403
    from ferroloader.sources.shards import *  # noqa: F403

__getattr__ = forward(__name__)
