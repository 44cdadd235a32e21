"""A job over the shared queue as torchrun restarts it
(tests/test_world_queue_ranks.py): ``torchrun --max-restarts=1 ...
world_restart.py OUT_DIR``. Every rank saves its own state after its 3rd
batch (all at the same step) and nothing else; on the first attempt rank 1
dies after its 5th batch, so torchrun restarts every rank, and each loads
only its own last state and reads on. Each rank writes what it read up to
its state (first attempt) and on the attempt that finished.

``world_restart.py OUT_DIR --relaunch`` is the job launched again by hand,
on any number of ranks, after the first launch lost its rank 1: each rank
loads its own last state, or rank 0's where it has none."""

import json
import os
import sys
import time
from datetime import timedelta

import ferroloader as fl
import torch.distributed as dist

out = sys.argv[1]
LENS = [17, 40, 9, 33, 25, 12, 30, 21, 8, 35]  # 230 items


class Shards(fl.ShardedDataset):
    def shards(self):
        return list(range(len(LENS)))

    def iter_shard(self, shard, start=0):
        for o in range(start, LENS[shard]):
            time.sleep(0.002)  # (a read: the ranks take turns with the queue)
            yield 1000 * shard + o

    def shard_len(self, shard):
        return LENS[shard]


def main():
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun's store outlives a restart; gloo's own keys in it do not say
    # which attempt wrote them, and a restarted rank reads a dead peer's
    # address (torch 2.15: "connectFullMesh failed ... Connection refused"
    # on every restart, with any rendezvous). A prefix per attempt keeps
    # each attempt's keys, the shared queue's among them, apart.
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", base),
                            rank=rank, world_size=world)
    loader = fl.DataLoader(Shards(), batch_size=4, shuffle=True, seed=0,
                           sharding=fl.Sharding(mode="dynamic", across="world", even=False))
    relaunch = "--relaunch" in sys.argv
    resume = attempt > 0 or relaunch
    mine = os.path.join(out, f"state{rank}.json")
    if resume:
        # its own state only (any rank's holds the whole job's position)
        with open(mine if os.path.exists(mine) else os.path.join(out, "state0.json")) as f:
            loader.load_state_dict(json.load(f))
    seen = []
    for step, batch in enumerate(loader):
        seen += [int(v) for v in batch]
        if not resume and step == 2:
            dist.barrier()  # every rank at the same step, as a checkpoint is
            with open(mine, "w") as f:
                json.dump(loader.state_dict(), f)
            with open(os.path.join(out, f"before{rank}.json"), "w") as f:
                json.dump(seen, f)
            dist.barrier()
        if not resume and rank == 1 and step == 4:
            os._exit(3)  # the rank is lost: torchrun restarts the job
    name = f"after{rank}-relaunch.json" if relaunch else f"after{rank}-{attempt}.json"
    with open(os.path.join(out, name), "w") as f:
        json.dump(seen, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
