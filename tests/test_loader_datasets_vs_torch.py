"""ferroloader.DataLoader against torch.utils.data.DataLoader: every kind of dataset and sample,
batch by batch.

Every test runs the same dataset through torch's DataLoader and through
ferroloader's under identical seeds (see helpers.run_both) and compares every
batch, len(loader), the warnings, errors raised while iterating, the calls the
dataset received, and the state of every random generator afterwards.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from helpers import (
    FERRO,
    TORCH,
    PerRun,
    assert_same,
    assert_same_outcome,
    normalize,
    outcome,
    run_both,
    seed_all,
)
from loader_cases import (
    ITERABLES,
    MAP_DATASETS,
    ListDataset,
    N,
    SizedIterable,
    identity_collate,
)

pytestmark = pytest.mark.timeout(60)

# (batch_size, shuffle, drop_last)
BATCH_ARGS = [
    (bs, sh, dl)
    for bs in (1, 3, 7, None)
    for sh in (False, True)
    for dl in (False, True)
    if not (bs is None and dl)
]


@pytest.mark.parametrize("bs,shuffle,drop_last", BATCH_ARGS, ids=str)
@pytest.mark.parametrize("name", list(MAP_DATASETS))
def test_map_dataset_matrix(name, bs, shuffle, drop_last):
    """Every map-style dataset yields torch's batches, len and RNG state for every
    batch_size/shuffle/drop_last."""
    run_both(
        MAP_DATASETS[name],
        seed=1234,
        batch_size=bs,
        shuffle=shuffle,
        drop_last=drop_last,
    )


@pytest.mark.parametrize("bs", [1, 3, None])
@pytest.mark.parametrize("name", ["int", "mix", "tensor_transposed", "lib_tensor_dataset"])
def test_map_dataset_with_generator(name, bs):
    """A shuffled loader with generator= yields torch's batches and leaves the generator in
    torch's state, for each dataset and batch_size."""
    run_both(
        MAP_DATASETS[name],
        seed=7,
        batch_size=bs,
        shuffle=True,
        generator=torch.Generator().manual_seed(99),
    )


@pytest.mark.parametrize("shuffle", [False, True])
def test_generator_consumed_without_shuffle(shuffle):
    """generator= is consumed as torch consumes it (the base seed is drawn from it) whether or
    not the loader shuffles."""
    run_both(
        MAP_DATASETS["int"], seed=3, batch_size=4, shuffle=shuffle,
        generator=torch.Generator().manual_seed(5),
    )


# --------------------------------------------------------------------------- #
# IterableDataset
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("bs,drop_last", [(1, False), (3, False), (3, True), (7, True),
                                          (None, False), (11, False), (11, True)], ids=str)
@pytest.mark.parametrize("name", list(ITERABLES))
def test_iterable_dataset(name, bs, drop_last):
    """Every IterableDataset (with or without __len__, empty, chained) yields torch's batches
    and len(loader) outcome for every batch_size/drop_last."""
    run_both(ITERABLES[name], seed=3, batch_size=bs, drop_last=drop_last)


@pytest.mark.parametrize("name", ["ints_nolen", "dicts"])
def test_iterable_dataset_with_generator(name):
    """An IterableDataset loader with generator= yields torch's batches and leaves the generator
    in torch's state."""
    run_both(ITERABLES[name], seed=3, batch_size=2, generator=torch.Generator().manual_seed(8))


@pytest.mark.parametrize("bs,drop_last", [(1, False), (2, False), (3, True), (None, False)])
@pytest.mark.parametrize("reported", [0, 2, 5, N, 20])
def test_iterable_length_warning(reported, bs, drop_last):
    """len(loader) from the dataset's __len__, and torch's warning when more comes out."""
    e, a = run_both(
        lambda lib: SizedIterable(N, reported=reported),
        seed=0,
        batch_size=bs,
        drop_last=drop_last,
    )
    assert e.warnings == a.warnings


def test_iterable_length_warning_text_with_pytest_warns():
    """Iterating past an IterableDataset's under-reported __len__ emits torch's UserWarning
    text, visible to pytest.warns."""
    def collect(lib):
        loader = lib.DataLoader(SizedIterable(6, reported=2), batch_size=1)
        assert len(loader) == 2
        with pytest.warns(UserWarning) as record:
            list(loader)
        return [str(w.message) for w in record]

    assert collect(TORCH) == collect(FERRO)
    assert collect(TORCH)  # torch does warn here


def test_iterable_len_without_len():
    """len(loader) over an IterableDataset without __len__ fails with torch's error, and its
    batches still match torch's."""
    run_both(ITERABLES["ints_nolen"], seed=0, batch_size=3)


def test_iterable_len_not_called_no_warning():
    """Without a len(loader) call, yielding more than an IterableDataset's __len__ emits no
    warning, as in torch."""
    e, a = run_both(lambda lib: SizedIterable(N, reported=1), seed=0, call_len=False)
    assert e.warnings == a.warnings == []


# --------------------------------------------------------------------------- #
# plain containers as datasets, pin_memory, misc arguments
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "make",
    [
        lambda lib: list(range(7)),
        lambda lib: range(9),
        lambda lib: torch.arange(8),
        lambda lib: np.arange(6, dtype=np.float32),
        lambda lib: [{"a": i} for i in range(5)],
    ],
    ids=["list", "range", "tensor", "ndarray", "list_of_dicts"],
)
@pytest.mark.parametrize("bs", [2, None])
def test_plain_containers_as_dataset(make, bs):
    """Plain containers (list, range, tensor, ndarray, list of dicts) used as the dataset are
    shuffled and batched as torch's, with and without batch_size."""
    run_both(make, seed=0, batch_size=bs, shuffle=True)


@pytest.mark.parametrize(
    "extra",
    [
        {"pin_memory": True},
        {"pin_memory": True, "pin_memory_device": "cpu"},
        {"in_order": False},
        {"worker_init_fn": lambda wid: (_ for _ in ()).throw(RuntimeError("called"))},
        {"timeout": 0},
        {"timeout": 0.0},
        {"prefetch_factor": None},
        {"persistent_workers": False},
        {"multiprocessing_context": None},
        {"timeout": 1.5},
    ],
    # (no object addresses: ids must be the same in every process)
    ids=lambda d: normalize(
        ",".join(sorted(d)) + ("=" + repr(next(iter(d.values()))) if d else "")
    ),
)
def test_misc_arguments(extra):
    """Arguments without effect in a single process (pin_memory, in_order, an uncalled
    worker_init_fn, timeout, prefetch_factor=None, ...) give torch's batches and warnings."""
    run_both(MAP_DATASETS["dict"], seed=0, batch_size=3, **extra)


def test_get_worker_info_in_main_process():
    """get_worker_info() returns None in the main process, inside __getitem__ during iteration
    and outside it."""
    seen = []

    def make(lib):
        class DS(tud.Dataset):
            def __getitem__(self, i):
                seen.append((lib.__name__, lib.get_worker_info()))
                return i

            def __len__(self):
                return 3

        return DS()

    run_both(make, seed=0, batch_size=2)
    assert FERRO.get_worker_info() is None
    assert {info for _, info in seen} == {None}


# --------------------------------------------------------------------------- #
# the iterator object, unusual index types, __getitems__ variants
# --------------------------------------------------------------------------- #


def test_iterator_protocol():
    """The loader's iterator behaves as torch's: iter(it) is it, len(it), next(), StopIteration
    on every call after exhaustion, and len() with batch_size=None."""
    def run(lib):
        seed_all(0)
        loader = lib.DataLoader(ListDataset(lambda i: i), batch_size=3, shuffle=True)
        it = iter(loader)
        out = [iter(it) is it, len(it), next(it)]
        out += [list(it), outcome(lambda: next(it)), outcome(lambda: next(it))]
        loader2 = lib.DataLoader(ListDataset(lambda i: i), batch_size=None)
        out += [len(iter(loader2))]
        return out

    e, a = run(TORCH), run(FERRO)
    for x, y in zip(e, a):
        assert_same_outcome(x, y)


def test_loader_generator_reassigned_after_init():
    """Reassigning loader.generator between epochs changes the next epoch and the states of both
    generators exactly as in torch."""
    def run(lib):
        seed_all(0)
        g1 = torch.Generator().manual_seed(1)
        g2 = torch.Generator().manual_seed(2)
        loader = lib.DataLoader(ListDataset(lambda i: i), batch_size=4, shuffle=True,
                                generator=g1)
        first = list(loader)
        loader.generator = g2  # the base seed now comes from g2; the sampler keeps g1
        second = list(loader)
        return first, second, g1.get_state(), g2.get_state(), torch.rand(2)

    assert_same(run(TORCH), run(FERRO))


def test_loader_collate_fn_reassigned_between_epochs():
    """A collate_fn assigned to the loader between epochs takes effect in the next epoch, as in
    torch."""
    def run(lib):
        loader = lib.DataLoader(ListDataset(lambda i: i), batch_size=4)
        first = list(loader)
        loader.collate_fn = identity_collate
        return first, list(loader)

    assert_same(run(TORCH), run(FERRO))


@pytest.mark.parametrize(
    "sampler",
    [
        lambda: np.array([3, 1, 2, 9]),
        lambda: torch.tensor([4, 0, 8]),
        lambda: (i for i in (5, 2, 7)),
        lambda: range(8, 0, -3),
        lambda: {1: "a", 4: "b"},
    ],
    ids=["ndarray", "tensor", "generator", "range", "dict"],
)
@pytest.mark.parametrize("bs", [2, None])
def test_unusual_sampler_iterables(sampler, bs):
    """Any iterable given as sampler= (ndarray, tensor, generator, range, dict) reaches the
    dataset as the same index objects and gives torch's batches and len outcome."""
    run_both(MAP_DATASETS["int"], seed=0, batch_size=bs,
             sampler=PerRun(lambda ctx: sampler(), "iterable"))


@pytest.mark.parametrize(
    "batch_sampler",
    [
        lambda: [(0, 1), (2,)],
        lambda: [torch.tensor([3, 4]), torch.tensor([0])],
        lambda: [np.array([5, 6, 7])],
        lambda: [[], [1]],
        lambda: [range(3), range(5, 9)],
    ],
    ids=["tuples", "tensors", "ndarray", "empty_batch", "ranges"],
)
@pytest.mark.parametrize("dataset", ["int", "getitems", "lib_tensor_dataset"])
def test_unusual_batch_sampler_items(batch_sampler, dataset):
    """Batches given as tuples, tensors, ndarrays, empty lists or ranges reach
    __getitem__/__getitems__ as in torch and collate (or fail) as torch's do."""
    run_both(MAP_DATASETS[dataset], seed=0,
             batch_sampler=PerRun(lambda ctx: batch_sampler(), "bs"))


class NoneGetitems(ListDataset):
    __getitems__ = None


class TupleGetitems(ListDataset):
    def __getitems__(self, indices):
        self.log.append(("getitems", type(indices).__name__, list(indices)))
        return tuple(self.items[i] for i in indices)


class GeneratorGetitems(ListDataset):
    def __getitems__(self, indices):
        return (self.items[i] for i in indices)


@pytest.mark.parametrize("cls", [NoneGetitems, TupleGetitems, GeneratorGetitems])
@pytest.mark.parametrize("bs", [1, 3, None])
def test_getitems_variants(cls, bs):
    """A __getitems__ set to None, returning a tuple or returning a generator is handled as
    torch handles it, for every batch_size with shuffle."""
    run_both(lambda lib: cls(lambda i: {"v": i}), seed=0, batch_size=bs, shuffle=True)


def test_same_sample_object_in_batch():
    """A batch holding one tensor object several times (every sample is the same tensor, indices
    repeat) collates to torch's batch."""
    shared = torch.arange(3)

    run_both(lambda lib: ListDataset(lambda i: shared), seed=0, batch_size=4,
             sampler=PerRun(lambda ctx: [0, 0, 1, 1, 2], "dup"))


def test_loader_yields_independent_batches():
    """Holding every batch (list(loader)) keeps each batch intact."""

    def run(lib):
        loader = lib.DataLoader(lib.TensorDataset(torch.arange(40.0).reshape(N, 4)),
                                batch_size=3)
        held = list(loader)
        for b in held:
            b[0].add_(1000)  # writing to one batch must not touch another
        return held, [b[0].untyped_storage().nbytes() for b in held]

    assert_same(run(TORCH), run(FERRO))
