"""Where a loading job spends its time: ``DataLoader.stats()``.

Counted always (a few clock reads per batch). In the main process:
``wait`` (the training loop inside ``next()`` waiting for a batch; with
``num_workers=0`` the whole fetch and collate), ``decode`` (rebuilding a
batch over shared memory), ``pin`` (``pin_memory``) and ``loop`` (the
training loop's own time between batches). In the workers (or in the main
process with ``num_workers=0``): ``fetch`` (the dataset: ``__getitem__``,
``__getitems__``, an iterator, a table gather), ``collate`` and ``transfer``
(writing the batch into shared memory), summed over workers; a worker's
timings travel with each batch it sends, so once an epoch has ended every
batch its workers made is counted.

``FERROLOADER_WARN_WAITING=0.3`` (a share) warns once per iterator when the
training loop waits on data for more than that share of its time over 256
batches, naming the slowest stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_NS = 1e-9


@dataclass
class WorkerStats:
    """One worker's (or the main process's, with ``num_workers=0``) stage
    timings, in seconds: ``fetch`` (the dataset), ``collate``, ``transfer``
    (writing the batch into shared memory), and the ``batches`` it made.

    >>> import ferroloader, torch
    >>> loader = ferroloader.DataLoader(torch.arange(8), batch_size=2, num_workers=2)
    >>> _ = list(loader)
    >>> [w.batches for w in loader.stats().workers]
    [2, 2]
    """

    fetch: float = 0.0
    collate: float = 0.0
    transfer: float = 0.0
    batches: int = 0

    def __add__(self, other: WorkerStats) -> WorkerStats:
        return WorkerStats(
            self.fetch + other.fetch,
            self.collate + other.collate,
            self.transfer + other.transfer,
            self.batches + other.batches,
        )


@dataclass
class LoaderStats:
    """Stage timings of a loader's batches, in seconds (see the module doc):
    what ``DataLoader.stats()`` returns, summed over every epoch so far.
    ``print()`` it for a table.

    >>> import ferroloader, torch
    >>> loader = ferroloader.DataLoader(torch.arange(8), batch_size=2)
    >>> _ = list(loader)
    >>> stats = loader.stats()
    >>> stats.batches, 0.0 <= stats.waiting_share <= 1.0
    (4, True)
    >>> stats.limiting_stage() in ("fetch", "collate", "transfer", "decode", "pin")
    True
    """

    batches: int = 0
    wait: float = 0.0
    decode: float = 0.0
    pin: float = 0.0
    loop: float = 0.0
    workers: list[WorkerStats] = field(default_factory=list)
    # num_workers="auto": the layout, its changes and why (see
    # ferroloader.tuning); set by DataLoader.stats(), not summed
    autotune: Any = None
    # remote shards: what the shard cache did (ferroloader.CacheStats), set
    # by DataLoader.stats(), not summed
    remote: Any = None
    # Sharding(across="world"): what the job's shared queue did for this
    # rank (ferroloader.QueueStats), set by DataLoader.stats()
    queue: Any = None
    # worker_method="ray": where each worker runs (ferroloader.ray.WorkerPlace:
    # its node, its actor's restarts), set by DataLoader.stats()
    ray: Any = None

    @property
    def fetch(self) -> float:
        return sum(w.fetch for w in self.workers)

    @property
    def collate(self) -> float:
        return sum(w.collate for w in self.workers)

    @property
    def transfer(self) -> float:
        return sum(w.transfer for w in self.workers)

    @property
    def waiting_share(self) -> float:
        """The share of the training loop's time spent waiting for data."""
        total = self.wait + self.loop
        return self.wait / total if total > 0 else 0.0

    def limiting_stage(self) -> str:
        """The stage with the most time per batch (workers' stages per
        worker batch, the main process's per batch handed over)."""
        done = sum(w.batches for w in self.workers)
        stages = {
            "fetch": self.fetch / max(done, 1),
            "collate": self.collate / max(done, 1),
            "transfer": self.transfer / max(done, 1),
            "decode": self.decode / max(self.batches, 1),
            "pin": self.pin / max(self.batches, 1),
        }
        return max(stages, key=lambda k: stages[k])

    def __add__(self, other: LoaderStats) -> LoaderStats:
        n = max(len(self.workers), len(other.workers))
        mine = self.workers + [WorkerStats()] * (n - len(self.workers))
        theirs = other.workers + [WorkerStats()] * (n - len(other.workers))
        return LoaderStats(
            self.batches + other.batches,
            self.wait + other.wait,
            self.decode + other.decode,
            self.pin + other.pin,
            self.loop + other.loop,
            [a + b for a, b in zip(mine, theirs)],
        )

    @classmethod
    def from_engine(cls, raw: Any) -> LoaderStats:
        (wait, decode, pin, loop, batches), workers = raw
        return cls(
            int(batches),
            wait * _NS,
            decode * _NS,
            pin * _NS,
            loop * _NS,
            [WorkerStats(f * _NS, c * _NS, t * _NS, int(b)) for f, c, t, b in workers],
        )

    def __str__(self) -> str:
        def ms(s: float, n: int) -> str:
            return f"{s * 1e3 / n:8.3f}" if n else "       -"

        done = sum(w.batches for w in self.workers)
        lines = [
            f"{self.batches} batches; the training loop waited {self.waiting_share:.0%} of "
            f"its time (slowest stage: {self.limiting_stage()})",
            "stage            total s   ms/batch",
            f"main: wait     {self.wait:9.3f}   {ms(self.wait, self.batches)}",
            f"main: decode   {self.decode:9.3f}   {ms(self.decode, self.batches)}",
            f"main: pin      {self.pin:9.3f}   {ms(self.pin, self.batches)}",
            f"main: loop     {self.loop:9.3f}   {ms(self.loop, self.batches)}",
            f"work: fetch    {self.fetch:9.3f}   {ms(self.fetch, done)}",
            f"work: collate  {self.collate:9.3f}   {ms(self.collate, done)}",
            f"work: transfer {self.transfer:9.3f}   {ms(self.transfer, done)}",
        ]
        if self.autotune is not None:
            lines.append(str(self.autotune))
        if self.remote is not None:
            lines.append(str(self.remote))
        if self.queue is not None:
            lines.append(str(self.queue))
        if self.ray:
            lines.extend(f"ray worker {p.worker}: node {p.node_ip}, {p.restarts} restarts"
                         for p in self.ray)
        return "\n".join(lines)


def of_iterator(it: Any) -> LoaderStats:
    """The stats an engine iterator counted (empty for torch's iterators)."""
    raw = getattr(it, "_stats", None)
    return LoaderStats() if raw is None else LoaderStats.from_engine(raw)


__all__ = ["LoaderStats", "WorkerStats"]
