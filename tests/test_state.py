"""Snapshot and resume: ``DataLoader.state_dict()`` / ``load_state_dict()``.

Every resume test compares against an uninterrupted run of the same loader:
the batches handed over before the snapshot plus those of the resumed
loader (the rest of that epoch and the next one) must equal the
uninterrupted run's batches, value for value and in order, and the global
generator must end where it ends in the uninterrupted run.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
from typing import Any, Callable

import ferroloader as fl
import pytest
import torch
import torch.utils.data as tud
from helpers import ferro_only, plain, time_limit
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = [
    ferro_only,
    time_limit(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

N = 11  # batch sizes 2 and 3 leave a partial last batch
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


class Squares(tud.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"i": i, "x": torch.tensor([i, i * i], dtype=torch.float32)}


class RngStateMap(tud.Dataset):
    """A map-style dataset whose items draw from torch's global RNG and
    whose state is that RNG (torchdata's test dataset does this)."""

    def __init__(self, n: int = 24) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return int(torch.randint(1000, ())) * 100 + i

    def state_dict(self) -> dict:
        return {"g": torch.get_rng_state().tolist()}

    def load_state_dict(self, sd: dict) -> None:
        torch.set_rng_state(torch.tensor(sd["g"], dtype=torch.uint8))


class GlobalRngSampler(tud.Sampler):
    """A user sampler without state methods that draws from the global RNG
    while it iterates: resume must fast-forward it on the same draws."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield (i * 7 + int(torch.randint(0, 3, ()).item())) % self.n

    def __len__(self) -> int:
        return self.n


class StatefulShuffle(tud.Sampler):
    """A user sampler with ``state_dict``/``load_state_dict`` in torchdata's
    convention: its own generator per epoch, a count of indices yielded, and
    the position kept until the next ``__iter__`` starts a new epoch."""

    def __init__(self, n: int, seed: int = 17) -> None:
        self.n = n
        self.seed = seed
        self.epoch = -1
        self.yielded = 0
        self.loaded: dict | None = None
        self.loaded_calls = 0

    def __iter__(self):
        if self.loaded is not None:
            # a state saved before the first __iter__ means "epoch 0 from the start"
            self.epoch = max(self.loaded["epoch"], 0)
            self.yielded = self.loaded["yielded"]
            self.loaded = None
        else:
            self.epoch, self.yielded = self.epoch + 1, 0
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        for i in order[self.yielded :]:
            self.yielded += 1
            yield i

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, sd: dict) -> None:
        self.loaded_calls += 1
        self.loaded = dict(sd)


def _loader(kind: str, nw: int, **extra: Any) -> fl.DataLoader:
    ds = Squares()
    kw: dict[str, Any] = {"batch_size": 2, "num_workers": nw, **extra}
    if kind == "sequential":
        pass
    elif kind == "shuffle":
        kw["shuffle"] = True
    elif kind == "shuffle_generator":
        kw.update(shuffle=True, generator=torch.Generator().manual_seed(5))
    elif kind == "random_replacement_generator":
        g = torch.Generator().manual_seed(9)
        kw["sampler"] = fl.RandomSampler(ds, replacement=True, num_samples=17, generator=g)
    elif kind == "torch_random":
        kw["sampler"] = tud.RandomSampler(ds, num_samples=25)
    elif kind == "weighted":
        kw["sampler"] = fl.WeightedRandomSampler([float(i % 4) + 0.5 for i in range(N)], 13)
    elif kind == "subset":
        kw["sampler"] = fl.SubsetRandomSampler([9, 1, 4, 7, 3, 0, 10])
    elif kind == "batch_sampler":
        del kw["batch_size"]
        kw["batch_sampler"] = fl.BatchSampler(fl.RandomSampler(ds), 3, drop_last=True)
    elif kind == "user_sampler":
        kw["sampler"] = GlobalRngSampler(N)
    elif kind == "stateful_sampler":
        kw["sampler"] = StatefulShuffle(N)
    elif kind == "distributed":
        kw["sampler"] = fl.DistributedSampler(ds, num_replicas=2, rank=1, seed=3)
    else:
        raise AssertionError(kind)
    return fl.DataLoader(ds, **kw)


KINDS = [
    "sequential",
    "shuffle",
    "shuffle_generator",
    "random_replacement_generator",
    "torch_random",
    "weighted",
    "subset",
    "batch_sampler",
    "user_sampler",
    "stateful_sampler",
    "distributed",
]


def _uninterrupted(make: Callable[[], Any], seed: int, epochs: int) -> tuple[list, torch.Tensor]:
    torch.manual_seed(seed)
    loader = make()
    out = [plain(b) for _ in range(epochs) for b in loader]
    return out, torch.get_rng_state()


@functools.cache
def _expected(kind: str) -> tuple[list, torch.Tensor]:
    """Two uninterrupted epochs with num_workers=0 (a map-style loader's
    batches do not depend on num_workers) and the global RNG after them."""
    return _uninterrupted(lambda: _loader(kind, 0), 0, 2)


def _check(kind: str, nw_before: int, nw_after: int, stop: int, **extra: Any) -> None:
    """The resumed run's batches and global RNG equal the uninterrupted run's."""
    seed = 0
    expected, rng_expected = _expected(kind)
    torch.manual_seed(seed)
    loader = _loader(kind, nw_before, **extra)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(stop)]
    sd = pickle.loads(pickle.dumps(loader.state_dict()))
    del it, loader
    torch.manual_seed(seed + 1000)
    resumed = _loader(kind, nw_after, **extra)
    resumed.load_state_dict(sd)
    rest = [plain(b) for b in resumed]  # the rest of the interrupted epoch
    rest += [plain(b) for b in resumed]  # the next epoch
    assert head + rest == expected
    assert torch.equal(torch.get_rng_state(), rng_expected)


def _epoch_len(kind: str) -> int:
    torch.manual_seed(0)
    return len(list(_loader(kind, 0)))


@pytest.mark.parametrize("kind", KINDS)
def test_resume_at_every_position_single_process(kind):
    """With num_workers=0, a snapshot after any number of batches resumes to
    exactly the uninterrupted run's remaining batches, next epoch and RNG."""
    for stop in range(_epoch_len(kind) + 1):
        _check(kind, 0, 0, stop)


@pytest.mark.parametrize("kind", KINDS)
def test_resume_at_every_position_two_workers(kind):
    """With two workers (batches prefetched when the snapshot is taken), a
    resume loses and repeats no batch, at any position."""
    for stop in range(_epoch_len(kind) + 1):
        _check(kind, 2, 2, stop)


@pytest.mark.parametrize("nw_before,nw_after", [(0, 3), (4, 1), (2, 0)])
@pytest.mark.parametrize("kind", ["shuffle", "weighted", "user_sampler", "stateful_sampler"])
def test_resume_with_a_different_number_of_workers(kind, nw_before, nw_after):
    """A map-style loader resumes exactly with another num_workers."""
    for stop in (0, 1, 3, _epoch_len(kind)):
        _check(kind, nw_before, nw_after, stop)


def test_resume_out_of_order_and_persistent_workers():
    """in_order=False and persistent workers still resume without losing or
    repeating a batch (compared as multisets: arrival order is free)."""
    for extra in ({"in_order": False}, {"persistent_workers": True}):
        for stop in (0, 2, 5):
            torch.manual_seed(0)
            loader = _loader("shuffle", 2, **extra)
            it = iter(loader)
            head = [plain(next(it)) for _ in range(stop)]
            sd = loader.state_dict()
            del it, loader
            resumed = _loader("shuffle", 2, **extra)
            resumed.load_state_dict(sd)
            rest = [plain(b) for b in resumed]
            torch.manual_seed(0)
            expected = [plain(b) for b in _loader("shuffle", 0)]
            key = json.dumps
            assert sorted(map(key, head + rest)) == sorted(map(key, expected))


def test_resume_across_the_epoch_boundary():
    """A snapshot taken after the epoch ended resumes with the next epoch,
    identical to the uninterrupted run's second epoch."""
    torch.manual_seed(3)
    loader = _loader("shuffle", 0)
    first = [plain(b) for b in loader]
    second = [plain(b) for b in loader]
    torch.manual_seed(3)
    loader = _loader("shuffle", 0)
    assert [plain(b) for b in loader] == first
    sd = loader.state_dict()
    assert sd["epoch"] is None
    torch.manual_seed(99)
    resumed = _loader("shuffle", 2)
    resumed.load_state_dict(sd)
    assert [plain(b) for b in resumed] == second


CHAINS = [
    ("shuffle", {}, [(0, 2), (2, 1), (0, 3)]),
    ("stateful_sampler", {}, [(2, 2), (2, 1), (0, 2)]),
    ("user_sampler", {"in_order": True}, [(2, 3), (0, 1), (3, 2)]),
]


@pytest.mark.parametrize("kind,extra,hops", CHAINS)
def test_chained_resumes(kind, extra, hops):
    """A resumed loader can be snapshot again (and again): each hop
    (num_workers, batches taken) continues the same epochs exactly."""
    expected, _ = _expected(kind)
    torch.manual_seed(0)
    got: list = []
    sd = None
    for nw, take in hops:
        loader = _loader(kind, nw, **(extra if nw else {}))
        if sd is not None:
            loader.load_state_dict(pickle.loads(pickle.dumps(sd)))
            assert loader.state_dict()["epoch"] == sd["epoch"]  # loaded, not yet iterated
        it = iter(loader)
        got += [plain(next(it)) for _ in range(take)]
        sd = loader.state_dict()
        del it, loader
    last = _loader(kind, 0)
    last.load_state_dict(sd)
    got += [plain(b) for b in last] + [plain(b) for b in last]
    assert got == expected


def test_state_after_the_iterator_is_dropped():
    """Breaking out of the loop drops the iterator; state_dict() still knows
    where the epoch stopped."""
    for nw in (0, 2):
        torch.manual_seed(1)
        loader = _loader("shuffle", nw)
        head = []
        for b in loader:
            head.append(plain(b))
            if len(head) == 3:
                break
        sd = loader.state_dict()
        resumed = _loader("shuffle", nw)
        resumed.load_state_dict(sd)
        torch.manual_seed(1)
        assert head + [plain(b) for b in resumed] == [plain(b) for b in _loader("shuffle", 0)]


def test_state_is_plain_data_and_survives_torch_save_in_a_fresh_process(tmp_path):
    """The state is plain Python data; saved with torch.save and loaded in a
    new interpreter, it resumes to the uninterrupted run's batches."""
    torch.manual_seed(0)
    loader = _loader("shuffle_generator", 2)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(2)]
    sd = loader.state_dict()
    del it

    def check_plain(v: Any) -> None:
        assert isinstance(v, (int, float, str, bytes, bool, type(None), list, dict)), type(v)
        if isinstance(v, dict):
            for k, x in v.items():
                assert isinstance(k, str)
                check_plain(x)
        elif isinstance(v, list):
            for x in v:
                check_plain(x)

    check_plain(sd)
    path = tmp_path / "state.pt"
    torch.save(sd, path)
    script = textwrap.dedent(
        f"""
        import json, sys, torch
        sys.path.insert(0, {TESTS_DIR!r})
        from test_state import _loader, plain
        resumed = _loader("shuffle_generator", 1)
        resumed.load_state_dict(torch.load({str(path)!r}, weights_only=True))
        print(json.dumps([plain(b) for b in resumed]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=100, check=True
    )
    torch.manual_seed(0)
    expected = [plain(b) for b in _loader("shuffle_generator", 0)]
    assert head + json.loads(out.stdout) == expected


def test_stateful_sampler_is_restored_through_its_methods():
    """A sampler with state methods is loaded through load_state_dict, not
    fast-forwarded."""
    torch.manual_seed(0)
    loader = _loader("stateful_sampler", 0)
    it = iter(loader)
    next(it), next(it)
    sd = loader.state_dict()
    assert sd["epoch"]["sampler_state"] == {"epoch": 0, "yielded": 4}
    resumed = _loader("stateful_sampler", 0)
    resumed.load_state_dict(sd)
    list(resumed)
    assert resumed.sampler.loaded_calls == 1


class CountingIterable(tud.IterableDataset):
    """An iterable without state methods: resumed by skipping samples."""

    def __init__(self, n: int = 13) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield {"i": i, "x": torch.tensor([i * 0.5])}


class StatefulIterable(CountingIterable):
    """An iterable with state methods (torchdata's protocol)."""

    def __init__(self, n: int = 13) -> None:
        super().__init__(n)
        self.pos = 0
        self.skipped_by_state = 0

    def __iter__(self):
        while self.pos < self.n:
            i = self.pos
            self.pos += 1
            yield {"i": i, "x": torch.tensor([i * 0.5])}
        self.pos = 0

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, sd: dict) -> None:
        self.pos = sd["pos"]
        self.skipped_by_state = sd["pos"]


@pytest.mark.parametrize("cls", [CountingIterable, StatefulIterable])
@pytest.mark.parametrize("bs", [None, 1, 3])
def test_resume_iterable_dataset_single_process(cls, bs):
    """An IterableDataset (num_workers=0) resumes at every position, with or
    without its own state methods."""
    full = [plain(b) for b in fl.DataLoader(cls(), batch_size=bs)]
    for stop in range(len(full) + 1):
        loader = fl.DataLoader(cls(), batch_size=bs)
        it = iter(loader)
        head = [plain(next(it)) for _ in range(stop)]
        sd = pickle.loads(pickle.dumps(loader.state_dict()))
        del it
        resumed = fl.DataLoader(cls(), batch_size=bs)
        resumed.load_state_dict(sd)
        assert head + [plain(b) for b in resumed] == full, stop
        if cls is StatefulIterable and 0 < stop < len(full):
            assert resumed.dataset.skipped_by_state > 0


class ShardedCounter(tud.IterableDataset):
    """Each worker's replica yields every num_workers-th sample from its id
    (uneven shards); no state methods: resumed by skipping."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def _mine(self) -> range:
        info = tud.get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        return range(w, self.n, k)

    def __iter__(self):
        for i in self._mine():
            yield {"i": i, "x": torch.tensor([i * 0.5])}


class StatefulShardedCounter(ShardedCounter):
    """The same shards with state methods (torchdata's protocol: the
    position is kept until the next __iter__)."""

    def __init__(self, n: int = 23) -> None:
        super().__init__(n)
        self.pos = 0
        self.loaded = False

    def __iter__(self):
        if not self.loaded:
            self.pos = 0
        self.loaded = False
        mine = self._mine()
        while self.pos < len(mine):
            i = mine[self.pos]
            self.pos += 1
            yield {"i": i, "x": torch.tensor([i * 0.5])}

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, sd: dict) -> None:
        self.pos = sd["pos"]
        self.loaded = True


@pytest.mark.parametrize("cls", [ShardedCounter, StatefulShardedCounter])
@pytest.mark.parametrize("nw,bs", [(2, 3), (3, 2), (2, None)])
def test_resume_iterable_dataset_with_workers(cls, nw, bs):
    """An IterableDataset with workers resumes at every position with the
    same num_workers: each replica continues after the batches it had handed
    over, the round-robin where it was, and the next epoch is whole."""
    def make() -> fl.DataLoader:
        return fl.DataLoader(cls(), batch_size=bs, num_workers=nw)

    uninterrupted = make()
    full = [plain(b) for _ in range(2) for b in uninterrupted]
    per_epoch = len(full) // 2
    for stop in range(0, per_epoch + 1, 2 if bs is None else 1):
        loader = make()
        it = iter(loader)
        head = [plain(next(it)) for _ in range(stop)]
        sd = pickle.loads(pickle.dumps(loader.state_dict()))
        del it, loader
        resumed = make()
        resumed.load_state_dict(sd)
        rest = [plain(b) for b in resumed] + [plain(b) for b in resumed]
        assert head + rest == full, stop


def test_resume_iterable_with_workers_out_of_order_and_persistent():
    """in_order=False or persistent workers: an iterable resumes without
    losing or repeating a sample."""
    for extra in ({"in_order": False}, {"persistent_workers": True}):
        def make(extra=extra) -> fl.DataLoader:
            return fl.DataLoader(StatefulShardedCounter(), batch_size=2, num_workers=2, **extra)

        expected = sorted(json.dumps(plain(b)) for b in make())
        for stop in (1, 4):
            loader = make()
            it = iter(loader)
            head = [plain(next(it)) for _ in range(stop)]
            sd = loader.state_dict()
            del it, loader
            resumed = make()
            resumed.load_state_dict(sd)
            got = sorted(json.dumps(b) for b in head + [plain(b) for b in resumed])
            assert got == expected


@pytest.mark.parametrize("make", [ShardedCounter, RngStateMap], ids=["iterable", "map_stateful"])
def test_resume_with_other_workers_is_refused_with_a_reason(make):
    """A state that lives in the workers' replicas (an IterableDataset's
    position, a map-style dataset's own state) saved with 2 workers refuses
    to resume with 3 (or 0): the iter() after load_state_dict() raises an
    error that says why and what to do, a ValueError and (torchdata's type
    there) an AssertionError."""
    loader = fl.DataLoader(make(), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    del it
    for nw in (3, 0):
        other = fl.DataLoader(make(), batch_size=2, num_workers=nw)
        other.load_state_dict(sd)
        with pytest.raises(ValueError, match="same num_workers") as err:
            iter(other)
        assert isinstance(err.value, AssertionError)
        assert "num_workers=2" in str(err.value)
        # raised by iter(), which its text says (not load_state_dict())
        assert str(err.value).startswith("iter(): the state given to load_state_dict()")


@pytest.mark.parametrize(
    "change,match",
    [
        ({"batch_size": 3}, "batch size"),
        ({"shuffle": False}, "sampler"),
        ({"drop_last": True}, "drop_last"),
        ({"dataset": list(range(N + 1))}, "dataset length"),
    ],
)
def test_mismatched_state_is_refused(change, match):
    """A state from a loader with another length, batch size, drop_last or
    sampler raises a ValueError that names the mismatch."""
    base = {"dataset": list(range(N)), "batch_size": 2, "shuffle": True}
    loader = fl.DataLoader(**base)
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    other = fl.DataLoader(**{**base, **change})
    with pytest.raises(ValueError, match=match):
        other.load_state_dict(sd)


def test_state_of_another_version_or_kind_is_refused():
    """A state of another format version, or not a loader state at all,
    raises a ValueError; so does one saved with generator= loaded without."""
    loader = _loader("shuffle", 0)
    sd = loader.state_dict()
    with pytest.raises(ValueError, match="version"):
        loader.load_state_dict({**sd, "ferroloader_state": 999})
    with pytest.raises(ValueError, match="not a ferroloader"):
        loader.load_state_dict({"_num_yielded": 3})
    with pytest.raises(ValueError, match="generators"):
        _loader("shuffle_generator", 0).load_state_dict(sd)


def test_state_dict_is_cheap_and_does_not_pause_workers():
    """state_dict() mid-epoch with workers reads counters only: it returns
    without waiting for any worker (a worker stuck in __getitem__ does not
    delay it)."""
    torch.manual_seed(0)
    loader = _loader("shuffle", 2)
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    for _ in range(100):
        loader.state_dict()
    per_call = (time.perf_counter() - t0) / 100
    assert per_call < 0.05  # generous: a loaded CI machine; the bench reports the real figure
    del it


@given(
    kind=st.sampled_from(["shuffle", "weighted", "batch_sampler", "subset", "user_sampler"]),
    stop=st.integers(0, 8),
    nw_before=st.sampled_from([0, 1, 2]),
    nw_after=st.sampled_from([0, 1, 2]),
    in_order=st.booleans(),
)
@settings(max_examples=max(5, settings.default.max_examples // 6))
def test_hypothesis_resume(kind, stop, nw_before, nw_after, in_order):
    """For random stop points and worker counts, a resume loses and repeats
    no batch (and keeps the order when in_order=True)."""
    stop = min(stop, _epoch_len(kind))
    if in_order:
        _check(kind, nw_before, nw_after, stop)
        return
    extra = {"in_order": False} if nw_before else {}
    torch.manual_seed(0)
    loader = _loader(kind, nw_before, **extra)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(stop)]
    sd = loader.state_dict()
    del it, loader
    resumed = _loader(kind, nw_after)
    resumed.load_state_dict(sd)
    rest = [plain(b) for b in resumed]
    torch.manual_seed(0)
    expected = [plain(b) for b in _loader(kind, 0)]
    assert sorted(map(json.dumps, head + rest)) == sorted(map(json.dumps, expected))


@pytest.mark.parametrize("cls", [ShardedCounter, StatefulShardedCounter])
def test_chained_resumes_of_an_iterable_with_workers(cls):
    """An iterable with workers snapshot again after a resume continues
    exactly (each replica's count and state carry over)."""
    def make() -> fl.DataLoader:
        return fl.DataLoader(cls(), batch_size=2, num_workers=2)

    uninterrupted = make()
    full = [plain(b) for b in uninterrupted]
    got: list = []
    sd = None
    for take in (3, 2, 1):
        loader = make()
        if sd is not None:
            loader.load_state_dict(sd)
        it = iter(loader)
        got += [plain(next(it)) for _ in range(take)]
        sd = loader.state_dict()
        del it, loader
    last = make()
    last.load_state_dict(sd)
    assert got + [plain(b) for b in last] == full


@given(
    kind=st.sampled_from(
        ["shuffle", "weighted", "batch_sampler", "stateful_sampler", "distributed"]
    ),
    hops=st.lists(st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 3)), min_size=1, max_size=3),
)
@settings(max_examples=max(5, settings.default.max_examples // 6))
def test_hypothesis_chained_resumes(kind, hops):
    """Any chain of snapshot/resume hops (random num_workers, random
    batches taken) yields the uninterrupted run's two epochs."""
    expected, _ = _expected(kind)
    torch.manual_seed(0)
    got: list = []
    sd = None
    for nw, take in hops:
        loader = _loader(kind, nw)
        if sd is not None:
            loader.load_state_dict(sd)
        it = iter(loader)
        for _ in range(take):
            try:
                got.append(plain(next(it)))
            except StopIteration:
                break
        sd = loader.state_dict()
        del it, loader
    last = _loader(kind, 0)
    last.load_state_dict(sd)
    rest = [plain(b) for b in last]
    if len(got) + len(rest) < len(expected):  # the interrupted epoch was the first
        rest += [plain(b) for b in last]
    assert (got + rest)[: len(expected)] == expected


@settings(max_examples=60, deadline=None)
@given(
    items=st.integers(0, 40),
    keep=st.integers(0, 12),
    count=st.integers(0, 5),
    kept=st.integers(0, 4),
)
def test_recorder_resends_then_draws_and_keeps_the_last(
    items: int, keep: int, count: int, kept: int
) -> None:
    """The engine's record of a stateful sampler's stream: the batches in
    flight at a snapshot come first (not counted again), then the sampler's,
    numbered on from ``count``; the last ``keep`` are found by number."""
    from ferroloader import _core

    resent = [(count - kept + i, [f"old{i}"]) for i in range(kept) if count - kept + i >= 0]
    source = iter([[i] for i in range(items)])
    rec = _core.Recorder(source, keep, count, resent)
    assert not rec.pulled
    got = list(rec)
    assert got == [b for _, b in resent] + [[i] for i in range(items)]
    assert rec.pulled
    drawn = list(zip(range(count, count + items), ([i] for i in range(items))))
    expect = dict((resent + drawn)[-keep:] if keep else [])
    seqs = list(range(count + items + 2))
    assert rec.batches(seqs) == [expect.get(s) for s in seqs]
