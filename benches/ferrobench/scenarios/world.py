"""The job's shared shard queue against static sharding, 4 ranks on this
machine (world_queue), ``even=False``: every rank waits 0.3 ms per item
(a read), one rank ten times that (a slow node), then all ranks equal; on
three shapes of data: 24 shards of 10-60 items, one shard per rank, 64
shards of 100. Each round starts a job of 4 rank processes per mode and
shape; the queue lives in a TCPStore the bench hosts. An epoch's time is
from the first rank's start to the last rank's end."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
from datetime import timedelta
from typing import Any, List, Tuple

import numpy as np

from ..harness import Check, Settings

RANKS = 4
ITEM = 0.0003  # seconds of waiting per item on every rank
SLOW = 10  # the slow rank waits this many times as long


def _read_ints(path: str, start: int = 0) -> Any:
    yield from (int(v) for v in np.fromfile(path, dtype=np.int64)[start:])


def _rank(rank: int, mode: str, paths: List[str], lens: List[int], slow: bool, port: int,
          name: str, out: Any) -> None:
    import ferroloader as fl
    import torch.distributed as dist

    delay = ITEM * (SLOW if slow and rank == 0 else 1)

    class Shards(fl.FileShards):
        def iter_shard(self, shard: Any, start: int = 0) -> Any:
            for item in super().iter_shard(shard, start):
                if delay:
                    time.sleep(delay)
                yield item

    if mode == "world":
        store = dist.TCPStore("127.0.0.1", port, RANKS + 1, False, timeout=timedelta(seconds=60))
        sharding = fl.Sharding(mode="dynamic", across="world", store=store, name=name,
                               rank=rank, world_size=RANKS, even=False)
    else:
        sharding = fl.Sharding(mode="static", rank=rank, world_size=RANKS, even=False)
    loader = fl.DataLoader(Shards(paths, _read_ints, lengths=lens), batch_size=32,
                           shuffle=True, seed=0, sharding=sharding)
    t0 = time.monotonic()
    n = sum(len(b) for b in loader)
    out.put((rank, t0, time.monotonic(), n))


def _job(mode: str, paths: List[str], lens: List[int], slow: bool, store: Any,
         round_no: str) -> Tuple[float, List[Any]]:
    """One epoch of the 4-rank job: its seconds, and each rank's report.
    Ranks come from the fork server (torch imported once): a fork of this
    process, whose store threads may hold the resolver's lock, could hang
    a rank's first connection to the store."""
    ctx = multiprocessing.get_context("forkserver")
    out = ctx.Queue()
    name = f"bench-{os.getpid()}-{round_no}-{mode}-{slow}"
    procs = [ctx.Process(target=_rank, args=(r, mode, paths, lens, slow, store.port, name, out))
             for r in range(RANKS)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    start = min(r[1] for r in reports)
    end = max(r[2] for r in reports)
    assert sum(r[3] for r in reports) == sum(lens), "an item was lost or read twice"
    return end - start, sorted(reports)


def _shapes(quick: bool) -> List[Tuple[str, List[int], float]]:
    """The data's shapes: (name, items per shard, the slow rank's target)."""
    rng = np.random.default_rng(0)
    few = [int(v) for v in rng.integers(10, 61, 24)]
    if quick:
        return [("24 shards of 10-60 items", few, 0.5)]
    return [("24 shards of 10-60 items", few, 0.5),
            ("one shard per rank (4 of 200 items)", [200] * RANKS, 0.6),
            ("64 shards of 100 items", [100] * 64, 0.2)]


def sc_world_queue(st: Settings, fl: Any) -> List[Check]:
    """4 ranks, ``even=False``, on three shapes of data: static sharding
    against the shared queue, with one rank ten times slower per item and
    with equal ranks (ferroloader against itself)."""
    import torch.distributed as dist

    multiprocessing.set_forkserver_preload(["torch", "numpy", "ferroloader"])
    folder = tempfile.mkdtemp(prefix="ferrobench-world-")
    checks: List[Check] = []
    try:
        store = dist.TCPStore("127.0.0.1", 0, RANKS + 1, True, timeout=timedelta(seconds=60),
                              wait_for_workers=False)
        for shape, lens, target in _shapes(st.quick):
            sub = os.path.join(folder, str(len(checks)))
            os.makedirs(sub)
            paths = []
            for s, n in enumerate(lens):
                p = os.path.join(sub, f"shard-{s:03d}.bin")
                (1000 * s + np.arange(n, dtype=np.int64)).tofile(p)
                paths.append(p)
            slow = Check(f"{shape}: epoch seconds, shared queue, one rank 10x slower", "s",
                         "static sharding", target=target, higher_is_better=False)
            equal = Check(f"{shape}: epoch seconds, shared queue, equal ranks", "s",
                          "static sharding", target=1.1, higher_is_better=False)
            share: List[float] = []
            for k in range(st.repeats):
                tag = f"{len(checks)}-{k}"
                for check, is_slow in ((slow, True), (equal, False)):
                    t_static, _ = _job("static", paths, lens, is_slow, store, tag)
                    t_world, reports = _job("world", paths, lens, is_slow, store, tag)
                    check.add(t_static, t_world)
                    if is_slow:
                        share.append(reports[0][3] / (sum(lens) / RANKS))
            slow.note = (
                f"the slow rank read {min(share):.2f}-{max(share):.2f} of a quarter of the "
                f"items ({sum(lens)} in all); at most 1.0x on every shape"
            )
            checks += [slow, equal]
        return checks
    finally:
        shutil.rmtree(folder, ignore_errors=True)
