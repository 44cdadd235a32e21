"""ferroloader.DataLoader against torch.utils.data.DataLoader: collate_fn, len(loader), errors while
iterating, attributes and two-way drop-in.

Every test runs the same dataset through torch's DataLoader and through
ferroloader's under identical seeds (see helpers.run_both) and compares every
batch, len(loader), the warnings, errors raised while iterating, the calls the
dataset received, and the state of every random generator afterwards.
"""
from __future__ import annotations

import ferroloader
import pytest
import torch
import torch.utils.data as tud
from helpers import (
    FERRO,
    TORCH,
    PerRun,
    Raised,
    assert_same_outcome,
    compare_runs,
    outcome,
    run_both,
    run_loader,
)
from loader_cases import (
    MAP_DATASETS,
    SAMPLERS,
    ListDataset,
    N,
    identity_collate,
)

pytestmark = pytest.mark.timeout(60)

# --------------------------------------------------------------------------- #
# collate_fn
# --------------------------------------------------------------------------- #




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
    """Any collate_fn (custom, drawing from the global RNG, either library's default_collate or
    default_convert, a lambda) gives torch's batches and RNG state for every batch_size/shuffle."""
    run_both(
        MAP_DATASETS["int"],
        seed=4,
        batch_size=bs,
        shuffle=shuffle,
        collate_fn=PerRun(COLLATE_FNS[name], name),
    )


@pytest.mark.parametrize("name", ["mix", "tuple", "np_f32", "tensor_transposed"])
def test_lib_default_collate_as_collate_fn(name):
    """The library's own default_collate passed explicitly as collate_fn gives torch's batches
    for mixed, tuple, numpy and transposed-tensor samples."""
    run_both(
        MAP_DATASETS[name],
        seed=4,
        batch_size=3,
        collate_fn=PerRun(COLLATE_FNS["lib_default_collate"], "default_collate"),
    )


# --------------------------------------------------------------------------- #
# len(loader)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("bs,drop_last", [(1, False), (3, False), (3, True), (None, False),
                                          (10, True), (11, True), (11, False)], ids=str)
@pytest.mark.parametrize("n", [0, 1, 10, 11])
def test_len_loader_map(n, bs, drop_last):
    """len(loader) and an epoch's batch count equal torch's (or fail with torch's error) for
    map-style datasets of 0-11 items, every batch_size/drop_last, shuffled or not."""
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
    """len(loader) equals torch's for a RandomSampler with num_samples, a WeightedRandomSampler
    with drop_last, a list as batch_sampler and a DistributedSampler with batch_size=None."""
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
    """len(loader) over a sampler without __len__ raises torch's exception type and message."""
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
    """An exception from __getitem__ ends the epoch at the same batch as torch's, with torch's
    type and message (StopIteration silently, as in torch), and later epochs run as torch's."""
    run_both(lambda lib: FailingDataset(exc=exc), seed=0, batch_size=bs, epochs=(None, None, 2))


def test_collate_error_during_iteration():
    """default_collate's error on uncollatable samples (None, numpy string arrays) comes at the
    same batch with torch's type and message."""
    run_both(MAP_DATASETS["none"], seed=0, batch_size=2)
    run_both(MAP_DATASETS["np_str_array"], seed=0, batch_size=2)


class ErroringIterable(tud.IterableDataset):
    def __iter__(self):
        yield 1
        yield 2
        raise ValueError("stream broke")


@pytest.mark.parametrize("bs", [1, 2, 3, None])
def test_iterable_error_propagates(bs):
    """An exception raised mid-stream by an IterableDataset surfaces after the same batches as
    torch's, with torch's type and message, for every batch_size and epoch."""
    run_both(lambda lib: ErroringIterable(), seed=0, batch_size=bs)


# --------------------------------------------------------------------------- #
# two-way drop-in
# --------------------------------------------------------------------------- #


def test_ferro_datasets_are_torch_datasets():
    """ferroloader's dataset and sampler classes subclass their torch.utils.data counterparts,
    so isinstance checks written for torch accept them."""
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
    """torch's DataLoader fed ferroloader's TensorDataset and sampler yields the same batches,
    len and generator states as fed torch's own, for every built-in sampler."""
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
    """ferroloader's DataLoader fed torch's TensorDataset and samplers reproduces torch's
    DataLoader run exactly, for every built-in sampler."""
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
    """torch's DataLoader given ferroloader's BatchSampler over a RandomSampler yields the same
    batches and RNG state as given torch's."""
    run_both(
        MAP_DATASETS["tensor_i64"],
        seed=2,
        batch_sampler=PerRun(
            lambda c: c.lib.BatchSampler(c.lib.RandomSampler(c.dataset), 4, True), "bs"
        ),
        actual=(TORCH.DataLoader, FERRO),
    )


def test_torch_loader_with_ferro_tensor_dataset_shuffle():
    """torch's DataLoader shuffling ferroloader's TensorDataset yields the same batches and RNG
    state as shuffling torch's."""
    run_both(
        lambda lib: lib.TensorDataset(torch.randn(N, 32), torch.randint(0, 5, (N,))),
        seed=5,
        batch_size=4,
        shuffle=True,
        actual=(TORCH.DataLoader, FERRO),
    )


def test_ferro_loader_with_ferro_subset_and_concat():
    """A shuffled ConcatDataset of a Subset and a TensorDataset built from ferroloader's classes
    loads exactly like torch's built from torch's."""
    def make(lib):
        base = lib.TensorDataset(torch.arange(12.0).reshape(6, 2), torch.arange(6))
        return lib.ConcatDataset([lib.Subset(base, [5, 0, 3]), base])

    run_both(make, seed=9, batch_size=4, shuffle=True)


def test_loader_attributes():
    """A DataLoader's public attributes have torch's values for default, shuffled,
    batch_size=None and batch_sampler construction, and shuffle=True wires a torch RandomSampler
    into a torch BatchSampler."""
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


def test_batch_sampler_is_an_instance_of_ferroloaders_and_exactly_torchs_class():
    """A loader's batch_sampler is an instance of ferroloader.BatchSampler (as torch's is of
    torch's), and its class is exactly torch's BatchSampler, which frameworks that rebuild
    loaders (Lightning: ``type(batch_sampler) is not BatchSampler``) require; a hand-built
    ferroloader.BatchSampler passes the same check and batches as torch's."""
    ds = ListDataset(lambda i: i)
    for lib in (TORCH, FERRO):
        loader = lib.DataLoader(ds, batch_size=3, shuffle=True)
        assert isinstance(loader.batch_sampler, lib.BatchSampler)
        assert type(loader.batch_sampler) is tud.BatchSampler
    made = ferroloader.BatchSampler(ferroloader.SequentialSampler(range(7)), 3, False)
    assert type(made) is tud.BatchSampler
    assert len(made) == 3 and list(made) == [[0, 1, 2], [3, 4, 5], [6]]
    loader = ferroloader.DataLoader(list(range(7)), batch_sampler=made)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6]]


def test_setting_loader_attribute_allowed_ones():
    """As in torch, collate_fn and new user attributes can be set on a built DataLoader, and the
    new collate_fn takes effect."""
    for lib in (TORCH, FERRO):
        loader = lib.DataLoader(list(range(4)), batch_size=2)
        loader.collate_fn = identity_collate
        loader.some_user_attr = 3
        assert list(loader) == [[0, 1], [2, 3]]


def test_every_name_torch_utils_data_exports_is_exported():
    """Every name in torch.utils.data.__all__ is in ferroloader.__all__ (the
    README's list of names is exact)."""
    import ferroloader
    import torch.utils.data as tud

    assert set(tud.__all__) <= set(ferroloader.__all__), set(tud.__all__) - set(ferroloader.__all__)
    for name in tud.__all__:
        assert hasattr(ferroloader, name), name


def test_a_loader_pickles_and_deep_copies_after_an_epoch_as_torchs_does():
    """After an epoch, a loader survives pickle and deepcopy (torch's does),
    and the copy's next epoch is the original's next epoch."""
    import copy
    import pickle

    for lib in (tud, ferroloader):
        torch.manual_seed(0)
        loader = lib.DataLoader(list(range(10)), batch_size=3, shuffle=True, num_workers=2)
        list(loader)
        state = torch.get_rng_state()
        nxt = [b.tolist() for b in loader]
        for clone in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
            torch.set_rng_state(state)
            assert [b.tolist() for b in clone] == nxt, lib


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_built_samplers_are_ferroloaders_subclasses_with_torchs_draws(shuffle, batch_size):
    """The sampler the constructor builds is ferroloader's class, so
    isinstance holds against both libraries' names, and the batches stay
    torch's (same draws from the same generator)."""
    fl = ferroloader
    data = list(range(23))
    ours = fl.DataLoader(data, batch_size=batch_size, shuffle=shuffle)
    theirs = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=shuffle)
    kind = "RandomSampler" if shuffle else "SequentialSampler"
    assert isinstance(ours.sampler, getattr(fl, kind))
    assert isinstance(ours.sampler, getattr(torch.utils.data, kind))
    if batch_size is not None:
        # torch's class itself: Lightning rebuilds any other batch sampler
        assert type(ours.batch_sampler) is torch.utils.data.BatchSampler
        assert ours.batch_sampler.sampler is ours.sampler
    assert (ours.batch_size, ours.drop_last) == (theirs.batch_size, theirs.drop_last)
    for _ in range(2):
        torch.manual_seed(3)
        want = [torch.as_tensor(b).tolist() for b in theirs]
        torch.manual_seed(3)
        assert [torch.as_tensor(b).tolist() for b in ours] == want
