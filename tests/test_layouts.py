"""The layout changes speed, never data: for random seeds, datasets
(map-style, sharded, a mixture, a table) and samplers, every layout (0 to
3 workers; processes, threads, threads inside processes; persistent or not;
``num_workers="auto"`` with its layout forced to change mid-epoch;
``pin_memory``) yields, epoch after epoch, the batches ``num_workers=0``
yields; and a state saved on any layout mid-epoch resumes on any other
into the same remaining batches of that epoch and the next ones.

The contract is that of ``seed=`` (docs/guide/determinism.md): with the
global generator or ``generator=``, persistent workers keep torch's
behaviour, whose draws after the first epoch differ from fresh workers'.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable

import ferroloader as fl
import pytest
import torch
from ferroloader.tuning.bounds import Layout
from helpers import ferro_only, plain, time_limit
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = [
    ferro_only,
    time_limit(150),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    # pin_memory=True on a machine without a GPU: torch's warning, no pinning
    pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning"),
]

EPOCHS = 3


@dataclass(frozen=True)
class Setup:
    """Where the work runs; ``auto``: ``num_workers="auto"`` with these
    layouts forced at batches ``1, 2, ...`` of every epoch."""

    num_workers: int = 0
    method: str = "multiprocessing"
    threads: int = 1
    persistent: bool = False
    pin: bool = False
    auto: tuple[Layout, ...] = ()

    def kwargs(self) -> dict[str, Any]:
        if self.auto:
            return {"num_workers": "auto", "persistent_workers": self.persistent}
        kw: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin}
        if self.num_workers:
            kw.update(worker_method=self.method, worker_threads=self.threads,
                      persistent_workers=self.persistent)
        return kw


P, T = "multiprocessing", "thread"
AUTO_LAYOUTS = [Layout(0), Layout(2), Layout(1, T), Layout(2, T), Layout(1, P, 2),
                Layout(3, prefetch_factor=1)]

setups = st.one_of(
    st.builds(Setup, num_workers=st.integers(0, 3), pin=st.booleans()),
    st.builds(Setup, num_workers=st.integers(1, 3), method=st.just(T),
              persistent=st.booleans()),
    st.builds(Setup, num_workers=st.integers(1, 3), persistent=st.booleans(),
              pin=st.booleans()),
    st.builds(Setup, num_workers=st.integers(1, 2), threads=st.just(2),
              persistent=st.booleans()),
    st.builds(Setup, persistent=st.booleans(),
              auto=st.lists(st.sampled_from(AUTO_LAYOUTS), min_size=1, max_size=3).map(tuple)),
)


def _iterate(loader: Any, setup: Setup, it: Any = None, first: int = 0) -> list[Any]:
    """The rest of an epoch: ``it`` (or a new iterator), forcing the auto
    layouts at batches ``first + 1, first + 2, ...``."""
    it = iter(loader) if it is None else it
    out = []
    k = first
    while True:
        j = k - first
        if setup.auto and 0 < j <= len(setup.auto) and hasattr(it, "_force"):
            it._force(setup.auto[j - 1])
        try:
            out.append(plain(next(it)))
        except StopIteration:
            return out
        k += 1


def _epochs(make: Callable[[Setup], Any], setup: Setup) -> list[list[Any]]:
    # (a sampler of the user's without a generator draws from the global
    # one, which each run starts from the same state)
    torch.manual_seed(0)
    loader = make(setup)
    return [_iterate(loader, setup) for _ in range(EPOCHS)]


def _check(make: Callable[[Setup], Any], a: Setup, b: Setup, epoch: int, stop: int) -> None:
    """``a`` and ``b`` give the one-process batches for every epoch; a state
    saved on ``a`` after ``stop`` batches of ``epoch`` resumes on ``b`` into
    the rest of that epoch and the epochs after it."""
    want = _epochs(make, Setup())
    assert _epochs(make, a) == want, f"{a}"
    stop = min(stop, len(want[epoch]))
    torch.manual_seed(0)
    loader = make(a)
    for e in range(epoch):
        assert _iterate(loader, a) == want[e]
    it = iter(loader)
    head = [plain(next(it)) for _ in range(stop)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    del it, loader
    torch.manual_seed(12345)  # the state puts back what the loader draws from
    resumed = make(b)
    resumed.load_state_dict(state)
    rest = _iterate(resumed, b, first=stop)
    assert head + rest == want[epoch], f"epoch {epoch} resumed on {b} at {stop}"
    for e in range(epoch + 1, EPOCHS):
        assert _iterate(resumed, b) == want[e], f"epoch {e} after the resume on {b}"


# --------------------------------------------------------------------------
# the datasets


class Items(torch.utils.data.Dataset):
    """Map-style: item ``i`` is ``{"i": i, "x": [i, 2i]}``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"i": i, "x": torch.tensor([i, 2 * i], dtype=torch.float32)}


SAMPLERS = ["shuffle", "sequential", "random_replacement", "weighted", "subset",
            "batch_sampler", "distributed"]


def _map_loader(n: int, sampler: str, seed: int, batch: int, drop_last: bool
                ) -> Callable[[Setup], Any]:
    def make(setup: Setup) -> Any:
        ds = Items(n)
        kw: dict[str, Any] = {"batch_size": batch, "drop_last": drop_last, "seed": seed}
        if sampler == "shuffle":
            kw["shuffle"] = True
        elif sampler == "random_replacement":
            kw["sampler"] = fl.RandomSampler(ds, replacement=True, num_samples=n + 3)
        elif sampler == "weighted":
            kw["sampler"] = fl.WeightedRandomSampler([1.0 + i % 3 for i in range(n)], n)
        elif sampler == "subset":
            kw["sampler"] = fl.SubsetRandomSampler(list(range(0, n, 2)))
        elif sampler == "batch_sampler":
            del kw["batch_size"], kw["drop_last"]
            kw["batch_sampler"] = fl.BatchSampler(fl.RandomSampler(ds), batch, drop_last)
        elif sampler == "distributed":
            kw["sampler"] = fl.DistributedSampler(ds, num_replicas=2, rank=1, seed=seed)
        return fl.DataLoader(ds, **kw, **setup.kwargs())

    return make


common = {
    "a": setups,
    "b": setups,
    "seed": st.integers(0, 2**32),
    "epoch": st.integers(0, EPOCHS - 1),
    "stop": st.integers(0, 6),
}
EXAMPLES = max(8, settings.default.max_examples // 5)


@given(n=st.integers(1, 23), sampler=st.sampled_from(SAMPLERS), batch=st.integers(1, 5),
       drop_last=st.booleans(), **common)
@settings(max_examples=EXAMPLES)
def test_map_style_batches_do_not_depend_on_the_layout(n, sampler, batch, drop_last, a, b, seed,
                                                       epoch, stop):
    _check(_map_loader(n, sampler, seed, batch, drop_last), a, b, epoch, stop)


class Ranges(fl.ShardedDataset):
    def __init__(self, lens: list[int]) -> None:
        self.lens = lens

    def shards(self) -> list[int]:
        return list(range(len(self.lens)))

    def iter_shard(self, shard: int, start: int = 0) -> Any:
        return iter(range(1000 * shard + start, 1000 * shard + self.lens[shard]))

    def shard_len(self, shard: int) -> int:
        return self.lens[shard]


@given(lens=st.lists(st.integers(0, 15), min_size=1, max_size=6),
       mode=st.sampled_from(["static", "elastic"]), lanes=st.integers(1, 5),
       shuffle=st.booleans(), batch=st.integers(1, 4), **common)
@settings(max_examples=EXAMPLES)
def test_sharded_batches_do_not_depend_on_the_layout(lens, mode, lanes, shuffle, batch, a, b,
                                                     seed, epoch, stop):
    def make(setup: Setup) -> Any:
        sharding = fl.Sharding(mode=mode, lanes=lanes, shuffle_block=3)
        return fl.DataLoader(Ranges(lens), batch_size=batch, shuffle=shuffle, seed=seed,
                             sharding=sharding, **setup.kwargs())

    _check(make, a, b, epoch, stop)


@given(weights=st.tuples(st.floats(0.1, 5.0), st.floats(0.1, 5.0)),
       replacement=st.booleans(), batch=st.integers(1, 4), sharded=st.booleans(), **common)
@settings(max_examples=EXAMPLES)
def test_mixture_batches_do_not_depend_on_the_layout(weights, replacement, batch, sharded, a, b,
                                                     seed, epoch, stop):
    def make(setup: Setup) -> Any:
        second: Any = Ranges([4, 7]) if sharded else list(range(100, 109))
        mix = fl.Mixture({"a": list(range(13)), "b": second},
                         {"a": weights[0], "b": weights[1]}, seed=seed, replacement=replacement,
                         num_samples=17 if replacement else None)
        return fl.DataLoader(mix, batch_size=batch, **setup.kwargs())

    _check(make, a, b, epoch, stop)


@given(n=st.integers(1, 30), shuffle=st.booleans(), batch=st.integers(1, 6), **common)
@settings(max_examples=EXAMPLES)
def test_table_batches_do_not_depend_on_the_layout(n, shuffle, batch, a, b, seed, epoch, stop):
    pa = pytest.importorskip("pyarrow", reason="TableDataset's tables are a test extra")
    table = pa.table({"i": pa.array(range(n), pa.int64()),
                      "text": pa.array([None if i % 4 == 0 else f"t{i}" for i in range(n)],
                                       pa.string()),
                      "v": pa.array([float(i) / 3 for i in range(n)])})

    def make(setup: Setup) -> Any:
        return fl.DataLoader(fl.TableDataset(table), batch_size=batch, shuffle=shuffle,
                             seed=seed, **setup.kwargs())

    _check(make, a, b, epoch, stop)
