"""Workers on a Ray cluster: ``DataLoader(..., num_workers=n,
worker_method="ray")`` (or ``worker_method=ferroloader.RayWorkers(...)``).

Each worker is a Ray actor that runs ferroloader's own worker host on the
user's dataset: the same fetch, the same Rust collate into the same record
format as a worker process (``_core.ActorHost``). In the training process,
each worker has a relay thread running the worker loop
(``_core.relay_loop``) that the engine talks to as to a worker thread; the
relay sends each task to its actor, and the batch's record comes back over
a TCP stream from the actor (``transport="stream"``, the default) or
through Ray's object store (``"object_store"``), and is copied into the
relay's arena. The scheduler, the window, the order, the state, the seeds
and the decoding are those of local workers, so the batches are too.

An actor that dies (killed, its node gone) is replaced, on another node if
its own is gone: the relay starts a new actor with the same dataset and
worker id, brings it to where the lost one stood (a lane of a sharded
dataset at its last batch's position), and sends the task again; a task is
a pure function of its indices and seeds, so the epoch's batches do not
change. Past ``max_restarts`` for a worker, the task fails with
``RayWorkerLost`` naming the worker, its node and what it was reading.

A loader holds its actors only while it needs them: when a worker's relay
ends (the end of an epoch without persistent workers, a dropped iterator,
``loader.close()``, the loader collected) its actor goes back to an idle
pool, where the next loader placed the same way takes it warm (an actor
takes seconds to start: it imports torch), and ends after
``RayWorkers(idle_timeout=)`` seconds unused, or at once when a loader
placed otherwise needs the room. A request no node of the cluster can
hold fails at once; one the cluster is too busy for is logged after a few
seconds and fails after ``RayWorkers(place_within=)``, naming the live
loaders that hold actors. ``ray`` is imported only here, and only when
asked.
"""

from __future__ import annotations

import logging
import math
import pickle
import re
import socket
import struct
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from ferroloader import _core
from ferroloader.errors import ConfigError, RayWorkerLost

log = logging.getLogger("ferroloader.ray")

TRANSPORTS = ("stream", "object_store")

# A stream frame's header: the record's length, or NO_BATCH when the task
# made none (its reply says what instead).
_HEADER = "<Q"
_HEADER_SIZE = 8
NO_BATCH = 2**64 - 1

# How long the trainer waits for a worker's stream to be accepted, and
# between checks that a task it reads from is still running.
CONNECT_WITHIN = 30.0
STALL_CHECK = 1.0
# After this many seconds waiting for room on the cluster, a loader says so.
WARN_PLACING_AFTER = 5.0


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


def _actor_class(ray: Any) -> Any:
    """The worker actor (made once per process: the ``ray.remote`` class)."""
    cls = getattr(_actor_class, "cls", None)
    if cls is not None:
        return cls

    class Worker:
        """A loader's worker on a Ray node: ferroloader's worker host over
        the user's dataset (``_core.ActorHost``)."""

        def __init__(self) -> None:
            self.host: Any = None
            self.stream: Optional[socket.socket] = None

        def place(self) -> tuple[str, str]:
            ctx = ray.get_runtime_context()
            return ray.util.get_node_ip_address(), ctx.get_node_id()

        def reset(self) -> None:
            """Handed back idle: the last loader's dataset and stream go."""
            self.host = None
            if self.stream is not None:
                self.stream.close()
                self.stream = None

        def setup(self, dataset: Any, job: dict[str, Any], base_seed: int,
                  num_workers: int) -> None:
            import torch

            from ferroloader import _worker

            # (a worker process runs with one intra-op thread, as torch's do)
            torch.set_num_threads(1)
            self.host = _worker.actor_host(dataset, job, base_seed, num_workers)

        def start_epoch(self) -> Optional[bytes]:
            return self.host.start_epoch()

        def lanes(self, lanes: list[int], shuffle: bool, block: int, root: int) -> None:
            self.host.lanes(lanes, shuffle, block, root)

        def assign(self, lane: int, works: list[tuple[int, int, int]], last: bool) -> None:
            self.host.assign(lane, works, last)

        def hand_back(self, lane: int) -> None:
            self.host.hand_back(lane)

        def run(self, task: Any) -> Any:
            import numpy as np

            (kind, payload, state, pos), times = self.host.run(task)
            if kind == "batch":
                # an array travels through the object store as a buffer and
                # is read on the trainer's node without a copy
                payload = np.frombuffer(payload, dtype=np.uint8)
            return (kind, payload, state, pos), times

        def open_stream(self) -> tuple[str, int]:
            """A port on this node for the trainer's relay to connect to."""
            self.listener = socket.create_server((ray.util.get_node_ip_address(), 0))
            self.listener.settimeout(CONNECT_WITHIN)
            return self.listener.getsockname()[:2]

        def accept_stream(self) -> None:
            if self.stream is not None:  # (a relay before this one's)
                self.stream.close()
            conn, _ = self.listener.accept()
            self.listener.close()
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            self.stream = conn

        def run_streamed(self, task: Any) -> Any:
            """``run``, the batch's record written to the stream (which
            the relay reads as this runs): a frame for every task, so
            that the relay never waits for one that does not come."""
            assert self.stream is not None
            try:
                (kind, payload, state, pos), times = self.host.run(task)
            except BaseException:
                self.stream.sendall(struct.pack(_HEADER, NO_BATCH))
                raise
            if kind == "batch":
                self.stream.sendall(struct.pack(_HEADER, len(payload)))
                self.stream.sendall(payload)
                payload = len(payload)
            else:
                self.stream.sendall(struct.pack(_HEADER, NO_BATCH))
            return (kind, payload, state, pos), times

    _actor_class.cls = ray.remote(Worker)  # type: ignore[attr-defined]
    return _actor_class.cls  # type: ignore[attr-defined]


class RayPool:
    """A loader's Ray workers: one actor per worker id while its relay
    runs, placed as ``RayWorkers`` says, replaced when it dies, handed back
    to the idle pool when its relay ends."""

    def __init__(self, options: RayWorkers, owner: str) -> None:
        self.ray = ray_module()
        self.options = options
        self.owner = owner  # how a placement error names this loader
        ray = self.ray
        if not ray.is_initialized():
            try:
                _probe(options.address)
                ray.init(address=options.address, ignore_reinit_error=True,
                         log_to_driver=False)
            except Exception as e:
                raise ConfigError(
                    f"worker_method='ray': cannot reach the Ray cluster at "
                    f"{options.address or 'the default address'}: {type(e).__name__}: {e}"
                ) from None
        else:
            _check_connected(ray, options.address)
        self.trainer_node = ray.get_runtime_context().get_node_id()
        self.actors: dict[int, Any] = {}
        # per worker, which relay holds its actor (a relay that ends hands
        # it back only if no later relay took it meanwhile)
        self.holder: dict[int, int] = {}
        self.places: dict[int, WorkerPlace] = {}
        self.lock = _LOCK
        # (actors belong to one connection: after ray.shutdown() and a new
        # ray.init(), the idle ones of the old are not taken)
        self.session = _session(ray)
        _POOLS.add(self)
        weakref.finalize(self, _idle, self.session, options, self.actors)

    def _new_actor(self, worker_id: int) -> Any:
        ray = self.ray
        opts: dict[str, Any] = {"num_cpus": self.options.num_cpus, "max_restarts": 0}
        if self.options.resources:
            opts["resources"] = self.options.resources
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if not alive:
            raise RayWorkerLost(f"DataLoader worker {worker_id}: no Ray node is alive",
                                worker_id)
        labelled = all("ray.io/node-id" in (n.get("Labels") or {}) for n in alive)
        others = [n for n in alive if n["NodeID"] != self.trainer_node]
        if self.options.avoid_trainer_node and others and labelled:
            # any node but the trainer's (while another is alive: when only
            # the trainer's is left, a replaced actor goes there)
            from ray.util.scheduling_strategies import NodeLabelSchedulingStrategy, NotIn

            opts["scheduling_strategy"] = NodeLabelSchedulingStrategy(
                hard={"ray.io/node-id": NotIn(self.trainer_node)})
            alive = others
        else:
            opts["scheduling_strategy"] = "SPREAD"
        _check_feasible(self.options, alive)
        return _actor_class(ray).options(**opts).remote()

    def ensure(self, worker_ids: list[int], relay_ids: list[int]) -> None:
        """An actor for each of ``worker_ids``, held by the relays
        ``relay_ids``: idle ones of loaders placed the same way first (the
        other idle ones are ended, for their room), new ones started side
        by side. On failure, those started here are ended."""
        fresh: list[int] = []
        with self.lock:
            missing = [w for w in worker_ids if w not in self.actors]
            key = _placement(self.session, self.options)
            for other in [k for k in _IDLE if k != key]:
                _kill(self.ray, [a for a, _ in _IDLE.pop(other)])
            idle = _IDLE.setdefault(key, [])
            try:
                for w in missing:
                    self.actors[w] = idle.pop()[0] if idle else self._new_actor(w)
                    fresh.append(w)
            except BaseException:
                _kill(self.ray, [self.actors.pop(w) for w in fresh])
                raise
            for w, r in zip(worker_ids, relay_ids):
                self.holder[w] = r
        try:
            self._place({w: 0 for w in fresh})
        except BaseException:
            with self.lock:
                _kill(self.ray, [self.actors.pop(w) for w in fresh if w in self.actors])
            raise

    def _place(self, restarts: dict[int, int]) -> None:
        """Waits until the actors of the workers ``restarts`` names have
        started, and notes where (with their restart counts). Actors handed
        back meanwhile (an epoch that just ended) take the place of those
        still waiting, and a dead idle one is replaced; the wait is said in
        the log after a few seconds, and is an error past ``place_within``."""
        ray, key = self.ray, _placement(self.session, self.options)
        lost = _lost_errors(ray)
        refs = {w: self._ping(w) for w in restarts}
        t0, warned = time.monotonic(), False
        within = self.options.place_within
        while True:
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0.2)
            for w, ref in list(refs.items()):
                if ref not in ready:
                    continue
                try:
                    ip, node = ray.get(ref)
                except lost:  # an idle actor that died meanwhile
                    with self.lock:
                        self.actors[w] = self._new_actor(w)
                    refs[w] = self._ping(w)
                    continue
                self.places[w] = WorkerPlace(w, ip, node, restarts[w])
                del refs[w]
            if not refs:
                return
            with self.lock:
                idle = _IDLE.get(key) or []
                for w in list(refs)[:len(idle)]:
                    _kill(ray, [self.actors[w]])
                    self.actors[w] = idle.pop()[0]
                    refs[w] = self._ping(w)
            waited = time.monotonic() - t0
            if not warned and waited >= WARN_PLACING_AFTER and within > WARN_PLACING_AFTER:
                warned = True
                log.warning("ferroloader: %d of %d Ray worker actors wait for room on the "
                            "cluster (each asks %s; free now: %s; held: %s). Waiting up to "
                            "%.0f s (RayWorkers(place_within=...))", len(refs), len(restarts),
                            self.options.request(), _free(ray), holders(), within)
            if waited >= within:
                raise ConfigError(
                    f"worker_method='ray': {len(refs)} of {len(restarts)} worker actors could "
                    f"not be placed within {within:.0f} s (each asks {self.options.request()}; "
                    f"the cluster has {_free(ray)} free). Held by ferroloader now: "
                    f"{holders()}. A loader hands its actors back at the end of an epoch "
                    "without persistent workers, at loader.close() or the end of a `with "
                    "loader:` block; idle ones end after RayWorkers(idle_timeout=) or at "
                    "ferroloader.ray.release()"
                )

    def _ping(self, w: int) -> Any:
        """Worker ``w``'s actor's ``place()`` call; an actor that is gone
        (an idle one of a cluster shut down) is replaced first."""
        try:
            return self.actors[w].place.remote()
        except Exception:
            with self.lock:
                self.actors[w] = self._new_actor(w)
            return self.actors[w].place.remote()

    def actor(self, worker_id: int, replace: bool = False) -> Any:
        """Worker ``worker_id``'s actor (a new one when ``replace``)."""
        with self.lock:
            if not (replace or worker_id not in self.actors):
                return self.actors[worker_id]
            old = self.actors.pop(worker_id, None)
            if old is not None:
                _kill(self.ray, [old])
            self.actors[worker_id] = self._new_actor(worker_id)
            last = self.places.get(worker_id)
            restarts = last.restarts + 1 if replace and last is not None else 0
        try:
            self._place({worker_id: restarts})
        except BaseException:
            with self.lock:
                _kill(self.ray, [self.actors.pop(worker_id)])
            raise
        return self.actors[worker_id]

    def give_back(self, worker_id: int, relay_id: int, alive: bool) -> None:
        """Relay ``relay_id`` ended: worker ``worker_id``'s actor goes idle
        (or ends, when it failed), unless a later relay holds it."""
        with self.lock:
            if self.holder.get(worker_id) != relay_id or worker_id not in self.actors:
                return
            del self.holder[worker_id]
            actor = self.actors.pop(worker_id)
            if alive:
                _idle(self.session, self.options, {worker_id: actor})
            else:
                _kill(self.ray, [actor])

    def held(self) -> int:
        return len(self.actors)

    def close(self) -> None:
        """The actors go back to the idle ones, for the next loader."""
        with self.lock:
            self.holder.clear()
            _idle(self.session, self.options, self.actors)


def _check_connected(ray: Any, address: Optional[str]) -> None:
    """``address`` names the cluster this process is connected to (or is
    left to it): a process is connected to one cluster at a time."""
    if address is None or address in ("auto", "local") or "://" in address:
        return  # (a ray:// client address cannot be compared here)
    try:
        gcs = ray.get_runtime_context().gcs_address
    except Exception:
        return
    if not gcs or _same_endpoint(address, gcs, ray):
        return
    raise ConfigError(
        f"RayWorkers(address={address!r}): this process is connected to the Ray cluster at "
        f"{gcs}, and a process is connected to one cluster at a time: leave address=None to "
        "use the connected one, or call ray.shutdown() first"
    )


def _same_endpoint(a: str, b: str, ray: Any) -> bool:
    (ha, _, pa), (hb, _, pb) = a.rpartition(":"), b.rpartition(":")
    if pa != pb:
        return False
    try:
        ia, ib = socket.gethostbyname(ha), socket.gethostbyname(hb)
    except OSError:
        return ha == hb
    if ia == ib:
        return True
    here = {ray.util.get_node_ip_address()}
    local = lambda ip: ip.startswith("127.") or ip in here  # noqa: E731
    return local(ia) and local(ib)


def _check_feasible(options: RayWorkers, nodes: list[dict[str, Any]]) -> None:
    """A request that no node alive could hold even when idle is an error
    now (Ray would keep it pending for ever)."""
    ask = options.request()
    if any(all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in ask.items()) for n in nodes):
        return
    have = "; ".join(
        f"{n.get('NodeManagerAddress', '?')}: "
        + ", ".join(f"{k}={v:g}" for k, v in sorted(n.get("Resources", {}).items())
                    if not k.startswith(("node:", "memory", "object_store_memory")))
        for n in nodes)
    where = " on a node other than the trainer's" if options.avoid_trainer_node else ""
    raise ConfigError(
        f"worker_method='ray': no node of the Ray cluster can hold a worker actor, which asks "
        f"{ask}{where} (the nodes have {have}): lower RayWorkers(num_cpus=, resources=), or "
        "add a node that has them"
    )


def _free(ray: Any) -> dict[str, float]:
    try:
        free = ray.available_resources()
    except Exception:
        return {}
    return {k: v for k, v in sorted(free.items())
            if not k.startswith(("node:", "memory", "object_store_memory"))}


def holders() -> str:
    """The live loaders that hold Ray worker actors, and the idle actors."""
    with _LOCK:
        live = [(p.owner, p.held(), p.options.request()) for p in list(_POOLS) if p.held()]
        idle = sum(len(v) for v in _IDLE.values())
    parts = [f"{owner} holds {n} actor{'s' if n > 1 else ''} of {ask}" for owner, n, ask in live]
    if idle:
        parts.append(f"{idle} idle actor{'s' if idle > 1 else ''} (handed back, kept warm)")
    return "; ".join(parts) or "no loader"


def _probe(address: Optional[str]) -> None:
    """A ``host:port`` cluster address that refuses connections is an error
    now (``ray.init`` would retry it for minutes)."""
    if not address or "://" in address or address == "auto" or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return
    with socket.create_connection((host, int(port)), timeout=10):
        pass


# Actors handed back, by how they were placed, with when: a Ray actor takes
# seconds to start (it imports torch), so the next loader takes these first.
_IDLE: dict[tuple[Any, ...], list[tuple[Any, float]]] = {}
# Every loader's pool (for naming who holds actors), and the lock of both.
_POOLS: weakref.WeakSet[RayPool] = weakref.WeakSet()
_LOCK = threading.RLock()


def release() -> int:
    """Ends the idle worker actors now (those that loaders handed back and
    no loader has taken since), so that their CPUs serve other Ray work;
    returns how many ended. They also end by themselves after
    ``RayWorkers(idle_timeout=)`` seconds.

    >>> import ferroloader.ray
    >>> ferroloader.ray.release()
    0
    """
    with _LOCK:
        idle = [a for actors in _IDLE.values() for a, _ in actors]
        _IDLE.clear()
    if idle:
        _kill(ray_module(), idle)
    return len(idle)


def _placement(session: str, options: RayWorkers) -> tuple[Any, ...]:
    return (session, options.address, options.num_cpus, tuple(sorted(options.resources.items())),
            options.avoid_trainer_node, options.idle_timeout)


def _idle(session: str, options: RayWorkers, actors: dict[int, Any]) -> None:
    """``actors`` handed back: idle, ended after ``options.idle_timeout``."""
    if not actors:
        return
    gone = list(actors.values())
    actors.clear()
    ray = ray_module()
    if not ray.is_initialized() or _session(ray) != session:
        return  # (the connection is gone, and its actors with it)
    for a in gone:
        try:
            a.reset.remote()
        except Exception:
            pass
    if options.idle_timeout <= 0:
        _kill(ray, gone)
        return
    now = time.monotonic()
    with _LOCK:
        _IDLE.setdefault(_placement(session, options), []).extend((a, now) for a in gone)
    timer = threading.Timer(options.idle_timeout + 0.05, _reap)
    timer.daemon = True
    timer.start()


def _reap() -> None:
    """Ends the actors idle for longer than their ``idle_timeout``."""
    now = time.monotonic()
    ended = []
    with _LOCK:
        for key in list(_IDLE):
            timeout = key[-1]
            keep = [(a, t) for a, t in _IDLE[key] if now - t < timeout]
            ended += [a for a, t in _IDLE[key] if now - t >= timeout]
            if keep:
                _IDLE[key] = keep
            else:
                del _IDLE[key]
    if ended:
        try:
            _kill(ray_module(), ended)
        except Exception:
            pass  # (Ray shut down meanwhile: its actors went with it)


def _session(ray: Any) -> Any:
    """This process's connection: its cluster and job (job ids start again
    in each new cluster)."""
    try:
        ctx = ray.get_runtime_context()
        return (ctx.gcs_address, ctx.get_job_id())
    except Exception:
        return None


def _kill(ray: Any, actors: list[Any]) -> None:
    if not ray.is_initialized():
        return  # (a call would start a new local cluster)
    for a in actors:
        try:
            ray.kill(a)
        except Exception:
            pass


def _lost_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """The errors that say an actor (or its node) is gone."""
    ex = ray.exceptions
    names = ("RayActorError", "ActorDiedError", "ActorUnavailableError",
             "ObjectLostError", "OwnerDiedError", "NodeDiedError", "WorkerCrashedError")
    return tuple(getattr(ex, n) for n in names if hasattr(ex, n))


class Relay:
    """Worker ``worker_id``'s relay in the training process: the worker
    loop's calls (``_core.relay_loop``) sent to its actor, which is
    replaced, and brought back to where it stood, when it dies."""

    def __init__(self, pool: RayPool, worker_id: int, dataset_ref: Any, job: dict[str, Any],
                 base_seed: int, num_workers: int, relay_id: int) -> None:
        self.pool = pool
        self.relay_id = relay_id
        self.task: Any = None  # the task under way (named if its actor is lost)
        self.failed = False  # its actor was lost for good
        self.ray = pool.ray
        self.worker_id = worker_id
        self.dataset_ref = dataset_ref
        self.job = job
        self.base_seed = base_seed
        self.num_workers = num_workers
        self.lost = _lost_errors(self.ray)
        self.iterable = job["iterable"] and job["shards"] is None
        self._forget()
        self.streamed = pool.options.transport == "stream"
        self.sock: Optional[socket.socket] = None
        self.buf = bytearray()
        self.actor = pool.actor(worker_id)
        self.pending_setup = self._submit_setup(self.actor)

    def _forget(self) -> None:
        """A new epoch: no lanes, nothing assigned."""
        self.lane_setup: Optional[tuple[list[int], bool, int, int]] = None
        self.works: dict[int, list[tuple[int, int, int]]] = {}
        self.last: dict[int, bool] = {}
        self.handing_back: set[int] = set()
        self.pos: dict[int, tuple[int, int, int]] = {}
        self.started = False

    def _submit_setup(self, actor: Any) -> Any:
        return actor.setup.remote(self.dataset_ref, self.job, self.base_seed, self.num_workers)

    def _setup(self, actor: Any) -> Any:
        self.ray.get(self._submit_setup(actor))
        return actor

    def _connect(self) -> None:
        """The stream to the current actor (a new one after a replacement)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        addr = self.ray.get(self.actor.open_stream.remote())
        sock = socket.create_connection(tuple(addr), timeout=CONNECT_WITHIN)
        self.ray.get(self.actor.accept_stream.remote())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.settimeout(STALL_CHECK)
        self.sock = sock

    def _read(self, ref: Any, n: int) -> memoryview:
        """``n`` bytes of the stream; a ``ConnectionError`` if it ends, or
        if they do not come after ``ref``'s task ended; the task's error
        if it failed."""
        if len(self.buf) < n:
            self.buf = bytearray(n)
        view = memoryview(self.buf)[:n]
        got = 0
        ended = 0.0  # seconds waited since the task ended
        assert self.sock is not None
        while got < n:
            try:
                k = self.sock.recv_into(view[got:])
            except socket.timeout:
                # the stream is quiet: an actor (or node) that Ray saw die
                # fails the task, which raises here (and is replaced); a
                # task that returned wrote its frame, which must arrive
                ready, _ = self.ray.wait([ref], timeout=0)
                if ready:
                    self.ray.get(ref)
                    ended += STALL_CHECK
                    if ended >= CONNECT_WITHIN:
                        raise ConnectionError(
                            f"the worker's frame did not arrive within {CONNECT_WITHIN:.0f} s "
                            "of its task's end") from None
                continue
            if k == 0:
                raise ConnectionError("the worker's stream closed")
            got += k
        return view

    def place(self) -> WorkerPlace:
        return self.pool.places[self.worker_id]

    # the worker loop's calls

    def start_epoch(self) -> Optional[bytes]:
        self._forget()
        self.started = True
        if self.pending_setup is not None:
            setup, self.pending_setup = self.pending_setup, None
            try:
                self.ray.get(setup)
            except self.lost as e:
                self._replace(e)
        return self._call(lambda a: a.start_epoch.remote())

    def lanes(self, lanes: list[int], shuffle: bool, block: int, root: int) -> None:
        self.lane_setup = (list(lanes), shuffle, block, root)
        self._call(lambda a: a.lanes.remote(lanes, shuffle, block, root))

    def assign(self, lane: int, works: list[tuple[int, int, int]], last: bool) -> None:
        self.works.setdefault(lane, []).extend(tuple(w) for w in works)  # type: ignore[misc]
        self.last[lane] = self.last.get(lane, False) or last
        self._call(lambda a: a.assign.remote(lane, works, last))

    def hand_back(self, lane: int) -> None:
        self.handing_back.add(lane)
        self._call(lambda a: a.hand_back.remote(lane))

    def run(self, task: Any) -> Any:
        self.task = task
        if self.streamed:
            reply, times = self._streamed(task)
        else:
            reply, times = self._call(lambda a: a.run.remote(task))
        pos = reply[3]
        if pos is not None:
            lane, started, shard, emitted = pos
            self.pos[lane] = (started, shard, emitted)
        return reply, times

    def wrap(self, exc: BaseException) -> bytes:
        """The relay's own error as a worker's exception (pickled as the
        worker loop pickles the user's)."""
        from torch._utils import ExceptionWrapper

        if isinstance(exc, RayWorkerLost):
            # the relay's own story, raised as it is (no relay traceback)
            return pickle.dumps(_Raise(exc))
        cause = getattr(exc, "cause", None)  # a RayTaskError: the error raised in the actor
        if isinstance(exc, self.ray.exceptions.RayTaskError) and isinstance(cause, Exception):
            exc = cause
        place = self.place()
        where = f"in DataLoader worker {self.worker_id} (a Ray actor on node {place.node_ip})"
        return pickle.dumps(ExceptionWrapper((type(exc), exc, exc.__traceback__), where=where))

    # faults

    def _call(self, submit: Any) -> Any:
        """``ray.get(submit(actor))``; an actor lost on the way is replaced
        and the call made again (at most ``max_restarts`` times)."""
        while True:
            try:
                return self.ray.get(submit(self.actor))
            except self.lost as e:
                self._replace(e)

    def _streamed(self, task: Any) -> Any:
        """A task on the stream: its frame read as it runs (the actor
        writes it before it returns), then its reply. The batch is handed
        to the engine as an array over the relay's buffer, which the
        engine copies into its arena before the next task."""
        import numpy as np

        while True:
            if self.sock is None:
                self._connect()
            ref = self.actor.run_streamed.remote(task)
            try:
                (n,) = struct.unpack(_HEADER, self._read(ref, _HEADER_SIZE))
                view = None if n == NO_BATCH else self._read(ref, n)
                (kind, payload, state, pos), times = self.ray.get(ref)
            except self.lost as e:
                self._replace(e)
                continue
            except OSError as e:  # the stream lost: its actor (or node) is going
                self._replace(self._why_broken(ref, e))
                continue
            if kind == "batch":
                assert view is not None and payload == n
                payload = np.frombuffer(view, dtype=np.uint8)
            return (kind, payload, state, pos), times

    def _why_broken(self, ref: Any, broken: OSError) -> BaseException:
        """Why a task's stream broke, in Ray's words where it has them (the
        actor's or node's death fails the task soon after)."""
        try:
            self.ray.get(ref, timeout=10)
        except self.lost as e:
            return e
        except Exception:
            pass
        return broken

    def _replace(self, cause: BaseException) -> None:
        place = self.place()
        if self.iterable:
            self._lost(place, cause, "and an IterableDataset's replica cannot move to another "
                       "actor: make the dataset a ferroloader.ShardedDataset (its shards are "
                       "read again from where they stood)")
        if place.restarts >= self.pool.options.max_restarts:
            self._lost(place, cause, f"after {place.restarts} restarts (RayWorkers(max_restarts="
                       f"{self.pool.options.max_restarts}))")
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        try:
            actor = self._setup(self.pool.actor(self.worker_id, replace=True))
        except self.lost as e:
            self._replace(e)
            return
        except ConfigError as e:  # no node can take it now
            self._lost(place, cause, f"and no node could take a new actor ({e})")
        if self.started:
            # where the lost actor stood: its epoch, its lanes at their
            # last batch's position, what it was told to hand back
            self.ray.get(actor.start_epoch.remote())
            if self.lane_setup is not None:
                self.ray.get(actor.lanes.remote(*self.lane_setup))
                for lane, works in self.works.items():
                    self.ray.get(actor.assign.remote(lane, self._rest(lane, works),
                                                     self.last.get(lane, False)))
                    if lane in self.handing_back:
                        self.ray.get(actor.hand_back.remote(lane))
        self.actor = actor

    def _lost(self, place: WorkerPlace, cause: BaseException, why: str) -> None:
        """Raises ``RayWorkerLost``: the worker, its node, what it was
        reading and how its actor ended, then Ray's own words."""
        self.failed = True
        code, how = _how_it_ended(cause)
        what = _describe_task(self.task)
        raise RayWorkerLost(
            f"DataLoader worker {self.worker_id} (a Ray actor on node {place.node_ip}) was lost "
            f"while {what}: {how}; it was not replaced {why}. Ray said: "
            f"{type(cause).__name__}: {_first_lines(cause)}",
            self.worker_id, place.node_ip, code, self.task)

    def end(self) -> None:
        """The relay's loop ended: its stream closes, its actor goes back."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.pool.give_back(self.worker_id, self.relay_id, alive=not self.failed)

    def _rest(self, lane: int, works: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """What lane ``lane`` still has to read: the work it was reading
        from its last batch's position, then those it had not begun."""
        pos = self.pos.get(lane)
        if pos is None:
            return list(works)
        started, shard, emitted = pos
        current = works[started - 1] if 0 < started <= len(works) else (shard, emitted, 2**64 - 1)
        return [(shard, emitted, current[2]), *works[started:]]


class _Raise:
    """A relay's ``RayWorkerLost``, pickled where a worker's exception
    wrapper goes: ``reraise()`` raises it as it is."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def reraise(self) -> None:
        raise self.exc


def _how_it_ended(cause: BaseException) -> tuple[Optional[int], str]:
    """``(exit code, how)`` of a lost actor, as far as Ray's error says."""
    text = str(cause)
    code = re.search(r"exit code (-?\d+)", text)
    if "killed by `ray.kill`" in text:
        return None, "its actor was killed (ray.kill)"
    if code is not None:
        return int(code.group(1)), f"its process exited with code {code.group(1)}"
    if re.search(r"node .*(died|dead|removed|terminated)", text, re.I) \
            or type(cause).__name__ == "NodeDiedError":
        return None, "its node was lost"
    if isinstance(cause, OSError):
        return None, f"its stream broke ({cause})"
    return None, ("its process ended without an exit status Ray could read (os._exit, a "
                  "signal such as SIGKILL from the OOM killer, or a crash)")


def _describe_task(task: Any) -> str:
    if not isinstance(task, tuple) or len(task) != 2:
        return "setting up"
    kind, value = task
    if kind == "ints":
        shown = ", ".join(map(str, value[:16])) + (", ..." if len(value) > 16 else "")
        return f"reading indices [{shown}]"
    if kind == "int":
        return f"reading index {value}"
    if kind == "lane":
        return f"reading lane {value} of the sharded dataset"
    if kind == "addresses":
        return f"reading {len(value)} items by address, from (shard, item) {tuple(value[0])}" \
            if value else "reading by address"
    if kind == "iterable":
        return "iterating its replica of the IterableDataset"
    return "reading a batch from a custom sampler"


def _first_lines(cause: BaseException, n: int = 3) -> str:
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    return " ".join(lines[:n]) if lines else "(no message)"


_relay_ids = [0]


def start(loader: Any, jobs: list[dict[str, Any]], base_seed: int, socks: list[socket.socket],
          threads: list[Any], pids: list[int]) -> None:
    """``worker_method="ray"``: per worker, an actor (held while its relay
    runs) and a relay thread here that the engine talks to."""
    options = loader.worker_method if isinstance(loader.worker_method, RayWorkers) \
        else RayWorkers()
    pool = getattr(loader, "_ray_pool", None)
    if pool is None or pool.options != options:
        if pool is not None:
            pool.close()
        owner = (f"a DataLoader over {type(loader.dataset).__name__} "
                 f"(id {id(loader):#x}, num_workers={len(jobs)})")
        pool = loader._ray_pool = RayPool(options, owner)
    ray = pool.ray
    with _LOCK:
        ids = [_relay_ids[0] + k for k in range(len(jobs))]
        _relay_ids[0] += len(jobs)
    pool.ensure([job["worker_id"] for job in jobs], ids)
    started = 0
    try:
        try:
            dataset_ref = ray.put(loader.dataset)
        except Exception as e:
            raise ConfigError(
                f"worker_method='ray': the dataset cannot be sent to the Ray workers: "
                f"{type(e).__name__}: {e}"
            ) from None
        relays = []
        for job, rid in zip(jobs, ids):
            job = {**job}
            relays.append(Relay(pool, job["worker_id"], dataset_ref, job, base_seed, len(jobs),
                                rid))
        loader._ray_relays = relays
        for job, relay in zip(jobs, relays):
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            socks.append(parent)
            shm = (job["shm_initial"], job["shm_limit"], job["prefetch_factor"], job["trim"])
            t = threading.Thread(target=_relay_thread, args=(child, relay, shm),
                                 name=f"pt_data_worker_{job['worker_id']}_ray", daemon=True)
            t.start()
            started += 1
            threads.append(t)
            pids.append(0)
    except BaseException:
        # the actors no relay thread took go back (the threads hand back theirs)
        for job, rid in list(zip(jobs, ids))[started:]:
            pool.give_back(job["worker_id"], rid, alive=True)
        raise


def _relay_thread(sock: socket.socket, relay: Relay, shm: tuple[int, int, int, bool]) -> None:
    try:
        _core.relay_loop(sock.detach(), relay, shm)
    finally:
        relay.end()


def places(loader: Any) -> list[WorkerPlace]:
    """Where each of the loader's Ray workers runs (``stats().ray``)."""
    pool = getattr(loader, "_ray_pool", None)
    if pool is None:
        return []
    return [pool.places[k] for k in sorted(pool.places)]


__all__ = ["RayWorkerLost", "RayWorkers", "WorkerPlace", "release"]
