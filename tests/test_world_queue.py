"""One shard queue for the whole job (``Sharding(across="world")``): ranks
claim works from a counter in ``torch.distributed``'s store. Every item is
read exactly once per epoch (``even=False``); with ``even=True`` every rank
yields the same number of batches and what that holds back is read first in
the next epoch; every rank's states resume exactly the rest, on the same and
on another number of ranks. Ranks here are threads over one ``HashStore``
(the same store calls a job makes); ``test_world_queue_ranks.py`` runs them
as gloo processes."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections import Counter
from typing import Any, Callable

import ferroloader as fl
import helpers
import pytest
import torch
import torch.distributed as dist
from ferroloader.epoch.accounts import job_accounts, remaining
from helpers import ferro_only, time_limit
from hypothesis import given, settings
from hypothesis import strategies as st
from shard_cases import Counted, ranges

pytestmark = [
    ferro_only,
    time_limit(150),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

# a rank that has not finished in this long is stuck
STUCK_AFTER = 60.0

_jobs = [0]


def job_name() -> str:
    """A namespace per job (the ranks here share one process and one store)."""
    _jobs[0] += 1
    return f"test{os.getpid()}-{_jobs[0]}"


def side_by_side(fns: list[Callable[[], Any]]) -> list[Any]:
    return helpers.side_by_side(fns, STUCK_AFTER)


def loader(ds: Any, store: Any, name: str, rank: int, world: int, *, even: bool, nw: int = 0,
           batch: int = 3, **kw: Any) -> fl.DataLoader:
    sharding = fl.Sharding(mode="dynamic", across="world", store=store, name=name, rank=rank,
                           world_size=world, even=even, shuffle_block=BLOCK)
    extra = {"worker_method": "thread"} if nw else {}
    return fl.DataLoader(ds, batch_size=batch, shuffle=True, seed=SEED, num_workers=nw,
                         sharding=sharding, **extra, **kw)


def items(batches: list[Any]) -> list[int]:
    return [int(x) for b in batches for x in b]


SEED, BLOCK = 11, 4  # the loaders' seed= and shuffle_block=


def expand(works: list[tuple[int, int, int]], lens: list[int], epoch: int,
           block: int = BLOCK) -> list[int]:
    """The items of (shard, emitted, end) works of ``Counted`` shards in a
    shuffled epoch: positions in the epoch's block orders (the sharding
    page's ``torch.randperm`` per block), as the items there."""
    root = fl.seeds.epoch_seed(SEED, epoch)
    out = []
    for s, e, end in works:
        for p in range(e, min(end, lens[s])):
            b, lo = p // block, p // block * block
            n = min(block, lens[s] - lo)
            g = torch.Generator().manual_seed(fl.seeds.block_seed(root, s, b))
            out.append(1000 * s + lo + int(torch.randperm(n, generator=g)[p - lo]))
    return out


def all_items(lens: list[int]) -> list[int]:
    return [1000 * s + o for s, n in enumerate(lens) for o in range(n)]


def held_back(states: list[dict[str, Any]], lens: list[int]) -> list[int]:
    """What the job's last epoch held back, from every rank's state taken
    between epochs."""
    carry = fl.merge_states(states).get("world_carry")
    if carry is None:
        return []
    accounts = job_accounts(carry)
    first = accounts[0]
    return expand(remaining(accounts), lens, first["epoch"], first["block"])


lens_st = st.lists(st.integers(0, 14), min_size=1, max_size=9)


@given(lens=lens_st, world=st.integers(2, 4), epochs=st.integers(1, 3), batch=st.integers(1, 4),
       nw=st.sampled_from([0, 0, 2]))
@settings(max_examples=max(8, settings.default.max_examples // 5))
def test_every_item_exactly_once_per_epoch(lens, world, epochs, batch, nw):
    store, name = dist.HashStore(), job_name()
    loaders = [loader(Counted(lens), store, name, r, world, even=False, nw=nw, batch=batch)
               for r in range(world)]
    per_rank = side_by_side([lambda ld=ld: [items(list(ld)) for _ in range(epochs)]
                             for ld in loaders])
    for e in range(epochs):
        assert sorted(v for r in per_rank for v in r[e]) == all_items(lens), f"epoch {e}"
    stats = [ld.stats().queue for ld in loaders]
    assert sum(s.items for s in stats) == epochs * sum(lens)
    assert sum(s.shards for s in stats) == epochs * ranges(lens, world, BLOCK)


@given(lens=lens_st, world=st.integers(2, 4), epochs=st.integers(1, 3), batch=st.integers(1, 4),
       nw=st.sampled_from([0, 0, 2]))
@settings(max_examples=max(8, settings.default.max_examples // 5))
def test_even_counts_and_what_they_hold_back_is_read_next(lens, world, epochs, batch, nw):
    """Every rank yields the same number of batches, all full; over the
    epochs, what was read plus what the last epoch holds back is every item
    once per epoch (what one epoch holds back the next reads), and what an
    epoch holds back stays within the bound the sharding page states."""
    store, name = dist.HashStore(), job_name()
    loaders = [loader(Counted(lens), store, name, r, world, even=True, nw=nw, batch=batch)
               for r in range(world)]

    def run(ld: fl.DataLoader) -> Any:
        epochs_read = []
        for _ in range(epochs):
            n = len(ld)  # before the epoch: what iter() will decide
            it = iter(ld)
            assert len(ld) == n
            batches = list(it)
            assert len(batches) == n
            epochs_read.append(batches)
        return epochs_read, ld.state_dict()

    got = side_by_side([lambda ld=ld: run(ld) for ld in loaders])
    read: Counter[int] = Counter()
    for e in range(epochs):
        counts = {len(got[r][0][e]) for r in range(world)}
        assert len(counts) == 1, f"epoch {e}: batch counts {counts}"
        for r in range(world):
            assert all(len(b) == batch for b in got[r][0][e])
            read.update(items(got[r][0][e]))
    held = Counter(held_back([g[1] for g in got], lens))
    assert read + held == Counter(all_items(lens) * epochs)
    # the bound the sharding page states
    assert sum(held.values()) < world * batch + (world - 1) * max(max(lens) - 1, 0)


@given(lens=lens_st, world=st.integers(2, 4), after=st.integers(1, 4),
       stops=st.lists(st.integers(0, 12), min_size=4, max_size=4), even=st.booleans(),
       nw=st.sampled_from([0, 0, 2]), through_json=st.booleans())
@settings(max_examples=max(8, settings.default.max_examples // 5))
def test_every_ranks_state_resumes_exactly_the_rest_on_any_number_of_ranks(
    lens, world, after, stops, even, nw, through_json
):
    """Each rank stops after its own number of batches; every rank's state
    resumes on `after` ranks into exactly the items not yet read (and, with
    even counts, what that epoch then holds back), and the next epoch is
    whole."""
    store, name = dist.HashStore(), job_name()
    loaders = [loader(Counted(lens), store, name, r, world, even=even, nw=nw)
               for r in range(world)]

    def head(ld: fl.DataLoader, stop: int) -> Any:
        it = iter(ld)
        seen = []
        for _ in range(stop):
            try:
                seen.append(next(it))
            except StopIteration:
                break
        state = ld.state_dict()
        del it
        return items(seen), state

    heads = side_by_side([lambda ld=ld, k=stops[r]: head(ld, k) for r, ld in enumerate(loaders)])
    states = [h[1] for h in heads]
    if through_json:
        states = [json.loads(json.dumps(s)) for s in states]
    store2, name2 = dist.HashStore(), job_name()
    resumed = [loader(Counted(lens), store2, name2, r, after, even=even, nw=nw)
               for r in range(after)]
    for ld in resumed:
        ld.load_state_dict(states)

    def rest(ld: fl.DataLoader) -> Any:
        n = len(ld) if even and after > 1 else None  # (the saved epoch's, before iter())
        it = iter(ld)
        if n is not None:
            assert len(ld) == n
        this = list(it)
        between = ld.state_dict()
        n = len(ld) if even and after > 1 else None
        nxt = list(ld)
        if n is not None:
            assert len(nxt) == n
        return this, nxt, ld.state_dict(), between

    tails = side_by_side([lambda ld=ld: rest(ld) for ld in resumed])
    before = [v for h in heads for v in h[0]]
    this_epoch = [v for t in tails for v in items(t[0])]
    next_epoch = [v for t in tails for v in items(t[1])]
    if all(s["epoch"] is None for s in states):
        # every rank had finished the epoch: the resume begins the next
        if not even:
            assert sorted(before) == sorted(this_epoch) == all_items(lens)
        return
    if not even:
        assert sorted(before + this_epoch) == all_items(lens)
        assert sorted(next_epoch) == all_items(lens)
        return
    assert len({len(t[0]) for t in tails}) == 1 and len({len(t[1]) for t in tails}) == 1
    held_this = held_back([t[3] for t in tails], lens)
    held_next = held_back([t[2] for t in tails], lens)
    assert Counter(before + this_epoch + held_this) == Counter(all_items(lens))
    assert Counter(next_epoch + held_next) == Counter(all_items(lens) + held_this)


@pytest.mark.parametrize("lens", [[20] * 24, [90] * 3], ids=["24 shards", "one per rank"])
def test_a_faster_rank_claims_more(lens):
    """One rank that waits 5 ms an item reads far fewer items than its
    static share (160 of 480, or its one shard of 90): with one shard per
    rank too, since shards are claimed in ranges (of 8 items here); the
    others, threads sharing one interpreter here, split the rest as the
    GIL lets them."""
    store, name = dist.HashStore(), job_name()
    datasets = [Counted(lens, delay=0.005 if r == 0 else 0.0) for r in range(3)]
    loaders = [loader(datasets[r], store, name, r, 3, even=False, batch=5) for r in range(3)]
    got = side_by_side([lambda ld=ld: items(list(ld)) for ld in loaders])
    assert sorted(v for g in got for v in g) == all_items(lens)
    stats = [ld.stats().queue for ld in loaders]
    assert sum(s.shards for s in stats) == ranges(lens, 3, BLOCK)
    # (its first range, the one it reads ahead into, and the few it holds)
    assert stats[0].items <= 40, [s.items for s in stats]


def test_shards_are_cut_in_whole_blocks_or_the_block_shrinks_and_a_resume_keeps_it():
    """4,800 items in 3 shards with shuffle_block=64: on 2 ranks the list's
    ranges are 38 items, on 3 ranks 25, each its own shuffle block (a 64th
    of a rank's share is under a block). States saved on 2 ranks mid-epoch
    (even counts) resume on 3: the epoch's rest is read in the saved
    blocks, what it holds back is carried into the next epoch's blocks,
    and every item is read once per epoch."""
    lens = [2000, 1700, 1100]

    def make(store: Any, name: str, r: int, world: int) -> fl.DataLoader:
        return fl.DataLoader(Counted(lens), batch_size=16, shuffle=True, seed=SEED,
                             sharding=fl.Sharding(mode="dynamic", across="world", store=store,
                                                  name=name, rank=r, world_size=world,
                                                  even=True))

    store, name = dist.HashStore(), job_name()
    lds = [make(store, name, r, 2) for r in range(2)]

    def head(ld: fl.DataLoader) -> Any:
        it = iter(ld)
        seen = [next(it) for _ in range(20)]
        return items(seen), ld.state_dict()

    heads = side_by_side([lambda ld=ld: head(ld) for ld in lds])
    states = [h[1] for h in heads]
    for st_ in states:
        # (each rank's state holds the whole job's accounts)
        accounts = job_accounts(st_["epoch"]["shards"])
        assert len(accounts) == 2 and {a["block"] for a in accounts} == {38}
        assert {min(w[2], lens[w[0]]) - w[1] for w in accounts[0]["list"]} <= set(range(1, 39))
    store2, name2 = dist.HashStore(), job_name()
    again = [make(store2, name2, r, 3) for r in range(3)]
    for ld in again:
        ld.load_state_dict(states)

    def rest(ld: fl.DataLoader) -> Any:
        this = items(list(ld))
        between = ld.state_dict()
        nxt = items(list(ld))
        return this, nxt, ld.state_dict(), between

    tails = side_by_side([lambda ld=ld: rest(ld) for ld in again])
    assert {a["block"] for a in job_accounts(tails[0][2]["world_carry"])} == {25}
    before = [v for h in heads for v in h[0]]
    held_this = held_back([t[3] for t in tails], lens)
    held_next = held_back([t[2] for t in tails], lens)
    this_epoch = [v for t in tails for v in t[0]]
    next_epoch = [v for t in tails for v in t[1]]
    assert Counter(before + this_epoch + held_this) == Counter(all_items(lens))
    assert Counter(next_epoch + held_next) == Counter(all_items(lens) + held_this)


def test_map_style_data_through_the_queue():
    """DynamicDistributedSampler: blocks of indices claimed by the ranks,
    every index once per epoch (even=False), equal counts with even=True."""
    n = 103
    for even in (False, True):
        store, name = dist.HashStore(), job_name()
        ds = torch.arange(n)
        loaders = [fl.DataLoader(ds, batch_size=4, sampler=fl.DynamicDistributedSampler(
            ds, block=8, store=store, name=name, rank=r, num_replicas=3, even=even))
            for r in range(3)]
        got = side_by_side([lambda ld=ld: [items(list(ld)) for _ in range(2)] for ld in loaders])
        if not even:
            for e in range(2):
                assert sorted(v for g in got for v in g[e]) == list(range(n))
        else:
            assert len({len(g[0]) for g in got}) == 1
            assert len(set(got[0][0])) == len(got[0][0])
    with pytest.raises(fl.ConfigError, match="leave batch_sampler, sharding and shuffle"):
        fl.DataLoader(ds, sampler=fl.DynamicDistributedSampler(ds, store=store), shuffle=True)


def test_len_before_the_first_epoch_is_the_count_the_epoch_yields():
    """With even=True len() is known before iter(): the batches even counts
    guarantee, from the lengths alone (Lightning and schedulers read it
    then); with even=False, or one rank, it stays a TypeError."""
    store, name = dist.HashStore(), job_name()
    lens = [9, 4, 7]
    lds = [loader(Counted(lens), store, name, r, 2, even=True) for r in range(2)]
    # 20 items in ranges of 8 (9 -> 8 + 1): (20 - (2 - 1) * (8 - 1)) // (2 * 3)
    assert len(lds[0]) == len(lds[1]) == (20 - 7) // 6
    got = side_by_side([lambda ld=ld: len(list(ld)) for ld in lds])
    assert got == [2, 2]
    uneven = loader(Counted(lens), dist.HashStore(), job_name(), 0, 2, even=False)
    with pytest.raises(TypeError, match="even=False the ranks' batch counts are not fixed"):
        len(uneven)


@given(lens=lens_st, world=st.integers(2, 3), batch=st.integers(1, 3),
       dropped=st.lists(st.booleans(), min_size=3, max_size=3))
@settings(max_examples=max(8, settings.default.max_examples // 5))
def test_a_trainer_that_reads_len_batches_and_drops_iterators_loses_nothing(
        lens, world, batch, dropped):
    """As Lightning runs an epoch: len() first, sometimes an iterator made
    and dropped before its first batch, then exactly len() batches, never
    asking for the end. Each epoch still yields len() batches on every
    rank, and what was read plus what the last epoch holds back is every
    item once per epoch."""
    store, name = dist.HashStore(), job_name()
    loaders = [loader(Counted(lens), store, name, r, world, even=True, batch=batch)
               for r in range(world)]

    def run(ld: fl.DataLoader) -> Any:
        read = []
        for drop in dropped:
            n = len(ld)
            if drop:
                iter(ld)
            it = iter(ld)
            # (a loop over an epoch of no batches asks for one, and ends)
            got = list(itertools.islice(it, n)) if n else list(it)
            assert len(got) == n
            read.append(items(got))
        assert list(it) == []  # (the last epoch ended: its state holds what it held back)
        return read, ld.state_dict()

    got = side_by_side([lambda ld=ld: run(ld) for ld in loaders])
    read = Counter(v for g in got for epoch in g[0] for v in epoch)
    # (the state after the last epoch's len() batches: it holds what that
    # epoch held back)
    held = Counter(held_back([g[1] for g in got], lens))
    assert read + held == Counter(all_items(lens) * len(dropped))


def test_a_trainer_that_counts_every_epoch_as_the_first_is_told_what_it_skips(caplog):
    """transformers' Trainer reads len() once and takes that many batches
    from every epoch. The second epoch is longer by what the first held
    back; what the Trainer leaves of it is not carried (a new iter() begins
    a fresh epoch), and rank 0 logs a warning that counts it when the third
    begins: what was read, what the warning counts and what the last epoch
    has left are every item three times."""
    import logging

    lens = [7, 13, 5, 11, 9, 6, 12, 8] * 2
    store, name = dist.HashStore(), job_name()
    loaders = [loader(Counted(lens), store, name, r, 2, even=True, batch=4) for r in range(2)]
    first = len(loaders[0])

    def run(ld: fl.DataLoader) -> Any:
        read = []
        for _ in range(3):
            read += items(list(itertools.islice(iter(ld), first)))
        return read, len(ld), ld.state_dict()

    with caplog.at_level(logging.WARNING, logger="ferroloader.worldqueue"):
        got = side_by_side([lambda ld=ld: run(ld) for ld in loaders])
    said = [r.getMessage() for r in caplog.records if "was left after" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("ferroloader: epoch 1 of the shared queue was "
                                                 f"left after {first} of its "), said
    skipped = int(said[0].split("; the ")[1].split(" items")[0])
    assert skipped > 0
    read = Counter(v for g in got for v in g[0])
    assert max(read.values()) <= 3
    # (the third epoch, left as the Trainer leaves it: its state holds the rest)
    rest = remaining(job_accounts(got[0][2]["epoch"]["shards"]))
    assert sum(read.values()) + skipped + sum(min(end, lens[s]) - e for s, e, end in rest) == (
        3 * sum(lens))


def test_the_queue_needs_a_store_or_a_process_group():
    assert not dist.is_initialized()
    ld = fl.DataLoader(Counted([3, 4]), sharding=fl.Sharding(mode="dynamic", across="world"))
    with pytest.raises(fl.ConfigError, match="init_process_group"):
        iter(ld)
    with pytest.raises(fl.ConfigError, match="mode='dynamic'"):
        fl.Sharding(across="world")
    with pytest.raises(fl.ConfigError, match="across"):
        fl.Sharding(mode="dynamic", across="everywhere")


@given(lens=st.lists(st.integers(0, 14), min_size=4, max_size=12),
       before=st.integers(2, 4), after=st.integers(1, 4), even=st.booleans(),
       steps=st.integers(1, 3), rank0s=st.booleans())
@settings(max_examples=max(6, settings.default.max_examples // 8), deadline=None)
def test_each_rank_resumes_from_one_state_of_its_own_on_any_number_of_ranks(
        lens, before, after, even, steps, rank0s):
    """A relaunch on another number of ranks where each rank loads only one
    state: its own, or (a rank that had none) rank 0's; or every rank rank
    0's (``rank0s``: Lightning writes rank 0's checkpoint only). Every
    rank's state holds the whole job's accounts (state_dict() meets the
    others), so the ranks read exactly the rest of the epoch, and, with
    even counts, what it holds back is read in the next."""
    store, name = dist.HashStore(), job_name()
    lds = [loader(Counted(lens), store, name, r, before, even=even) for r in range(before)]

    def head(ld: fl.DataLoader) -> Any:
        it = iter(ld)
        seen = list(itertools.islice(it, steps))
        return items(seen), ld.state_dict()

    heads = side_by_side([lambda ld=ld: head(ld) for ld in lds])
    # (every rank's state is the same job's position)
    assert len({json.dumps(h[1]["epoch"]["shards"], sort_keys=True) for h in heads if h[1]["epoch"]
                is not None}) <= 1
    store2, name2 = dist.HashStore(), job_name()
    again = [loader(Counted(lens), store2, name2, r, after, even=even) for r in range(after)]
    for r, ld in enumerate(again):
        ld.load_state_dict(json.loads(json.dumps(heads[r if r < before and not rank0s else 0][1])))
    tails = side_by_side([lambda ld=ld: (items(list(ld)), ld.state_dict()) for ld in again])
    got = [v for t in tails for v in t[0]]
    want = all_items(lens)
    if heads[0][1]["epoch"] is None:
        # (the saved epoch had ended: the relaunch reads the next, what the
        # saved one held back first)
        want += held_back([heads[0][1]], lens)
    else:
        got += [v for h in heads for v in h[0]]
    if even and after > 1:
        assert len({len(t[0]) for t in tails}) == 1
        got += held_back([t[1] for t in tails], lens)
    assert Counter(got) == Counter(want)


def test_ranks_that_begin_an_epoch_from_different_states_are_refused():
    """A rank that did not load a state beside ranks that did would claim
    positions of another list (items read twice): its first claim names
    the mismatch instead."""
    lens = [5, 6] * 4
    store, name = dist.HashStore(), job_name()
    lds = [loader(Counted(lens), store, name, r, 2, even=False) for r in range(2)]
    states = side_by_side([lambda ld=ld: (next(iter(ld)), ld.state_dict())[1] for ld in lds])
    store2, name2 = dist.HashStore(), job_name()
    again = [loader(Counted(lens), store2, name2, r, 2, even=False) for r in range(2)]
    again[0].load_state_dict(states[0])  # rank 1 loads nothing
    first = items(list(again[0]))
    with pytest.raises(fl.ShardQueueError, match="different states"):
        list(again[1])
    assert len(first) < sum(lens)


class _Dead:
    """A store whose server went away: every call fails as a TCPStore's
    does when its connection is gone."""

    def add(self, key: str, n: int) -> int:
        raise RuntimeError("Connection reset by peer")

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("Connection reset by peer")

        return fail


@pytest.mark.parametrize("nw", [0, 2])
def test_a_store_that_goes_away_is_a_clear_error_not_a_hang(nw):
    store = dist.HashStore()
    ld = loader(Counted([6] * 8), store, job_name(), 0, 1, even=False, nw=nw)
    it = iter(ld)
    next(it)
    ld.sharding.__dict__["store"] = _Dead()  # (frozen: its next epoch's store)
    it._epoch_record.shards.world_epoch.queue.store = _Dead()
    with pytest.raises(fl.ShardQueueError, match="lost its store"):
        for _ in it:
            pass
    with pytest.raises(fl.ShardQueueError, match=r"cannot reach its store|lost its store"):
        ld2 = loader(Counted([6]), _Dead(), job_name(), 0, 1, even=False)
        list(ld2)


def test_stats_and_namespaces():
    """Two loaders of a job over the same shards keep apart by name; the
    stats count the claims, their items and the seconds on the store."""
    store = dist.HashStore()
    a = loader(Counted([4, 4]), store, "a", 0, 1, even=False)
    b = loader(Counted([4, 4]), store, "b", 0, 1, even=False)
    assert sorted(items(list(a))) == sorted(items(list(b))) == all_items([4, 4])
    q = a.stats().queue
    assert (q.shards, q.items) == (2, 8) and q.waited >= 0  # (shards under 8 items: whole)
    assert "works claimed" in str(a.stats())



@pytest.mark.parametrize("even", [False, True])
def test_each_rank_resuming_its_own_state_on_the_same_ranks(even):
    """torchrun's restart: each rank loads the state it saved; the ranks
    exchange their accounts through the store and read exactly the rest."""
    lens = [7, 1, 13, 3, 0, 5, 9, 2] * 3
    store, name = dist.HashStore(), job_name()
    lds = [loader(Counted(lens), store, name, r, 3, even=even) for r in range(3)]

    def head(ld: fl.DataLoader) -> Any:
        it = iter(ld)
        seen = [next(it) for _ in range(2)]
        return items(seen), ld.state_dict()

    heads = side_by_side([lambda ld=ld: head(ld) for ld in lds])
    store2, name2 = dist.HashStore(), job_name()
    again = [loader(Counted(lens), store2, name2, r, 3, even=even) for r in range(3)]
    for ld, (_, state) in zip(again, heads):
        ld.load_state_dict(state)
    tails = side_by_side([lambda ld=ld: (items(list(ld)), ld.state_dict()) for ld in again])
    got = [v for h in heads for v in h[0]] + [v for t in tails for v in t[0]]
    if even:
        assert len({len(t[0]) for t in tails}) == 1
        got += held_back([t[1] for t in tails], lens)
    assert sorted(got) == all_items(lens)


def test_states_of_different_steps_or_missing_a_rank_are_refused_before_anything_is_read():
    """Three ranks read 3 batches of 4 each; the epoch resumes on one rank.
    Any rank's state, or a list of them, gives the 960 items of 960; states
    of two steps, or a merged state that lost a rank's account, are refused
    naming it (a rank missing gave 252 and a rank repeated 360 items of
    240: claims read twice)."""
    lens = [20] * 48
    store, name = dist.HashStore(), job_name()
    lds = [loader(Counted(lens), store, name, r, 3, even=False, batch=4) for r in range(3)]

    def head(ld: fl.DataLoader) -> Any:
        it = iter(ld)
        seen = [next(it) for _ in range(3)]
        early = json.loads(json.dumps(ld.state_dict()))
        seen.append(next(it))
        return items(seen), early, ld.state_dict()

    heads = side_by_side([lambda ld=ld: head(ld) for ld in lds])
    read = [v for h in heads for v in h[0]]
    late = [h[2] for h in heads]
    for states in ([late[1]], [late[0], late[1]], late, fl.merge_states(late)):
        one = loader(Counted(lens), dist.HashStore(), job_name(), 0, 1, even=False, batch=4)
        one.load_state_dict(states)
        assert sorted(read + items(list(one))) == all_items(lens)
    mixed = [heads[0][1], late[1], late[2]]
    one = loader(Counted(lens), dist.HashStore(), job_name(), 0, 1, even=False, batch=4)
    with pytest.raises(fl.ConfigError, match=r"two accounts of rank \d of 3: .*different steps"):
        one.load_state_dict(mixed)
    with pytest.raises(fl.ConfigError, match="different steps"):
        fl.merge_states(mixed)
    for keep, says in (([0, 1], r"rank 2 is missing"),
                       ([0, 0, 2], r"rank 1 is missing.*rank 0's state is given 2 times")):
        bad = fl.merge_states(late)
        accounts = bad["epoch"]["shards"]["accounts"]
        bad["epoch"]["shards"]["accounts"] = [accounts[i] for i in keep]
        one = loader(Counted(lens), dist.HashStore(), job_name(), 0, 1, even=False, batch=4)
        one.load_state_dict(bad)  # (the format holds: the ranks are checked before a read)
        with pytest.raises(fl.ConfigError, match=says):
            iter(one)


def test_states_of_two_jobs_are_refused():
    lens = [5] * 6
    states = []
    for world in (2, 3):
        store, name = dist.HashStore(), job_name()
        lds = [loader(Counted(lens), store, name, r, world, even=False) for r in range(world)]
        states.append(side_by_side([lambda ld=ld: (next(iter(ld)), ld.state_dict())[1]
                                    for ld in lds]))
    with pytest.raises(fl.ConfigError, match=r"different epochs|different sizes"):
        fl.merge_states(states[0] + states[1][:1])


def test_a_rank_that_does_not_start_the_next_epoch_is_named_after_a_bounded_logged_wait(
        monkeypatch, caplog):
    """Ranks given different epoch counts: rank 1 reads one epoch, rank 0
    two. Rank 0 waits for rank 1's account of the first epoch, says so once
    in the log, and past Sharding(wait_for_ranks=) raises naming rank 1."""
    import logging

    import ferroloader.epoch.store as wq

    monkeypatch.setattr(wq, "LOG_AFTER", 0.3)
    store, name = dist.HashStore(), job_name()
    lds = [fl.DataLoader(Counted([6, 5, 4]), batch_size=2, seed=SEED, sharding=fl.Sharding(
        mode="dynamic", across="world", store=store, name=name, rank=r, world_size=2,
        wait_for_ranks=1.5)) for r in range(2)]
    side_by_side([lambda ld=ld: list(ld) for ld in lds])
    with caplog.at_level(logging.WARNING, logger="ferroloader.worldqueue"):
        t0 = time.monotonic()
        with pytest.raises(fl.ShardQueueError, match=r"from rank 1 \(of 2\).*wait_for_ranks"):
            list(lds[0])
        assert 1.5 <= time.monotonic() - t0 < STUCK_AFTER
    said = [r.getMessage() for r in caplog.records if r.name == "ferroloader.worldqueue"]
    assert len(said) == 1 and "rank 1 of 2" in said[0], said
