"""Determinism control: ``DataLoader(seed=S)`` and ``per_sample_seed=True``."""

from __future__ import annotations

import random

import ferroloader as fl
import numpy as np
import pytest
import torch
import torch.utils.data as tud
from ferroloader.seeds import epoch_seed, sample_seed
from helpers import ferro_only, time_limit

pytestmark = [
    ferro_only,
    time_limit(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

N = 10


class Draws(tud.Dataset):
    """Each sample is its index and one draw from each global generator."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {
            "i": i,
            "torch": torch.rand(()).item(),
            "random": random.random(),
            "numpy": float(np.random.rand()),
        }


def _orders(loader: fl.DataLoader, epochs: int = 2) -> list[list[int]]:
    return [[int(i) for b in loader for i in b["i"]] for _ in range(epochs)]


def _draws_by_index(loader: fl.DataLoader, epochs: int = 2) -> list[dict]:
    out = []
    for _ in range(epochs):
        seen = {}
        for b in loader:
            for k, i in enumerate(b["i"].tolist()):
                seen[i] = (b["torch"][k].item(), b["random"][k].item(), b["numpy"][k].item())
        out.append(seen)
    return out


def _global_states() -> tuple:
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _assert_states_equal(a: tuple, b: tuple) -> None:
    assert torch.equal(a[0], b[0])
    assert a[1] == b[1]
    assert a[2][0] == b[2][0] and np.array_equal(a[2][1], b[2][1]) and a[2][2:] == b[2][2:]


@pytest.mark.parametrize("nw", [0, 2])
def test_seeded_order_ignores_and_leaves_the_global_rng(nw):
    """A seeded loader's order does not depend on the global RNG, and two
    epochs with per-sample seeding leave every global generator untouched."""
    orders = []
    for global_seed in (0, 12345):
        torch.manual_seed(global_seed)
        random.seed(global_seed)
        np.random.seed(global_seed)
        before = _global_states()
        loader = fl.DataLoader(
            Draws(), batch_size=3, shuffle=True, num_workers=nw, seed=5, per_sample_seed=True
        )
        orders.append(_orders(loader))
        _assert_states_equal(before, _global_states())
    assert orders[0] == orders[1]
    assert orders[0][0] != orders[0][1]  # epochs differ


@pytest.mark.parametrize("seed", [0, 5, 2**40 + 3])
def test_epoch_order_is_torch_shuffle_under_the_documented_seed(seed):
    """Epoch e of a seeded loader is torch's shuffle with
    generator=torch.Generator().manual_seed(epoch_seed(seed, e))."""
    loader = fl.DataLoader(Draws(), batch_size=4, shuffle=True, seed=seed)
    got = _orders(loader, epochs=3)
    for e in range(3):
        g = torch.Generator().manual_seed(epoch_seed(seed, e))
        ref = tud.DataLoader(range(N), batch_size=4, shuffle=True, generator=g)
        assert got[e] == [int(i) for b in ref for i in b]


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_persistent_workers_keep_the_seeded_order_of_every_epoch(method):
    """With seed=, persistent workers (which draw no new base seed after
    the first epoch, as torch's) give every epoch the order of any other
    layout: the loader's own generator still makes the draw it makes for
    new workers."""
    def orders(nw: int, persistent: bool) -> list[list[int]]:
        extra = {"worker_method": method} if nw else {}
        loader = fl.DataLoader(torch.arange(40), batch_size=40, shuffle=True, seed=7,
                               num_workers=nw, persistent_workers=persistent, **extra)
        return [next(iter(loader)).tolist() for _ in range(3)]

    assert orders(2, True) == orders(2, False) == orders(0, False)


def test_explicit_generator_keeps_priority():
    """With generator= as well as seed=, the order is the generator's, as
    without seed=."""
    a = fl.DataLoader(Draws(), batch_size=3, shuffle=True, seed=5,
                      generator=torch.Generator().manual_seed(1))
    b = fl.DataLoader(Draws(), batch_size=3, shuffle=True,
                      generator=torch.Generator().manual_seed(1))
    assert _orders(a) == _orders(b)


def test_per_sample_draws_are_the_same_for_any_workers_and_order():
    """With per_sample_seed=True each index's draws are the same for 0, 2
    and 3 workers (persistent or not), shuffled or not, and differ between
    epochs."""
    runs = []
    for nw, shuffle, persistent in [
        (0, False, False),
        (0, True, False),
        (2, True, False),
        (2, False, True),
        (3, True, True),
    ]:
        loader = fl.DataLoader(
            Draws(), batch_size=3, shuffle=shuffle, num_workers=nw, seed=11,
            per_sample_seed=True, persistent_workers=persistent,
        )
        runs.append(_draws_by_index(loader))
    for r in runs[1:]:
        assert r == runs[0]
    assert runs[0][0] != runs[0][1]
    first = runs[0][0][4]
    torch.manual_seed(sample_seed(11, 0, 4))
    assert first[0] == torch.rand(()).item()


def test_per_sample_draws_survive_a_resume():
    """Per-sample draws after a resume (with another num_workers) equal the
    uninterrupted run's."""
    def make(nw: int) -> fl.DataLoader:
        return fl.DataLoader(Draws(), batch_size=2, shuffle=True, num_workers=nw, seed=3,
                             per_sample_seed=True)

    uninterrupted = make(0)
    full = [b for _ in range(2) for b in uninterrupted]
    loader = make(2)
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    sd = loader.state_dict()
    del it
    resumed = make(0)
    resumed.load_state_dict(sd)
    rest = [b for _ in range(2) for b in resumed]
    got = head + rest
    assert len(got) == len(full)
    for a, b in zip(got, full):
        for key in ("i", "torch", "random", "numpy"):
            assert torch.equal(a[key], b[key])


def test_a_state_with_another_seed_is_refused():
    """Loading a state saved with seed=1 into a loader with seed=2 raises a
    ValueError naming the seed."""
    sd = fl.DataLoader(Draws(), shuffle=True, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        fl.DataLoader(Draws(), shuffle=True, seed=2).load_state_dict(sd)


class WithGetitems(Draws):
    def __getitems__(self, indices):
        return [self[i] for i in indices]


@pytest.mark.parametrize(
    "kwargs,dataset,match",
    [
        ({"per_sample_seed": True}, Draws, "needs seed"),
        ({"seed": "7"}, Draws, "seed should be an int"),
        ({"seed": True}, Draws, "seed should be an int"),
        ({"seed": 1, "per_sample_seed": True}, WithGetitems, "__getitems__"),
    ],
)
def test_bad_seed_arguments_are_refused(kwargs, dataset, match):
    """Unusable seed arguments raise a ValueError that says why."""
    with pytest.raises(ValueError, match=match):
        fl.DataLoader(dataset(), **kwargs)


def test_unseeded_loader_is_unchanged():
    """Without seed=, the order is torch's for the same global seed (the
    default stays torch's, bit for bit)."""
    torch.manual_seed(9)
    ours = [int(i) for b in fl.DataLoader(range(N), batch_size=3, shuffle=True) for i in b]
    torch.manual_seed(9)
    ref = [int(i) for b in tud.DataLoader(range(N), batch_size=3, shuffle=True) for i in b]
    assert ours == ref
