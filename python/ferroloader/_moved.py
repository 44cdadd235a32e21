"""The old module paths and where their code went: each old path is a
module of two lines that forwards to the new ones (``forward``), so that
``import ferroloader.ray`` and ``ferroloader.worldqueue.merge_states``
keep working while code moves to the new paths."""

from __future__ import annotations

import importlib
from typing import Any, Callable

MOVED: dict[str, tuple[str, ...]] = {
    "autotune": ("tuning.bounds", "tuning.climb"),
    "tunepolicy": ("tuning.policy", "tuning.estimate"),
    "tunemodel": ("tuning.model",),
    "pinning": ("run.pinning",),
    "forkserver": ("hosts.forkserver",),
    "ray": ("hosts.ray", "hosts.ray.pool", "hosts.ray.relay"),
    "state": ("epoch.state",),
    "mixture": ("epoch.mixture",),
    "worldqueue": ("epoch.world", "epoch.accounts", "sources.worldqueue", "epoch.store",
                   "epoch.state"),
    "shards": ("sources.shards", "epoch.shards", "sources.remote"),
    "remote": ("sources.remote", "sources.cache_settings"),
    "tar": ("sources.tar",),
    "table": ("sources.table",),
    "packing": ("sources.packing",),
}


def forward(old: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of old path ``old`` (``ferroloader.x``):
    a name is looked up in the modules its code went to, in order."""
    short = old.rsplit(".", 1)[-1]

    def getattr_(name: str) -> Any:
        modules = [importlib.import_module(f"ferroloader.{new}") for new in MOVED[short]]
        if name == "__all__":  # (``from ferroloader.x import *``)
            return sorted({n for m in modules for n in getattr(m, "__all__", ())})
        for module in modules:
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    return getattr_


def old_path(module: str) -> str:
    """The path a moved module's classes had (``ferroloader.epoch.mixture``:
    ``ferroloader.mixture``), where a saved state names them; any other
    module's path as it is."""
    for old, news in MOVED.items():
        if module == f"ferroloader.{news[0]}":
            return f"ferroloader.{old}"
    return module
