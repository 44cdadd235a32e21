"""Moved: ``ferroloader.ray`` forwards to ``ferroloader.hosts.ray`` and the
rest of ``ferroloader._moved.MOVED['ray']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.hosts.ray import *  # noqa: F403
    from ferroloader.hosts.ray.pool import *  # noqa: F403
    from ferroloader.hosts.ray.relay import *  # noqa: F403

__getattr__ = forward(__name__)
