"""Lightning with strategy="ddp" on 2 CPU ranks (gloo): Lightning rebuilds
the training loader to inject a DistributedSampler. Run as
``python lightning_ddp.py OUT_DIR torch|ferroloader|patched``; Lightning
re-launches this script for rank 1. ``patched``: the model builds torch's
``DataLoader`` and the fit runs inside ``ferroloader.patch()``. Each rank
writes ``OUT_DIR/rank<r>.json``: the loader class it trained from, its
sampler's class, the batches it saw, the final weights, and how many
epochs ferroloader's engine served (0 for torch).
"""

import json
import os
import sys

import ferroloader
import lightning as L
import torch
import torch.utils.data as tud

out_dir, lib_name = sys.argv[1], sys.argv[2]
lib = ferroloader if lib_name == "ferroloader" else tud


class Data(tud.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"x": torch.rand(4, generator=g), "i": i}


SERVED = {"epochs": 0}
_get = ferroloader.DataLoader._get_iterator


def _counting(self):
    SERVED["epochs"] += 1
    return _get(self)


ferroloader.DataLoader._get_iterator = _counting


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen = []

    def train_dataloader(self):
        return lib.DataLoader(Data(), batch_size=4, shuffle=True, num_workers=2)

    def training_step(self, batch, _):
        self.seen.append([int(i) for i in batch["i"]])
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    L.seed_everything(0, workers=False, verbose=False)
    model = Model()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    if lib_name == "patched":
        with ferroloader.patch():
            trainer.fit(model)
    else:
        trainer.fit(model)
    loader = trainer.train_dataloader
    result = {
        "loader": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "sampler": type(loader.sampler).__qualname__,
        "seen": model.seen,
        "weights": [float(w) for w in model.layer.weight.detach().flatten()],
        "served": SERVED["epochs"],
    }
    with open(os.path.join(out_dir, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
