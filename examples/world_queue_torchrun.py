"""One shard queue for the whole job under torchrun, with the checkpoint
pattern that resumes it exactly: each rank saves its own loader state, and
on restart (on the same or another number of ranks) each rank loads its
own, or rank 0's where it has none. A state saved on several ranks holds
every rank's account of the queue, so any one of them resumes the job.

    torchrun --standalone --nproc-per-node=2 examples/world_queue_torchrun.py \
        --out run --stop-after 3          # reads 3 batches a rank, saves, stops
    torchrun --standalone --nproc-per-node=3 examples/world_queue_torchrun.py \
        --out run --resume run             # reads exactly the rest

Each rank writes the items it read to ``OUT/rank<r>-<phase>.json``, so the
two runs together can be checked: every item once. The shards are small
text files written by rank 0 into ``OUT/data`` on the first run.
"""

from __future__ import annotations

import argparse
import json
import os

import ferroloader as fl
import torch.distributed as dist

SHARDS, LINES = 12, 20


def read_lines(path: str, start: int = 0):
    with open(path) as f:
        for i, line in enumerate(f):
            if i >= start:
                yield line.rstrip("\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--stop-after", type=int, default=None, help="batches, then save")
    parser.add_argument("--resume", default=None, help="the folder of a run's checkpoints")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # the queue lives in this group's store
    rank = dist.get_rank()
    data = os.path.join(args.out, "data")
    if rank == 0 and not os.path.isdir(data):
        os.makedirs(data)
        for s in range(SHARDS):
            with open(os.path.join(data, f"part-{s:02d}.txt"), "w") as f:
                f.writelines(f"{s}-{i}\n" for i in range(LINES))
    dist.barrier()

    paths = sorted(os.path.join(data, name) for name in os.listdir(data))
    shards = fl.FileShards(paths, read_lines, lengths=[LINES] * len(paths))
    loader = fl.DataLoader(
        shards, batch_size=4, shuffle=True, seed=0,
        # even=False: every item exactly once, ranks' batch counts may differ
        sharding=fl.Sharding(mode="dynamic", across="world", even=False),
    )
    if args.resume:
        mine = os.path.join(args.resume, f"checkpoint-rank{rank}.json")
        if not os.path.exists(mine):  # (more ranks than saved: any rank's state serves)
            mine = os.path.join(args.resume, "checkpoint-rank0.json")
        with open(mine) as f:
            loader.load_state_dict(json.load(f))

    read: list[str] = []
    for step, batch in enumerate(loader):
        read.extend(batch)  # (a training step would go here)
        if args.stop_after is not None and step + 1 == args.stop_after:
            # the checkpoint: every rank saves its own state, at the same
            # step (state_dict() meets the other ranks through the store)
            with open(os.path.join(args.out, f"checkpoint-rank{rank}.json"), "w") as f:
                json.dump(loader.state_dict(), f)
            break
    phase = "resumed" if args.resume else "first"
    with open(os.path.join(args.out, f"rank{rank}-{phase}.json"), "w") as f:
        json.dump(read, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
