"""accelerate over the job's shared queue, 2 CPU processes under torchrun
(tests/test_world_queue_ranks.py): ``torchrun --nproc-per-node=2
accelerate_world.py OUT_DIR``. ``Accelerator(cpu=True)`` starts the process
group (gloo) and the queue lives in its store. ``accelerator.prepare`` of
the loader is refused (it would split the queue's batches again); the loader
is iterated as it is, with the model prepared, for 2 epochs. Each process
writes ``OUT_DIR/rank<r>.json``: the refusal, per epoch len() before it and
the items read, and its state after the last epoch."""

import json
import os
import sys

import ferroloader as fl
import torch
from accelerate import Accelerator

LENS = [17, 40, 9, 33, 25, 12, 30, 21, 8, 35]  # 230 items


class Shards(fl.ShardedDataset):
    def shards(self):
        return list(range(len(LENS)))

    def iter_shard(self, shard, start=0):
        return iter(range(1000 * shard + start, 1000 * shard + LENS[shard]))

    def shard_len(self, shard):
        return LENS[shard]


def main():
    out = sys.argv[1]
    accelerator = Accelerator(cpu=True)
    loader = fl.DataLoader(Shards(), batch_size=4,
                           sharding=fl.Sharding(mode="dynamic", across="world"))
    try:
        accelerator.prepare(loader)
        refused = None
    except fl.ConfigError as e:
        refused = str(e)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    model, opt = accelerator.prepare(model, opt)
    epochs = []
    for _ in range(2):
        n = len(loader)
        items = []
        for batch in loader:
            items += [int(v) for v in batch]
            loss = model(batch.float().unsqueeze(1)).pow(2).mean()
            accelerator.backward(loss)  # (DDP's gradients: the ranks step together)
            opt.step()
            opt.zero_grad()
        epochs.append({"len": n, "items": items})
    record = {"refused": refused, "epochs": epochs, "state": loader.state_dict()}
    with open(os.path.join(out, f"rank{accelerator.process_index}.json"), "w") as f:
        json.dump(record, f)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
