"""Moved: ``ferroloader.autotune`` forwards to ``ferroloader.tuning.bounds``
and the rest of ``ferroloader._moved.MOVED['autotune']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.tuning.bounds import *  # noqa: F403
    from ferroloader.tuning.climb import *  # noqa: F403

__getattr__ = forward(__name__)
