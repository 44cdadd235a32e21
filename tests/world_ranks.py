"""One rank of the shared-queue tests (tests/test_world_queue_ranks.py):
gloo over loopback, the queue in the default process group's store. A rank
reads what its job spec says and writes what it read to
``out/rank<r>.json``; a state it saves goes to ``out/state<r>.json``."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

import ferroloader as fl
import numpy as np
import torch


def read_ints(path: str, start: int = 0) -> Any:
    yield from (int(v) for v in np.fromfile(path, dtype=np.int64)[start:])


class Slow(fl.FileShards):
    """File shards whose reads wait ``delay`` seconds an item (a slow node)."""

    def __init__(self, *args: Any, delay: float = 0.0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.delay = delay

    def iter_shard(self, shard: Any, start: int = 0) -> Any:
        for item in super().iter_shard(shard, start):
            if self.delay:
                time.sleep(self.delay)
            yield item


def make_loader(spec: dict[str, Any], rank: int) -> fl.DataLoader:
    kind = spec["kind"]
    extra: dict[str, Any] = {"num_workers": spec.get("nw", 0)}
    if extra["num_workers"]:
        extra["multiprocessing_context"] = "fork"
    sharding = fl.Sharding(mode="dynamic", across="world", even=spec["even"], shuffle_block=4)
    if kind in ("files", "s3"):
        cache = None
        if kind == "s3":
            cache = fl.ShardCache(dir=spec["cache"], budget="64MiB")
        delay = spec.get("delay", 0.0) if rank == spec.get("slow_rank", -1) else 0.0
        ds = Slow(spec["paths"], read_ints, lengths=spec["lens"], cache=cache, delay=delay)
        return fl.DataLoader(ds, batch_size=spec["batch"], shuffle=True, seed=3,
                             sharding=sharding, **extra)
    if kind == "table":
        ds = fl.TableShards(spec["paths"], columns=["id"])
        return fl.DataLoader(ds, batch_size=spec["batch"], shuffle=True, seed=3,
                             sharding=sharding, **extra)
    assert kind == "map"
    data = torch.arange(spec["n"])
    sampler = fl.DynamicDistributedSampler(data, block=5, even=spec["even"])
    return fl.DataLoader(data, batch_size=spec["batch"], sampler=sampler, **extra)


def ints(batch: Any) -> list[int]:
    if isinstance(batch, dict):
        batch = batch["id"]
    return [int(x) for x in batch]


def world_rank(rank: int, world: int, port: int, out: str, spec: dict[str, Any]) -> None:
    import torch.distributed as dist

    os.environ.update(spec.get("env", {}))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    record: dict[str, Any] = {"epochs": [], "error": None}
    ld = make_loader(spec, rank)
    if spec.get("resume"):
        states = [json.load(open(os.path.join(out, f"state{r}.json")))
                  for r in range(spec["resume"])]
        ld.load_state_dict(states)
    try:
        stop = spec.get("stop")
        for e in range(spec["epochs"]):
            it = iter(ld)
            seen: list[int] = []
            t0 = time.perf_counter()
            for k, batch in enumerate(it):
                seen += ints(batch)
                if stop is not None and e == 0 and k + 1 == stop:
                    # every rank at the same step, as a job checkpoints
                    dist.barrier()
                    with open(os.path.join(out, f"state{rank}.json"), "w") as f:
                        json.dump(ld.state_dict(), f)
                    record["before_stop"] = list(seen)
                    dist.barrier()
                    if rank in spec.get("die", []):
                        _write(out, rank, record)
                        os._exit(17)  # the rank is lost (and the job with it)
                if rank == spec.get("store_dies_with", -1) and k == 0:
                    os._exit(17)  # the rank that hosts the store goes
            record["epochs"].append({"items": seen, "seconds": time.perf_counter() - t0})
        record["queue"] = vars(ld.stats().queue)
    except Exception as e:
        record["error"] = f"{type(e).__name__}: {e}"
    _write(out, rank, record)
    if spec.get("die") or spec.get("store_dies_with") is not None:
        os._exit(0)  # the job is torn down; no barrier with the lost rank
    dist.barrier()  # the test's own: the store (rank 0's) outlives every rank's reads
    dist.destroy_process_group()


def _write(out: str, rank: int, record: dict[str, Any]) -> None:
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
