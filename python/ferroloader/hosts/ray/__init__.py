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

from ferroloader.errors import RayWorkerLost
from ferroloader.hosts.ray.options import RayWorkers, WorkerPlace, ray_module
from ferroloader.hosts.ray.pool import holders, release
from ferroloader.hosts.ray.relay import places, start

__all__ = ["RayWorkerLost", "RayWorkers", "WorkerPlace", "holders", "places", "ray_module",
           "release", "start"]
