"""Moved: ``ferroloader.tunepolicy`` forwards to ``ferroloader.tuning.policy``
and the rest of ``ferroloader._moved.MOVED['tunepolicy']``."""

from typing import TYPE_CHECKING

from ferroloader._moved import forward

if TYPE_CHECKING:  # (what type checkers see at the old path)
    from ferroloader.tuning.estimate import *  # noqa: F403
    from ferroloader.tuning.policy import *  # noqa: F403

__getattr__ = forward(__name__)
