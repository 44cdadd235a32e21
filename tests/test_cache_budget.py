"""Any shard cache budget that holds the largest shard finishes the epoch,
with every item once: when the loaders sharing a cache directory claim
more room for their lanes' open shards than the budget has, each lane lets
go of its shard between batches (``ShardCache.short_of_room``)."""

from __future__ import annotations

import uuid
from typing import Any

import ferroloader as fl
import pytest
from helpers import side_by_side
from hypothesis import given, settings
from hypothesis import strategies as st
from remote_servers import read_ints
from shard_cases import write_int_shards

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    # (budgets below the lanes' shards are drawn on purpose)
    pytest.mark.filterwarnings("ignore::ferroloader.CacheBudgetWarning"),
]

# a loader that has not finished in this long is stuck (a run takes well
# under a second on a quiet machine)
STUCK_AFTER = 60.0


def _write(folder: str, lens: list[int]) -> list[str]:
    return ["file://" + p for p in write_int_shards(folder, lens)]


def _epochs(loaders: list[Any], epochs: int) -> list[list[list[int]]]:
    """Each loader's items per epoch, the loaders running side by side (as
    ranks of one machine would); a loader that does not finish fails."""
    return side_by_side(
        [lambda ld=ld: [[v for b in ld for v in b.tolist()] for _ in range(epochs)]
         for ld in loaders],
        STUCK_AFTER,
    )


LAYOUTS = [(0, "multiprocessing"), (1, "multiprocessing"), (2, "multiprocessing"), (2, "thread")]


@given(
    lens=st.lists(st.integers(1, 40), min_size=2, max_size=9),
    room=st.floats(1.0, 6.0),
    lanes=st.integers(1, 6),
    mode=st.sampled_from(["static", "dynamic", "elastic"]),
    layout=st.sampled_from(LAYOUTS),
    ranks=st.sampled_from([1, 2]),
    shuffle=st.booleans(),
    batch=st.integers(1, 9),
)
@settings(max_examples=max(12, settings.default.max_examples // 4))
def test_any_budget_of_one_shard_finishes_every_epoch_with_every_item_once(
    tmp_path_factory, lens, room, lanes, mode, layout, ranks, shuffle, batch
):
    root = tmp_path_factory.mktemp("budget")
    urls = _write(str(root / "src"), lens)
    # room for `room` of the largest shard (8 bytes an item)
    budget = int(max(lens) * 8 * room)
    cache_dir = str(root / f"cache-{uuid.uuid4().hex[:8]}")
    nw, method = layout
    extra = {} if nw == 0 else {"worker_method": method}
    loaders = []
    for rank in range(ranks):
        cache = fl.ShardCache(dir=cache_dir, budget=budget)
        ds = fl.FileShards(urls, read_ints, lengths=lens, cache=cache)
        sharding = fl.Sharding(mode=mode, lanes=lanes, even=False, rank=rank, world_size=ranks)
        loaders.append(fl.DataLoader(ds, batch_size=batch, shuffle=shuffle, seed=5,
                                     num_workers=nw, sharding=sharding, **extra))
    per_rank = _epochs(loaders, epochs=2)
    want = sorted(1000 * s + o for s, n in enumerate(lens) for o in range(n))
    for epoch in range(2):
        got = sorted(v for items in per_rank for v in items[epoch])
        assert got == want, f"epoch {epoch}"


def test_a_tight_budget_changes_no_batch(tmp_path):
    """Letting go between batches reopens each shard where it stood: the
    batches are those of a budget that holds every lane's shard."""
    lens = [30, 7, 19, 40, 3, 25, 11, 33]
    urls = _write(str(tmp_path / "src"), lens)

    def batches(budget: int, nw: int) -> list[list[int]]:
        cache = fl.ShardCache(dir=str(tmp_path / f"cache-{budget}-{nw}"), budget=budget)
        ds = fl.FileShards(urls, read_ints, lengths=lens, cache=cache)
        loader = fl.DataLoader(ds, batch_size=4, shuffle=True, seed=1, num_workers=nw,
                               sharding=fl.Sharding(lanes=4, shuffle_block=8))
        return [b.tolist() for b in loader]

    roomy = batches(1 << 20, 0)
    assert batches(40 * 8, 0) == roomy
    assert batches(40 * 8, 2) == roomy
    assert batches(2 * 40 * 8, 2) == roomy


def test_leases_make_the_cache_short_of_room_and_go_with_their_epoch(tmp_path):
    lens = [10] * 6  # 80 bytes a shard
    urls = _write(str(tmp_path / "src"), lens)
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget=400)
    ds = fl.FileShards(urls, read_ints, lengths=lens, cache=cache)
    roomy = fl.DataLoader(ds, batch_size=2, sharding=fl.Sharding(lanes=2))
    it = iter(roomy)
    next(it)
    assert cache._native().leased() == 160  # 2 lanes, 80 bytes each
    assert not cache.short_of_room()
    crowded = fl.DataLoader(ds, batch_size=2, sharding=fl.Sharding(lanes=4))
    it2 = iter(crowded)
    assert cache._native().leased() == 160 + 320
    assert cache.short_of_room()
    assert sorted(v for b in it2 for v in b.tolist()) == sorted(
        1000 * s + o for s in range(6) for o in range(10))
    del it2, crowded
    import gc

    gc.collect()
    assert not cache.short_of_room()
    assert len([v for b in it for v in b.tolist()]) == 58


@pytest.mark.filterwarnings("default::ferroloader.CacheBudgetWarning")
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_a_budget_below_the_lanes_shards_warns_once_and_counts_the_downloads_again(
        tmp_path, mode):
    """The walk's case, small: 8 lanes over shards of 16 KiB with a budget
    of 20 KiB (one shard) fetched far more than the data, without a word.
    Now the first iter() warns once, naming the budget the readers need,
    and stats().remote counts the downloads of evicted shards; with that
    budget, neither."""
    import warnings

    lens = [2048] * 8  # 16 KiB each (8 bytes an item)
    urls = _write(str(tmp_path / "src"), lens)

    def run(budget: int, folder: str) -> tuple[list[Any], Any]:
        cache = fl.ShardCache(dir=str(tmp_path / folder), budget=budget)
        ds = fl.FileShards(urls, read_ints, lengths=lens, cache=cache)
        nw = 8 if mode == "dynamic" else 0  # (dynamic: a lane per worker thread)
        extra = {"worker_method": "thread"} if nw else {}
        loader = fl.DataLoader(ds, batch_size=256, shuffle=True, seed=1, num_workers=nw,
                               sharding=fl.Sharding(mode=mode, lanes=8), **extra)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", fl.CacheBudgetWarning)
            for _ in range(2):
                assert sorted(v for b in loader for v in b.tolist()) == sorted(
                    1000 * s + o for s, n in enumerate(lens) for o in range(n))
        said = [w for w in seen if issubclass(w.category, fl.CacheBudgetWarning)]
        return said, loader.stats().remote

    said, stats = run(20 << 10, "small")
    assert len(said) == 1, [str(w.message) for w in said]
    assert "128KiB" in str(said[0].message) and "8 readers" in str(said[0].message)
    assert stats.redownloads > 0 and stats.downloads == 8 + stats.redownloads, stats
    said, stats = run(128 << 10, "enough")
    assert said == [] and stats.redownloads == 0 and stats.downloads == 8, stats
