"""ferroloader.DataLoader against torch.utils.data.DataLoader, batch by batch.

Every test runs the same dataset through torch's DataLoader and through
ferroloader's under identical seeds (see helpers.run_both) and compares every
batch, len(loader), the warnings, errors raised while iterating, the calls the
dataset received, and the state of every random generator afterwards.
"""

from __future__ import annotations

import collections
import itertools
import warnings

import ferroloader
import numpy as np
import pytest
import torch
import torch.utils.data as tud
from helpers import (
    FERRO,
    HYPOTHESIS,
    TORCH,
    PerRun,
    Raised,
    assert_same,
    assert_same_outcome,
    compare_runs,
    outcome,
    run_both,
    run_loader,
    seed_all,
)
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(60)

N = 10  # dataset length: batch sizes 3 and 7 leave a partial last batch

Point = collections.namedtuple("Point", ["x", "y"])
Record = collections.namedtuple("Record", ["name", "value", "tags"])


# --------------------------------------------------------------------------- #
# datasets (each built fresh per run from `lib`, the side's module)
# --------------------------------------------------------------------------- #


class ListDataset(tud.Dataset):
    """Map-style dataset over a list built by `make(i)`; logs the indices it gets."""

    def __init__(self, make, n=N):
        self.items = [make(i) for i in range(n)]
        self.log = []

    def __getitem__(self, index):
        self.log.append(("getitem", type(index).__name__, index))
        return self.items[index]

    def __len__(self):
        return len(self.items)

    def __repr__(self):
        return f"ListDataset(n={len(self.items)})"


class GetItemsDataset(ListDataset):
    """Defines __getitems__: the loader must call it with the batch's index list."""

    def __getitems__(self, indices):
        self.log.append(("getitems", type(indices).__name__, list(indices)))
        return [("batched", self.items[i]) for i in indices]


class DictKeyDataset(tud.Dataset):
    """Map-style dataset with string keys (needs a custom sampler)."""

    def __init__(self):
        self.data = {f"k{i}": i * 10 for i in range(N)}
        self.log = []

    def __getitem__(self, key):
        self.log.append(("getitem", type(key).__name__, key))
        return {"key": key, "value": self.data[key]}

    def __len__(self):
        return len(self.data)


class RangeIterable(tud.IterableDataset):
    """IterableDataset without __len__."""

    def __init__(self, n=N, make=None):
        self.n = n
        self.make = make or (lambda i: i)
        self.log = []

    def __iter__(self):
        self.log.append(("iter",))
        for i in range(self.n):
            yield self.make(i)

    def __repr__(self):
        return f"RangeIterable(n={self.n})"


class SizedIterable(RangeIterable):
    """IterableDataset with a __len__ that may under-report (to trigger torch's warning)."""

    def __init__(self, n=N, reported=None, make=None):
        super().__init__(n, make)
        self.reported = n if reported is None else reported

    def __len__(self):
        return self.reported

    def __repr__(self):
        return f"SizedIterable(n={self.n}, reported={self.reported})"


def _t(make):
    return lambda lib: ListDataset(make)


def _noncontig(i):
    return torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2] + i


def _transposed(i):
    return (torch.arange(12, dtype=torch.float64).reshape(3, 4) * i).t()


def _expanded(i):
    return torch.tensor([float(i)]).expand(3, 4)


def _channels_last(i):
    return (torch.arange(24, dtype=torch.float32).reshape(1, 2, 3, 4) + i).to(
        memory_format=torch.channels_last
    )


def _np(dtype):
    def make(i):
        return (np.arange(6).reshape(2, 3) + i).astype(dtype)

    return make


MAP_DATASETS = {
    "int": _t(lambda i: i),
    "negative_big_int": _t(lambda i: -(2**40) + i),
    "float": _t(lambda i: i / 3),
    "float_special": _t(lambda i: [float("nan"), float("inf"), -0.0, 1e308, -1.5][i % 5]),
    "bool": _t(lambda i: i % 3 == 0),
    "str": _t(lambda i: f"s{i}"),
    "bytes": _t(lambda i: bytes([65 + i, 66])),
    "tuple": _t(lambda i: (i, float(i), f"x{i}")),
    "list": _t(lambda i: [i, i * 2, i * 3]),
    "dict": _t(lambda i: {"a": i, "b": float(i), "c": f"c{i}"}),
    "nested_dict": _t(
        lambda i: {"outer": {"inner": [i, (i, i + 1)], "t": torch.full((2,), i)}, "s": "k"}
    ),
    "ordered_dict": _t(lambda i: collections.OrderedDict([("z", i), ("a", [i, i])])),
    "namedtuple": _t(lambda i: Point(i, float(i))),
    "namedtuple_nested": _t(lambda i: Record(f"r{i}", torch.tensor([i, i]), [i, "t"])),
    "tensor_f32_2d": _t(lambda i: torch.arange(6, dtype=torch.float32).reshape(2, 3) * i),
    "tensor_f64_0d": _t(lambda i: torch.tensor(i * 0.5, dtype=torch.float64)),
    "tensor_i64": _t(lambda i: torch.arange(4) + i),
    "tensor_i32": _t(lambda i: torch.arange(4, dtype=torch.int32) - i),
    "tensor_i16": _t(lambda i: torch.arange(3, dtype=torch.int16) * i),
    "tensor_i8": _t(lambda i: torch.arange(3, dtype=torch.int8) - i),
    "tensor_u8": _t(lambda i: torch.arange(5, dtype=torch.uint8) + i),
    "tensor_bf16": _t(lambda i: torch.linspace(0, 1, 5, dtype=torch.bfloat16) * i),
    "tensor_f16": _t(lambda i: torch.linspace(0, 1, 5, dtype=torch.float16) + i),
    "tensor_c64": _t(lambda i: torch.tensor([1 + 2j, i - 1j], dtype=torch.complex64)),
    "tensor_c128": _t(lambda i: torch.tensor([i + 0.5j], dtype=torch.complex128)),
    "tensor_bool": _t(lambda i: torch.tensor([i % 2 == 0, True, False])),
    "tensor_0d_int": _t(lambda i: torch.tensor(i)),
    "tensor_empty": _t(lambda i: torch.zeros(0, 3)),
    "tensor_nan": _t(lambda i: torch.tensor([float("nan"), i, float("-inf")])),
    "tensor_noncontig": _t(_noncontig),
    "tensor_transposed": _t(_transposed),
    "tensor_expanded": _t(_expanded),
    "tensor_channels_last": _t(_channels_last),
    "tensor_requires_grad": _t(lambda i: torch.full((2,), float(i), requires_grad=True)),
    "np_f32": _t(_np(np.float32)),
    "np_f64": _t(_np(np.float64)),
    "np_f16": _t(_np(np.float16)),
    "np_i8": _t(_np(np.int8)),
    "np_i16": _t(_np(np.int16)),
    "np_i32": _t(_np(np.int32)),
    "np_i64": _t(_np(np.int64)),
    "np_u8": _t(_np(np.uint8)),
    "np_u16": _t(_np(np.uint16)),
    "np_u32": _t(_np(np.uint32)),
    "np_u64": _t(_np(np.uint64)),
    "np_bool": _t(_np(np.bool_)),
    "np_c64": _t(_np(np.complex64)),
    "np_c128": _t(_np(np.complex128)),
    "np_0d": _t(lambda i: np.array(i * 1.5)),
    "np_noncontig": _t(lambda i: (np.arange(12, dtype=np.float32).reshape(3, 4) + i)[:, ::2]),
    "np_fortran": _t(lambda i: np.asfortranarray(np.arange(6.0).reshape(2, 3) + i)),
    "np_scalar_f32": _t(lambda i: np.float32(i) / 4),
    "np_scalar_f64": _t(lambda i: np.float64(i) / 4),
    "np_scalar_i64": _t(lambda i: np.int64(i)),
    "np_scalar_i16": _t(lambda i: np.int16(i)),
    "np_scalar_u8": _t(lambda i: np.uint8(i)),
    "np_scalar_bool": _t(lambda i: np.bool_(i % 2)),
    "np_str_array": _t(lambda i: np.array(["a", "b"])),
    "np_object_array": _t(lambda i: np.array([i, "x"], dtype=object)),
    "none": _t(lambda i: None),
    "complex_py": _t(lambda i: complex(i, 1)),
    "mixed_int_float": _t(lambda i: i if i % 2 else float(i)),
    "mix": _t(
        lambda i: {
            "image": torch.full((3, 2, 2), i, dtype=torch.uint8),
            "feat": np.full((4,), i, dtype=np.float32),
            "label": i % 3,
            "weight": i / 7,
            "name": f"item{i}",
            "raw": b"\x00" * (i % 2 + 1),
            "pair": (np.int32(i), torch.tensor(float(i))),
            "meta": {"ok": i % 2 == 0, "ids": [i, i + 1]},
        }
    ),
    "getitems": lambda lib: GetItemsDataset(lambda i: {"v": i, "t": torch.tensor([i, -i])}),
    "torch_tensor_dataset": lambda lib: TORCH.TensorDataset(
        torch.randn(N, 32), torch.randint(0, 5, (N,))
    ),
    "ferro_tensor_dataset": lambda lib: FERRO.TensorDataset(
        torch.randn(N, 32), torch.randint(0, 5, (N,))
    ),
    "lib_tensor_dataset": lambda lib: lib.TensorDataset(
        torch.randn(N, 32), torch.randint(0, 5, (N,))
    ),
    "lib_tensor_dataset_3": lambda lib: lib.TensorDataset(
        torch.arange(N, dtype=torch.float64),
        torch.randn(N, 2, 3).transpose(1, 2),
        torch.randint(0, 2, (N,), dtype=torch.bool),
    ),
}

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
    run_both(
        MAP_DATASETS[name],
        seed=7,
        batch_size=bs,
        shuffle=True,
        generator=torch.Generator().manual_seed(99),
    )


@pytest.mark.parametrize("shuffle", [False, True])
def test_generator_consumed_without_shuffle(shuffle):
    # The base seed is drawn from generator= even when nothing is shuffled.
    run_both(
        MAP_DATASETS["int"], seed=3, batch_size=4, shuffle=shuffle,
        generator=torch.Generator().manual_seed(5),
    )


# --------------------------------------------------------------------------- #
# samplers passed to the loader
# --------------------------------------------------------------------------- #


class UserSampler(tud.Sampler):
    """A Python sampler that draws from the global torch RNG while iterating."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        order = list(range(self.n - 1, -1, -1))
        for i in order:
            if torch.rand(()) < 0.3:
                yield (i * 7) % self.n
            yield i

    def __len__(self):
        return 2 * self.n


class UserBatchSampler(tud.Sampler):
    """Batches of varying size, one of them drawn from the global RNG."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        start = 0
        size = 1
        while start < self.n:
            yield list(range(start, min(start + size, self.n)))
            start += size
            size = int(torch.randint(1, 4, ()).item())

    def __len__(self):
        return self.n


def _samplers():
    """name -> fn(ctx) building a sampler over ctx.dataset, from ctx.lib's classes."""

    def lib_sampler(cls_name, *args_fn, **kw):
        def build(ctx, cls_from=None):
            lib = cls_from or ctx.lib
            cls = getattr(lib, cls_name)
            resolved = {k: (v(ctx) if callable(v) else v) for k, v in kw.items()}
            return cls(*(a(ctx) if callable(a) else a for a in args_fn), **resolved)

        return build

    ds = lambda ctx: ctx.dataset  # noqa: E731
    gen = lambda seed: (lambda ctx: ctx.gen(seed))  # noqa: E731
    return {
        "sequential": lib_sampler("SequentialSampler", ds),
        "random": lib_sampler("RandomSampler", ds),
        "random_gen": lib_sampler("RandomSampler", ds, generator=gen(11)),
        "random_repl": lib_sampler("RandomSampler", ds, replacement=True),
        "random_repl_gen_40": lib_sampler(
            "RandomSampler", ds, replacement=True, num_samples=40, generator=gen(12)
        ),
        "random_num_samples_small": lib_sampler("RandomSampler", ds, num_samples=4),
        "random_num_samples_big": lib_sampler("RandomSampler", ds, num_samples=25),
        "random_num_samples_multiple": lib_sampler(
            "RandomSampler", ds, num_samples=2 * N, generator=gen(13)
        ),
        "subset_random": lib_sampler(
            "SubsetRandomSampler", lambda ctx: [8, 1, 5, 3, 9, 0]
        ),
        "subset_random_gen": lib_sampler(
            "SubsetRandomSampler", lambda ctx: range(2, 9), generator=gen(14)
        ),
        "weighted": lib_sampler(
            "WeightedRandomSampler", lambda ctx: [0.1, 0.5, 2.0, 0, 1, 1, 3, 0.2, 0.2, 4], 15
        ),
        "weighted_noreplace_gen": lib_sampler(
            "WeightedRandomSampler",
            lambda ctx: torch.tensor([1.0, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
            7,
            replacement=False,
            generator=gen(15),
        ),
        "distributed": lib_sampler(
            "DistributedSampler", ds, num_replicas=3, rank=1, shuffle=True, seed=4
        ),
        "distributed_noshuffle_droplast": lib_sampler(
            "DistributedSampler", ds, num_replicas=4, rank=3, shuffle=False, drop_last=True
        ),
    }


SAMPLERS = _samplers()


def _user_sampler(ctx):
    return UserSampler(len(ctx.dataset))


SAMPLER_CASES = [
    *((name, src) for name in SAMPLERS for src in ("own", "torch", "ferro")),
    ("user", "own"),
    ("plain_list", "own"),
]


@pytest.mark.parametrize("bs", [1, 3, None])
@pytest.mark.parametrize("sampler_name,sampler_from", SAMPLER_CASES)
def test_sampler_argument(sampler_name, sampler_from, bs):
    """sampler= from the run's own lib, or always torch's / ferroloader's classes."""
    if sampler_name == "user":
        build = _user_sampler
    elif sampler_name == "plain_list":
        build = lambda ctx: [3, 1, 4, 1, 5, 9, 2, 6]  # noqa: E731
    else:
        cls_from = {"own": None, "torch": TORCH, "ferro": FERRO}[sampler_from]
        fn = SAMPLERS[sampler_name]
        build = lambda ctx: fn(ctx, cls_from)  # noqa: E731
    run_both(
        lambda lib: ListDataset(lambda i: {"i": i, "t": torch.tensor([i, 2 * i])}),
        seed=21,
        batch_size=bs,
        sampler=PerRun(build, sampler_name),
    )


@pytest.mark.parametrize("name", ["random", "random_repl", "subset_random", "weighted"])
def test_sampler_sharing_loader_generator(name):
    """Sampler and loader share one generator: the order of draws must match torch."""
    cls_name = {
        "random": "RandomSampler",
        "random_repl": "RandomSampler",
        "subset_random": "SubsetRandomSampler",
        "weighted": "WeightedRandomSampler",
    }[name]

    def build(ctx):
        cls = getattr(ctx.lib, cls_name)
        if name == "random":
            return cls(ctx.dataset, generator=ctx.generator)
        if name == "random_repl":
            return cls(ctx.dataset, replacement=True, num_samples=70, generator=ctx.generator)
        if name == "subset_random":
            return cls([0, 2, 4, 6, 8], generator=ctx.generator)
        return cls([1.0] * N, 12, generator=ctx.generator)

    run_both(
        MAP_DATASETS["int"],
        seed=5,
        batch_size=3,
        sampler=PerRun(build, name),
        generator=torch.Generator().manual_seed(2024),
        epochs=(None, 2, None),
    )


def test_sampler_with_string_keys():
    run_both(
        lambda lib: DictKeyDataset(),
        seed=0,
        batch_size=4,
        sampler=PerRun(lambda ctx: [f"k{i}" for i in (9, 2, 4, 4, 0, 7)], "keys"),
    )


def test_distributed_sampler_set_epoch_through_loader():
    def make(ctx):
        s = ctx.lib.DistributedSampler(ctx.dataset, num_replicas=2, rank=0, seed=3)
        s.set_epoch(5)
        return s

    run_both(MAP_DATASETS["int"], seed=0, batch_size=2, sampler=PerRun(make, "dist"))


# --------------------------------------------------------------------------- #
# batch_sampler=
# --------------------------------------------------------------------------- #


def _batch_samplers():
    def bs_of(inner, batch_size, drop_last, cls_from=None):
        def build(ctx):
            lib = cls_from or ctx.lib
            return lib.BatchSampler(inner(ctx, lib), batch_size, drop_last)

        return build

    def seq(ctx, lib):
        return lib.SequentialSampler(ctx.dataset)

    def rnd(ctx, lib):
        return lib.RandomSampler(ctx.dataset, generator=ctx.gen(31))

    def rnd_global(ctx, lib):
        return lib.RandomSampler(ctx.dataset)

    def rnd_shared(ctx, lib):
        return lib.RandomSampler(ctx.dataset, generator=ctx.generator)

    def dist(ctx, lib):
        return lib.DistributedSampler(ctx.dataset, num_replicas=2, rank=1)

    return {
        "seq_3": bs_of(seq, 3, False),
        "seq_3_drop": bs_of(seq, 3, True),
        "random_4": bs_of(rnd, 4, False),
        "random_global_4_drop": bs_of(rnd_global, 4, True),
        "random_shared_gen_3": bs_of(rnd_shared, 3, False),
        "dist_2": bs_of(dist, 2, False),
        "torch_bs_over_ferro_sampler": bs_of(lambda c, lib: FERRO.RandomSampler(c.dataset), 3,
                                             False, TORCH),
        "ferro_bs_over_torch_sampler": bs_of(lambda c, lib: TORCH.RandomSampler(c.dataset), 3,
                                             False, FERRO),
        "torch_bs": bs_of(rnd_global, 3, False, TORCH),
        "ferro_bs": bs_of(rnd_global, 3, False, FERRO),
        "bs_over_list": bs_of(lambda c, lib: [5, 4, 3, 2, 1, 0, 9], 2, False),
        "user": lambda ctx: UserBatchSampler(len(ctx.dataset)),
        "list_of_lists": lambda ctx: [[0, 1, 2], [9], [4, 4], [3, 5, 7, 8]],
    }


BATCH_SAMPLERS = _batch_samplers()


@pytest.mark.parametrize("with_generator", [False, True])
@pytest.mark.parametrize("name", list(BATCH_SAMPLERS))
def test_batch_sampler_argument(name, with_generator):
    kw = {}
    if with_generator:
        kw["generator"] = torch.Generator().manual_seed(77)
    run_both(
        MAP_DATASETS["mix"],
        seed=8,
        batch_sampler=PerRun(BATCH_SAMPLERS[name], name),
        epochs=(None, 1, None),
        **kw,
    )


def test_getitems_receives_batch_sampler_lists():
    run_both(
        MAP_DATASETS["getitems"],
        seed=0,
        batch_sampler=PerRun(lambda ctx: [[3, 1], [0], [2, 2, 2]], "lists"),
    )


@pytest.mark.parametrize("bs", [None, 1, 4])
def test_getitems_dataset(bs):
    run_both(MAP_DATASETS["getitems"], seed=2, batch_size=bs, shuffle=True)


# --------------------------------------------------------------------------- #
# collate_fn
# --------------------------------------------------------------------------- #


def identity_collate(batch):
    return batch


def random_collate(batch):
    # draws from the global RNG: the order of draws relative to the sampler's matters
    noise = torch.randint(0, 100, (len(batch),))
    return {"batch": batch, "noise": noise}


def convert_then_sum(batch):
    return sum(int(x) for x in batch)


COLLATE_FNS = {
    "identity": lambda ctx: identity_collate,
    "random": lambda ctx: random_collate,
    "sum": lambda ctx: convert_then_sum,
    "lib_default_collate": lambda ctx: ctx.lib.default_collate,
    "lib_default_convert": lambda ctx: ctx.lib.default_convert,
    "torch_default_collate": lambda ctx: TORCH.default_collate,
    "ferro_default_collate": lambda ctx: FERRO.default_collate,
    "lambda_via_lib": lambda ctx: (lambda b: ctx.lib.default_collate([x * 2 for x in b])),
}


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("bs", [1, 3, None])
@pytest.mark.parametrize("name", list(COLLATE_FNS))
def test_custom_collate_fn(name, bs, shuffle):
    run_both(
        MAP_DATASETS["int"],
        seed=4,
        batch_size=bs,
        shuffle=shuffle,
        collate_fn=PerRun(COLLATE_FNS[name], name),
    )


@pytest.mark.parametrize("name", ["mix", "tuple", "np_f32", "tensor_transposed"])
def test_lib_default_collate_as_collate_fn(name):
    run_both(
        MAP_DATASETS[name],
        seed=4,
        batch_size=3,
        collate_fn=PerRun(COLLATE_FNS["lib_default_collate"], "default_collate"),
    )


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
# IterableDataset
# --------------------------------------------------------------------------- #


ITERABLES = {
    "ints_nolen": lambda lib: RangeIterable(),
    "ints_len": lambda lib: SizedIterable(),
    "empty": lambda lib: RangeIterable(0),
    "dicts": lambda lib: RangeIterable(make=lambda i: {"x": torch.full((2,), i), "s": str(i)}),
    "numpy": lambda lib: RangeIterable(make=lambda i: np.full((3,), i, dtype=np.int16)),
    "tuples": lambda lib: SizedIterable(make=lambda i: (i, float(i) / 2, torch.tensor([i]))),
    "chain": lambda lib: lib.ChainDataset([RangeIterable(4), SizedIterable(5)]),
    "chain_plus": lambda lib: RangeIterable(3) + SizedIterable(4),
}


@pytest.mark.parametrize("bs,drop_last", [(1, False), (3, False), (3, True), (7, True),
                                          (None, False), (11, False), (11, True)], ids=str)
@pytest.mark.parametrize("name", list(ITERABLES))
def test_iterable_dataset(name, bs, drop_last):
    run_both(ITERABLES[name], seed=3, batch_size=bs, drop_last=drop_last)


@pytest.mark.parametrize("name", ["ints_nolen", "dicts"])
def test_iterable_dataset_with_generator(name):
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
    def collect(lib):
        loader = lib.DataLoader(SizedIterable(6, reported=2), batch_size=1)
        assert len(loader) == 2
        with pytest.warns(UserWarning) as record:
            list(loader)
        return [str(w.message) for w in record]

    assert collect(TORCH) == collect(FERRO)
    assert collect(TORCH)  # torch does warn here


def test_iterable_len_without_len():
    run_both(ITERABLES["ints_nolen"], seed=0, batch_size=3)


def test_iterable_len_not_called_no_warning():
    e, a = run_both(lambda lib: SizedIterable(N, reported=1), seed=0, call_len=False)
    assert e.warnings == a.warnings == []


# --------------------------------------------------------------------------- #
# len(loader)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("bs,drop_last", [(1, False), (3, False), (3, True), (None, False),
                                          (10, True), (11, True), (11, False)], ids=str)
@pytest.mark.parametrize("n", [0, 1, 10, 11])
def test_len_loader_map(n, bs, drop_last):
    def lens(lib):
        out = []
        ds = ListDataset(lambda i: i, n=n)
        for shuffle in (False, True):
            loader = lib.DataLoader(ds, batch_size=bs, shuffle=shuffle, drop_last=drop_last)
            out.append(len(loader))
            if n > 0:
                out.append(sum(1 for _ in loader))
        return out

    assert_same_outcome(outcome(lambda: lens(TORCH)), outcome(lambda: lens(FERRO)))


def test_len_loader_with_samplers():
    def lens(lib):
        ds = ListDataset(lambda i: i)
        return [
            len(lib.DataLoader(ds, sampler=lib.RandomSampler(ds, num_samples=23), batch_size=4)),
            len(lib.DataLoader(ds, sampler=lib.WeightedRandomSampler([1.0] * 3, 5),
                               batch_size=2, drop_last=True)),
            len(lib.DataLoader(ds, batch_sampler=[[1], [2, 3]])),
            len(lib.DataLoader(ds, sampler=lib.DistributedSampler(ds, 3, 2), batch_size=None)),
        ]

    assert lens(TORCH) == lens(FERRO)


def test_len_loader_sampler_without_len():
    def gen_sampler():
        yield from range(3)

    e = Raised.of(_raises(lambda: len(TORCH.DataLoader(range(5), sampler=gen_sampler()))))
    a = Raised.of(_raises(lambda: len(FERRO.DataLoader(range(5), sampler=gen_sampler()))))
    assert_same_outcome(e, a)


def _raises(fn):
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("expected an exception")


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
    ids=lambda d: ",".join(sorted(d)) + ("=" + repr(next(iter(d.values()))) if d else ""),
)
def test_misc_arguments(extra):
    run_both(MAP_DATASETS["dict"], seed=0, batch_size=3, **extra)


def test_get_worker_info_in_main_process():
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
# errors while iterating
# --------------------------------------------------------------------------- #


class FailingDataset(tud.Dataset):
    def __init__(self, bad=(4,), exc=KeyError):
        self.bad = set(bad)
        self.exc = exc

    def __getitem__(self, i):
        if i in self.bad:
            raise self.exc(f"bad index {i}")
        return torch.tensor([i])

    def __len__(self):
        return N


@pytest.mark.parametrize("exc", [KeyError, ValueError, IndexError, RuntimeError, StopIteration])
@pytest.mark.parametrize("bs", [1, 3, None])
def test_dataset_error_propagates_and_loader_reusable(exc, bs):
    run_both(lambda lib: FailingDataset(exc=exc), seed=0, batch_size=bs, epochs=(None, None, 2))


def test_collate_error_during_iteration():
    run_both(MAP_DATASETS["none"], seed=0, batch_size=2)
    run_both(MAP_DATASETS["np_str_array"], seed=0, batch_size=2)


class ErroringIterable(tud.IterableDataset):
    def __iter__(self):
        yield 1
        yield 2
        raise ValueError("stream broke")


@pytest.mark.parametrize("bs", [1, 2, 3, None])
def test_iterable_error_propagates(bs):
    run_both(lambda lib: ErroringIterable(), seed=0, batch_size=bs)


# --------------------------------------------------------------------------- #
# two-way drop-in
# --------------------------------------------------------------------------- #


def test_ferro_datasets_are_torch_datasets():
    x, y = torch.randn(N, 32), torch.randint(0, 5, (N,))
    assert isinstance(ferroloader.TensorDataset(x, y), tud.Dataset)
    assert isinstance(ferroloader.TensorDataset(x, y), tud.TensorDataset)
    assert isinstance(ferroloader.Dataset(), tud.Dataset)
    assert issubclass(ferroloader.IterableDataset, tud.IterableDataset)
    for name in ("StackDataset", "ConcatDataset", "ChainDataset", "Subset"):
        assert issubclass(getattr(ferroloader, name), getattr(tud, name)), name
    for name in (
        "Sampler SequentialSampler RandomSampler SubsetRandomSampler "
        "WeightedRandomSampler BatchSampler DistributedSampler"
    ).split():
        assert issubclass(getattr(ferroloader, name), getattr(tud, name)), name
    ds = ferroloader.TensorDataset(x, y)
    assert isinstance(ferroloader.RandomSampler(ds), tud.Sampler)
    assert isinstance(ferroloader.SequentialSampler(ds), tud.SequentialSampler)


LIB_SAMPLERS = ["sequential", "random_gen", "random_repl", "subset_random", "weighted",
                "distributed", "random_num_samples_multiple"]


@pytest.mark.parametrize("sampler_name", LIB_SAMPLERS)
def test_torch_loader_accepts_ferro_samplers_and_datasets(sampler_name):
    fn = SAMPLERS[sampler_name]
    # expected: torch loader, torch dataset, torch sampler
    # actual:   torch loader, ferroloader dataset, ferroloader sampler
    run_both(
        lambda lib: lib.TensorDataset(torch.randn(N, 4), torch.arange(N)),
        seed=17,
        batch_size=3,
        sampler=PerRun(fn, sampler_name),
        actual=(TORCH.DataLoader, FERRO),
    )


@pytest.mark.parametrize("sampler_name", LIB_SAMPLERS)
def test_ferro_loader_accepts_torch_samplers_and_datasets(sampler_name):
    fn = SAMPLERS[sampler_name]
    run_both(
        lambda lib: lib.TensorDataset(torch.randn(N, 4), torch.arange(N)),
        seed=17,
        batch_size=3,
        sampler=PerRun(fn, sampler_name),
        actual=(FERRO.DataLoader, TORCH),
    )


@pytest.mark.parametrize("sampler_name", LIB_SAMPLERS)
def test_ferro_batches_equal_torch_loader_fed_ferro_samplers(sampler_name):
    """ferroloader (all ferro) == torch DataLoader fed ferroloader's samplers."""
    fn = SAMPLERS[sampler_name]
    mk = lambda lib: lib.TensorDataset(torch.randn(N, 4), torch.arange(N))  # noqa: E731
    kw = dict(seed=17, epochs=(None, None), call_len=True,
              loader_kwargs={"batch_size": 3, "sampler": PerRun(fn, sampler_name)})
    e = run_loader(TORCH.DataLoader, FERRO, mk, side="torch", **kw)
    a = run_loader(FERRO.DataLoader, FERRO, mk, side="ferroloader", **kw)
    compare_runs(e, a)


def test_torch_loader_with_ferro_batch_sampler():
    run_both(
        MAP_DATASETS["tensor_i64"],
        seed=2,
        batch_sampler=PerRun(
            lambda c: c.lib.BatchSampler(c.lib.RandomSampler(c.dataset), 4, True), "bs"
        ),
        actual=(TORCH.DataLoader, FERRO),
    )


def test_torch_loader_with_ferro_tensor_dataset_shuffle():
    run_both(
        lambda lib: lib.TensorDataset(torch.randn(N, 32), torch.randint(0, 5, (N,))),
        seed=5,
        batch_size=4,
        shuffle=True,
        actual=(TORCH.DataLoader, FERRO),
    )


def test_ferro_loader_with_ferro_subset_and_concat():
    def make(lib):
        base = lib.TensorDataset(torch.arange(12.0).reshape(6, 2), torch.arange(6))
        return lib.ConcatDataset([lib.Subset(base, [5, 0, 3]), base])

    run_both(make, seed=9, batch_size=4, shuffle=True)


def test_loader_attributes():
    def attrs(lib, **kw):
        ds = ListDataset(lambda i: i)
        loader = lib.DataLoader(ds, **kw)
        return {
            "batch_size": loader.batch_size,
            "drop_last": loader.drop_last,
            "num_workers": loader.num_workers,
            "prefetch_factor": loader.prefetch_factor,
            "pin_memory": loader.pin_memory,
            "timeout": loader.timeout,
            "persistent_workers": loader.persistent_workers,
            "in_order": loader.in_order,
            "dataset_is": loader.dataset is ds,
            "sampler": type(loader.sampler).__name__,
            "batch_sampler": type(loader.batch_sampler).__name__,
            "collate_fn": getattr(loader.collate_fn, "__name__", None),
            "multiprocessing_context": loader.multiprocessing_context,
            "generator": loader.generator,
        }

    for kw in (
        {},
        {"batch_size": 4, "shuffle": True, "drop_last": True},
        {"batch_size": None},
        {"batch_sampler": [[0, 1]]},
    ):
        assert attrs(TORCH, **kw) == attrs(FERRO, **kw), kw

    ds = ListDataset(lambda i: i)
    loader = FERRO.DataLoader(ds, batch_size=2, shuffle=True)
    assert isinstance(loader.sampler, tud.RandomSampler)
    assert isinstance(loader.batch_sampler, tud.BatchSampler)
    assert loader.batch_sampler.batch_size == 2
    assert loader.batch_sampler.sampler is loader.sampler


def test_setting_loader_attribute_allowed_ones():
    # torch lets users set attributes that are not frozen; so must ferroloader
    for lib in (TORCH, FERRO):
        loader = lib.DataLoader(list(range(4)), batch_size=2)
        loader.collate_fn = identity_collate
        loader.some_user_attr = 3
        assert list(loader) == [[0, 1], [2, 3]]


# --------------------------------------------------------------------------- #
# hypothesis: random loader configurations
# --------------------------------------------------------------------------- #


@HYPOTHESIS
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
# subclasses of built-in samplers and datasets: overrides must be honoured
# --------------------------------------------------------------------------- #


def _sampler_subclasses():
    def reversed_random(base):
        class ReversedRandom(base):
            def __iter__(self):
                return iter(list(super().__iter__())[::-1])

        return ReversedRandom

    def skipping_sequential(base):
        class EveryOther(base):
            def __iter__(self):
                return iter(range(0, len(self.data_source), 2))

        return EveryOther

    def fewer_random(base):
        class FewerRandom(base):
            @property
            def num_samples(self):
                return 4

        return FewerRandom

    def own_len_sequential(base):
        class ShortLen(base):
            def __len__(self):
                return 3

        return ShortLen

    return {
        "reversed_random": (reversed_random, "RandomSampler", lambda ctx: (ctx.dataset,)),
        "every_other_sequential": (skipping_sequential, "SequentialSampler",
                                   lambda ctx: (ctx.dataset,)),
        "num_samples_property": (fewer_random, "RandomSampler", lambda ctx: (ctx.dataset,)),
        "own_len_sequential": (own_len_sequential, "SequentialSampler",
                               lambda ctx: (ctx.dataset,)),
        "reversed_weighted": (reversed_random, "WeightedRandomSampler",
                              lambda ctx: ([1.0] * N, 8)),
        "reversed_subset": (reversed_random, "SubsetRandomSampler", lambda ctx: ([1, 5, 7],)),
        "reversed_distributed": (reversed_random, "DistributedSampler",
                                 lambda ctx: (ctx.dataset, 2, 1)),
    }


SAMPLER_SUBCLASSES = _sampler_subclasses()


@pytest.mark.parametrize("base_from", ["own", "torch"])
@pytest.mark.parametrize("bs", [1, 4, None])
@pytest.mark.parametrize("name", list(SAMPLER_SUBCLASSES))
def test_sampler_subclass_overrides_are_honoured(name, bs, base_from):
    make_cls, base_name, args = SAMPLER_SUBCLASSES[name]

    def build(ctx):
        lib = ctx.lib if base_from == "own" else TORCH
        return make_cls(getattr(lib, base_name))(*args(ctx))

    run_both(MAP_DATASETS["int"], seed=6, batch_size=bs, sampler=PerRun(build, name))


@pytest.mark.parametrize("base_from", ["own", "torch"])
def test_batch_sampler_subclass_overrides_are_honoured(base_from):
    def build(ctx):
        lib = ctx.lib if base_from == "own" else TORCH

        class PairsReversed(lib.BatchSampler):
            def __iter__(self):
                for b in super().__iter__():
                    yield b[::-1]

        return PairsReversed(lib.RandomSampler(ctx.dataset), 3, False)

    run_both(MAP_DATASETS["tuple"], seed=6, batch_sampler=PerRun(build, "pairs"))


def _sampler_mutations():
    def random_repl(ctx):
        s = ctx.lib.RandomSampler(ctx.dataset)
        s.replacement = True
        s._num_samples = 13
        s.generator = ctx.gen(3)
        return s

    def weighted(ctx):
        s = ctx.lib.WeightedRandomSampler([1.0] * N, 4)
        s.weights = torch.arange(N, dtype=torch.double)
        s.num_samples = 9
        s.replacement = False
        return s

    def dist(ctx):
        s = ctx.lib.DistributedSampler(ctx.dataset, num_replicas=3, rank=0, shuffle=False)
        s.epoch = 4
        s.seed = 99
        s.shuffle = True
        s.rank = 2
        return s

    def subset(ctx):
        s = ctx.lib.SubsetRandomSampler([0, 1])
        s.indices = [9, 8, 7, 6]
        return s

    def sequential(ctx):
        s = ctx.lib.SequentialSampler(ctx.dataset)
        s.data_source = list(range(4))
        return s

    return {"random": random_repl, "weighted": weighted, "distributed": dist,
            "subset": subset, "sequential": sequential}


SAMPLER_MUTATIONS = _sampler_mutations()


@pytest.mark.parametrize("bs", [2, None])
@pytest.mark.parametrize("name", list(SAMPLER_MUTATIONS))
def test_sampler_attributes_changed_after_construction(name, bs):
    """torch reads a sampler's attributes when it iterates, not when it is built."""
    run_both(MAP_DATASETS["int"], seed=12, batch_size=bs,
             sampler=PerRun(SAMPLER_MUTATIONS[name], name))


def test_batch_sampler_attributes_changed_after_construction():
    def build(ctx):
        b = ctx.lib.BatchSampler(ctx.lib.SequentialSampler(ctx.dataset), 2, False)
        b.batch_size = 4
        b.drop_last = True
        b.sampler = ctx.lib.RandomSampler(ctx.dataset, generator=ctx.gen(2))
        return b

    run_both(MAP_DATASETS["int"], seed=0, batch_sampler=PerRun(build, "bs"))


def test_sampler_changed_between_epochs():
    def run(lib):
        seed_all(1)
        ds = ListDataset(lambda i: i)
        s = lib.RandomSampler(ds, generator=torch.Generator().manual_seed(4))
        loader = lib.DataLoader(ds, sampler=s, batch_size=3)
        out = [list(loader)]
        s.replacement = True
        s._num_samples = 5
        out.append(list(loader))
        ds.items.extend([10, 11])  # the data source grows
        s.replacement = False
        s._num_samples = None
        out.append(list(loader))
        out.append(torch.rand(2))
        return out

    assert_same(run(TORCH), run(FERRO))


class ScaledTensorDataset:
    """Factory of TensorDataset subclasses whose __getitem__ transforms items."""

    @staticmethod
    def make(base):
        class Scaled(base):
            def __getitem__(self, index):
                x, y = super().__getitem__(index)
                return x * 2, y + 100

        return Scaled


@pytest.mark.parametrize("base_from", ["own", "torch", "ferro"])
@pytest.mark.parametrize("bs", [1, 3, None])
def test_tensor_dataset_subclass_getitem_is_honoured(base_from, bs):
    def make(lib):
        base = {"own": lib, "torch": TORCH, "ferro": FERRO}[base_from].TensorDataset
        return ScaledTensorDataset.make(base)(torch.randn(N, 4), torch.arange(N))

    run_both(make, seed=3, batch_size=bs, shuffle=True)


def test_tensor_dataset_subclass_with_getitems():
    def make(lib):
        class WithGetitems(lib.TensorDataset):
            def __getitems__(self, indices):
                return [(self.tensors[0][i].sum(), i) for i in indices]

        return WithGetitems(torch.randn(N, 4), torch.arange(N))

    run_both(make, seed=3, batch_size=4, shuffle=True)


def test_tensor_dataset_tensors_replaced_after_loader_built():
    def run(lib):
        seed_all(0)
        ds = lib.TensorDataset(torch.zeros(N, 2), torch.arange(N))
        loader = lib.DataLoader(ds, batch_size=4)
        first = list(loader)
        ds.tensors = (torch.ones(N, 3), torch.arange(N) * 2)
        second = list(loader)
        ds.tensors[0][0] = 7.0  # in-place change of the data also shows
        return first, second, list(loader)

    assert_same(run(TORCH), run(FERRO))


TENSOR_DATASET_TENSORS = {
    "float32_labels": lambda: (torch.randn(N, 32), torch.randint(0, 5, (N,))),
    "transposed": lambda: (torch.randn(4, N).t(),),
    "expanded": lambda: (torch.arange(3.0).expand(N, 3),),
    "offset": lambda: (torch.arange(3 * (N + 2)).reshape(N + 2, 3)[2:],),
    "strided_rows": lambda: (torch.arange(4 * 2 * N).reshape(2 * N, 4)[::2],),
    "channels_last": lambda: (torch.randn(N, 3, 2, 2).to(memory_format=torch.channels_last),),
    "dtypes": lambda: (
        torch.arange(N, dtype=torch.bfloat16),
        torch.arange(N, dtype=torch.int8),
        torch.arange(N) % 2 == 0,
        torch.arange(N).to(torch.complex64),
        torch.arange(N, dtype=torch.int32).to(torch.uint16),
        torch.arange(N, dtype=torch.float16).reshape(N, 1, 1),
    ),
    "zero_width": lambda: (torch.zeros(N, 0), torch.zeros(N, 3, 0, dtype=torch.int64)),
    "requires_grad": lambda: (torch.randn(N, 2, requires_grad=True),),
    "parameter": lambda: (torch.nn.Parameter(torch.randn(N, 2)),),
    "conj": lambda: (torch.randn(N, 2, dtype=torch.complex64).conj(),),
    "nan": lambda: (torch.tensor([float("nan")] * N),),
    "one_dim": lambda: (torch.arange(N),),
}


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("bs", [1, 4, None])
@pytest.mark.parametrize("name", list(TENSOR_DATASET_TENSORS))
def test_tensor_dataset_layouts(name, bs, shuffle):
    run_both(lambda lib: lib.TensorDataset(*TENSOR_DATASET_TENSORS[name]()), seed=2,
             batch_size=bs, shuffle=shuffle)


TD_INDEX_SAMPLERS = {
    "negative": [-1, -10, 3, -4],
    "out_of_range": [0, 1, 10, 2],
    "negative_out_of_range": [0, -11],
    "numpy_ints": [np.int64(2), np.int32(1), np.uint8(7)],
    "tensor_ints": [torch.tensor(3), torch.tensor(0)],
    "bools": [True, False, True],
    "slices": [slice(0, 2), slice(1, 3)],
    "lists": [[0, 1], [2, 3]],
    "floats": [1.0, 2.0],
    "none": [None, None],
}


@pytest.mark.parametrize("bs", [2, None])
@pytest.mark.parametrize("name", list(TD_INDEX_SAMPLERS))
def test_tensor_dataset_unusual_indices(name, bs):
    run_both(
        lambda lib: lib.TensorDataset(torch.arange(4.0 * N).reshape(N, 4), torch.arange(N)),
        seed=0,
        batch_size=bs,
        sampler=PerRun(lambda ctx: list(TD_INDEX_SAMPLERS[name]), name),
    )


# --------------------------------------------------------------------------- #
# the iterator object, unusual index types, __getitems__ variants
# --------------------------------------------------------------------------- #


def test_iterator_protocol():
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
    run_both(lambda lib: cls(lambda i: {"v": i}), seed=0, batch_size=bs, shuffle=True)


def test_same_sample_object_in_batch():
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


# --------------------------------------------------------------------------- #
# generator=torch.default_generator (the global generator passed explicitly)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("sampler", ["shuffle", "random", "random_repl", "subset", "weighted"])
def test_default_generator_passed_explicitly(sampler):
    g = torch.default_generator
    kw: dict = {"batch_size": 3, "epochs": (None, 1, None)}
    if sampler == "shuffle":
        kw["shuffle"] = True
    else:
        def build(ctx):
            lib = ctx.lib
            if sampler == "random":
                return lib.RandomSampler(ctx.dataset, generator=g)
            if sampler == "random_repl":
                return lib.RandomSampler(ctx.dataset, replacement=True, num_samples=40,
                                         generator=g)
            if sampler == "subset":
                return lib.SubsetRandomSampler([2, 4, 6, 8], generator=g)
            return lib.WeightedRandomSampler([1.0] * N, 7, generator=g)

        kw["sampler"] = PerRun(build, sampler)

    epochs = kw.pop("epochs")
    # run_loader never clones torch.default_generator: it is reseeded per run
    run_both(MAP_DATASETS["int"], seed=9, epochs=epochs, generator=g, **kw)


# --------------------------------------------------------------------------- #
# hypothesis: random samplers x loader arguments x partial epochs
# --------------------------------------------------------------------------- #


SAMPLER_KINDS = ["none", "random", "random_repl", "subset", "weighted", "weighted_norepl",
                 "distributed", "user", "batch_sampler"]


@HYPOTHESIS
@given(
    n=st.integers(1, 25),
    kind=st.sampled_from(SAMPLER_KINDS),
    cls_from=st.sampled_from(["own", "torch", "ferro"]),
    bs=st.one_of(st.none(), st.integers(1, 8)),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
    loader_gen=st.one_of(st.none(), st.integers(0, 2**40)),
    share_gen=st.booleans(),
    num_samples=st.integers(1, 60),
    epochs=st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=1, max_size=3),
    replicas=st.integers(1, 4),
)
def test_hypothesis_samplers_in_loader(n, kind, cls_from, bs, drop_last, shuffle, seed,
                                       loader_gen, share_gen, num_samples, epochs, replicas):
    kw: dict = {}
    if loader_gen is not None:
        kw["generator"] = torch.Generator().manual_seed(loader_gen)

    def sampler_gen(ctx):
        if share_gen and ctx.generator is not None:
            return ctx.generator
        return ctx.gen(seed + 1) if share_gen else None

    def build(ctx):
        lib = {"own": ctx.lib, "torch": TORCH, "ferro": FERRO}[cls_from]
        ds = ctx.dataset
        if kind == "random":
            return lib.RandomSampler(ds, num_samples=num_samples, generator=sampler_gen(ctx))
        if kind == "random_repl":
            return lib.RandomSampler(ds, replacement=True, num_samples=num_samples,
                                     generator=sampler_gen(ctx))
        if kind == "subset":
            return lib.SubsetRandomSampler(list(range(0, n, 2)), generator=sampler_gen(ctx))
        if kind == "weighted":
            return lib.WeightedRandomSampler([float(i % 3) + 0.5 for i in range(n)],
                                             num_samples, generator=sampler_gen(ctx))
        if kind == "weighted_norepl":
            return lib.WeightedRandomSampler([float(i % 3) + 0.5 for i in range(n)],
                                             min(num_samples, n), replacement=False,
                                             generator=sampler_gen(ctx))
        if kind == "distributed":
            return lib.DistributedSampler(ds, num_replicas=replicas, rank=replicas - 1,
                                          shuffle=shuffle, seed=seed, drop_last=drop_last)
        if kind == "user":
            return UserSampler(n)
        return lib.BatchSampler(lib.RandomSampler(ds, generator=sampler_gen(ctx)), bs or 1,
                                drop_last)

    if kind == "none":
        kw.update(batch_size=bs, shuffle=shuffle, drop_last=drop_last and bs is not None)
    elif kind == "batch_sampler":
        kw["batch_sampler"] = PerRun(build, kind)
    else:
        kw.update(batch_size=bs, drop_last=drop_last and bs is not None,
                  sampler=PerRun(build, kind))
    run_both(lambda lib: lib.TensorDataset(torch.arange(n * 2).reshape(n, 2)),
             seed=seed, epochs=tuple(epochs), **kw)
