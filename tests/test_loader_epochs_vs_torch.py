"""ferroloader.DataLoader against torch.utils.data.DataLoader: partial and repeated epochs, live
iterators, and the order of RNG draws.

Every test runs the same dataset through torch's DataLoader and through
ferroloader's under identical seeds (see helpers.run_both) and compares every
batch, len(loader), the warnings, errors raised while iterating, the calls the
dataset received, and the state of every random generator afterwards.
"""
from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.utils.data as tud
from helpers import (
    FERRO,
    TORCH,
    PerRun,
    assert_same,
    run_both,
)
from hypothesis import given
from hypothesis import strategies as st
from loader_cases import (
    MAP_DATASETS,
    ListDataset,
    N,
    RangeIterable,
    _user_sampler,
)

pytestmark = pytest.mark.timeout(60)

# --------------------------------------------------------------------------- #
# partial epochs
# --------------------------------------------------------------------------- #


PARTIAL = [(0, None), (1, None), (2, 1, None), (3, 0, 2), (None, 2, None)]


@pytest.mark.parametrize("epochs", PARTIAL, ids=str)
@pytest.mark.parametrize(
    "case",
    [
        "shuffle",
        "shuffle_generator",
        "random_repl_sampler",
        "random_multi_perm_sampler",
        "subset_sampler",
        "weighted_sampler",
        "user_sampler",
        "tensor_dataset_shuffle",
    ],
)
def test_partial_epochs(case, epochs):
    """Epochs cut short after 0-3 batches leave every sampler and RNG as torch leaves them, so
    every later epoch matches torch's batches and generator states."""
    make = MAP_DATASETS["int"]
    kw: dict = {"batch_size": 2}
    if case == "shuffle":
        kw["shuffle"] = True
    elif case == "shuffle_generator":
        kw["shuffle"] = True
        kw["generator"] = torch.Generator().manual_seed(123)
    elif case == "random_repl_sampler":
        kw["sampler"] = PerRun(
            lambda c: c.lib.RandomSampler(c.dataset, replacement=True, num_samples=70), case
        )
    elif case == "random_multi_perm_sampler":
        kw["sampler"] = PerRun(
            lambda c: c.lib.RandomSampler(c.dataset, num_samples=35, generator=c.gen(1)), case
        )
    elif case == "subset_sampler":
        kw["sampler"] = PerRun(lambda c: c.lib.SubsetRandomSampler([1, 3, 5, 7, 9]), case)
    elif case == "weighted_sampler":
        kw["sampler"] = PerRun(
            lambda c: c.lib.WeightedRandomSampler([1, 2, 3, 4, 5, 5, 4, 3, 2, 1], 9), case
        )
    elif case == "user_sampler":
        kw["sampler"] = PerRun(_user_sampler, case)
    elif case == "tensor_dataset_shuffle":
        make = MAP_DATASETS["lib_tensor_dataset"]
        kw["shuffle"] = True
    run_both(make, seed=31, epochs=epochs, **kw)


@pytest.mark.parametrize("epochs", PARTIAL, ids=str)
def test_partial_epochs_iterable(epochs):
    """IterableDataset epochs cut short after 0-3 batches are followed by epochs that match
    torch's batches and dataset calls."""
    run_both(lambda lib: RangeIterable(), seed=1, batch_size=3, epochs=epochs)


def test_two_live_iterators():
    """Two iterators of one loader interleaved, as torch allows with num_workers=0."""

    def run(lib):
        torch.manual_seed(0)
        loader = lib.DataLoader(ListDataset(lambda i: i), batch_size=2, shuffle=True)
        it1, it2 = iter(loader), iter(loader)
        out = [next(it1), next(it2), next(it2), next(it1), list(it1), list(it2)]
        return out, torch.rand(3)

    assert_same(run(TORCH), run(FERRO))


# --------------------------------------------------------------------------- #
# hypothesis: random loader configurations
# --------------------------------------------------------------------------- #


@given(
    n=st.integers(0, 30),
    bs=st.one_of(st.none(), st.integers(1, 12)),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    gen_seed=st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    epochs=st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=1, max_size=3),
    tensor_ds=st.booleans(),
)
def test_hypothesis_loader_configs(n, bs, shuffle, drop_last, seed, gen_seed, epochs, tensor_ds):
    """For any dataset size, batch_size, shuffle, drop_last, seed, generator= and sequence of
    full or partial epochs, the run matches torch's exactly."""
    if bs is None:
        drop_last = False
    kw = {}
    if gen_seed is not None:
        kw["generator"] = torch.Generator().manual_seed(gen_seed)
    if tensor_ds:
        make = lambda lib: lib.TensorDataset(  # noqa: E731
            torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n)
        )
    else:
        make = lambda lib: ListDataset(lambda i: (i, f"s{i}"), n=n)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_both(make, seed=seed, batch_size=bs, shuffle=shuffle, drop_last=drop_last,
                 epochs=tuple(epochs), **kw)


def test_many_epochs_same_loader():
    """Ten epochs of one shuffled loader: every epoch's order matches torch."""
    run_both(MAP_DATASETS["lib_tensor_dataset"], seed=42, batch_size=4, shuffle=True,
             epochs=tuple(itertools.repeat(None, 10)))


# --------------------------------------------------------------------------- #
# when user code runs: eager __iter__ methods that draw from the global RNG
# --------------------------------------------------------------------------- #


class EagerSampler(tud.Sampler):
    """__iter__ is a plain function: it runs (and draws) when iter() is called."""

    def __init__(self, n, log):
        self.n = n
        self.log = log

    def __iter__(self):
        perm = torch.randperm(self.n).tolist()
        self.log.append(("sampler_iter", perm[0]))
        return iter(perm)

    def __len__(self):
        return self.n


class EagerBatchSampler(EagerSampler):
    def __iter__(self):
        perm = torch.randperm(self.n).tolist()
        self.log.append(("batch_sampler_iter", perm[0]))
        return iter([perm[i:i + 3] for i in range(0, self.n, 3)])

    def __len__(self):
        return (self.n + 2) // 3


class EagerIterable(tud.IterableDataset):
    """__iter__ is a plain function that draws from the global RNG."""

    def __init__(self):
        self.log = []

    def __iter__(self):
        offset = int(torch.randint(0, 1000, ()).item())
        self.log.append(("dataset_iter", offset))
        return iter([offset + i for i in range(7)])


@pytest.mark.parametrize("epochs", [(0, None), (1, 0, None), (None, None)], ids=str)
@pytest.mark.parametrize("with_gen", [False, True])
@pytest.mark.parametrize("kind", ["sampler_bs2", "sampler_bsNone", "batch_sampler", "iterable"])
def test_order_of_user_code_and_base_seed(kind, with_gen, epochs):
    """User __iter__ code drawing from the global RNG (sampler, batch sampler or iterable
    dataset) runs in torch's order relative to the loader's base-seed draw, with or without
    generator=, partial epochs included."""
    kw = {}
    if with_gen:
        kw["generator"] = torch.Generator().manual_seed(5)
    if kind == "iterable":
        make = lambda lib: EagerIterable()  # noqa: E731
        kw["batch_size"] = 2
    else:
        make = MAP_DATASETS["int"]
        if kind == "sampler_bs2":
            kw["sampler"] = PerRun(lambda c: EagerSampler(N, c.dataset.log), kind)
            kw["batch_size"] = 2
        elif kind == "sampler_bsNone":
            kw["sampler"] = PerRun(lambda c: EagerSampler(N, c.dataset.log), kind)
            kw["batch_size"] = None
        else:
            kw["batch_sampler"] = PerRun(lambda c: EagerBatchSampler(N, c.dataset.log), kind)
    run_both(make, seed=17, epochs=epochs, **kw)
