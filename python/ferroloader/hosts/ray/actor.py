"""The worker actor: ferroloader's worker host over the user's dataset on a
Ray node (``_core.ActorHost``), and the stream it writes batches into."""

from __future__ import annotations

import socket
import struct
from typing import Any, Optional

from ferroloader.hosts import entry

# A stream frame's header: the record's length, or NO_BATCH when the task
# made none (its reply says what instead).
_HEADER = "<Q"


_HEADER_SIZE = 8


NO_BATCH = 2**64 - 1


# How long the trainer waits for a worker's stream to be accepted, and
# between checks that a task it reads from is still running.
CONNECT_WITHIN = 30.0


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

            # (a worker process runs with one intra-op thread, as torch's do)
            torch.set_num_threads(1)
            self.host = entry.actor_host(dataset, job, base_seed, num_workers)

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
