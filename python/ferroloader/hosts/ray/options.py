"""What a loader's Ray workers ask of the cluster: ``RayWorkers``, checked
against its documented forms, and where each worker ran."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from ferroloader.errors import ConfigError

TRANSPORTS = ("stream", "object_store")


def ray_module() -> Any:
    """``ray``, or a ``ConfigError`` naming the extra that brings it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "worker_method='ray' runs the workers as Ray actors, and Ray is not installed: "
            "pip install ray (from a checkout of ferroloader: pip install '.[ray]')"
        ) from None
    return ray


def _seconds(value: Any, positive: bool) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and (value > 0 if positive else value >= 0))


class RayWorkers:
    """Where and how a loader's Ray workers run:
    ``DataLoader(ds, num_workers=8, worker_method=ferroloader.RayWorkers(...))``.

    - ``address``: the cluster's (``ray.init(address=...)``: ``"host:port"``,
      ``"auto"`` or ``"ray://host:port"``); default: the one this process
      is connected to, else the running one, else a local one. A process
      is connected to one cluster: an address other than the connected
      one's is an error.
    - ``num_cpus``, ``resources``: what each worker actor asks of its node
      (``resources``: a dict of custom resource names to amounts, such as
      ``{"GPU": 1}`` or ``{"preprocess": 1}``).
    - ``avoid_trainer_node``: place the workers on nodes other than the
      training process's (when there are any).
    - ``max_restarts``: how many times each worker's actor is replaced
      after it died, before its task fails with ``RayWorkerLost``.
    - ``transport``: how batches come to the training process:
      ``"stream"`` (default), a TCP connection per worker that the
      batch's record is written into and read from straight into the
      relay's arena; or ``"object_store"``, Ray's object store (which
      moves it between nodes, zero-copy on the trainer's). The stream
      measured 2x faster on images (the guide's costs section).
    - ``place_within``: seconds to wait for the cluster to have room for
      the actors (it says so after 5 s); a request that no node can hold
      at all fails at once.
    - ``idle_timeout``: seconds an actor a loader handed back waits for
      another loader placed the same way before it ends (0: at once).

    >>> import ferroloader as fl
    >>> fl.RayWorkers(num_cpus=2, avoid_trainer_node=True)  # doctest: +NORMALIZE_WHITESPACE
    RayWorkers(address=None, num_cpus=2, resources=None, avoid_trainer_node=True,
               max_restarts=3, transport='stream', place_within=120.0, idle_timeout=60.0)
    """

    def __init__(self, address: Optional[str] = None, num_cpus: float = 1,
                 resources: Optional[Mapping[str, float]] = None,
                 avoid_trainer_node: bool = False, max_restarts: int = 3,
                 transport: str = "stream", place_within: float = 120.0,
                 idle_timeout: float = 60.0) -> None:
        def fail(arg: str, forms: str, value: Any) -> ConfigError:
            return ConfigError(f"RayWorkers {arg} should be {forms}, but got {arg}={value!r}")

        if address is not None and (not isinstance(address, str) or not _address_ok(address)):
            raise fail("address", "None, 'auto', 'host:port' or 'ray://host:port' (a str)",
                       address)
        if not _seconds(num_cpus, positive=False):
            raise fail("num_cpus", "a non-negative number", num_cpus)
        if resources is not None:
            if not isinstance(resources, Mapping):
                raise fail("resources", "a dict of resource names to amounts, such as "
                           "{'GPU': 1}", resources)
            for k, v in resources.items():
                if not isinstance(k, str) or not k or k == "CPU":
                    raise fail("resources", "a dict of resource names (non-empty str; CPUs are "
                               "num_cpus=) to amounts", resources)
                if not _seconds(v, positive=False):
                    raise fail("resources", "a dict of resource names to non-negative amounts",
                               resources)
        if not isinstance(avoid_trainer_node, bool):
            raise fail("avoid_trainer_node", "True or False", avoid_trainer_node)
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise fail("max_restarts", "a non-negative int", max_restarts)
        if not isinstance(transport, str) or transport not in TRANSPORTS:
            raise fail("transport", f"one of {TRANSPORTS}", transport)
        if not _seconds(place_within, positive=True):
            raise fail("place_within", "a positive number of seconds", place_within)
        if not _seconds(idle_timeout, positive=False):
            raise fail("idle_timeout", "a non-negative number of seconds", idle_timeout)
        self.address = address
        self.transport = transport
        self.num_cpus = num_cpus
        self.resources = dict(resources or {})
        self.avoid_trainer_node = avoid_trainer_node
        self.max_restarts = max_restarts
        self.place_within = float(place_within)
        self.idle_timeout = float(idle_timeout)

    def __repr__(self) -> str:
        return (f"RayWorkers(address={self.address!r}, num_cpus={self.num_cpus!r}, "
                f"resources={self.resources or None!r}, "
                f"avoid_trainer_node={self.avoid_trainer_node!r}, "
                f"max_restarts={self.max_restarts!r}, transport={self.transport!r}, "
                f"place_within={self.place_within!r}, idle_timeout={self.idle_timeout!r})")

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, RayWorkers) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))

    def request(self) -> dict[str, float]:
        """What one actor asks of its node."""
        ask = {"CPU": float(self.num_cpus)} if self.num_cpus else {}
        ask.update({k: float(v) for k, v in self.resources.items()})
        return ask


def _address_ok(address: str) -> bool:
    if address in ("auto", "local"):
        return True
    rest = address.split("://", 1)[1] if "://" in address else address
    host, _, port = rest.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


@dataclass
class WorkerPlace:
    """Where a Ray worker runs: its node's IP and id, and how many times its
    actor was replaced."""

    worker: int
    node_ip: str
    node_id: str
    restarts: int = 0


__all__ = ["TRANSPORTS", "RayWorkers", "WorkerPlace", "ray_module"]


def is_ray(method: Any) -> bool:
    """``worker_method="ray"`` or a ``ferroloader.RayWorkers``."""
    return (isinstance(method, str) and method == "ray") or type(method).__name__ == "RayWorkers"


def check_worker_method(method: Any, num_workers: int, worker_threads: Any, auto: bool) -> None:
    if not isinstance(method, (str, RayWorkers)):
        raise ConfigError(f"worker_method should be a str or ferroloader.RayWorkers, but got "
                          f"{method!r}")
    if auto:
        raise ConfigError("num_workers='auto' chooses among local workers; give a number of "
                          "Ray workers (num_workers=n)")
    if num_workers == 0:
        raise ConfigError(
            "worker_method='ray' runs num_workers Ray actors, and num_workers=0 starts none "
            "(it loads in the main thread): set num_workers >= 1"
        )
    if worker_threads != 1:
        raise ConfigError("worker_threads= sets the threads inside each worker process; Ray "
                          "workers are actors (one loop each)")
    ray_module()  # a clear error now when Ray is not installed
