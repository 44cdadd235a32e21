"""Sharding done by the loader: static, dynamic and elastic, across workers
and ranks (ranks from torch.distributed over gloo, or given explicitly)."""

from __future__ import annotations

import itertools
import json
import pickle
import socket
from collections import Counter
from typing import Any

import ferroloader as fl
import pytest
import torch
import torch.multiprocessing as tmp
from helpers import time_limit
from hypothesis import given, settings
from hypothesis import strategies as st
from shard_cases import (
    LENS,
    Counted,
    Draws,
    all_items,
    decode_samples,
    flat,
    read_tar,
    write_tar_shards,
)


def _loader(mode: str = "static", nw: int = 0, rank: int = 0, world: int = 1, **kw: Any):
    even = kw.pop("even", False)
    ds = kw.pop("dataset", None) or Counted(known=kw.pop("known", True))
    sharding = fl.Sharding(mode=mode, even=even, rank=rank, world_size=world, **kw.pop("sh", {}))
    kw.setdefault("batch_size", 3)
    kw.setdefault("shuffle", True)
    kw.setdefault("seed", 7)
    return fl.DataLoader(ds, num_workers=nw, sharding=sharding, **kw)


def _epoch(loader) -> list[list[int]]:
    return [[int(x) for x in b] for b in loader]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ranks started with spawn make spawn the default start method for their
# workers too (each a fresh interpreter importing torch, seconds apiece):
# the workers fork, except in one configuration that keeps that default.
CONFIGS = [
    {"mode": m, "even": e, "num_workers": nw, **({"multiprocessing_context": "fork"} if nw else {})}
    for m in ("static", "dynamic")
    for e in (False, True)
    for nw in (0, 3)
] + [{"mode": "dynamic", "even": False, "num_workers": 1}]


@time_limit(300)
def test_two_gloo_ranks_shard_with_ranks_from_torch_distributed(tmp_path):
    """Two ranks (gloo over loopback) x 0/3 workers (and 1 spawned), static and dynamic,
    uneven shards: exactly-once mode reads every item once across ranks,
    even mode gives every rank the same batch count, and a static rank's
    batches are the same for any num_workers."""
    port = _free_port()
    tmp.start_processes(
        __import__("shard_cases").gloo_rank,
        args=(2, port, str(tmp_path), CONFIGS),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for i, c in enumerate(CONFIGS):
        for epoch in range(2):
            per_rank = [ranks[r][i][epoch] for r in range(2)]
            if c["even"]:
                assert len(per_rank[0]) == len(per_rank[1]), (c, epoch)
                items = flat(per_rank[0] + per_rank[1])
                assert len(items) == len(set(items)), "even mode truncates, never repeats"
            else:
                assert sorted(flat(per_rank[0] + per_rank[1])) == all_items(), (c, epoch)
    for mode in ("static",):
        for even in (False, True):
            same = [i for i, c in enumerate(CONFIGS) if c["mode"] == mode and c["even"] == even]
            for r in range(2):
                first = ranks[r][same[0]]
                for i in same[1:]:
                    assert ranks[r][i] == first, f"rank {r}, {CONFIGS[i]}"


@pytest.mark.parametrize("world", [1, 2])
def test_static_batches_do_not_depend_on_num_workers(world):
    """A static rank's batch sequence (order and batch boundaries) is the
    same for 0, 1, 2 and 3 workers, in order or not, persistent or not."""
    for rank in range(world):
        want = _epoch(_loader(rank=rank, world=world))
        for nw, extra in [(1, {}), (2, {"persistent_workers": True}), (3, {})]:
            assert _epoch(_loader(nw=nw, rank=rank, world=world, **extra)) == want, (rank, nw)


def test_shuffled_order_changes_per_epoch_and_repeats_for_the_seed():
    """With shuffle=True the order differs between epochs, is the same for
    the same seed, and differs for another seed; without, it is the
    shards' own order (still in lanes)."""
    a = _loader(nw=2, persistent_workers=True)
    b = _loader(nw=0)
    ea, eb = [_epoch(a) for _ in range(2)], [_epoch(b) for _ in range(2)]
    assert ea == eb
    assert ea[0] != ea[1]
    assert sorted(flat(ea[0])) == sorted(flat(ea[1])) == all_items()
    assert _epoch(_loader(seed=8)) != ea[0]
    plain = _epoch(_loader(shuffle=False, sh={"lanes": 1}))
    assert flat(plain) == all_items()


@pytest.mark.parametrize("nw,in_order", [(0, True), (1, True), (3, True), (3, False)])
def test_dynamic_reads_every_item_once(nw, in_order):
    """Dynamic assignment, uneven shards, unknown lengths: every item of the
    rank exactly once per epoch, for two epochs on persistent workers."""
    extra = {"persistent_workers": True} if nw else {}
    loader = _loader("dynamic", nw=nw, known=False, in_order=in_order, **extra)
    for _ in range(2):
        assert sorted(flat(_epoch(loader))) == all_items()


def test_two_ranks_explicit_split_the_shards():
    """Explicit rank/world_size: the ranks' items are disjoint and cover the
    dataset (exactly-once mode), each rank reading whole shards."""
    parts = [flat(_epoch(_loader(rank=r, world=2, nw=1))) for r in range(2)]
    assert sorted(parts[0] + parts[1]) == all_items()
    shards = [{x // 1000 for x in p} for p in parts]
    assert not shards[0] & shards[1]


def test_even_counts_are_equal_and_need_shard_len():
    """even=True: both ranks yield the same number of batches; without
    shard_len a ConfigError says what to provide."""
    counts = [len(_epoch(_loader(rank=r, world=2, even=True))) for r in range(2)]
    assert counts[0] == counts[1] > 0
    assert len(_loader(rank=0, world=2, even=True)) == counts[0]
    with pytest.raises(fl.ConfigError, match="shard_len"):
        list(_loader(rank=0, world=2, even=True, known=False))


def test_file_shards_without_lengths_are_told_to_pass_lengths(tmp_path):
    """A FileShards user gives lengths with lengths=, not shard_len(): every
    error that needs them says so."""
    paths = []
    for s in range(3):
        p = tmp_path / f"part-{s}.txt"
        p.write_text("a\nb\n")
        paths.append(str(p))
    ds = fl.FileShards(paths, lambda path: open(path).read().split())
    for mode, world in (("static", 2), ("dynamic", 2), ("elastic", 1)):
        loader = fl.DataLoader(ds, sharding=fl.Sharding(mode=mode, rank=0, world_size=world))
        with pytest.raises(fl.ConfigError, match=r"FileShards\(\.\.\., lengths=\.\.\.\)") as e:
            iter(loader)
        assert "shard_len" not in str(e.value)
    with pytest.raises(TypeError, match=r"lengths=") as e:
        len(fl.DataLoader(ds))
    assert "shard_len" not in str(e.value)
    with pytest.raises(TypeError, match=r"lengths="):
        len(ds)


def test_len_is_the_batches_this_rank_yields():
    """len(loader) is the number of batches the rank yields (static, exact)."""
    for rank in range(2):
        loader = _loader(rank=rank, world=2, nw=2)
        assert len(loader) == len(_epoch(loader))
    with pytest.raises(TypeError):
        len(_loader(known=False))


_LEN_WORKERS = [(0, "multiprocessing")] + [
    (nw, method) for nw in (1, 2, 3) for method in ("multiprocessing", "thread")
]


@time_limit(120)
@pytest.mark.parametrize("mode", ["static", "dynamic", "elastic"])
@pytest.mark.parametrize("nw,method", _LEN_WORKERS)
def test_len_is_the_number_of_batches_in_every_mode(mode, nw, method):
    """len(loader) is the number of batches a loop gets, in every sharding
    mode, for 0 to 3 workers (processes or threads), drop_last, even and
    shuffle either way, on either of two ranks. Dynamic mode's count does
    not depend on which worker read which shard: the lanes' last items are
    read by the last lane, so only the rank's last batch is short, as with
    one lane."""
    combos = list(itertools.product([False, True], repeat=3))
    for i, (drop_last, even, shuffle) in enumerate(combos):
        rank = i % 2
        loader = _loader(
            mode,
            nw=nw,
            rank=rank,
            world=2,
            even=even,
            batch_size=4,
            drop_last=drop_last,
            shuffle=shuffle,
            worker_method=method,
        )
        what = (mode, nw, method, drop_last, even, shuffle, rank)
        want = len(loader)
        batches = _epoch(loader)
        assert len(batches) == want, what
        if mode == "dynamic":
            items = sum(LENS[s] for s in _rank_shards(loader, rank))
            assert want == (items // 4 if drop_last else -(-items // 4)) or even, what
            assert all(len(b) == 4 for b in batches[:-1]), what
        if drop_last and (mode != "elastic" or even):
            # (elastic with even=False reads every item once: it splits the
            # last global batch as it falls, drop_last or not)
            assert all(len(b) == 4 for b in batches), what


def _rank_shards(loader, rank: int) -> list[int]:
    """The shards rank ``rank`` of 2 reads in the loader's next epoch."""
    from ferroloader.seeds import epoch_seed, shard_order_seed

    n = len(LENS)
    if not loader._shard_shuffle:
        return list(range(n))[rank::2]
    root = epoch_seed(loader.seed, loader._epochs_started - 1)
    g = torch.Generator().manual_seed(shard_order_seed(root))
    return torch.randperm(n, generator=g).tolist()[rank::2]


@time_limit(120)
@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_len_of_the_readmes_dynamic_tar_example(tmp_path, method):
    """The README's tar example (4 shards of 40 samples, batch_size=32, 2
    workers, dynamic sharding, lengths given): 5 batches of 32, and len()
    says 5 (each worker's short last batch made 6)."""
    paths = write_tar_shards(str(tmp_path), [40] * 4)
    ds = fl.FileShards(paths, read_tar, lengths=[40] * 4)
    loader = fl.DataLoader(
        ds,
        batch_size=32,
        num_workers=2,
        worker_method=method,
        collate_fn=decode_samples,
        sharding=fl.Sharding(mode="dynamic"),
    )
    for _ in range(2):
        assert len(loader) == 5
        sizes = [len(b["id"]) for b in loader]
        assert sizes == [32] * 5


@pytest.mark.parametrize("mode", ["static", "dynamic"])
@pytest.mark.parametrize("nw_before,nw_after", [(3, 1), (0, 2), (2, 0)])
def test_resume_mid_epoch_with_another_num_workers(mode, nw_before, nw_after):
    """A sharded epoch saved mid-way resumes with another num_workers:
    static gives exactly the batches that came next (and the next epoch's),
    dynamic exactly the items that were left."""
    for stop in (0, 3, 9):
        whole = _loader(mode, nw=nw_before, known=mode == "static")
        ref = [_epoch(whole) for _ in range(2)]
        first = _loader(mode, nw=nw_before, known=mode == "static")
        it = iter(first)
        head = [[int(x) for x in next(it)] for _ in range(stop)]
        sd = pickle.loads(pickle.dumps(first.state_dict()))
        del it
        resumed = _loader(mode, nw=nw_after, known=mode == "static")
        resumed.load_state_dict(sd)
        tail = _epoch(resumed)
        nxt = _epoch(resumed)
        if mode == "static":
            assert head + tail == ref[0], stop
            assert nxt == ref[1]
        else:
            assert sorted(flat(head + tail)) == all_items(), stop
            assert sorted(flat(nxt)) == all_items()


def test_resume_refuses_another_rank_or_world_size():
    """A static or dynamic state is per rank: another rank or world size is
    refused with a ValueError that says so."""
    a = _loader(rank=0, world=2)
    it = iter(a)
    next(it)
    sd = a.state_dict()
    with pytest.raises(ValueError, match="rank 0"):
        b = _loader(rank=1, world=2)
        b.load_state_dict(sd)
        next(iter(b))
    with pytest.raises(ValueError, match="world_size 2"):
        c = _loader(rank=0, world=1)
        c.load_state_dict(sd)
        next(iter(c))


def test_a_loaded_position_names_what_differs_from_the_loader():
    """The engine's check of a sharded position against the loader that
    resumes it names the sharding, mode, world size or rank that differs;
    every rank's merged state of the job's queue resumes anywhere."""
    from ferroloader._core import check_shard_resume as check

    saved = {"across": "rank", "mode": "dynamic", "world": 2, "rank": 1}
    check(saved, "rank", "dynamic", 2, 1)
    with pytest.raises(fl.ConfigError, match=r"across='rank'\), this loader shards across='world'"):
        check(saved, "world", "dynamic", 2, 1)
    with pytest.raises(fl.ConfigError, match="'dynamic' sharding, this loader shards 'static'"):
        check(saved, "rank", "static", 2, 1)
    with pytest.raises(fl.ConfigError, match="world_size 2, this process has 3"):
        check(saved, "rank", "dynamic", 3, 1)
    with pytest.raises(fl.ConfigError, match="saved by rank 1, this process is rank 0"):
        check(saved, "rank", "dynamic", 2, 0)
    check({"mode": "elastic", "world": 4, "rank": 3}, "rank", "elastic", 1, 0)
    check({"across": "world", "merged": True}, "world", "dynamic", 5, 4)


def _global_sequence(make, world: int, steps: int) -> tuple[list[int], dict]:
    """``steps`` global batches on ``world`` simulated ranks, rank by rank
    within each step, and rank 0's state after them."""
    loaders = [make(r, world) for r in range(world)]
    its = [iter(ld) for ld in loaders]
    seen: list[int] = []
    for _ in range(steps):
        for it in its:
            seen.extend(int(x) for x in next(it))
    return seen, loaders[0].state_dict()


def _rest(make, world: int, sd: dict) -> list[int]:
    out: list[int] = []
    for r in range(world):
        ld = make(r, world)
        ld.load_state_dict(sd)
        out.extend(flat(list(ld)))
    return out


@pytest.mark.parametrize("after", [1, 4])
def test_elastic_sharding_resumes_on_another_number_of_ranks(after):
    """Elastic sharding: 2 ranks consume some global batches and save; 1 or
    4 ranks resume and read exactly the rest of the global sequence, none
    twice, none skipped; the sequence itself does not depend on the world
    size."""

    def make(r: int, w: int, nw: int = 1):
        return _loader("elastic", nw=nw, rank=r, world=w, even=False, sh={"shuffle_block": 4})

    one = flat(list(make(0, 1, 0)))
    assert sorted(one) == all_items()
    seen, sd = _global_sequence(make, 2, 3)
    assert seen == one[: len(seen)], "the global sequence is the one-rank order"
    rest = _rest(make, after, sd)
    assert sorted(seen + rest) == all_items()
    assert sorted(rest) == sorted(one[len(seen) :])


@pytest.mark.parametrize("after", [1, 4])
def test_elastic_batch_sampler_resumes_on_another_number_of_ranks(after):
    """ElasticBatchSampler (map-style): the global sequence is
    torch.randperm under epoch_seed(seed, epoch) for any world size, and a
    job saved on 2 ranks resumes on 1 or 4 with exactly the rest."""
    n = 53
    data = list(range(n))

    def make(r: int, w: int):
        s = fl.ElasticBatchSampler(n, 4, seed=5, even=False, rank=r, world_size=w)
        return fl.DataLoader(data, batch_sampler=s, num_workers=1)

    one = flat(list(make(0, 1)))
    g = torch.Generator().manual_seed(fl.seeds.epoch_seed(5, 0))
    assert one == torch.randperm(n, generator=g).tolist()
    seen, sd = _global_sequence(make, 2, 3)
    assert seen == one[: len(seen)]
    rest = _rest(make, after, sd)
    assert sorted(seen + rest) == data


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_elastic_even_modes_give_every_rank_the_same_batches(world):
    """Elastic even mode splits the last global batch evenly, padded to a
    multiple of the ranks as DistributedSampler pads (or drops it with
    drop_last=True): every rank yields the same number of batches and
    items, all full but the last; the items are DistributedSampler's count."""
    total = len(all_items())
    for drop_last in (False, True):
        sizes = []
        seen: list[int] = []
        for r in range(world):
            ld = _loader("elastic", rank=r, world=world, even=True, drop_last=drop_last)
            batches = list(ld)
            assert all(len(b) == 3 for b in batches[:-1])
            assert len(ld) == len(batches)
            sizes.append([len(b) for b in batches])
            seen += [int(x) for b in batches for x in b]
        assert all(s == sizes[0] for s in sizes)
        if not drop_last:
            padded = len(torch.utils.data.DistributedSampler(range(total), num_replicas=world,
                                                             rank=0, shuffle=False))
            assert sum(sizes[0]) == padded
            assert sorted(set(seen)) == all_items()
        else:
            assert all(n == 3 for n in sizes[0])


def test_one_rank_reads_every_item_once_as_distributed_sampler_does():
    """One rank pads nothing: ElasticBatchSampler(100, 8) yields the 100
    indices DistributedSampler(num_replicas=1) yields, elastic sharding each
    item once."""
    s = fl.ElasticBatchSampler(100, 8, rank=0, world_size=1)
    got = [i for b in s for i in b]
    assert sorted(got) == list(range(100)) and len(s) == 13
    ld = _loader("elastic", rank=0, world=1, even=True)
    assert sorted(int(x) for b in ld for x in b) == all_items()


@pytest.mark.parametrize("mode", ["static", "dynamic", "elastic"])
def test_unbatched_sharded_items_are_converted_as_torch_converts_them(mode):
    """batch_size=None: items come one by one through default_convert, as
    torch's loader gives an IterableDataset's items (ints stay ints)."""
    want = sorted(torch.utils.data.DataLoader(Counted(), batch_size=None, num_workers=2))
    assert type(want[0]) is int
    for nw in (0, 2):
        ld = _loader(mode, nw=nw, batch_size=None)
        got = list(ld)
        assert sorted(got) == want and all(type(x) is int for x in got), (mode, nw)


def test_torch_dataloader_reads_a_sharded_dataset_once():
    """torch's own DataLoader accepts a ShardedDataset: with 2 workers each
    item comes once (the dataset splits its shards by worker itself)."""
    loader = torch.utils.data.DataLoader(Counted(), batch_size=None, num_workers=2)
    assert sorted(int(x) for x in loader) == all_items()
    assert len(Counted()) == len(all_items())


@pytest.mark.parametrize("mode", ["static", "dynamic", "elastic"])
def test_per_item_seeds_do_not_depend_on_workers(mode):
    """per_sample_seed=True with a sharded dataset: each item's draws from
    torch, random and numpy are the same for 0, 2 and 3 workers."""
    draws: list[dict] = []
    for nw in (0, 2, 3):
        ld = _loader(mode, nw=nw, dataset=Draws(), per_sample_seed=True, collate_fn=list)
        draws.append({x[0]: x[1:] for b in ld for x in b})
    assert draws[0] == draws[1] == draws[2]
    assert len(set(draws[0].values())) == len(draws[0]), "items get different draws"


def test_file_shards_read_files_with_or_without_start(tmp_path):
    """FileShards: one shard per file; a reader taking ``start`` is given
    it, any other is skipped into with islice; lengths enable even mode."""
    paths = []
    for i, n in enumerate([3, 5, 2]):
        p = tmp_path / f"part-{i}.txt"
        p.write_text("".join(f"{i}:{k}\n" for k in range(n)))
        paths.append(p)

    def read(path):
        with open(path) as f:
            yield from (line.strip() for line in f)

    starts: list[int] = []

    def read_from(path, start=0):
        starts.append(start)
        with open(path) as f:
            yield from (line.strip() for line in list(f)[start:])

    want = sorted(f"{i}:{k}" for i, n in enumerate([3, 5, 2]) for k in range(n))
    for reader in (read, read_from):
        ds = fl.FileShards(paths, reader, lengths=[3, 5, 2])
        got = [x for b in fl.DataLoader(ds, batch_size=2, shuffle=True, seed=1) for x in b]
        assert sorted(got) == want
    assert starts and all(s % 256 == 0 for s in starts)
    ds = fl.FileShards(paths, read)
    # (a local reader reaches workers only by fork)
    loader = fl.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    assert sorted(x for b in loader for x in b) == want


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_webdataset_tar_shards(tmp_path, mode):
    """Webdataset-layout tar shards read by FileShards with the README's
    reader: every sample once per epoch with 2 workers, a resume with
    another num_workers reads exactly the rest, and torch's DataLoader over
    the same dataset reads the same samples."""
    sizes = [5, 12, 3, 7]
    paths = write_tar_shards(str(tmp_path), sizes)
    want = sorted(f"{s}-{i}" for s, n in enumerate(sizes) for i in range(n))
    ds = fl.FileShards(paths, read_tar, lengths=sizes)

    def make(nw: int):
        return fl.DataLoader(
            ds,
            batch_size=4,
            shuffle=True,
            seed=3,
            num_workers=nw,
            collate_fn=decode_samples,
            sharding=fl.Sharding(mode=mode, shuffle_block=4),
        )

    ids = [i for b in make(2) for i in b["id"]]
    assert sorted(ids) == want
    first = make(2)
    it = iter(first)
    head = [i for _ in range(3) for i in next(it)["id"]]
    sd = first.state_dict()
    del it
    resumed = make(0)
    resumed.load_state_dict(sd)
    rest = [i for b in resumed for i in b["id"]]
    assert sorted(head + rest) == want
    torch_ids = [
        i
        for b in torch.utils.data.DataLoader(
            ds, batch_size=4, num_workers=2, collate_fn=decode_samples
        )
        for i in b["id"]
    ]
    assert sorted(torch_ids) == want


def _splitmix_reference(x):
    """SplitMix64 as published (golden-ratio increment, then the finaliser)."""
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def test_seeds_are_the_engines():
    """ferroloader.seeds (the engine's one definition) gives the documented
    functions of SplitMix64, and the shard order is torch.randperm under
    shard_order_seed."""
    from ferroloader import seeds

    mix = _splitmix_reference
    for seed, epoch, root, shard, block in [(0, 0, 1, 2, 3), (2**62, 7, 99, 12, 0)]:
        want_root = mix(mix(seed) ^ epoch) >> 1
        assert seeds.epoch_seed(seed, epoch) == want_root
        assert seeds.shard_order_seed(root) == mix(root ^ mix(1)) >> 1
        h = root
        for part in (2, shard, block):
            h = mix(h ^ mix(part))
        assert seeds.block_seed(root, shard, block) == h >> 1
        assert seeds.sample_seed(seed, epoch, 5) == mix(want_root ^ mix(5)) >> 1
    ld = _loader(shuffle=True, sh={"lanes": 1, "shuffle_block": 10**6})
    order = [b // 1000 for b in flat(_epoch(ld))]
    shards = [s for i, s in enumerate(order) if i == 0 or order[i - 1] != s]
    root = seeds.epoch_seed(7, 0)
    perm = torch.randperm(
        len(LENS), generator=torch.Generator().manual_seed(seeds.shard_order_seed(root))
    ).tolist()
    assert shards == [s for s in perm if LENS[s]]


def test_sharding_arguments_are_checked():
    """Bad sharding arguments raise ConfigError (a ValueError) naming them."""
    with pytest.raises(ValueError, match="mode"):
        fl.Sharding(mode="round")
    with pytest.raises(ValueError, match="lanes"):
        fl.Sharding(lanes=0)
    with pytest.raises(ValueError, match="rank"):
        fl.Sharding(rank=2, world_size=2)
    with pytest.raises(ValueError, match="ShardedDataset"):
        fl.DataLoader(list(range(4)), sharding=fl.Sharding())
    with pytest.raises(ValueError, match="in_order"):
        list(_loader("elastic", nw=2, in_order=False))
    with pytest.raises(ValueError, match="shard_len"):
        list(_loader("elastic", known=False))


@given(
    mode=st.sampled_from(["static", "dynamic"]),
    stop=st.integers(0, 20),
    nw=st.sampled_from([0, 1, 2]),
    nw_after=st.sampled_from([0, 1, 2]),
    batch=st.integers(1, 5),
)
@settings(max_examples=max(4, settings.default.max_examples // 8))
def test_hypothesis_sharded_resume(mode, stop, nw, nw_after, batch):
    """For random stop points, batch sizes and worker counts, a sharded
    resume loses and repeats no item (static: keeps the order too)."""
    whole = _epoch(_loader(mode, nw=0, batch_size=batch))
    # past the epoch's end the state is between epochs (the next iter() is
    # the next epoch)
    stop = min(stop, len(whole))
    first = _loader(mode, nw=nw, batch_size=batch)
    it = iter(first)
    head = [[int(x) for x in b] for b in itertools.islice(it, stop)]
    sd = first.state_dict()
    del it
    resumed = _loader(mode, nw=nw_after, batch_size=batch)
    resumed.load_state_dict(sd)
    got = head + _epoch(resumed)
    if mode == "static":
        assert got == whole
    assert Counter(flat(got)) == Counter(all_items())


@time_limit(120)
def test_one_dynamic_lane_keeps_the_stream_order():
    """With one worker, dynamic sharding has one lane, whose batches must
    come in its stream's order (as in one process) however shards are
    handed out; a task sent back for more work is never overtaken. (The
    soak found batches swapped, and so a resume that lost and repeated.)"""
    lens = [0, 3, 20, 7, 1, 20, 1, 0, 20, 1]
    ds = Counted(lens)
    ref = _loader("dynamic", nw=0, dataset=ds, batch_size=8, seed=1636501802)
    loader = _loader(
        "dynamic", nw=1, dataset=ds, batch_size=8, seed=1636501802, persistent_workers=True
    )
    for epoch in range(10):
        assert _epoch(loader) == _epoch(ref), f"epoch {epoch}"


class _OneShardWillNotOpen(fl.ShardedDataset):
    """Shard "bad" raises when it is opened (a missing file, as FileShards
    over a path that is gone); the others hold 5 items each."""

    def shards(self) -> list[str]:
        return ["a", "bad", "c", "d"]

    def shard_len(self, shard: str) -> int:
        return 5

    def iter_shard(self, shard: str, start: int = 0) -> Any:
        if shard == "bad":
            raise FileNotFoundError(f"no such file: {shard}")
        return iter([f"{shard}{i}" for i in range(start, 5)])


@time_limit(60)
@pytest.mark.parametrize("mode", ["static", "dynamic", "elastic"])
@pytest.mark.parametrize("nw", [0, 2])
def test_a_shard_that_fails_to_open_is_raised_once_and_the_epoch_goes_on(mode, nw):
    """torch's iterators may be resumed after an error: a loop that catches
    it gets the rest of the epoch and the epoch ends. A lane (static,
    dynamic) ends the failed shard with the batch it was filling, so the
    error comes once; elastic batches address items, so each batch holding
    one of the shard's items raises."""
    loader = fl.DataLoader(
        _OneShardWillNotOpen(),
        batch_size=2,
        num_workers=nw,
        sharding=fl.Sharding(mode=mode),
        timeout=20 if nw else 0,
    )
    it = iter(loader)
    got: list[str] = []
    errors = 0
    while True:
        try:
            got.extend(next(it))
        except StopIteration:
            break
        except FileNotFoundError:
            errors += 1
            assert errors == 1 or mode == "elastic", "raised again"
            assert errors <= 3
    assert errors >= 1
    assert not any(x.startswith("bad") for x in got)
    assert len(got) == len(set(got))
    # shards "c" and "d" are read whole whatever batch the error took
    assert {f"{s}{i}" for s in "cd" for i in range(5)} <= set(got)
