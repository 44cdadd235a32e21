"""ferroloader's samplers and random_split against torch's, draw for draw.

Each case builds the sampler from torch's class and from ferroloader's under
the same torch.manual_seed (and/or generator= seeded alike), iterates it (in
full or partially), and compares the index sequences, len(), errors, and the
state of the global generator and of every explicit generator afterwards.
"""

from __future__ import annotations

import itertools
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
    assert_same_outcome,
    assert_same_rng,
    outcome,
    rng_after,
    seed_all,
)
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(60)


class Gens:
    """Generators created during one run; their final states are compared."""

    def __init__(self):
        self.made = []

    def __call__(self, seed):
        g = torch.Generator().manual_seed(seed)
        self.made.append(g)
        return g


def sampler_run(lib, build, seed, takes):
    """Build a sampler from `lib` and iterate it once per entry of `takes`.

    takes[i]: how many items to take in pass i (None: all). Returns the
    outcomes of construction, len(), each pass, and the RNG states afterwards.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seed_all(seed)
        gens = Gens()
        made = outcome(lambda: build(lib, gens))
        passes = []
        length = None
        if not isinstance(made, Raised):
            length = outcome(lambda: len(made))
            for k in takes:
                passes.append(outcome(lambda k=k: list(itertools.islice(iter(made), k))))
        rng = rng_after()
        states = [g.get_state() for g in gens.made]
    warns = [(w.category, str(w.message)) for w in caught]
    return made, length, passes, rng, states, warns


def compare_samplers(build, seed=0, takes=(None, None)):
    e_made, e_len, e_passes, e_rng, e_states, e_w = sampler_run(TORCH, build, seed, takes)
    a_made, a_len, a_passes, a_rng, a_states, a_w = sampler_run(FERRO, build, seed, takes)
    if isinstance(e_made, Raised) or isinstance(a_made, Raised):
        assert_same_outcome(e_made, a_made, "constructor")
    assert_same_outcome(e_len, a_len, "len(sampler)")
    for i, (ep, ap) in enumerate(zip(e_passes, a_passes)):
        assert_same_outcome(ep, ap, f"pass {i} (take {takes[i]})")
    assert_same_rng(e_rng, a_rng)
    assert len(e_states) == len(a_states)
    for i, (es, as_) in enumerate(zip(e_states, a_states)):
        assert torch.equal(es, as_), f"generator #{i} left in a different state"
    assert e_w == a_w, f"warnings differ: {e_w} vs {a_w}"
    return e_passes, a_passes


DATA = {n: list(range(100, 100 + n)) for n in (0, 1, 2, 5, 10, 33)}

TAKES = [(None, None), (0, None), (1, None), (3, 2, None), (None, 0, 5)]


# --------------------------------------------------------------------------- #
# SequentialSampler
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("source", ["list0", "list5", "range", "dataset", "tensor"])
def test_sequential(source):
    """SequentialSampler over an empty list, a list, a range, a dataset or a tensor
    yields the same indices and len() as torch's, on full and partial passes."""
    def build(lib, gens):
        src = {
            "list0": [],
            "list5": DATA[5],
            "range": range(3, 9),
            "dataset": lib.TensorDataset(torch.zeros(4, 2)),
            "tensor": torch.arange(6),
        }[source]
        return lib.SequentialSampler(src)

    compare_samplers(build, takes=(None, 2, None))


# --------------------------------------------------------------------------- #
# RandomSampler
# --------------------------------------------------------------------------- #


NUM_SAMPLES = [None, 1, 3, 5, 10, 20, 30, 31, 32, 33, 64, 65, 100]


@pytest.mark.parametrize("use_gen", [False, True])
@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("num_samples", NUM_SAMPLES)
@pytest.mark.parametrize("n", [1, 2, 10])
def test_random_sampler(n, num_samples, replacement, use_gen):
    """For every data size, num_samples, replacement and choice of global
    or explicit generator, RandomSampler yields the same indices as
    torch's on two passes and leaves every generator in the same state."""
    def build(lib, gens):
        return lib.RandomSampler(
            DATA[n],
            replacement=replacement,
            num_samples=num_samples,
            generator=gens(1000 + n) if use_gen else None,
        )

    compare_samplers(build, seed=n * 31 + (num_samples or 0))


@pytest.mark.parametrize("takes", TAKES, ids=str)
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"replacement": True},
        {"replacement": True, "num_samples": 70},
        {"num_samples": 25},
        {"num_samples": 20},
        {"num_samples": 4},
    ],
    ids=str,
)
@pytest.mark.parametrize("use_gen", [False, True])
def test_random_sampler_partial(kw, takes, use_gen):
    """Passes of any length, including ones abandoned partway, yield the same indices
    as torch's RandomSampler, and later passes continue from the same generator state."""
    def build(lib, gens):
        return lib.RandomSampler(DATA[10], generator=gens(5) if use_gen else None, **kw)

    compare_samplers(build, seed=11, takes=takes)


def test_random_sampler_interleaved_iterators():
    """Two live iterators over one RandomSampler, advanced alternately,
    yield the same indices as torch's with and without replacement, and
    leave the global and explicit generators as torch's do."""
    def run(lib):
        seed_all(3)
        g = torch.Generator().manual_seed(9)
        out = []
        for gen in (None, g):
            s = lib.RandomSampler(DATA[10], generator=gen, replacement=gen is None,
                                  num_samples=40)
            it1, it2 = iter(s), iter(s)
            out += [next(it2), next(it1), list(itertools.islice(it2, 35)), list(it1), list(it2)]
        out.append(torch.rand(3))
        out.append(g.get_state())
        return out

    assert_same(run(TORCH), run(FERRO))


def test_random_sampler_dataset_grows():
    """num_samples follows len(data_source) when not given, as in torch."""

    def run(lib):
        seed_all(0)
        data = list(range(5))
        s = lib.RandomSampler(data)
        first = (len(s), sorted(s))
        data.extend([5, 6, 7])
        return first, len(s), sorted(s), s.num_samples

    assert_same(run(TORCH), run(FERRO))


def test_random_sampler_attributes():
    """RandomSampler exposes replacement, num_samples, generator and
    data_source with torch's values, for default and explicit arguments."""
    def run(lib):
        g = torch.Generator()
        out = []
        for kw in ({}, {"replacement": True, "num_samples": 7, "generator": g}):
            s = lib.RandomSampler(DATA[5], **kw)
            out.append((s.replacement, s.num_samples, s.generator is kw.get("generator"),
                        s.data_source is DATA[5]))
        return out

    assert_same(run(TORCH), run(FERRO))


@pytest.mark.parametrize("num_samples", [True, 3.0, 0, -1, "3", None])
@pytest.mark.parametrize("replacement", [False, True, 1, None])
def test_random_sampler_args(replacement, num_samples):
    """Each replacement value (False, True, 1, None) with each num_samples
    value (True, 3.0, 0, -1, '3', None) is accepted or rejected as by
    torch's RandomSampler: same error type and message, or same indices."""
    def build(lib, gens):
        return lib.RandomSampler(DATA[5], replacement=replacement, num_samples=num_samples)

    compare_samplers(build, takes=(None,))


def test_random_sampler_empty_dataset():
    """Over an empty data source, RandomSampler with or without replacement
    fails at the same step as torch's, with the same error type and message."""
    compare_samplers(lambda lib, gens: lib.RandomSampler([]))
    compare_samplers(lambda lib, gens: lib.RandomSampler([], replacement=True, num_samples=3))


# --------------------------------------------------------------------------- #
# SubsetRandomSampler
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("takes", [(None, None), (0, None), (2, None)], ids=str)
@pytest.mark.parametrize("use_gen", [False, True])
@pytest.mark.parametrize(
    "indices",
    ["list", "range", "tuple", "empty", "tensor", "ndarray", "one", "repeated"],
)
def test_subset_random_sampler(indices, use_gen, takes):
    """SubsetRandomSampler yields torch's permutation, with the same item types,
    for every kind of index container (list, range, tuple, tensor, ndarray;
    empty, single, repeated) and generator, on full and partial passes."""
    def build(lib, gens):
        idx = {
            "list": [9, 3, 7, 1, 0, 4],
            "range": range(10, 40, 3),
            "tuple": (5, 6, 7),
            "empty": [],
            "tensor": torch.tensor([4, 8, 15, 16, 23, 42]),
            "ndarray": np.array([2, 7, 1, 8], dtype=np.int32),
            "one": [77],
            "repeated": [1, 1, 2, 2, 1],
        }[indices]
        return lib.SubsetRandomSampler(idx, generator=gens(3) if use_gen else None)

    compare_samplers(build, seed=4, takes=takes)


# --------------------------------------------------------------------------- #
# WeightedRandomSampler
# --------------------------------------------------------------------------- #


WEIGHTS = {
    "list": [0.1, 0.9, 0.4, 0.7, 3.0, 0.6],
    "ints": [1, 2, 3, 0, 5],
    "tuple": (0.5, 0.5, 1.0),
    "tensor_f32": torch.tensor([0.2, 0.3, 0.5, 1.5]),
    "tensor_f64": torch.tensor([1.0, 1e-3, 10.0], dtype=torch.float64),
    "ndarray": np.array([3.0, 1.0, 0.0, 2.0, 4.0]),
    "uniform40": [1.0] * 40,
    "one": [2.5],
    "mostly_zero": [0, 0, 0, 1, 0, 0, 2],
}


@pytest.mark.parametrize("use_gen", [False, True])
@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("num_samples", [1, 2, 3, 5, 6, 40, 100])
@pytest.mark.parametrize("weights", list(WEIGHTS))
def test_weighted_random_sampler(weights, num_samples, replacement, use_gen):
    """For every weight container and dtype, num_samples, replacement and
    generator choice, WeightedRandomSampler yields the same indices as torch's
    on full and partial passes, or raises the same error where torch's does."""
    def build(lib, gens):
        return lib.WeightedRandomSampler(
            WEIGHTS[weights], num_samples, replacement=replacement,
            generator=gens(21) if use_gen else None,
        )

    compare_samplers(build, seed=num_samples, takes=(None, 2, None))


@pytest.mark.parametrize(
    "args",
    [
        ([1.0, 2.0], 0, True),
        ([1.0, 2.0], -3, True),
        ([1.0, 2.0], True, True),
        ([1.0, 2.0], 2.0, True),
        ([1.0, 2.0], "2", True),
        ([1.0, 2.0], 2, 1),
        ([1.0, 2.0], 2, None),
        ([[1.0, 2.0]], 2, True),
        ([], 2, True),
        (3.0, 2, True),
        ([-1.0, 2.0], 2, True),
        ([0.0, 0.0], 2, True),
        ([float("nan"), 1.0], 2, True),
        ([float("inf"), 1.0], 2, True),
        ([1.0, 0.0, 0.0], 2, False),
        ([1.0, 1.0], 3, False),
        (["a", "b"], 2, True),
    ],
    ids=str,
)
def test_weighted_random_sampler_bad_args(args):
    """Each questionable weights/num_samples/replacement combination behaves
    as in torch's WeightedRandomSampler: the same exception type and message
    at the same step, or the same indices where torch accepts it."""
    weights, num_samples, replacement = args

    def build(lib, gens):
        return lib.WeightedRandomSampler(weights, num_samples, replacement=replacement)

    compare_samplers(build, takes=(None,))


def test_weighted_random_sampler_attributes():
    """WeightedRandomSampler stores the weights as the same (float64) tensor as
    torch's and exposes the same num_samples, replacement, generator and len()."""
    def run(lib):
        s = lib.WeightedRandomSampler([1, 2, 3], 4, replacement=False)
        return s.weights, s.num_samples, s.replacement, s.generator, len(s)

    assert_same(run(TORCH), run(FERRO))


# --------------------------------------------------------------------------- #
# BatchSampler
# --------------------------------------------------------------------------- #


INNER = {
    "sequential": lambda lib, gens: lib.SequentialSampler(DATA[10]),
    "random": lambda lib, gens: lib.RandomSampler(DATA[10]),
    "random_gen": lambda lib, gens: lib.RandomSampler(DATA[10], generator=gens(8)),
    "random_repl": lambda lib, gens: lib.RandomSampler(DATA[10], replacement=True,
                                                       num_samples=45),
    "weighted": lambda lib, gens: lib.WeightedRandomSampler([1, 2, 3, 4], 9),
    "subset": lambda lib, gens: lib.SubsetRandomSampler([5, 3, 1]),
    "distributed": lambda lib, gens: lib.DistributedSampler(DATA[10], 3, 1),
    "list": lambda lib, gens: [4, 4, 2, 8, 1],
    "range": lambda lib, gens: range(7),
    "empty": lambda lib, gens: [],
    "torch_random": lambda lib, gens: TORCH.RandomSampler(DATA[5]),
    "ferro_random": lambda lib, gens: FERRO.RandomSampler(DATA[5]),
}


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [1, 3, 5, 10, 11])
@pytest.mark.parametrize("inner", list(INNER))
def test_batch_sampler(inner, batch_size, drop_last):
    """For every batch size and drop_last, BatchSampler yields the same
    batches and len() as torch's over any inner sampler or iterable, a
    sampler of the other library included, on full and partial passes."""
    def build(lib, gens):
        return lib.BatchSampler(INNER[inner](lib, gens), batch_size, drop_last)

    compare_samplers(build, seed=batch_size, takes=(None, 1, None))


def test_batch_sampler_over_generator_object():
    """BatchSampler over a one-shot iterable (a generator object)
    yields its batches once: the second pass is empty, as in torch."""
    def build(lib, gens):
        return lib.BatchSampler((i * i for i in range(7)), 3, False)

    compare_samplers(build, takes=(None, None))


def test_batch_sampler_over_python_sampler_drawing_rng():
    """BatchSampler over a Python sampler that draws from the global
    torch RNG yields the same batches as torch's and leaves the global
    RNG in the same state, after partial, full and empty passes."""
    class Drawing(tud.Sampler):
        def __iter__(self):
            for i in range(8):
                yield int(torch.randint(0, 100, ()).item()) + i

        def __len__(self):
            return 8

    compare_samplers(lambda lib, gens: lib.BatchSampler(Drawing(), 3, False),
                     takes=(1, None, 0))


def test_batch_sampler_yields_lists():
    """Every batch from BatchSampler is a plain list, as in torch."""
    def run(lib):
        return [type(b) for b in lib.BatchSampler(range(5), 2, False)]

    assert run(TORCH) == run(FERRO)


@pytest.mark.parametrize(
    "args",
    [(0, False), (-1, False), (True, False), (2.0, False), ("2", False), (None, False),
     (2, None), (2, 0), (2, "yes"), (2, 1)],
    ids=str,
)
def test_batch_sampler_bad_args(args):
    """An invalid batch_size (zero, negative, bool, float, string, None) or a non-bool
    drop_last raises the same exception type and message as torch's BatchSampler."""
    bs, dl = args
    compare_samplers(lambda lib, gens: lib.BatchSampler(range(5), bs, dl), takes=(None,))


def test_batch_sampler_len_without_inner_len():
    """When the inner iterable has no len(), len(BatchSampler) raises the
    same error as torch's, while iteration still yields the same batches."""
    compare_samplers(
        lambda lib, gens: lib.BatchSampler((i for i in range(5)), 2, False), takes=(None,)
    )


def test_batch_sampler_attributes():
    """BatchSampler exposes batch_size, drop_last and the
    very sampler object it was given, as torch's does."""
    def run(lib):
        inner = lib.SequentialSampler(DATA[5])
        b = lib.BatchSampler(inner, 2, True)
        return b.batch_size, b.drop_last, b.sampler is inner

    assert_same(run(TORCH), run(FERRO))


# --------------------------------------------------------------------------- #
# DistributedSampler
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(
    "n,replicas", [(0, 2), (1, 3), (2, 5), (3, 7), (10, 1), (10, 3), (10, 4), (33, 4), (12, 12)]
)
def test_distributed_sampler_all_ranks(n, replicas, shuffle, drop_last):
    """For every rank, dataset size and replica count, with or without shuffle and drop_last,
    DistributedSampler yields the same shard and len() as torch's, on full and partial passes."""
    for rank in range(replicas):

        def build(lib, gens, rank=rank):
            return lib.DistributedSampler(DATA[n] if n in DATA else list(range(n)),
                                          num_replicas=replicas, rank=rank, shuffle=shuffle,
                                          seed=17, drop_last=drop_last)

        compare_samplers(build, takes=(None, 1, None))


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31, -5])
@pytest.mark.parametrize("epochs", [(0,), (1,), (0, 1, 2), (7, 7), (2**20,)], ids=str)
def test_distributed_sampler_set_epoch(epochs, seed):
    """For seeds including -5 and 2**31 and any sequence of set_epoch()
    calls, DistributedSampler reports the same epoch and yields the same
    shard on every pass as torch's, leaving the global RNG as torch's does."""
    def run(lib):
        seed_all(0)
        s = lib.DistributedSampler(DATA[33], num_replicas=3, rank=2, seed=seed)
        out = [s.epoch]
        for e in epochs:
            s.set_epoch(e)
            out += [s.epoch, list(s), list(s)]
        out.append(torch.rand(3))
        return out

    assert_same(run(TORCH), run(FERRO))


def test_distributed_sampler_attributes():
    """DistributedSampler computes the same num_samples, total_size and
    len() as torch's and exposes the same num_replicas, rank, epoch,
    drop_last, shuffle and seed, for empty and undersized datasets too."""
    def run(lib):
        out = []
        for n, r, dl in ((10, 3, False), (10, 3, True), (2, 5, True), (0, 2, False)):
            s = lib.DistributedSampler(list(range(n)), num_replicas=r, rank=r - 1,
                                       shuffle=False, seed=3, drop_last=dl)
            out.append((s.num_replicas, s.rank, s.epoch, s.drop_last, s.num_samples,
                        s.total_size, s.shuffle, s.seed, len(s)))
        return out

    assert_same(run(TORCH), run(FERRO))


@pytest.mark.parametrize(
    "kw",
    [
        {"num_replicas": 2, "rank": 2},
        {"num_replicas": 2, "rank": -1},
        {"num_replicas": 1, "rank": 5},
        {"num_replicas": 0, "rank": 0},
        {"num_replicas": 2},
        {"rank": 0},
        {},
    ],
    ids=str,
)
def test_distributed_sampler_errors(kw):
    """An out-of-range rank or num_replicas, or an omitted one with no initialized process
    group, raises the same exception type and message as torch's DistributedSampler."""
    compare_samplers(lambda lib, gens: lib.DistributedSampler(DATA[5], **kw), takes=(None,))


def test_distributed_sampler_does_not_touch_global_rng():
    """Full, empty and partial passes of a shuffling DistributedSampler leave the global
    RNGs in the same state as torch's, which draws only from its own seed + epoch generator."""
    compare_samplers(
        lambda lib, gens: lib.DistributedSampler(DATA[10], num_replicas=2, rank=0, seed=5),
        takes=(None, 0, 3),
    )


# --------------------------------------------------------------------------- #
# random_split
# --------------------------------------------------------------------------- #


def split_run(lib, dataset_fn, lengths, use_gen, seed=0):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seed_all(seed)
        ds = dataset_fn(lib)
        g = torch.Generator().manual_seed(77) if use_gen else None
        kwargs = {"generator": g} if use_gen else {}
        res = outcome(lambda: lib.random_split(ds, lengths, **kwargs))
        if not isinstance(res, Raised):
            assert type(res) is list
            for sub in res:
                assert isinstance(sub, tud.Subset)
                assert sub.dataset is ds
            res = [(type(s.indices), list(s.indices), len(s), [s[i] for i in range(len(s))])
                   for s in res]
        rng = rng_after()
        state = g.get_state() if g is not None else None
    return res, rng, state, [(w.category, str(w.message)) for w in caught]


SPLIT_DATASETS = {
    "range10": lambda lib: range(10),
    "list11": lambda lib: list(range(100, 111)),
    "tensor_ds": lambda lib: lib.TensorDataset(torch.arange(12).reshape(6, 2)),
    "empty": lambda lib: [],
}

SPLITS = [
    [3, 7],
    [10],
    [0, 10],
    [5, 5, 0],
    [2, 2, 2, 2, 2],
    [0.3, 0.7],
    [0.5, 0.5],
    [0.3, 0.3, 0.4],
    [1.0],
    [0.1, 0.1, 0.1, 0.7],
    [0.05, 0.95],
    [0.0, 1.0],
    [0.25] * 4,
    [1 / 3] * 3,
    [3, 8],
    [1.5, -0.5],
    [0.6, 0.6],
    [0.2, 0.2],
    [6, 6],
    [],
    [11],
    [6],
    [0],
]


@pytest.mark.parametrize("use_gen", [False, True])
@pytest.mark.parametrize("lengths", SPLITS, ids=str)
@pytest.mark.parametrize("ds", list(SPLIT_DATASETS))
def test_random_split(ds, lengths, use_gen):
    """For every dataset and integer or fractional lengths, with or without a generator,
    random_split gives the same parts as torch's (Subsets of the dataset with the same
    indices and items) or the same error, with the same warnings and RNG states."""
    e = split_run(TORCH, SPLIT_DATASETS[ds], lengths, use_gen)
    a = split_run(FERRO, SPLIT_DATASETS[ds], lengths, use_gen)
    assert_same_outcome(e[0], a[0], "random_split")
    assert_same_rng(e[1], a[1])
    if use_gen:
        assert torch.equal(e[2], a[2]), "generator left in a different state"
    assert e[3] == a[3], f"warnings differ: {e[3]} vs {a[3]}"


def test_random_split_returns_ferro_subsets_usable_by_torch_loader():
    """Parts from ferroloader's random_split, fed to torch's DataLoader, give
    the same batches as torch's own random_split parts under the same seed."""
    torch.manual_seed(0)
    parts = FERRO.random_split(range(10), [0.5, 0.5])
    loader = TORCH.DataLoader(parts[0], batch_size=2)
    torch.manual_seed(0)
    tparts = TORCH.random_split(range(10), [0.5, 0.5])
    assert_same(list(loader), list(TORCH.DataLoader(tparts[0], batch_size=2)))


def test_random_split_zero_length_warning_pytest_warns():
    """Fractional lengths that round a part down to zero length emit
    the same UserWarning messages as torch's, visible to pytest.warns."""
    def run(lib):
        torch.manual_seed(0)
        with pytest.warns(UserWarning) as rec:
            lib.random_split(range(3), [0.1, 0.1, 0.8])
        return [str(w.message) for w in rec]

    assert run(TORCH) == run(FERRO)


# --------------------------------------------------------------------------- #
# hypothesis
# --------------------------------------------------------------------------- #


@given(
    n=st.integers(1, 60),
    replacement=st.booleans(),
    num_samples=st.one_of(st.none(), st.integers(1, 200)),
    seed=st.integers(0, 2**63 - 1),
    gen_seed=st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    takes=st.lists(st.one_of(st.none(), st.integers(0, 70)), min_size=1, max_size=3),
)
def test_hypothesis_random_sampler(n, replacement, num_samples, seed, gen_seed, takes):
    """For any data size, replacement, num_samples, global seed, optional
    generator seed and sequence of (partial) passes, RandomSampler yields the
    same indices as torch's and leaves every generator in the same state."""
    data = list(range(n))

    def build(lib, gens):
        g = gens(gen_seed) if gen_seed is not None else None
        return lib.RandomSampler(data, replacement=replacement, num_samples=num_samples,
                                 generator=g)

    compare_samplers(build, seed=seed, takes=tuple(takes))


@given(
    weights=st.lists(
        st.one_of(st.floats(0, 100, allow_nan=False), st.just(0.0), st.integers(0, 5)),
        min_size=1, max_size=40,
    ),
    num_samples=st.integers(1, 60),
    replacement=st.booleans(),
    seed=st.integers(0, 2**32),
    use_gen=st.booleans(),
    as_tensor=st.booleans(),
    take=st.one_of(st.none(), st.integers(0, 10)),
)
def test_hypothesis_weighted_sampler(weights, num_samples, replacement, seed, use_gen,
                                     as_tensor, take):
    """For any non-negative weights (list or float32 tensor), num_samples,
    replacement, seed and generator choice, WeightedRandomSampler yields the same
    indices as torch's, or the same error, on a partial and then a full pass."""
    w = torch.tensor([float(x) for x in weights]) if as_tensor else weights

    def build(lib, gens):
        return lib.WeightedRandomSampler(w, num_samples, replacement=replacement,
                                         generator=gens(seed + 1) if use_gen else None)

    compare_samplers(build, seed=seed, takes=(take, None))


@given(
    n=st.integers(0, 60),
    replicas=st.integers(1, 9),
    rank_frac=st.floats(0, 0.999),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**40),
    drop_last=st.booleans(),
    epoch=st.integers(0, 1000),
)
def test_hypothesis_distributed_sampler(n, replicas, rank_frac, shuffle, seed, drop_last, epoch):
    """For any dataset size, replica count, rank, shuffle, seed, drop_last
    and epoch, DistributedSampler yields the same shard and len() as torch's."""
    rank = int(rank_frac * replicas)
    data = list(range(n))

    def build(lib, gens):
        s = lib.DistributedSampler(data, num_replicas=replicas, rank=rank, shuffle=shuffle,
                                   seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        return s

    compare_samplers(build, takes=(None, 2))


@given(
    indices=st.lists(st.integers(0, 1000), max_size=50),
    seed=st.integers(0, 2**32),
    use_gen=st.booleans(),
    take=st.one_of(st.none(), st.integers(0, 10)),
)
def test_hypothesis_subset_random_sampler(indices, seed, use_gen, take):
    """For any index list, seed and generator choice, SubsetRandomSampler
    yields the same permutation as torch's on a partial and then a full pass."""
    def build(lib, gens):
        return lib.SubsetRandomSampler(indices, generator=gens(seed) if use_gen else None)

    compare_samplers(build, seed=seed, takes=(take, None))


@given(
    n=st.integers(0, 40),
    batch_size=st.integers(1, 12),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
    take=st.one_of(st.none(), st.integers(0, 5)),
)
def test_hypothesis_batch_sampler(n, batch_size, drop_last, shuffle, seed, take):
    """For any dataset size, batch size, drop_last and sequential or seeded random inner sampler,
    BatchSampler yields the same batches and len() as torch's on a partial and then a full pass."""
    data = list(range(n))

    def build(lib, gens):
        inner = (lib.RandomSampler(data, generator=gens(seed)) if shuffle and n
                 else lib.SequentialSampler(data))
        return lib.BatchSampler(inner, batch_size, drop_last)

    compare_samplers(build, seed=seed, takes=(take, None))


@given(
    n=st.integers(0, 40),
    parts=st.lists(st.integers(0, 10), min_size=1, max_size=5),
    fractions=st.booleans(),
    seed=st.integers(0, 2**32),
    use_gen=st.booleans(),
)
def test_hypothesis_random_split(n, parts, fractions, seed, use_gen):
    """For any dataset size and integer or fractional lengths, with or without a generator,
    random_split gives the same parts or error, warnings and RNG states as torch's."""
    if fractions:
        total = sum(parts) or 1
        lengths = [p / total for p in parts]
    else:
        lengths = parts
    mk = lambda lib: list(range(n))  # noqa: E731
    e = split_run(TORCH, mk, lengths, use_gen, seed)
    a = split_run(FERRO, mk, lengths, use_gen, seed)
    assert_same_outcome(e[0], a[0], "random_split")
    assert_same_rng(e[1], a[1])
    if use_gen:
        assert torch.equal(e[2], a[2])
    assert e[3] == a[3]


# --------------------------------------------------------------------------- #
# attributes changed after construction, data sources that change size
# --------------------------------------------------------------------------- #


def _mutated(name):
    def build(lib, gens):
        if name == "random_to_replacement":
            s = lib.RandomSampler(DATA[10])
            s.replacement = True
            s._num_samples = 40
            return s
        if name == "random_generator_set":
            s = lib.RandomSampler(DATA[10])
            s.generator = gens(5)
            return s
        if name == "random_data_source_set":
            s = lib.RandomSampler(DATA[10], generator=gens(5))
            s.data_source = DATA[33]
            return s
        if name == "weighted_weights_set":
            s = lib.WeightedRandomSampler([1.0, 1.0], 3)
            s.weights = torch.tensor([0.0, 1.0, 5.0, 2.0], dtype=torch.double)
            s.replacement = False
            return s
        if name == "weighted_weights_inplace":
            s = lib.WeightedRandomSampler([1.0, 1.0, 1.0], 5)
            s.weights[1] = 0.0
            return s
        if name == "weighted_float32_weights_set":
            s = lib.WeightedRandomSampler([1.0, 1.0, 1.0], 5, generator=gens(1))
            s.weights = torch.tensor([1.0, 2.0, 3.0])  # float32 tensor: torch accepts it
            return s
        if name == "subset_indices_set":
            s = lib.SubsetRandomSampler([1, 2])
            s.indices = [7, 8, 9, 10]
            return s
        if name == "distributed_fields_set":
            s = lib.DistributedSampler(DATA[10], num_replicas=2, rank=0)
            s.seed, s.epoch, s.rank, s.drop_last = 3, 2, 1, True
            return s
        if name == "distributed_shuffle_off":
            s = lib.DistributedSampler(DATA[10], num_replicas=3, rank=1)
            s.shuffle = False
            return s
        if name == "batch_fields_set":
            b = lib.BatchSampler(lib.SequentialSampler(DATA[10]), 2, False)
            b.batch_size, b.drop_last = 3, True
            b.sampler = lib.RandomSampler(DATA[5], generator=gens(4))
            return b
        raise AssertionError(name)

    return build


MUTATIONS = ["random_to_replacement", "random_generator_set", "random_data_source_set",
             "weighted_weights_set", "weighted_weights_inplace", "weighted_float32_weights_set",
             "subset_indices_set", "distributed_fields_set", "distributed_shuffle_off",
             "batch_fields_set"]


@pytest.mark.parametrize("name", MUTATIONS)
def test_attributes_changed_after_construction(name):
    """Sampler attributes reassigned or mutated after construction (replacement,
    generator, data_source, weights, indices, DistributedSampler and BatchSampler
    fields) take effect on later passes exactly as in torch's samplers."""
    compare_samplers(_mutated(name), seed=2, takes=(None, 3, None))


@pytest.mark.parametrize("cls", ["SequentialSampler", "RandomSampler", "RandomSampler_repl",
                                 "DistributedSampler", "DistributedSampler_noshuffle"])
@pytest.mark.parametrize("change", [+3, -3, -10])
def test_data_source_changes_size(cls, change):
    """When the data source grows or shrinks after construction, or between
    iter() and the first next(), sequential, random and distributed samplers
    yield the same indices and len() as torch's, or fail the same way."""
    def run(lib):
        seed_all(4)
        data = list(range(10))
        if cls == "SequentialSampler":
            s = lib.SequentialSampler(data)
        elif cls == "RandomSampler":
            s = lib.RandomSampler(data)
        elif cls == "RandomSampler_repl":
            s = lib.RandomSampler(data, replacement=True)
        elif cls == "DistributedSampler":
            s = lib.DistributedSampler(data, num_replicas=3, rank=1, seed=5)
        else:
            s = lib.DistributedSampler(data, num_replicas=3, rank=2, shuffle=False)
        out = [outcome(lambda: list(s)), outcome(lambda: len(s))]
        if change > 0:
            data.extend(range(100, 100 + change))
        else:
            del data[change:]
        out += [outcome(lambda: list(s)), outcome(lambda: len(s))]
        it = outcome(lambda: iter(s))
        data.append(999)  # changes between iter() and the first next()
        out += [it if isinstance(it, Raised) else outcome(lambda: list(it)), torch.rand(2)]
        return out

    for i, (x, y) in enumerate(zip(run(TORCH), run(FERRO))):
        assert_same_outcome(x, y, f"step {i}")


# --------------------------------------------------------------------------- #
# large populations (other draw paths in torch's kernels)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "n", [2**16 + 1, 2**24 - 1, 2**24 + 3, 2**28 - 1, 2**28, 2**28 + 1, 2**31 + 7, 2**32 + 3,
          2**40 + 11, 2**62]
)
@pytest.mark.parametrize("use_gen", [False, True])
def test_random_sampler_replacement_huge_population(n, use_gen):
    """RandomSampler with replacement over populations from 2**16 + 1 to 2**62,
    across the sizes where torch's random draws change algorithm, yields the
    same indices as torch's with the global or an explicit generator."""
    def build(lib, gens):
        return lib.RandomSampler(range(n), replacement=True, num_samples=70,
                                 generator=gens(n % 1000) if use_gen else None)

    compare_samplers(build, seed=n % 97, takes=(None, 5, None))


@pytest.mark.parametrize("n", [1000, 65537, 100003])
def test_random_sampler_large_permutation(n):
    """RandomSampler without replacement over 1000, 65537 and 100003 items yields the same
    permutation as torch's, and a second pass continues from the same generator state."""
    def build(lib, gens):
        return lib.RandomSampler(range(n), generator=gens(n))

    compare_samplers(build, takes=(None, 10))


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("k,num_samples", [(1000, 5000), (5000, 1000), (70000, 300),
                                           (3, 100000)])
def test_weighted_sampler_large(k, num_samples, replacement):
    """WeightedRandomSampler over up to 70000 float64 weights, drawing up to 100000
    samples with or without replacement, yields the same indices as torch's."""
    if not replacement and num_samples > k:
        num_samples = k

    def build(lib, gens):
        w = torch.rand(k, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
        return lib.WeightedRandomSampler(w, num_samples, replacement=replacement,
                                         generator=gens(7))

    compare_samplers(build, takes=(None, 1))


# --------------------------------------------------------------------------- #
# pickling and copying (users and frameworks do both)
# --------------------------------------------------------------------------- #


COPYABLE = {
    "sequential": lambda lib, g: lib.SequentialSampler(DATA[10]),
    "random": lambda lib, g: lib.RandomSampler(DATA[10], generator=g),
    "random_global": lambda lib, g: lib.RandomSampler(DATA[10], replacement=True,
                                                      num_samples=12),
    "subset": lambda lib, g: lib.SubsetRandomSampler([3, 1, 4], generator=g),
    "weighted": lambda lib, g: lib.WeightedRandomSampler([1.0, 3.0, 2.0], 6, generator=g),
    "batch": lambda lib, g: lib.BatchSampler(lib.RandomSampler(DATA[10], generator=g), 3,
                                             False),
    "distributed": lambda lib, g: lib.DistributedSampler(DATA[10], 2, 1, seed=4),
}


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy"])
@pytest.mark.parametrize("name", list(COPYABLE))
def test_sampler_copies(name, how):
    """A sampler iterated once and then pickled, deep-copied or shallow-copied
    behaves as torch's copy (same type, indices and len(), or the same error),
    and the original and its generator continue the same way."""
    import copy
    import pickle

    def run(lib):
        seed_all(5)
        g = torch.Generator().manual_seed(8)
        s = COPYABLE[name](lib, g)
        first = list(s)  # advance the generator before copying
        if how == "pickle":
            c = outcome(lambda: pickle.loads(pickle.dumps(s)))
        elif how == "deepcopy":
            c = outcome(lambda: copy.deepcopy(s))
        else:
            c = outcome(lambda: copy.copy(s))
        if isinstance(c, Raised):
            return [first, c]
        return [first, type(c).__name__, list(c), list(s), outcome(lambda: len(c)),
                g.get_state(), torch.rand(2)]

    e, a = run(TORCH), run(FERRO)
    assert len(e) == len(a), (e, a)
    for i, (x, y) in enumerate(zip(e, a)):
        assert_same_outcome(x, y, f"item {i}")
