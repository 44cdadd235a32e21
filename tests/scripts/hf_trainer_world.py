"""transformers' Trainer over the job's shared queue, 2 CPU processes under
torchrun (tests/test_world_queue_ranks.py): ``torchrun --nproc-per-node=2
hf_trainer_world.py OUT_DIR``. The Trainer gets the loader from an
overridden ``get_train_dataloader()`` (its own would prepare it, which is
refused) and trains 2 epochs. Each process writes ``OUT_DIR/rank<r>.json``:
per epoch len() at its start and the items read, and the loader's state
when training ended."""

import json
import os
import sys

import ferroloader as fl
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

LENS = [17, 40, 9, 33, 25, 12, 30, 21, 8, 35]  # 230 items


class Shards(fl.ShardedDataset):
    def shards(self):
        return list(range(len(LENS)))

    def iter_shard(self, shard, start=0):
        return ({"x": torch.ones(1), "idx": 1000 * shard + o}
                for o in range(start, LENS[shard]))

    def shard_len(self, shard):
        return LENS[shard]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.epochs = []

    def forward(self, x, idx):
        self.epochs[-1]["items"] += [int(i) for i in idx]
        return {"loss": self.layer(x).pow(2).mean()}


class Epochs(TrainerCallback):
    def __init__(self, model, loader):
        self.model, self.loader = model, loader

    def on_epoch_begin(self, args, state, control, **kw):
        self.model.epochs.append({"len": len(self.loader), "items": []})


class QueueTrainer(Trainer):
    def __init__(self, loader, **kw):
        super().__init__(**kw)
        self.queue_loader = loader

    def get_train_dataloader(self):
        return self.queue_loader


def main():
    out = sys.argv[1]
    args = TrainingArguments(output_dir=os.path.join(out, "trainer"), use_cpu=True,
                             ddp_backend="gloo", num_train_epochs=2,
                             per_device_train_batch_size=4, report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True,
                             remove_unused_columns=False)
    # (the process group exists once the arguments are made: the queue's store)
    loader = fl.DataLoader(Shards(), batch_size=4,
                           sharding=fl.Sharding(mode="dynamic", across="world"))
    model = Model()
    trainer = QueueTrainer(loader, model=model, args=args,
                           callbacks=[Epochs(model, loader)])
    trainer.train()
    record = {"epochs": model.epochs, "state": loader.state_dict()}
    with open(os.path.join(out, f"rank{trainer.args.process_index}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
