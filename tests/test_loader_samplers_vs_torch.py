"""ferroloader.DataLoader against torch.utils.data.DataLoader: sampler=, batch_sampler=, sampler
subclasses and generators.

Every test runs the same dataset through torch's DataLoader and through
ferroloader's under identical seeds (see helpers.run_both) and compares every
batch, len(loader), the warnings, errors raised while iterating, the calls the
dataset received, and the state of every random generator afterwards.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import (
    FERRO,
    TORCH,
    PerRun,
    assert_same,
    run_both,
    seed_all,
)
from hypothesis import given
from hypothesis import strategies as st
from loader_cases import (
    MAP_DATASETS,
    SAMPLERS,
    DictKeyDataset,
    ListDataset,
    N,
    UserBatchSampler,
    UserSampler,
    _user_sampler,
)

pytestmark = pytest.mark.timeout(60)

# --------------------------------------------------------------------------- #
# samplers passed to the loader




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
    """A sampler yielding string keys, repeats included, reaches a dict-keyed dataset and
    collates as in torch."""
    run_both(
        lambda lib: DictKeyDataset(),
        seed=0,
        batch_size=4,
        sampler=PerRun(lambda ctx: [f"k{i}" for i in (9, 2, 4, 4, 0, 7)], "keys"),
    )


def test_distributed_sampler_set_epoch_through_loader():
    """A DistributedSampler's set_epoch() made before loading decides its shuffled shard in the
    loader as in torch."""
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
    """Every batch_sampler= (BatchSampler over any sampler, torch and ferroloader classes mixed,
    user-written, list of lists) yields torch's batches over full and partial epochs, with or
    without generator=."""
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
    """__getitems__ receives each batch_sampler list as torch passes it, order and repeated
    indices kept."""
    run_both(
        MAP_DATASETS["getitems"],
        seed=0,
        batch_sampler=PerRun(lambda ctx: [[3, 1], [0], [2, 2, 2]], "lists"),
    )


@pytest.mark.parametrize("bs", [None, 1, 4])
def test_getitems_dataset(bs):
    """A shuffled loader calls __getitems__ with each batch's indices (__getitem__ when
    batch_size=None) exactly as torch does."""
    run_both(MAP_DATASETS["getitems"], seed=2, batch_size=bs, shuffle=True)


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
    """Overrides in subclasses of built-in samplers (__iter__, __len__, a num_samples property)
    take effect as in torch, whether the base class is the run's own or torch's."""
    make_cls, base_name, args = SAMPLER_SUBCLASSES[name]

    def build(ctx):
        lib = ctx.lib if base_from == "own" else TORCH
        return make_cls(getattr(lib, base_name))(*args(ctx))

    run_both(MAP_DATASETS["int"], seed=6, batch_size=bs, sampler=PerRun(build, name))


@pytest.mark.parametrize("base_from", ["own", "torch"])
def test_batch_sampler_subclass_overrides_are_honoured(base_from):
    """A BatchSampler subclass's __iter__ override decides the batches as in torch, whether its
    base is the run's own class or torch's."""
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
    """batch_size, drop_last and sampler set on a BatchSampler after construction take effect
    when it iterates, as in torch."""
    def build(ctx):
        b = ctx.lib.BatchSampler(ctx.lib.SequentialSampler(ctx.dataset), 2, False)
        b.batch_size = 4
        b.drop_last = True
        b.sampler = ctx.lib.RandomSampler(ctx.dataset, generator=ctx.gen(2))
        return b

    run_both(MAP_DATASETS["int"], seed=0, batch_sampler=PerRun(build, "bs"))


def test_sampler_changed_between_epochs():
    """Changes between epochs to a RandomSampler's replacement/num_samples and to its data
    source's length show in the next epoch exactly as in torch."""
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
    """A TensorDataset subclass's __getitem__ override is used whichever library the base class
    comes from, giving torch's batches for every batch_size."""
    def make(lib):
        base = {"own": lib, "torch": TORCH, "ferro": FERRO}[base_from].TensorDataset
        return ScaledTensorDataset.make(base)(torch.randn(N, 4), torch.arange(N))

    run_both(make, seed=3, batch_size=bs, shuffle=True)


def test_tensor_dataset_subclass_with_getitems():
    """A TensorDataset subclass's __getitems__ is the one the loader calls, giving torch's
    batches."""
    def make(lib):
        class WithGetitems(lib.TensorDataset):
            def __getitems__(self, indices):
                return [(self.tensors[0][i].sum(), i) for i in indices]

        return WithGetitems(torch.randn(N, 4), torch.arange(N))

    run_both(make, seed=3, batch_size=4, shuffle=True)


def test_tensor_dataset_tensors_replaced_after_loader_built():
    """Tensors replaced on, or written into, a TensorDataset after the loader is built show in
    the next epoch, as in torch."""
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
    """TensorDatasets over strided, offset, expanded, channels_last, conj, requires_grad,
    Parameter, zero-width and unusual-dtype tensors give torch's batches for every
    batch_size/shuffle."""
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
    """TensorDataset indexed with negative, out-of-range, numpy, tensor, bool, slice, list,
    float or None indices gives torch's batches or torch's error."""
    run_both(
        lambda lib: lib.TensorDataset(torch.arange(4.0 * N).reshape(N, 4), torch.arange(N)),
        seed=0,
        batch_size=bs,
        sampler=PerRun(lambda ctx: list(TD_INDEX_SAMPLERS[name]), name),
    )


# --------------------------------------------------------------------------- #
# generator=torch.default_generator (the global generator passed explicitly)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("sampler", ["shuffle", "random", "random_repl", "subset", "weighted"])
def test_default_generator_passed_explicitly(sampler):
    """torch.default_generator passed explicitly as generator= (to the loader, and to the
    sampler) is consumed exactly as torch consumes it, over full and partial epochs."""
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
    """For any built-in or user sampler (classes from either library), batch_size, drop_last,
    shuffle, seed, loader/sampler generators and partial epochs, the run matches torch's
    exactly."""
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
