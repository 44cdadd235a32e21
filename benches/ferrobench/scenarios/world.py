"""The job's shared shard queue against static sharding, 4 ranks on this
machine (world_queue): one rank slow (3 ms of waiting per item, as a slow
node would add), then all ranks equal. Each round starts a job of 4 forked
rank processes per mode; the queue lives in a TCPStore the bench hosts.
An epoch's time is from the first rank's start to the last rank's end."""

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
SLOW = 0.003  # seconds of waiting per item on the slow rank


def _read_ints(path: str, start: int = 0) -> Any:
    yield from (int(v) for v in np.fromfile(path, dtype=np.int64)[start:])


def _rank(rank: int, mode: str, paths: List[str], lens: List[int], slow: bool, port: int,
          name: str, out: Any) -> None:
    import ferroloader as fl
    import torch.distributed as dist

    delay = SLOW if slow and rank == 0 else 0.0

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
    shards = loader.stats().queue.shards if mode == "world" else None
    out.put((rank, t0, time.monotonic(), n, shards))


def _job(mode: str, paths: List[str], lens: List[int], slow: bool, store: Any,
         round_no: int) -> Tuple[float, List[Any]]:
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


def sc_world_queue(st: Settings, fl: Any) -> List[Check]:
    """4 ranks, 64 shards of 100 items: static sharding against the shared
    queue, with one slow rank and with equal ranks (ferroloader against
    itself)."""
    import torch.distributed as dist

    multiprocessing.set_forkserver_preload(["torch", "numpy", "ferroloader"])
    n_shards, per = (32, 50) if st.quick else (64, 100)
    lens = [per] * n_shards
    folder = tempfile.mkdtemp(prefix="ferrobench-world-")
    try:
        paths = []
        for s in range(n_shards):
            p = os.path.join(folder, f"shard-{s:03d}.bin")
            (1000 * s + np.arange(per, dtype=np.int64)).tofile(p)
            paths.append(p)
        store = dist.TCPStore("127.0.0.1", 0, RANKS + 1, True, timeout=timedelta(seconds=60),
                              wait_for_workers=False)
        slow = Check("epoch seconds, shared queue, one slow rank", "s", "static sharding",
                     target=0.6, higher_is_better=False)
        equal = Check("epoch seconds, shared queue, equal ranks", "s", "static sharding",
                      target=1.1, higher_is_better=False)
        slow_share: List[float] = []
        for k in range(st.repeats):
            for check, is_slow in ((slow, True), (equal, False)):
                t_static, _ = _job("static", paths, lens, is_slow, store, k)
                t_world, reports = _job("world", paths, lens, is_slow, store, k)
                check.add(t_static, t_world)
                if is_slow:
                    slow_share.append(reports[0][4] / (n_shards / RANKS))
        slow.note = (
            f"the slow rank read {min(slow_share):.2f}-{max(slow_share):.2f} of the shards "
            f"static sharding gives it ({n_shards // RANKS} of {n_shards})"
        )
        return [slow, equal]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
