"""Lightning with strategy="ddp" on 2 CPU ranks (gloo) over the job's shared
queue, which lives in the process group Lightning starts. Run as
``python lightning_world.py OUT_DIR shards|sampler``; Lightning re-launches
this script for rank 1. ``shards``: a ``ShardedDataset`` with
``Sharding(mode="dynamic", across="world")``; ``sampler``: a map-style
dataset with ``DynamicDistributedSampler`` (Lightning's default
``use_distributed_sampler=True`` left on). Both with even counts (DDP's
steps must match). The module keeps its loader and Lightning asks for it
every epoch (``reload_dataloaders_every_n_epochs=1``), so it reads len()
every epoch: what the last epoch held back counts in it. Each rank writes
``OUT_DIR/rank<r>.json``: per epoch the items it read, its batch count,
and ``trainer.num_training_batches`` at the epoch's start (what the
progress bar shows as the total); and whether the loader kept the shared
queue.
"""

import json
import os
import sys

import ferroloader
import lightning as L
import torch
import torch.utils.data as tud

out_dir, mode = sys.argv[1], sys.argv[2]
LENS = [7, 30, 12, 3, 25, 18, 9, 21, 14, 11]


class Shards(ferroloader.ShardedDataset):
    def shards(self):
        return list(range(len(LENS)))

    def iter_shard(self, shard, start=0):
        return iter(range(1000 * shard + start, 1000 * shard + LENS[shard]))

    def shard_len(self, shard):
        return LENS[shard]


class Items(tud.Dataset):
    def __len__(self):
        return sum(LENS)

    def __getitem__(self, i):
        return i


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.epochs = []
        self.loader = None

    def train_dataloader(self):
        if self.loader is None:
            self.loader = self.build()
        return self.loader

    def build(self):
        if mode == "shards":
            return ferroloader.DataLoader(
                Shards(), batch_size=4, shuffle=True, seed=0,
                sharding=ferroloader.Sharding(mode="dynamic", across="world"))
        data = Items()
        return ferroloader.DataLoader(
            data, batch_size=4, num_workers=2, worker_method="thread",
            sampler=ferroloader.DynamicDistributedSampler(data, block=8))

    def on_train_epoch_start(self):
        self.epochs.append({"total": self.trainer.num_training_batches, "items": [],
                            "batches": 0})

    def training_step(self, batch, _):
        self.epochs[-1]["items"] += [int(i) for i in batch]
        self.epochs[-1]["batches"] += 1
        return self.layer(batch.float().unsqueeze(1)).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-6)


def main():
    model = Model()
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=2, strategy="ddp",
                        reload_dataloaders_every_n_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model)
    loader = trainer.train_dataloader
    result = {
        "loader": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "across": getattr(getattr(loader, "sharding", None), "across", None),
        "epochs": model.epochs,
        "held_back": loader.stats().queue.held_back,
    }
    with open(os.path.join(out_dir, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
