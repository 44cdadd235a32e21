"""Workers on a Ray cluster: ``DataLoader(..., num_workers=n,
worker_method="ray")`` (or ``worker_method=ferroloader.RayWorkers(...)``).

Each worker is a Ray actor that runs ferroloader's own worker host on the
user's dataset: the same fetch, the same Rust collate into the same record
format as a worker process (``_core.ActorHost``). In the training process,
each worker has a relay thread running the worker loop
(``_core.relay_loop``) that the engine talks to as to a worker thread; the
relay sends each task to its actor and copies the batch's record, which
Ray's object store brought over (zero-copy on the trainer's node), into
its arena. The scheduler, the window, the order, the state, the seeds and
the decoding are those of local workers, so the batches are too.

An actor that dies (killed, its node gone) is replaced, on another node if
its own is gone: the relay starts a new actor with the same dataset and
worker id, brings it to where the lost one stood (a lane of a sharded
dataset at its last batch's position), and sends the task again; a task is
a pure function of its indices and seeds, so the epoch's batches do not
change. Past ``max_restarts`` for a worker, the task fails with an error
naming the worker and its node. ``ray`` is imported only here, and only
when asked.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional

from ferroloader import _core
from ferroloader.errors import ConfigError

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


def ray_module() -> Any:
    """``ray``, or a ``ConfigError`` naming the extra that brings it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "worker_method='ray' runs the workers as Ray actors, and Ray is not installed: "
            "pip install 'ferroloader[ray]' (or pip install ray)"
        ) from None
    return ray


class RayWorkers:
    """Where and how a loader's Ray workers run:
    ``DataLoader(ds, num_workers=8, worker_method=ferroloader.RayWorkers(...))``.

    - ``address``: the cluster's (``ray.init(address=...)``); default: the
      one this process is connected to, else the running one, else a local
      one.
    - ``num_cpus``, ``resources``: what each worker actor asks of its node.
    - ``avoid_trainer_node``: place the workers on nodes other than the
      training process's (when there are any).
    - ``max_restarts``: how many times each worker's actor is replaced
      after it died, before its task fails naming the worker and node.
    - ``transport``: how batches come to the training process:
      ``"stream"`` (default), a TCP connection per worker that the
      batch's record is written into and read from straight into the
      relay's arena; or ``"object_store"``, Ray's object store (which
      moves it between nodes, zero-copy on the trainer's). The stream
      measured 2x faster on images (the guide's costs section).

    >>> import ferroloader as fl
    >>> fl.RayWorkers(num_cpus=2, avoid_trainer_node=True)  # doctest: +NORMALIZE_WHITESPACE
    RayWorkers(address=None, num_cpus=2, resources=None, avoid_trainer_node=True,
               max_restarts=3, transport='stream')
    """

    def __init__(self, address: Optional[str] = None, num_cpus: float = 1,
                 resources: Optional[dict[str, float]] = None, avoid_trainer_node: bool = False,
                 max_restarts: int = 3, transport: str = "stream") -> None:
        if not isinstance(num_cpus, (int, float)) or isinstance(num_cpus, bool) or num_cpus < 0:
            raise ConfigError(f"RayWorkers num_cpus should be a non-negative number, but got "
                              f"{num_cpus!r}")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ConfigError(f"RayWorkers max_restarts should be a non-negative int, but got "
                              f"{max_restarts!r}")
        if transport not in TRANSPORTS:
            raise ConfigError(f"RayWorkers transport should be one of {TRANSPORTS}, but got "
                              f"{transport!r}")
        self.address = address
        self.transport = transport
        self.num_cpus = num_cpus
        self.resources = dict(resources or {})
        self.avoid_trainer_node = bool(avoid_trainer_node)
        self.max_restarts = max_restarts

    def __repr__(self) -> str:
        return (f"RayWorkers(address={self.address!r}, num_cpus={self.num_cpus!r}, "
                f"resources={self.resources or None!r}, "
                f"avoid_trainer_node={self.avoid_trainer_node!r}, "
                f"max_restarts={self.max_restarts!r}, transport={self.transport!r})")

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, RayWorkers) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))


@dataclass
class WorkerPlace:
    """Where a Ray worker runs: its node's IP and id, and how many times its
    actor was replaced."""

    worker: int
    node_ip: str
    node_id: str
    restarts: int = 0


class RayWorkerLost(RuntimeError):
    """A Ray worker's actor died more times than ``max_restarts`` allows, or
    could not be replaced (no node can take it)."""


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

        def place(self) -> tuple[str, str]:
            ctx = ray.get_runtime_context()
            return ray.util.get_node_ip_address(), ctx.get_node_id()

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
    """A loader's Ray workers: one actor per worker id, kept across epochs
    (a Ray actor starts in seconds: it imports torch), placed as
    ``RayWorkers`` says, replaced when it dies."""

    def __init__(self, options: RayWorkers) -> None:
        self.ray = ray_module()
        self.options = options
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
        self.trainer_node = ray.get_runtime_context().get_node_id()
        self.actors: dict[int, Any] = {}
        self.places: dict[int, WorkerPlace] = {}
        self.lock = threading.Lock()
        # (a loader that goes leaves its actors to the next, warm)
        # (actors belong to one connection: after ray.shutdown() and a new
        # ray.init(), the idle ones of the old are not taken)
        self.session = ray.get_runtime_context().get_job_id()
        weakref.finalize(self, _idle, self.session, options, self.actors)

    def _new_actor(self, worker_id: int) -> Any:
        ray = self.ray
        opts: dict[str, Any] = {"num_cpus": self.options.num_cpus, "max_restarts": 0}
        if self.options.resources:
            opts["resources"] = self.options.resources
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if not alive:
            raise RayWorkerLost(f"DataLoader worker {worker_id}: no Ray node is alive")
        labelled = all("ray.io/node-id" in (n.get("Labels") or {}) for n in alive)
        others = [n for n in alive if n["NodeID"] != self.trainer_node]
        if self.options.avoid_trainer_node and others and labelled:
            # any node but the trainer's (while another is alive: when only
            # the trainer's is left, a replaced actor goes there)
            from ray.util.scheduling_strategies import NodeLabelSchedulingStrategy, NotIn

            opts["scheduling_strategy"] = NodeLabelSchedulingStrategy(
                hard={"ray.io/node-id": NotIn(self.trainer_node)})
        else:
            opts["scheduling_strategy"] = "SPREAD"
        return _actor_class(ray).options(**opts).remote()

    def ensure(self, worker_ids: list[int]) -> None:
        """An actor for each of ``worker_ids``: idle ones of earlier loaders
        placed the same way first (the others are ended, for their CPUs),
        new ones started side by side."""
        with self.lock:
            missing = [w for w in worker_ids if w not in self.actors]
            key = _placement(self.session, self.options)
            for other in [k for k in _IDLE if k != key]:
                _kill(self.ray, _IDLE.pop(other))
            idle = _IDLE.setdefault(key, [])
            fresh = []
            for w in missing:
                self.actors[w] = idle.pop() if idle else self._new_actor(w)
                fresh.append(w)
            where = self._placed([self.actors[w] for w in fresh])
            for w, (ip, node) in zip(fresh, where):
                self.places[w] = WorkerPlace(w, ip, node, 0)

    def _placed(self, actors: list[Any]) -> list[tuple[str, str]]:
        """Where ``actors`` run, once they have started; a clear error when
        the cluster cannot place them."""
        ready, waiting = self.ray.wait([a.place.remote() for a in actors],
                                       num_returns=len(actors), timeout=PLACE_WITHIN)
        if waiting:
            raise ConfigError(
                f"worker_method='ray': {len(waiting)} of {len(actors)} worker actors could not "
                f"be placed within {PLACE_WITHIN:.0f} s (each asks num_cpus="
                f"{self.options.num_cpus}, resources={self.options.resources or None}; the "
                f"cluster has {self.ray.available_resources()} free)"
            )
        return [self.ray.get(r) for r in ready]

    def actor(self, worker_id: int, replace: bool = False) -> Any:
        """Worker ``worker_id``'s actor (a new one when ``replace``)."""
        with self.lock:
            if replace or worker_id not in self.actors:
                old = self.actors.pop(worker_id, None)
                if old is not None:
                    try:
                        self.ray.kill(old)
                    except Exception:
                        pass
                actor = self._new_actor(worker_id)
                ((ip, node),) = self._placed([actor])
                restarts = self.places[worker_id].restarts + 1 if replace else 0
                self.places[worker_id] = WorkerPlace(worker_id, ip, node, restarts)
                self.actors[worker_id] = actor
            return self.actors[worker_id]

    def close(self) -> None:
        """The actors go back to the idle ones, for the next loader."""
        with self.lock:
            _idle(self.session, self.options, self.actors)


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


# Actors of loaders that went, by how they were placed: a Ray actor takes
# seconds to start (it imports torch), so the next loader takes these first.
_IDLE: dict[tuple[Any, ...], list[Any]] = {}

# How long a loader waits for its actors to be placed.
PLACE_WITHIN = 120.0


def release() -> int:
    """Ends the idle worker actors (those that loaders which are gone left
    for the next one), so that their CPUs serve other Ray work; returns how
    many ended. A loader that is still alive keeps its own actors.

    >>> import ferroloader.ray
    >>> ferroloader.ray.release()
    0
    """
    idle = [a for actors in _IDLE.values() for a in actors]
    _IDLE.clear()
    if idle:
        _kill(ray_module(), idle)
    return len(idle)


def _placement(session: str, options: RayWorkers) -> tuple[Any, ...]:
    return (session, options.address, options.num_cpus, tuple(sorted(options.resources.items())),
            options.avoid_trainer_node)


def _idle(session: str, options: RayWorkers, actors: dict[int, Any]) -> None:
    _IDLE.setdefault(_placement(session, options), []).extend(actors.values())
    actors.clear()


def _kill(ray: Any, actors: list[Any]) -> None:
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
                 base_seed: int, num_workers: int) -> None:
        self.pool = pool
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
                self._replace(e)
                continue
            if kind == "batch":
                assert view is not None and payload == n
                payload = np.frombuffer(view, dtype=np.uint8)
            return (kind, payload, state, pos), times

    def _replace(self, cause: BaseException) -> None:
        place = self.place()
        if self.iterable:
            raise RayWorkerLost(
                f"DataLoader worker {self.worker_id}'s Ray actor on node {place.node_ip} died "
                f"({type(cause).__name__}), and an IterableDataset's replica cannot move to "
                "another actor: make the dataset a ferroloader.ShardedDataset (its shards are "
                "read again from where they stood)"
            )
        if place.restarts >= self.pool.options.max_restarts:
            raise RayWorkerLost(
                f"DataLoader worker {self.worker_id}'s Ray actor on node {place.node_ip} died "
                f"after {place.restarts} restarts (max_restarts="
                f"{self.pool.options.max_restarts}): {type(cause).__name__}: "
                f"{str(cause).splitlines()[0] if str(cause) else ''}"
            )
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        actor = self._setup(self.pool.actor(self.worker_id, replace=True))
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

    def _rest(self, lane: int, works: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """What lane ``lane`` still has to read: the work it was reading
        from its last batch's position, then those it had not begun."""
        pos = self.pos.get(lane)
        if pos is None:
            return list(works)
        started, shard, emitted = pos
        current = works[started - 1] if 0 < started <= len(works) else (shard, emitted, 2**64 - 1)
        return [(shard, emitted, current[2]), *works[started:]]


def start(loader: Any, jobs: list[dict[str, Any]], base_seed: int, socks: list[socket.socket],
          threads: list[Any], pids: list[int]) -> None:
    """``worker_method="ray"``: per worker, an actor (kept by the loader
    across epochs) and a relay thread here that the engine talks to."""
    options = loader.worker_method if isinstance(loader.worker_method, RayWorkers) \
        else RayWorkers()
    pool = getattr(loader, "_ray_pool", None)
    if pool is None or pool.options != options:
        if pool is not None:
            pool.close()
        pool = loader._ray_pool = RayPool(options)
    ray = pool.ray
    pool.ensure([job["worker_id"] for job in jobs])
    try:
        dataset_ref = ray.put(loader.dataset)
    except Exception as e:
        raise ConfigError(
            f"worker_method='ray': the dataset cannot be sent to the Ray workers: "
            f"{type(e).__name__}: {e}"
        ) from None
    relays = []
    for job in jobs:
        job = {**job}
        relays.append(Relay(pool, job["worker_id"], dataset_ref, job, base_seed, len(jobs)))
    loader._ray_relays = relays
    for job, relay in zip(jobs, relays):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        socks.append(parent)
        shm = (job["shm_initial"], job["shm_limit"], job["prefetch_factor"], job["trim"])
        t = threading.Thread(target=_relay_thread, args=(child, relay, shm),
                             name=f"pt_data_worker_{job['worker_id']}_ray", daemon=True)
        t.start()
        threads.append(t)
        pids.append(0)


def _relay_thread(sock: socket.socket, relay: Relay, shm: tuple[int, int, int, bool]) -> None:
    _core.relay_loop(sock.detach(), relay, shm)


def places(loader: Any) -> list[WorkerPlace]:
    """Where each of the loader's Ray workers runs (``stats().ray``)."""
    pool = getattr(loader, "_ray_pool", None)
    if pool is None:
        return []
    return [pool.places[k] for k in sorted(pool.places)]


__all__ = ["RayWorkerLost", "RayWorkers", "WorkerPlace", "release"]
