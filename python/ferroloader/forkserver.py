"""Moved: ``ferroloader.forkserver`` forwards to
``ferroloader.hosts.forkserver`` and the rest of
``ferroloader._moved.MOVED['forkserver']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.hosts.forkserver import *  # noqa: F403

__getattr__ = forward(__name__)
