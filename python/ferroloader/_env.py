"""The ``FERROLOADER_*`` environment settings. Each is parsed and checked
by the engine (``src/settings.rs``), its one definition: ``iter()`` checks
them all before any worker starts (a bad value is a ``ConfigError`` naming
it), and the shared-memory budget is read here."""

from __future__ import annotations

import os

import ferroloader._core as _core

# a worker's first arena segment (it grows up to its share of the budget)
_INITIAL_ARENA = 64 << 20


def shm_limit() -> int:
    """The loader's shared-memory budget in bytes, shared by its workers:
    ``FERROLOADER_SHM_LIMIT`` (a byte count, optionally with a K, M, G or T
    suffix), else half of physical memory."""
    limit = _core.shm_limit_setting()
    if limit is not None:
        return limit
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def check_environment() -> None:
    """Refuses settings the engine would otherwise ignore: each read when
    an epoch starts, so a bad value is named before any worker starts."""
    _core.check_settings()
