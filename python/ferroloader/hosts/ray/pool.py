"""Who holds the cluster's room: a loader's actors while its relays run,
the idle ones handed back (taken by the next loader placed the same way,
ended after ``idle_timeout``), placement checked before Ray is asked and
waited for within ``place_within``."""

from __future__ import annotations

import logging
import socket
import threading
import time
import weakref
from typing import Any, Optional

from ferroloader.errors import ConfigError, RayWorkerLost
from ferroloader.hosts.ray.actor import _actor_class
from ferroloader.hosts.ray.options import RayWorkers, WorkerPlace, ray_module

log = logging.getLogger("ferroloader.ray")



# After this many seconds waiting for room on the cluster, a loader says so.
WARN_PLACING_AFTER = 5.0


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


__all__ = ["RayPool", "holders", "release"]
