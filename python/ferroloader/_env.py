"""The ``FERROLOADER_*`` environment settings, checked when an epoch
starts (a bad value is a ``ConfigError`` before any worker starts), and
the shared-memory budget ``FERROLOADER_SHM_LIMIT``."""

from __future__ import annotations

import math
import os
from typing import TypeVar

from ferroloader import pinning
from ferroloader.errors import ConfigError

_T_co = TypeVar("_T_co", covariant=True)


_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_INITIAL_ARENA = 64 << 20


# a larger budget cannot be a size of memory (and would overflow the engine's)
_MAX_SHM = 1 << 60


def shm_limit() -> int:
    """The loader's shared-memory budget in bytes, shared by its workers:
    ``FERROLOADER_SHM_LIMIT`` (a byte count, optionally with a K, M, G or T
    suffix), else half of physical memory."""
    raw = os.environ.get("FERROLOADER_SHM_LIMIT", "").strip().upper().removesuffix("B")
    if raw:
        unit = raw[-1] if raw[-1] in _SIZE_SUFFIXES else ""
        number = raw[: len(raw) - len(unit)].strip()
        try:
            value = float(number) * _SIZE_SUFFIXES[unit]
        except ValueError:
            value = math.nan
        if not 1 <= value <= _MAX_SHM:  # also NaN and inf
            raise ConfigError(
                f"FERROLOADER_SHM_LIMIT={os.environ['FERROLOADER_SHM_LIMIT']!r} is not a size "
                "from 1 byte to 1024T (e.g. 512M or 8G)"
            ) from None
        return int(value)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


# FERROLOADER_DISABLE's names: the engine's (src/facilities.rs) and the
# pinning's (ferroloader.pinning.DISABLE)
_DISABLE = ("memfd", "pidfd", pinning.DISABLE)


def check_environment() -> None:
    """Refuses settings the engine would otherwise ignore: each read when
    an epoch starts, so a bad value is named before any worker starts."""
    shm_limit()
    # (an empty value is unset, as for FERROLOADER_SHM_LIMIT)
    spin = os.environ.get("FERROLOADER_SPIN_US", "").strip() or None
    if spin is not None and not (
        spin.strip().isascii() and spin.strip().isdigit() and int(spin) <= 10_000_000
    ):
        raise ConfigError(
            f"FERROLOADER_SPIN_US={spin!r} is not a whole number of microseconds up to "
            "10000000 (e.g. 100)"
        )
    disable = os.environ.get("FERROLOADER_DISABLE", "")
    unknown = [
        n.strip() for n in disable.split(",") if n.strip() and n.strip().lower() not in _DISABLE
    ]
    if unknown:
        raise ConfigError(
            f"FERROLOADER_DISABLE={disable!r} names {', '.join(map(repr, unknown))}, which is "
            f"not a facility ferroloader can turn off; it takes a comma-separated list of "
            f"{', '.join(_DISABLE)}"
        )
    share = os.environ.get("FERROLOADER_WARN_WAITING", "").strip() or None
    if share is not None:
        try:
            ok = 0.0 < float(share) < 1.0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(
                f"FERROLOADER_WARN_WAITING={share!r} is not a share between 0 and 1 (e.g. 0.3)"
            )
