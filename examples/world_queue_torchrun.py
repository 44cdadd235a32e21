"""One shard queue for the whole job under torchrun, with the checkpoint
pattern that resumes it exactly: every rank's loader state gathered, saved
together, and given back as a list on restart (on the same or another
number of ranks).

    torchrun --standalone --nproc-per-node=2 examples/world_queue_torchrun.py \
        --out run --stop-after 3          # reads 3 batches a rank, saves, stops
    torchrun --standalone --nproc-per-node=3 examples/world_queue_torchrun.py \
        --out run --resume run/checkpoint.json   # reads exactly the rest

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
    parser.add_argument("--resume", default=None, help="a checkpoint saved by a run before")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # the queue lives in this group's store
    rank, world = dist.get_rank(), dist.get_world_size()
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
        with open(args.resume) as f:
            loader.load_state_dict(json.load(f))  # every rank's state, as a list

    read: list[str] = []
    for step, batch in enumerate(loader):
        read.extend(batch)  # (a training step would go here)
        if args.stop_after is not None and step + 1 == args.stop_after:
            # the checkpoint: every rank's state, gathered and saved together
            states: list = [None] * world
            dist.all_gather_object(states, loader.state_dict())
            if rank == 0:
                with open(os.path.join(args.out, "checkpoint.json"), "w") as f:
                    json.dump(states, f)
            break
    phase = "resumed" if args.resume else "first"
    with open(os.path.join(args.out, f"rank{rank}-{phase}.json"), "w") as f:
        json.dump(read, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
