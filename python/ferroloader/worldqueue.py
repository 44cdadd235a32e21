"""Moved: ``ferroloader.worldqueue`` forwards to ``ferroloader.epoch.world``
and the rest of ``ferroloader._moved.MOVED['worldqueue']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.epoch.accounts import *  # noqa: F403
    from ferroloader.epoch.state import *  # noqa: F403
    from ferroloader.epoch.store import *  # noqa: F403
    from ferroloader.epoch.world import *  # noqa: F403
    from ferroloader.sources.worldqueue import *  # noqa: F403

__getattr__ = forward(__name__)
