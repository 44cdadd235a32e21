"""The shard cache's settings: its directory and byte budget (arguments or
``FERROLOADER_CACHE_*``), sizes written as text, and the stores' options,
each key checked against what some store knows."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

import ferroloader._core as _core
from ferroloader.errors import ConfigError

_GIB = 1 << 30


def _default_dir() -> str:
    env = os.environ.get("FERROLOADER_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ferroloader", "shards")


def _default_budget() -> int:
    env = os.environ.get("FERROLOADER_CACHE_BUDGET")
    if env is None:
        return 16 * _GIB
    try:
        return _parse_bytes(env)
    except ValueError as e:
        raise ConfigError(f"FERROLOADER_CACHE_BUDGET: {e}") from None


# SI units are powers of 1000 (10 MB is 10,000,000 bytes), IEC units and
# bare letters powers of 1024 (10 MiB and 10M are 10,485,760 bytes)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": _GIB,
          "gib": _GIB, "t": 1 << 40, "tib": 1 << 40}


# the engine counts bytes in 64 bits
_MAX_BYTES = (1 << 64) - 1


def _parse_bytes(text: str) -> int:
    """A positive number of bytes from ``"500MiB"``, ``"20 GB"``, ``"1e9"``."""
    s = text.strip().lower()
    num = s.rstrip("kmgtib ")
    unit = s[len(num):].strip()
    try:
        value = float(num) * _UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(
            f"{text!r} is not a size (like 500MiB or 20GB: KiB, MiB, GiB, TiB and K, M, G, T "
            "are powers of 1024; kB, MB, GB, TB powers of 1000)"
        ) from None
    if not 1 <= value <= _MAX_BYTES:  # (NaN fails this too)
        raise ValueError(f"{text!r} is not a positive size of at most 2**64 - 1 bytes")
    return int(value)


def _check_option(key: str, text: str) -> None:
    """``retries`` and ``retry_timeout`` (seconds) are non-negative finite numbers."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e12:  # (NaN fails this too)
        raise ConfigError(
            f"ShardCache option {key!r} should be a non-negative number, but got {text!r}"
        )


# the keys users reach for most, for suggestions (every key object_store's
# builders parse is accepted: _core.store_option_known)
_COMMON_OPTIONS = (
    "aws_endpoint", "aws_region", "aws_access_key_id", "aws_secret_access_key",
    "aws_session_token", "aws_skip_signature", "aws_virtual_hosted_style_request",
    "allow_http", "google_service_account", "google_service_account_key",
    "google_application_credentials", "azure_storage_account_name",
    "azure_storage_account_key", "azure_storage_sas_key", "azure_storage_token",
    "azure_use_emulator", "timeout", "connect_timeout", "proxy_url", "retries",
    "retry_timeout",
)


def _check_options(options: Any) -> dict[str, str]:
    """``options`` as the stores take them (str to str), every key one
    that some store knows: a misspelt key would be ignored, and the store
    would reach for its default (an endpoint on the internet)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"ShardCache options should be a dict of object_store settings "
                          f"(such as {{'aws_endpoint': 'http://...'}}), but got "
                          f"options={options!r}")
    out = {}
    for key, value in options.items():
        if not isinstance(key, str) or not _core.store_option_known(key):
            near = difflib.get_close_matches(str(key).lower(), _COMMON_OPTIONS, n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(
                f"ShardCache options: {key!r} is not a setting of any store{hint}. The keys "
                "are object_store's: S3's (aws_endpoint, aws_region, aws_access_key_id, ...), "
                "GCS's (google_service_account, ...), Azure's (azure_storage_account_name, "
                "...), the HTTP client's (allow_http, timeout, proxy_url, ...), and retries, "
                "retry_timeout"
            )
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif not isinstance(value, (str, int, float)):
            raise ConfigError(f"ShardCache options: {key!r} should be a str (or a number or "
                              f"bool), but got {value!r}")
        out[key] = str(value)
    return out


def _show_bytes(n: int) -> str:
    """``n`` bytes as the shortest exact IEC size (``"20GiB"``), else bytes."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", _GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"
