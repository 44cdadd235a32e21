"""ferroloader's dataset classes against torch's: same items, lengths and errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from helpers import (
    FERRO,
    TORCH,
    Raised,
    assert_same,
    assert_same_call,
    assert_same_outcome,
    outcome,
    run_both,
)
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(60)


def probe(ds, keys):
    """len(ds) and ds[k] for every key, each as (value or exception record, warnings)."""

    def one(fn):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = outcome(fn)
        return res, [(w.category, str(w.message)) for w in caught]

    return [one(lambda: len(ds))] + [one(lambda k=k: ds[k]) for k in keys]


def compare_probe(build, keys):
    e = outcome(lambda: build(TORCH))
    a = outcome(lambda: build(FERRO))
    if isinstance(e, Raised) or isinstance(a, Raised):
        assert_same_outcome(e, a, "constructor")
        return
    pe, pa = probe(e, keys), probe(a, keys)
    for k, (x, wx), (y, wy) in zip(["len", *map(repr, keys)], pe, pa):
        assert_same_outcome(x, y, f"ds[{k}]")
        assert wx == wy, f"ds[{k}]: warnings differ: {wx} vs {wy}"


class Items(tud.Dataset):
    def __init__(self, items, getitems=False):
        self.items = list(items)
        self.getitems_calls = []
        if getitems:
            self.__getitems__ = self._getitems

    def __getitem__(self, i):
        return self.items[i]

    def _getitems(self, idx):
        self.getitems_calls.append(list(idx))
        return [("many", self.items[i]) for i in idx]

    def __len__(self):
        return len(self.items)


class ItemsWithGetitems(Items):
    def __getitems__(self, idx):
        return [("gi", self.items[i]) for i in idx]


class ShortGetitems(Items):
    def __getitems__(self, idx):
        return [self.items[i] for i in idx][:-1]


class Stream(tud.IterableDataset):
    def __init__(self, items, with_len=True):
        self.items = list(items)
        self.with_len = with_len

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        if not self.with_len:
            raise TypeError("Stream has no length")
        return len(self.items)


# --------------------------------------------------------------------------- #
# TensorDataset
# --------------------------------------------------------------------------- #

X = torch.arange(40, dtype=torch.float32).reshape(10, 4)
Y = torch.arange(10) % 3
Z = torch.randn(10, 3, 2).transpose(1, 2)  # non-contiguous
B = torch.arange(10) > 4

TD_KEYS = [0, 3, 9, -1, -10, 10, -11, slice(2, 5), slice(None, None, 3), [1, 1, 7],
           torch.tensor([2, 0]), torch.tensor(4), np.int64(5), np.array([3, 1]),
           torch.tensor([True, False] * 5), (0,), "a", 2.0, None]


@pytest.mark.parametrize(
    "tensors",
    [(X,), (X, Y), (X, Y, Z, B), (X[:, 1],), (torch.zeros(0, 3), torch.zeros(0))],
    ids=["one", "two", "four", "1d", "empty"],
)
def test_tensor_dataset_items(tensors):
    """TensorDataset gives the same len(), items (dtype, shape, strides, values),
    errors and warnings as torch's for every key kind: in- and out-of-range ints,
    slices, lists, index and bool tensors, numpy ints and arrays, tuples, invalid keys."""
    compare_probe(lambda lib: lib.TensorDataset(*tensors), TD_KEYS)


def test_tensor_dataset_items_are_views():
    """TensorDataset items are views into the tensors it was given (later writes show
    through, same storage offset and base), and it keeps those very tensors, as torch's does."""
    def run(lib):
        x = torch.zeros(5, 2)
        ds = lib.TensorDataset(x)
        item = ds[1][0]
        x[1, 0] = 7.0  # torch returns views: the change shows through
        return item, item.storage_offset(), item._base is x, ds.tensors[0] is x

    assert_same(run(TORCH), run(FERRO))


def test_tensor_dataset_attributes():
    """TensorDataset.tensors is a tuple holding the very tensors passed in, as in torch."""
    def run(lib):
        ds = lib.TensorDataset(X, Y)
        return type(ds.tensors), len(ds.tensors), ds.tensors[0] is X, ds.tensors[1] is Y

    assert run(TORCH) == run(FERRO)


@pytest.mark.parametrize(
    "args",
    [(), (X, Y[:5]), (X, torch.tensor(1.0)), (X, [1, 2]), (np.zeros((10, 2)),), (5,)],
    ids=["none", "size_mismatch", "0d", "list", "ndarray", "int"],
)
def test_tensor_dataset_constructor_errors(args):
    """Building a TensorDataset from no tensors, tensors of different lengths, a 0-d tensor, a list,
    an ndarray or an int, and taking its len(), fails with torch's exception type and message."""
    assert_same_call(
        lambda: len(TORCH.TensorDataset(*args)), lambda: len(FERRO.TensorDataset(*args))
    )


def test_tensor_dataset_with_requires_grad_and_bfloat16():
    """TensorDataset over a requires_grad float tensor and a bfloat16 tensor gives
    the same items as torch's, indexed directly and through a shuffled DataLoader."""
    w = torch.randn(6, 3, requires_grad=True)
    h = torch.arange(6, dtype=torch.bfloat16)
    compare_probe(lambda lib: lib.TensorDataset(w, h), [0, 5, slice(1, 3)])
    run_both(lambda lib: lib.TensorDataset(w, h), seed=0, batch_size=4, shuffle=True)


# --------------------------------------------------------------------------- #
# StackDataset
# --------------------------------------------------------------------------- #


A = Items(range(5))
C = Items([f"c{i}" for i in range(5)])
GI = ItemsWithGetitems([i * 10 for i in range(5)])


@pytest.mark.parametrize(
    "build",
    [
        lambda lib: lib.StackDataset(A, C),
        lambda lib: lib.StackDataset(A),
        lambda lib: lib.StackDataset(a=A, c=C),
        lambda lib: lib.StackDataset(x=A, gi=GI),
        lambda lib: lib.StackDataset(A, GI, lib.TensorDataset(X[:5])),
        lambda lib: lib.StackDataset(A, Items(range(4))),
        lambda lib: lib.StackDataset(a=A, c=Items(range(6))),
        lambda lib: lib.StackDataset(A, c=C),
        lambda lib: lib.StackDataset(),
        lambda lib: lib.StackDataset(A, 5),
        lambda lib: lib.StackDataset(list(range(5)), "abcde"),
    ],
    ids=["tuple", "single", "dict", "dict_getitems", "tuple_mixed", "len_mismatch",
         "dict_len_mismatch", "both_forms", "empty", "no_len", "plain_sequences"],
)
def test_stack_dataset_items(build):
    """StackDataset in tuple or dict form gives the same len(), items
    and index errors as torch's, and invalid stacks (length mismatch,
    both forms, no datasets, an unsized member) fail the same way."""
    compare_probe(build, [0, 4, -1, 5, -6])


@pytest.mark.parametrize(
    "build",
    [
        lambda lib: lib.StackDataset(A, C),
        lambda lib: lib.StackDataset(a=A, c=C),
        lambda lib: lib.StackDataset(A, GI),
        lambda lib: lib.StackDataset(x=GI, y=C),
        lambda lib: lib.StackDataset(A, ShortGetitems(range(5))),
        lambda lib: lib.StackDataset(s=ShortGetitems(range(5))),
    ],
    ids=["tuple", "dict", "tuple_getitems", "dict_getitems", "short", "dict_short"],
)
@pytest.mark.parametrize("indices", [[0, 2, 4], [], [3, 3], [4, 0, 1, 2, 3], [7]], ids=str)
def test_stack_dataset_getitems(build, indices):
    """StackDataset.__getitems__ returns the same samples as torch's for
    any index list, using members' own __getitems__ where present, and
    fails the same way on a short member result or an out-of-range index."""
    assert_same_call(
        lambda: build(TORCH).__getitems__(indices), lambda: build(FERRO).__getitems__(indices)
    )


@pytest.mark.parametrize("bs", [1, 2, None])
@pytest.mark.parametrize("form", ["tuple", "dict", "getitems"])
def test_stack_dataset_through_loader(form, bs):
    """A StackDataset in tuple form, dict form or with a __getitems__ member gives the
    same batches through a shuffled DataLoader as torch's, for batch_size 1, 2 and None."""
    def make(lib):
        if form == "tuple":
            return lib.StackDataset(lib.TensorDataset(X[:5]), A, C)
        if form == "dict":
            return lib.StackDataset(x=lib.TensorDataset(X[:5]), a=A, c=C)
        return lib.StackDataset(GI, A)

    run_both(make, seed=0, batch_size=bs, shuffle=True)


# --------------------------------------------------------------------------- #
# ConcatDataset and ds1 + ds2
# --------------------------------------------------------------------------- #


CONCAT_KEYS = [0, 4, 5, 9, 12, -1, -5, -13, -14, 13, 100, 1.5, "x"]


@pytest.mark.parametrize(
    "build",
    [
        lambda lib: lib.ConcatDataset([Items(range(5)), Items(range(10, 18))]),
        lambda lib: lib.ConcatDataset([Items([]), Items(range(5)), Items([]), Items("abcdefgh")]),
        lambda lib: lib.ConcatDataset(d for d in [Items(range(13))]),
        lambda lib: lib.ConcatDataset([lib.TensorDataset(X[:6]), lib.TensorDataset(X[6:])]),
        lambda lib: lib.ConcatDataset([list(range(6)), range(7)]),
        lambda lib: lib.ConcatDataset([]),
        lambda lib: lib.ConcatDataset([Items(range(3)), Stream(range(3))]),
        lambda lib: lib.ConcatDataset([Items([])]),
        lambda lib: lib.ConcatDataset([5]),
        lambda lib: Items(range(5)) + Items(range(8)),
        lambda lib: lib.TensorDataset(X[:5]) + lib.TensorDataset(X[5:]) + Items(range(3)),
    ],
    ids=["two", "with_empty", "generator_arg", "tensor_datasets", "plain", "none",
         "iterable_inside", "only_empty", "no_len", "plus", "plus_chain"],
)
def test_concat_dataset_items(build):
    """ConcatDataset and ds1 + ds2 give the same len(), items and errors as torch's
    for in-range, negative, out-of-range and non-integer keys, over empty parts, a
    generator argument, plain sequences, an IterableDataset part or no parts."""
    compare_probe(build, CONCAT_KEYS)


def test_concat_dataset_attributes():
    """ConcatDataset exposes cumulative_sizes, the deprecated cummulative_sizes alias
    (with torch's warning), its datasets as a list, and cumsum(), all as torch's does."""
    def run(lib):
        parts = [Items(range(3)), Items(range(4)), Items([])]
        ds = lib.ConcatDataset(parts)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            old = ds.cummulative_sizes
        return (ds.cumulative_sizes, old, [str(x.message) for x in w],
                [x.category for x in w], ds.datasets == parts, type(ds.datasets),
                lib.ConcatDataset.cumsum(parts))

    assert_same(run(TORCH), run(FERRO))


def test_add_operator_types():
    """ds1 + ds2 gives a torch ConcatDataset for map-style datasets and a ChainDataset
    for iterable ones, with the same type names, lengths and items as torch's."""
    def run(lib):
        a = lib.TensorDataset(X[:3])
        b = lib.TensorDataset(X[3:5])
        s1 = a + b
        s2 = Items(range(2)) + a
        c = lib.ChainDataset([Stream([1])]) + Stream([2])
        return (isinstance(s1, tud.ConcatDataset), type(s1).__name__, len(s1),
                isinstance(s2, tud.ConcatDataset),
                isinstance(c, tud.ChainDataset), type(c).__name__, list(c))

    assert_same(run(TORCH), run(FERRO))


def test_iterable_plus_returns_chain():
    """Adding two subclasses of ferroloader's IterableDataset gives a
    torch ChainDataset that yields the first's items, then the second's."""
    class S(FERRO.IterableDataset):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(self.n))

    c = S(2) + S(3)
    assert isinstance(c, tud.ChainDataset)
    assert list(c) == [0, 1, 0, 1, 2]


@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    idx=st.integers(-40, 40),
)
def test_hypothesis_concat_indexing(sizes, idx):
    """For any part sizes (empty parts included) and any index from -40
    to 40, ConcatDataset returns the same item or error as torch's."""
    def build(lib):
        return lib.ConcatDataset([Items(range(100 * k, 100 * k + s)) for k, s in enumerate(sizes)])

    compare_probe(build, [idx])


# --------------------------------------------------------------------------- #
# ChainDataset
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "build",
    [
        lambda lib: lib.ChainDataset([Stream(range(3)), Stream("ab")]),
        lambda lib: lib.ChainDataset([]),
        lambda lib: lib.ChainDataset([Stream([]), Stream([1])]),
        lambda lib: lib.ChainDataset([Stream([1]), Items([2])]),
        lambda lib: lib.ChainDataset([Stream([1]), Stream([2], with_len=False)]),
        lambda lib: lib.ChainDataset([Stream([1]), [5, 6]]),
        lambda lib: lib.ChainDataset([lib.ChainDataset([Stream([1, 2])]), Stream([3])]),
    ],
    ids=["two", "empty", "with_empty", "map_inside", "no_len", "list_inside", "nested"],
)
def test_chain_dataset(build):
    """ChainDataset yields the same items as torch's on repeated passes,
    computes or refuses len() the same way, and is an IterableDataset,
    for empty, map-style, list, unsized and nested members."""
    def run(lib):
        ds = build(lib)
        return [outcome(lambda: list(ds)), outcome(lambda: len(ds)), outcome(lambda: list(ds)),
                isinstance(ds, tud.IterableDataset)]

    e, a = run(TORCH), run(FERRO)
    for x, y in zip(e, a):
        assert_same_outcome(x, y)


@pytest.mark.parametrize("bs", [1, 2, None])
def test_chain_dataset_through_loader(bs):
    """ChainDataset gives the same batches and len() as torch's
    through a DataLoader with batch_size 1, 2 (drop_last) and None."""
    run_both(lambda lib: lib.ChainDataset([Stream(range(3)), Stream(range(10, 14))]),
             seed=0, batch_size=bs, drop_last=bs == 2)


def test_chain_dataset_is_lazy_about_generator_argument():
    """ChainDataset keeps a generator argument unconsumed until iterated:
    the first pass exhausts it and the second yields nothing, as in torch."""
    def run(lib):
        gen = (Stream([i]) for i in range(3))
        ds = lib.ChainDataset(gen)
        return list(ds), list(ds)  # the generator is spent after the first pass

    assert_same(run(TORCH), run(FERRO))


# --------------------------------------------------------------------------- #
# Subset
# --------------------------------------------------------------------------- #


BASE = Items([f"v{i}" for i in range(10)])
BASE_GI = ItemsWithGetitems([f"v{i}" for i in range(10)])
SUB_KEYS = [0, 2, -1, 5, -6, [0, 1], "x"]


@pytest.mark.parametrize(
    "build",
    [
        lambda lib: lib.Subset(BASE, [9, 0, 4, 4, 7]),
        lambda lib: lib.Subset(BASE, range(2, 8, 2)),
        lambda lib: lib.Subset(BASE, []),
        lambda lib: lib.Subset(BASE, torch.tensor([3, 1])),
        lambda lib: lib.Subset(BASE, np.array([5, 6, 8])),
        lambda lib: lib.Subset(BASE, [20, 1]),
        lambda lib: lib.Subset(lib.TensorDataset(X, Y), [1, 8, 3]),
        lambda lib: lib.Subset(list(range(50, 60)), [3, 4, 5]),
        lambda lib: lib.Subset(BASE_GI, [1, 2]),
        lambda lib: lib.Subset(lib.Subset(BASE, [8, 6, 4, 2]), [3, 0]),
    ],
    ids=["list", "range", "empty", "tensor_idx", "ndarray_idx", "out_of_range",
         "tensor_dataset", "plain_list", "getitems_base", "nested"],
)
def test_subset_items(build):
    """Subset gives the same len(), items and errors as torch's for list,
    range, tensor, ndarray, empty and out-of-range indices, over plain, tensor,
    list, __getitems__ and nested bases, list and non-integer keys included."""
    compare_probe(build, SUB_KEYS)


@pytest.mark.parametrize("indices", [[0, 1], [], [2, 2], [4], [1, 0]], ids=str)
@pytest.mark.parametrize(
    "base",
    [lambda lib: BASE, lambda lib: BASE_GI, lambda lib: lib.TensorDataset(X[:5]),
     lambda lib: lib.StackDataset(A, C)],
    ids=["plain", "getitems", "tensor_dataset", "stack"],
)
def test_subset_getitems(base, indices):
    """Subset.__getitems__ returns the same samples as torch's for any
    index list, delegating to the base's __getitems__ where it has one
    (plain, __getitems__, TensorDataset and StackDataset bases)."""
    def run(lib):
        return lib.Subset(base(lib), [4, 3, 2, 1, 0]).__getitems__(indices)

    assert_same_call(lambda: run(TORCH), lambda: run(FERRO))


def test_subset_attributes():
    """Subset keeps the very dataset and indices objects it
    was given and reports their length, as torch's does."""
    def run(lib):
        idx = [3, 1]
        s = lib.Subset(BASE, idx)
        return s.dataset is BASE, s.indices is idx, len(s)

    assert run(TORCH) == run(FERRO)


def test_subset_subclass_overriding_getitem_only():
    """A Subset subclass that overrides __getitem__ but not __getitems__
    is refused at construction with torch's exception type and message."""
    def run(lib):
        class MySubset(lib.Subset):
            def __getitem__(self, idx):
                return "mine"

        return MySubset(BASE, [0])

    e = outcome(lambda: run(TORCH))
    assert isinstance(e, Raised)
    assert_same_outcome(e, outcome(lambda: run(FERRO)))


def test_subset_subclass_overriding_both():
    """A Subset subclass that overrides both __getitem__ and __getitems__ has
    its overrides used, directly and when a DataLoader batches it, as in torch."""
    def run(lib):
        class MySubset(lib.Subset):
            def __getitem__(self, idx):
                return ("mine", idx)

            def __getitems__(self, indices):
                return [self[i] for i in indices]

        ds = MySubset(BASE, [0, 1, 2])
        return ds[1], list(lib.DataLoader(ds, batch_size=2))

    assert_same(run(TORCH), run(FERRO))


@pytest.mark.parametrize("bs", [1, 3, None])
@pytest.mark.parametrize("base", ["plain", "getitems", "tensor"])
def test_subset_through_loader(base, bs):
    """A Subset of a plain, __getitems__ or TensorDataset base gives the same
    batches through a shuffled DataLoader as torch's, for batch_size 1, 3 and None."""
    def make(lib):
        b = {"plain": BASE, "getitems": BASE_GI, "tensor": lib.TensorDataset(X, Y)}[base]
        return lib.Subset(b, [7, 2, 9, 0, 5])

    run_both(make, seed=0, batch_size=bs, shuffle=True)


# --------------------------------------------------------------------------- #
# Dataset / IterableDataset base classes
# --------------------------------------------------------------------------- #


def test_dataset_base_class():
    """The bare Dataset and IterableDataset base classes fail as torch's do on indexing, len()
    and instantiation/iter(), Dataset.__getitem__ called unbound on another dataset included."""
    def run(lib):
        return [outcome(lambda: lib.Dataset()[0]), outcome(lambda: len(lib.Dataset())),
                outcome(lambda: iter(lib.IterableDataset())),
                outcome(lambda: lib.Dataset.__getitem__(Items([1]), 0))]

    for x, y in zip(run(TORCH), run(FERRO)):
        assert_same_outcome(x, y)


def test_user_subclass_of_ferro_dataset_in_torch_loader():
    """A user dataset subclassing ferroloader's Dataset gives the same shuffled batches
    as an equivalent torch Dataset subclass, in torch's DataLoader and in ferroloader's."""
    class DS(FERRO.Dataset):
        def __getitem__(self, i):
            return {"i": i, "sq": torch.tensor(i * i)}

        def __len__(self):
            return 7

    class TDS(TORCH.Dataset):
        def __getitem__(self, i):
            return {"i": i, "sq": torch.tensor(i * i)}

        def __len__(self):
            return 7

    torch.manual_seed(1)
    e = list(TORCH.DataLoader(TDS(), batch_size=3, shuffle=True))
    torch.manual_seed(1)
    a = list(TORCH.DataLoader(DS(), batch_size=3, shuffle=True))
    torch.manual_seed(1)
    f = list(FERRO.DataLoader(DS(), batch_size=3, shuffle=True))
    assert_same(e, a)
    assert_same(e, f)


def test_user_iterable_subclass_of_ferro():
    """A user IterableDataset subclassing ferroloader's class gives the same batches
    as an equivalent torch subclass, in ferroloader's DataLoader and in torch's."""
    class S(FERRO.IterableDataset):
        def __iter__(self):
            return iter(range(5))

    class T(TORCH.IterableDataset):
        def __iter__(self):
            return iter(range(5))

    assert_same(list(TORCH.DataLoader(T(), batch_size=2)),
                list(FERRO.DataLoader(S(), batch_size=2)))
    assert_same(list(TORCH.DataLoader(T(), batch_size=2)),
                list(TORCH.DataLoader(S(), batch_size=2)))


def test_get_worker_info_main_process():
    """get_worker_info() returns None in the main process, in both libraries."""
    assert TORCH.get_worker_info() is None
    assert FERRO.get_worker_info() is None


# --------------------------------------------------------------------------- #
# pickling and copying
# --------------------------------------------------------------------------- #


COPYABLE_DATASETS = {
    "tensor": lambda lib: lib.TensorDataset(X, Y),
    "stack_tuple": lambda lib: lib.StackDataset(A, C),
    "stack_dict": lambda lib: lib.StackDataset(a=A, c=C),
    "concat": lambda lib: lib.ConcatDataset([A, C]),
    "chain": lambda lib: lib.ChainDataset([Stream([1, 2]), Stream([3])]),
    "subset": lambda lib: lib.Subset(lib.TensorDataset(X), [3, 1]),
}


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy"])
@pytest.mark.parametrize("name", list(COPYABLE_DATASETS))
def test_dataset_copies(name, how):
    """Pickled, deep-copied and shallow-copied datasets of every kind keep torch's type
    name, stay Datasets and yield the same items as torch's copies, or fail the same way."""
    import copy
    import pickle

    def run(lib):
        ds = COPYABLE_DATASETS[name](lib)
        if how == "pickle":
            c = outcome(lambda: pickle.loads(pickle.dumps(ds)))
        elif how == "deepcopy":
            c = outcome(lambda: copy.deepcopy(ds))
        else:
            c = outcome(lambda: copy.copy(ds))
        if isinstance(c, Raised):
            return [c]
        items = list(c) if isinstance(c, tud.IterableDataset) else [c[i] for i in range(len(c))]
        return [type(c).__name__, isinstance(c, tud.Dataset), items]

    e, a = run(TORCH), run(FERRO)
    for x, y in zip(e, a):
        assert_same_outcome(x, y)
