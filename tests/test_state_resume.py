"""Resumes that returned other data than an uninterrupted run, each family
with its regression test; states through JSON; states of sharded datasets
tied to their shard list; and a fuzz of ``load_state_dict`` with damaged
states (hypothesis)."""

from __future__ import annotations

import copy
import itertools
import json
import random
from typing import Any, Callable, Iterator, Optional

import ferroloader as fl
import pytest
import torch
import torch.utils.data as tud
from ferroloader.seeds import epoch_seed
from helpers import ferro_only, time_limit
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mp_helpers import LARGE, Indices
from shard_cases import Counted
from test_state import KINDS, RngStateMap, _expected, _loader, plain

pytestmark = [ferro_only, time_limit(120)]


def identity(x: Any) -> Any:
    return x


class EpochCounting(tud.IterableDataset):
    """Counts its epochs itself: the state at an epoch's end says the next
    epoch is the next one (torchdata's GeneratorIterable)."""

    def __init__(self, n: int = 12) -> None:
        self.n, self.i, self.epoch, self.resume = n, 0, 0, None

    def __iter__(self) -> Iterator[tuple[int, int]]:
        info = tud.get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        self.i, self.resume = (self.resume or 0), None
        mine = list(range(w, self.n, k))
        for x in mine[self.i :]:
            self.i += 1
            yield (x, self.epoch)
        self.i = 0
        self.epoch += 1

    def state_dict(self) -> dict:
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, sd: dict) -> None:
        self.resume, self.epoch = sd["i"], sd["epoch"]


class SelfIterating(tud.IterableDataset):
    """``__iter__`` makes the position and returns the dataset itself:
    its state can only be loaded after ``iter()`` (torchdata's order)."""

    def __init__(self, n: int = 20) -> None:
        self.n = n

    def __iter__(self) -> SelfIterating:
        info = tud.get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        self.pos = {"at": w, "step": k}
        return self

    def __next__(self) -> int:
        if self.pos["at"] >= self.n:
            raise StopIteration
        self.pos["at"] += self.pos["step"]
        return self.pos["at"] - self.pos["step"]

    def state_dict(self) -> dict:
        return {"pos": dict(self.pos)}

    def load_state_dict(self, sd: dict) -> None:
        self.pos = dict(sd["pos"])


class RngIterator:
    """An iterator whose state holds the worker's global RNG."""

    def __init__(self, items: list[int]) -> None:
        self.items, self.i = items, 0

    def __iter__(self) -> RngIterator:
        return self

    def __next__(self) -> int:
        if self.i >= len(self.items):
            raise StopIteration
        self.i += 1
        return self.items[int(torch.randint(len(self.items), ()))]

    def state_dict(self) -> dict:
        return {"i": self.i, "g": torch.get_rng_state().tolist()}

    def load_state_dict(self, sd: dict) -> None:
        self.i = sd["i"]
        torch.set_rng_state(torch.tensor(sd["g"], dtype=torch.uint8))


class RngIterable(tud.IterableDataset):
    def __iter__(self) -> RngIterator:
        info = tud.get_worker_info()
        w = info.id if info is not None else 0
        return RngIterator(list(range(100 * w, 100 * w + 9)))


def _through_json(sd: dict) -> dict:
    return json.loads(json.dumps(sd))


def _resume_equals_uninterrupted(
    make: Callable[[], fl.DataLoader], stop: int, epochs_before: int = 0, after: int = 1
) -> None:
    """Runs `epochs_before` epochs and `stop` batches, saves (through JSON),
    and checks that a new loader resumed from it yields what the first one
    yields next: the rest of the epoch and `after` more epochs."""
    torch.manual_seed(7)
    loader = make()
    for _ in range(epochs_before):
        list(loader)
    it = iter(loader)
    for _ in range(stop):
        next(it)
    sd = _through_json(loader.state_dict())
    expected = [plain(b) for b in it]
    for _ in range(after):
        expected += [plain(b) for b in loader]
    del it, loader
    torch.manual_seed(12345)  # the resume must not depend on it
    resumed = make()
    resumed.load_state_dict(sd)
    got = [plain(b) for b in resumed]
    for _ in range(after):
        got += [plain(b) for b in resumed]
    assert got == expected


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("stop", [0, 3, 7])
def test_dataset_state_of_the_global_rng_does_not_change_the_order(nw, stop):
    """A dataset whose state is torch's global RNG: loading it used to move
    the RNG the shuffle and base seed are drawn from, so the resumed epoch
    had another order (and, with workers, other draws)."""

    def make() -> fl.DataLoader:
        return fl.DataLoader(RngStateMap(), batch_size=2, shuffle=True, num_workers=nw)

    _resume_equals_uninterrupted(make, stop)


@pytest.mark.parametrize("stop", [0, 2, 5])
def test_map_dataset_state_in_each_worker(stop):
    """A map-style dataset drawing random numbers in its workers, with
    state methods: each worker's replica resumes from its own state, and
    each batch goes to the worker it went to before."""

    def make() -> fl.DataLoader:
        return fl.DataLoader(RngStateMap(), batch_size=3, num_workers=2)

    _resume_equals_uninterrupted(make, stop)


@pytest.mark.parametrize("stateful", [False, True])
@pytest.mark.parametrize("between", [False, True])
def test_persistent_workers_resume_after_the_first_epoch(stateful, between):
    """Epochs after the first on persistent workers draw no base seed
    (torch draws one only for new workers); a resumed one drew it anyway, so
    its shuffle differed. Mid-epoch and at the epoch boundary."""
    ds: tud.Dataset = RngStateMap() if stateful else tud.TensorDataset(torch.arange(24))

    def make() -> fl.DataLoader:
        return fl.DataLoader(
            ds, batch_size=2, shuffle=True, num_workers=2, persistent_workers=True
        )

    _resume_equals_uninterrupted(make, 0 if between else 4, epochs_before=1, after=1)


@pytest.mark.parametrize("nw,pw", [(0, False), (2, True)])
def test_state_at_an_epoch_end_carries_the_datasets_epoch(nw, pw):
    """An IterableDataset that counts epochs: a state taken after an epoch
    ended resumes the next epochs with the right count (it resumed at 0)."""

    def make() -> fl.DataLoader:
        return fl.DataLoader(
            EpochCounting(), num_workers=nw, persistent_workers=pw, collate_fn=identity
        )

    _resume_equals_uninterrupted(make, 0, epochs_before=1, after=2)


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("stop", [1, 6])
def test_iterator_state_is_loaded_after_iter(nw, stop):
    """A dataset that is its own iterator and makes its position in
    ``__iter__``: its state is loaded after ``iter()``, not before."""

    def make() -> fl.DataLoader:
        return fl.DataLoader(SelfIterating(), batch_size=2, num_workers=nw)

    _resume_equals_uninterrupted(make, stop)


@pytest.mark.parametrize("pw", [False, True])
def test_stateful_iterator_with_rng_resumes_at_an_epoch_end(pw):
    """An iterator whose state is the worker's RNG: the next epoch after an
    end-of-epoch state draws what the uninterrupted run drew."""

    def make() -> fl.DataLoader:
        g = torch.Generator().manual_seed(4)
        return fl.DataLoader(
            RngIterable(), num_workers=2, persistent_workers=pw, batch_size=2, generator=g
        )

    _resume_equals_uninterrupted(make, 0, epochs_before=1, after=1)


def test_loaded_state_is_what_state_dict_returns_until_iter():
    """state_dict() after load_state_dict() and before iter() returns the
    loaded state unchanged, and the resume still yields the right data."""

    def make() -> fl.DataLoader:
        return fl.DataLoader(RngStateMap(), batch_size=2, shuffle=True, num_workers=2)

    torch.manual_seed(3)
    loader = make()
    it = iter(loader)
    for _ in range(3):
        next(it)
    sd = _through_json(loader.state_dict())
    expected = [plain(b) for b in it]
    other = make()
    other.load_state_dict(sd)
    assert other.state_dict() == sd
    assert [plain(b) for b in other] == expected


def test_truthy_arguments_are_taken_as_torch_takes_them():
    """persistent_workers=(False,) is truthy, as for torch; and
    snapshot_every_n_steps (torchdata's argument) is accepted."""
    loader = fl.DataLoader(
        list(range(6)), num_workers=1, persistent_workers=(False,), snapshot_every_n_steps=3
    )
    assert [b.tolist() for _ in range(2) for b in loader] == [[i] for i in range(6)] * 2
    assert loader.snapshot_every_n_steps == 3


# JSON: every built-in sampler, sharding mode and num_workers


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nw", [0, 2])
def test_state_through_json_resumes_exactly(kind, nw):
    """json.dumps(state_dict()) works, and the state read back resumes to
    the uninterrupted run's batches."""
    expected, _ = _expected(kind)
    torch.manual_seed(0)
    loader = _loader(kind, nw)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(2)]
    text = json.dumps(loader.state_dict())
    del it, loader
    resumed = _loader(kind, nw)
    resumed.load_state_dict(json.loads(text))
    rest = [plain(b) for b in resumed] + [plain(b) for b in resumed]
    assert head + rest == expected


def _sharded(mode: str, lens: list[int], nw: int) -> fl.DataLoader:
    if mode == "elastic":
        return fl.DataLoader(
            Counted(lens), batch_size=2, num_workers=nw, sharding=fl.Sharding(mode="static")
        )
    return fl.DataLoader(
        Counted(lens), batch_size=2, num_workers=nw, shuffle=True, sharding=fl.Sharding(mode=mode)
    )


@pytest.mark.parametrize("mode", ["static", "dynamic"])
@pytest.mark.parametrize("nw", [0, 2])
def test_sharded_state_through_json_resumes_exactly(mode, nw):
    """A sharded epoch's state goes through JSON and resumes: the same
    batches as the uninterrupted run (the same items, where dynamic
    assignment to workers follows timing)."""
    lens = [7, 1, 9, 3, 5]
    torch.manual_seed(0)
    first = _sharded(mode, lens, nw)
    expected = [plain(b) for _ in range(2) for b in first]
    torch.manual_seed(0)
    loader = _sharded(mode, lens, nw)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(3)]
    text = json.dumps(loader.state_dict())
    del it, loader
    resumed = _sharded(mode, lens, nw)
    resumed.load_state_dict(json.loads(text))
    rest = [plain(b) for b in resumed] + [plain(b) for b in resumed]
    if mode == "dynamic" and nw:
        flat = sorted(x for b in head + rest for x in b)
        assert flat == sorted(x for b in expected for x in b)
    else:
        assert head + rest == expected


@pytest.mark.parametrize("nw", [0, 2])
def test_elastic_state_through_json_resumes_exactly(nw):
    """An ElasticBatchSampler's state goes through JSON and resumes."""

    def make() -> fl.DataLoader:
        ds = tud.TensorDataset(torch.arange(30))
        bs = fl.ElasticBatchSampler(ds, batch_size=4, seed=5)
        return fl.DataLoader(ds, batch_sampler=bs, num_workers=nw)

    _resume_equals_uninterrupted(make, 3, after=0)


@pytest.mark.parametrize(
    "mode,before,after",
    [
        ("static", [10] * 4, [20] * 2),
        ("dynamic", [10] * 4, [10] * 6),
        ("static", [10] * 4, [10, 10, 12, 8]),
    ],
)
def test_sharded_state_from_other_shards_is_refused(mode, before, after):
    """A state saved from one shard list is refused by a dataset with other
    shards (even of the same total length), naming the shard list."""
    loader = fl.DataLoader(Counted(before), batch_size=2, sharding=fl.Sharding(mode=mode))
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    other = fl.DataLoader(Counted(after), batch_size=2, sharding=fl.Sharding(mode=mode))
    with pytest.raises(ValueError, match="shard"):
        other.load_state_dict(sd)


@pytest.mark.parametrize(
    "layout", [{}, {"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"}],
    ids=["w0", "w2", "threads2"],
)
def test_a_state_drawn_past_the_epochs_end_is_a_clear_error(layout):
    """A state whose epoch.drawn is past the epoch's end (edited, or from a longer dataset) is
    the same ConfigError with or without workers, naming both counts: never a bare
    StopIteration out of iter() (with workers, the batches in flight are drawn again)."""
    def make() -> fl.DataLoader:
        return fl.DataLoader(list(range(20)), batch_size=2, shuffle=True, **layout)

    loader = make()
    it = iter(loader)
    next(it)
    next(it)
    sd = loader.state_dict()
    del it
    sd["epoch"]["drawn"] = 50
    resumed = make()
    resumed.load_state_dict(sd)
    with pytest.raises(fl.ConfigError) as e:
        next(iter(resumed))
    assert str(e.value) == (
        "iter(): the state given to load_state_dict() is 50 batches into the epoch, but this "
        "loader's epoch has 10"
    )


# the fuzz: no state of any shape reaches an InternalError, a hang or a crash


def _base_states() -> dict[str, dict]:
    out = {}
    for name, make in {
        "map_w2": lambda: fl.DataLoader(RngStateMap(), batch_size=2, shuffle=True, num_workers=2),
        "map_w0": lambda: fl.DataLoader(tud.TensorDataset(torch.arange(20)), batch_size=3),
        "iter_w2": lambda: fl.DataLoader(EpochCounting(), num_workers=2, collate_fn=identity),
        "shards": lambda: fl.DataLoader(
            Counted([5, 3, 8]), batch_size=2, sharding=fl.Sharding(mode="dynamic")
        ),
    }.items():
        torch.manual_seed(1)
        loader = make()
        it = iter(loader)
        next(it)
        next(it)
        out[name] = (make, loader.state_dict())
        del it
    return out


_BASES: dict[str, Any] = {}


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += _paths(v, (*prefix, i))
    return found


_ODD = [None, -1, 0, 1, 2**40, 1.5, "x", "", [], {}, [1, -2], {"a": 1}, True, b"\x00"]


def _mutate(state: dict, rng: random.Random, n: int) -> dict:
    state = copy.deepcopy(state)
    for _ in range(n):
        paths = [p for p in _paths(state) if p]
        if not paths:
            break
        path = rng.choice(paths)
        parent = state
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        action = rng.randrange(4)
        if action == 0:  # drop it
            del parent[key]
        elif action == 1:  # another type or an impossible value
            parent[key] = copy.deepcopy(rng.choice(_ODD))
        elif action == 2 and isinstance(parent[key], (list, str)) and parent[key]:
            parent[key] = parent[key][: rng.randrange(len(parent[key]))]  # truncated
        elif isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] = parent[key] + rng.choice([-3, -1, 1, 5, 1000])
    return state


@time_limit(300)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    base=st.sampled_from(["map_w2", "map_w0", "iter_w2", "shards"]),
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 4),
    json_trip=st.booleans(),
)
# a queued shard past the shard list (found under pytest-xdist's seeds)
@example(base="shards", seed=1699, n=2, json_trip=False)
def test_damaged_states_are_refused_or_resume(base, seed, n, json_trip):
    """A state with dropped, retyped, truncated or shifted fields is either
    refused with a ValueError (at load_state_dict() or the iter() after it)
    or resumes an epoch that ends: never another error (an InternalError, a
    worker death), a hang or a crash."""
    if not _BASES:
        _BASES.update(_base_states())
    make, good = _BASES[base]
    state = _mutate(good, random.Random(seed), n)
    if json_trip:
        try:
            state = json.loads(json.dumps(state))
        except TypeError:
            pass
    loader = make()
    try:
        loader.load_state_dict(state)
        count = 0
        for _ in loader:
            count += 1
            assert count < 1000, "a damaged state made an endless epoch"
    except fl.errors.FerroloaderError as e:
        # the loader refuses a state with a ValueError, nothing else
        assert isinstance(e, ValueError), repr(e)
    except Exception:
        # the dataset's own load_state_dict() refused a damaged part of its
        # state: re-raised with its own type, as torch re-raises user errors
        pass


# --------------------------------------------------------------------------- #
# The sampler's draw at the first next(), after other code used the RNG
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("between", ["draw", "reseed"])
def test_rng_used_between_iter_and_first_next_resumes_exactly(kind, between):
    """With one process a sampler draws its randomness at the first next(),
    as torch's does; code that drew from (or reseeded) the generators after
    iter() changed what it drew. A resume replays the generators as the
    sampler found them (accelerate's stateful loader calls state_dict(),
    which starts the iterator, long before the loop's first next())."""

    def touch() -> None:
        if between == "draw":
            torch.rand(3)
        else:
            torch.manual_seed(1234)

    def run(stop: Optional[int]) -> list:
        torch.manual_seed(0)
        loader = _loader(kind, 0)
        it = iter(loader)
        touch()
        got = [plain(b) for b in itertools.islice(it, stop)]
        if stop is None:
            return got
        saved = json.loads(json.dumps(loader.state_dict()))
        del it, loader
        torch.manual_seed(99)
        again = _loader(kind, 0)
        again.load_state_dict(saved)
        return got + [plain(b) for b in again]

    want = run(None)
    for stop in (1, 3):
        assert run(stop) == want, f"resumed after {stop} batches"


# --------------------------------------------------------------------------- #
# A resume beside the iterator it resumes: the permutation is handed over
# --------------------------------------------------------------------------- #


def _large_loader(lib: Any, sampler: str) -> Any:
    ds = Indices()
    if sampler == "shuffle":
        kw: dict = {"shuffle": True}
    elif sampler == "seed":
        # torch's: the generator the loader's own follows (reseeded per epoch
        # by the caller); ferroloader's: ``seed=``
        kw = {"shuffle": True}
        kw.update({"seed": 7} if lib is fl else {"generator": torch.Generator()})
    elif sampler == "num_samples":
        # two whole permutations and a part of a third
        kw = {"sampler": lib.RandomSampler(ds, num_samples=2 * LARGE + 5000)}
    else:
        kw = {"sampler": lib.SubsetRandomSampler(range(LARGE - 1, -1, -1))}
    return lib.DataLoader(ds, batch_size=4096, **kw)


def _torch_epochs(sampler: str, epochs: int) -> tuple[list, Any]:
    """torch's batches over ``epochs`` epochs of the large loader (for
    ``seed``, its generator reseeded as ``seed=7`` reseeds the loader's
    own), and its loader."""
    loader = _large_loader(tud, sampler)
    out: list = []
    for e in range(epochs):
        if sampler == "seed":
            loader.generator.manual_seed(epoch_seed(7, e))
        out += [b.tolist() for b in loader]
    return out, loader


@pytest.mark.parametrize("sampler", ["shuffle", "num_samples", "subset", "seed"])
@pytest.mark.parametrize("part", [0.05, 0.5, 0.95])
def test_a_resume_beside_the_live_iterator_gives_torchs_batches(sampler, part):
    """The autotuner moves an epoch to another layout this way: the new
    iterator opens the epoch while the old one still holds its permutation,
    which is then handed over instead of drawn again (a private generator's,
    or the loader's own of ``seed=``; ``subset`` draws from the global
    generator, shared: drawn again). Both go on with torch's batches, each
    to the epoch's end, and the next epoch too."""
    torch.manual_seed(5)
    want, torch_loader = _torch_epochs(sampler, 2)
    stop = max(1, int(part * len(want) / 2))
    torch.manual_seed(5)
    first = _large_loader(fl, sampler)
    it = iter(first)
    head = [b.tolist() for b in itertools.islice(it, stop)]
    resumed = _large_loader(fl, sampler)
    resumed.load_state_dict(first.state_dict())
    got = head + [b.tolist() for b in resumed]
    assert got == want[: len(got)] and len(got) == len(want) // 2
    # the interrupted iterator, still alive, goes on as it would have
    assert head + [b.tolist() for b in it] == want[: len(want) // 2]
    assert [b.tolist() for b in resumed] == want[len(want) // 2 :]
    if sampler == "seed":
        # the loader's own generator left where torch's draws leave it
        assert torch.equal(resumed.generator.get_state(), torch_loader.generator.get_state())

