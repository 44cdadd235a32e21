#!/usr/bin/env python3
"""Train a small CNN on generated images with ferroloader.

A complete training script of the usual shape: a map-style dataset that
generates 3x32x32 images of four classes (shapes drawn at random places),
random augmentations in ``__getitem__`` (crop, flip, noise; seeded per
worker as torch seeds them), a training loader with workers,
``pin_memory``, ``persistent_workers`` and shuffling, a validation loader,
an optimizer and a learning-rate schedule, accuracy printed per epoch.

The only change from a torch script is the import line:

    from ferroloader import DataLoader   # was: from torch.utils.data import DataLoader

Run it with ``python examples/train_cnn.py`` (``--fast`` for the seconds-long
version CI runs, ``--torch`` to run the same script on torch's loader).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from ferroloader import DataLoader
from torch import nn
from torch.utils.data import Dataset

CLASSES = ("square", "cross", "ring", "bar")


class Shapes(Dataset):
    """Image ``i``: class ``i % 4`` drawn at a place drawn from ``i``;
    ``augment`` adds a random crop, flip and noise from the worker's RNG."""

    def __init__(self, n: int, augment: bool, offset: int = 0) -> None:
        self.n = n
        self.augment = augment
        self.offset = offset

    def __len__(self) -> int:
        return self.n

    def draw(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.offset + i)
        img = torch.rand(3, 40, 40, generator=g) * 0.2
        cls = i % len(CLASSES)
        y, x = (int(v) for v in torch.randint(8, 24, (2,), generator=g))
        color = torch.rand(3, 1, 1, generator=g) * 0.6 + 0.4
        mask = torch.zeros(40, 40)
        if cls == 0:
            mask[y : y + 10, x : x + 10] = 1
        elif cls == 1:
            mask[y + 4 : y + 6, x : x + 10] = 1
            mask[y : y + 10, x + 4 : x + 6] = 1
        elif cls == 2:
            yy, xx = torch.meshgrid(torch.arange(40), torch.arange(40), indexing="ij")
            r = ((yy - y - 5) ** 2 + (xx - x - 5) ** 2).float().sqrt()
            mask[(r > 3) & (r < 5)] = 1
        else:
            mask[y : y + 12, x + 5 : x + 7] = 1
        return img * (1 - mask) + color * mask

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = self.draw(i)
        if self.augment:
            top, left = (int(v) for v in torch.randint(0, 9, (2,)))
            img = img[:, top : top + 32, left : left + 32]
            if torch.rand(()) < 0.5:
                img = img.flip(-1)
            img = img + torch.randn_like(img) * 0.05
        else:
            img = img[:, 4:36, 4:36]
        return img.contiguous(), i % len(CLASSES)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.head = nn.Linear(32 * 8 * 8, len(CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fast", action="store_true", help="a few seconds (CI)")
    p.add_argument("--torch", action="store_true", help="use torch's DataLoader instead")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    loader_cls = DataLoader
    if args.torch:
        from torch.utils.data import DataLoader as loader_cls  # type: ignore[no-redef]
    epochs = args.epochs or (2 if args.fast else 8)
    n_train, n_val = (512, 128) if args.fast else (8192, 1024)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    train = loader_cls(
        Shapes(n_train, augment=True),
        batch_size=64,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=device == "cuda",
        persistent_workers=args.workers > 0,
        drop_last=True,
    )
    val = loader_cls(
        Shapes(n_val, augment=False, offset=10**6), batch_size=256, num_workers=args.workers
    )
    model = Net().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=epochs * len(train))
    accuracy = 0.0
    losses: list[float] = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        model.train()
        for x, y in train:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())  # a number, off the autograd graph
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in val:
                pred = model(x.to(device)).argmax(1).cpu()
                correct += int((pred == y).sum())
                total += len(y)
        accuracy = correct / total
        print(
            f"epoch {epoch + 1}/{epochs}: loss {losses[-1]:.3f}, "
            f"val accuracy {accuracy:.1%}, {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    return {"accuracy": accuracy, "first_loss": losses[0], "last_loss": losses[-1]}


if __name__ == "__main__":
    main()
