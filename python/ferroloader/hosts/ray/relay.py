"""The relay in the training process: per Ray worker a thread runs the
engine's worker loop (``_core.relay_loop``) whose every call goes to the
worker's actor; an actor lost is replaced and brought to where it stood, or
its story told (``RayWorkerLost``)."""

from __future__ import annotations

import pickle
import re
import socket
import struct
import threading
from typing import Any, Optional

import ferroloader._core as _core
from ferroloader.errors import ConfigError, RayWorkerLost
from ferroloader.hosts.ray.actor import _HEADER, _HEADER_SIZE, CONNECT_WITHIN, NO_BATCH
from ferroloader.hosts.ray.options import RayWorkers, WorkerPlace
from ferroloader.hosts.ray.pool import _LOCK, RayPool, _lost_errors

STALL_CHECK = 1.0


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


def start(loader: Any, plan: Any, jobs: list[dict[str, Any]], socks: list[socket.socket],
          threads: list[Any], pids: list[int]) -> None:
    """``worker_method="ray"``: per worker, an actor (held while its relay
    runs) and a relay thread here that the engine talks to."""
    base_seed = plan.base_seed
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


__all__ = ["Relay", "places", "start"]
