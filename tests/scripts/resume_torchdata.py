"""A resume script written for torchdata's StatefulDataLoader.

tests/test_state_torchdata.py runs it as is and with only the import below
changed to ferroloader's DataLoader; both runs must pass. It checks, for
several loaders, that a snapshot after k batches, saved with torch.save and
loaded into a new loader, yields exactly the batches an uninterrupted run
yields after k.
"""

import io
import sys

import torch
from torch.utils.data import Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader


class Squares(Dataset):
    def __len__(self):
        return 23

    def __getitem__(self, i):
        return {"i": i, "sq": torch.tensor([i * i])}


class Counter(IterableDataset):
    """A stateful iterable in torchdata's protocol."""

    def __init__(self, n=17):
        self.n = n
        self.pos = 0

    def __iter__(self):
        while self.pos < self.n:
            self.pos += 1
            yield self.pos - 1

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self.pos = sd["pos"]


def plain(batch):
    if isinstance(batch, dict):
        return {k: plain(v) for k, v in batch.items()}
    return batch.tolist() if isinstance(batch, torch.Tensor) else batch


CASES = {
    "sequential_w0": lambda: StatefulDataLoader(Squares(), batch_size=4),
    "shuffle_w0": lambda: StatefulDataLoader(Squares(), batch_size=4, shuffle=True),
    "shuffle_w2": lambda: StatefulDataLoader(Squares(), batch_size=3, shuffle=True, num_workers=2),
    "drop_last_w2": lambda: StatefulDataLoader(
        Squares(), batch_size=5, shuffle=True, drop_last=True, num_workers=2
    ),
    "iterable_w0": lambda: StatefulDataLoader(Counter(), batch_size=4),
    "iterable_w2": lambda: StatefulDataLoader(Counter(), batch_size=3, num_workers=2),
}


def check(name, make, k):
    torch.manual_seed(0)
    expected = [plain(b) for b in make()]
    torch.manual_seed(0)
    loader = make()
    it = iter(loader)
    head = [plain(next(it)) for _ in range(k)]
    buf = io.BytesIO()
    torch.save(loader.state_dict(), buf)
    del it, loader
    torch.manual_seed(0)
    resumed = make()
    buf.seek(0)
    resumed.load_state_dict(torch.load(buf, weights_only=False))
    rest = [plain(b) for b in resumed]
    assert head + rest == expected, (name, k, head + rest, expected)


def main():
    for name, make in CASES.items():
        n = len(list(make()))
        for k in range(1, n):
            check(name, make, k)
    print("resumed", len(CASES), "loaders at every position")


if __name__ == "__main__":
    main()
    sys.exit(0)
