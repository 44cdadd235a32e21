"""``ferroloader.Mixture``: weighted draws from several map-style datasets.

The engine's draws are checked against a reference written here in Python
from the documented definition (``ferroloader.seeds.derive`` hashes, torch's
``randperm`` per source pass); through the loader the sequence is the same
for any number of workers, processes or threads; a snapshot at every
position resumes exactly, also on 3 ranks after 1, and new weights on resume
are followed from the resume position on.
"""

from __future__ import annotations

import math

import ferroloader
import pytest
import torch
import torch.utils.data as tud
from ferroloader.seeds import derive, epoch_seed
from helpers import time_limit
from hypothesis import given, settings
from hypothesis import strategies as st


class Tagged(tud.Dataset):
    """Item i of source ``tag``: ``tag * 1000 + i``."""

    def __init__(self, tag: int, n: int) -> None:
        self.tag, self.n = tag, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.tag * 1000 + i


def mixture(lens=(5, 7, 4), weights=(1.0, 2.0, 1.0), **kw) -> ferroloader.Mixture:
    names = [f"s{k}" for k in range(len(lens))]
    return ferroloader.Mixture(
        {n: Tagged(k, n_) for k, (n, n_) in enumerate(zip(names, lens))},
        weights=dict(zip(names, weights)), **kw)


def flat(loader) -> list[int]:
    return [int(x) for b in loader for x in b]


def reference(lens, weights, seed, epoch, *, replacement=False, exhausted="drop",
              num_samples=None, shards=None) -> list[int]:
    """The documented draws, in Python: draw p picks the source by
    ``derive(root, 11, p)`` over the weights of the sources still drawn
    from; source s's k-th read is ``randperm(len_s)`` seeded with
    ``derive(root, 13, s, pass)`` at ``k % len_s`` (with replacement:
    ``derive(root, 12, p) % len_s``); a sharded source's pass is its shards
    in the order of ``randperm(shards)`` from that seed, each in order.
    Global index = offset + index."""
    root = epoch_seed(seed, epoch)
    offsets = [sum(lens[:s]) for s in range(len(lens))]
    cap = (num_samples or sum(lens)) if replacement else (num_samples or math.inf)
    reads = [0] * len(lens)
    active = [n > 0 for n in lens]
    ran_out = [n == 0 for n in lens]
    perms: dict = {}
    out: list[int] = []
    p = 0
    while p < cap:
        if (exhausted == "cycle" and not replacement
                and all(r or w <= 0 for r, w in zip(ran_out, weights))):
            break
        total = sum(w for w, a in zip(weights, active) if a)
        if total <= 0:
            break
        target = ((derive(root, 11, p) >> 10) / float(1 << 53)) * total
        acc, s = 0.0, None
        for k, (w, a) in enumerate(zip(weights, active)):
            if a and w > 0:
                acc += w
                s = k
                if target < acc:
                    break
        n = lens[s]
        if replacement:
            index = derive(root, 12, p) % n
        else:
            k = reads[s]
            if k >= n and exhausted == "stop_first":
                break
            key = (s, k // n)
            if key not in perms:
                g = torch.Generator().manual_seed(derive(root, 13, s, k // n))
                if shards is None or shards[s] is None:
                    perms[key] = torch.randperm(n, generator=g).tolist()
                else:
                    starts = [sum(shards[s][:j]) for j in range(len(shards[s]))]
                    order = torch.randperm(len(shards[s]), generator=g).tolist()
                    perms[key] = [starts[j] + o for j in order for o in range(shards[s][j])]
            index = perms[key][k % n]
        reads[s] += 1
        if not replacement and reads[s] % n == 0:
            ran_out[s] = True
            if exhausted == "drop":
                active[s] = False
        out.append(offsets[s] + index)
        p += 1
    return out


# --------------------------------------------------------------------------- #
# the draws
# --------------------------------------------------------------------------- #


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 25), min_size=1, max_size=4),
    wseed=st.integers(0, 1000),
    seed=st.integers(0, 2**40),
    exhausted=st.sampled_from(["drop", "stop_first", "cycle"]),
    replacement=st.booleans(),
)
def test_the_engines_draws_are_the_documented_ones(lens, wseed, seed, exhausted, replacement):
    weights = [0.5 + (wseed * (k + 3)) % 7 for k in range(len(lens))]
    m = mixture(lens, weights, seed=seed, exhausted=exhausted, replacement=replacement)
    loader = ferroloader.DataLoader(m, batch_size=3)
    got = [int(x) for b in loader for x in b]
    expected = [m[i] for i in reference(lens, weights, seed, 0, exhausted=exhausted,
                                        replacement=replacement)]
    assert got == expected


@time_limit(60)
def test_realised_proportions_match_the_weights():
    """With replacement, 12,000 draws: each source's share is within 5
    binomial standard deviations of its weight."""
    weights = (0.5, 0.3, 0.2)
    m = mixture((100, 100, 100), weights, seed=1234, replacement=True, num_samples=12_000)
    items = flat(ferroloader.DataLoader(m, batch_size=500))
    assert len(items) == 12_000
    for k, w in enumerate(weights):
        share = sum(1 for x in items if x // 1000 == k) / len(items)
        assert abs(share - w) < 5 * math.sqrt(w * (1 - w) / len(items)), (k, share, w)


def test_drop_reads_every_item_once_and_epochs_differ():
    m = mixture(seed=5)
    loader = ferroloader.DataLoader(m, batch_size=4)
    e0, e1 = flat(loader), flat(loader)
    everything = sorted(m[i] for i in range(len(m)))
    assert sorted(e0) == everything and sorted(e1) == everything
    assert e0 != e1
    # the sequence is a function of (seed, epoch): a fresh loader repeats it
    again = ferroloader.DataLoader(mixture(seed=5), batch_size=4)
    assert flat(again) == e0 and flat(again) == e1


def test_stop_first_and_cycle():
    stop = flat(ferroloader.DataLoader(mixture((3, 40), (1, 1), seed=2, exhausted="stop_first"),
                                       batch_size=4))
    assert sum(1 for x in stop if x < 1000) == 3 and len(stop) < 43
    assert len(set(stop)) == len(stop)
    cyc = flat(ferroloader.DataLoader(mixture((3, 40), (1, 1), seed=2, exhausted="cycle"),
                                      batch_size=4))
    big = [x for x in cyc if x >= 1000]
    assert sorted(big) == [1000 + i for i in range(40)]
    small = [x for x in cyc if x < 1000]
    assert len(small) > 3 and set(small) == {0, 1, 2}


def test_torchdatas_stop_criteria_names_are_taken():
    for name, ours in (("FIRST_DATASET_EXHAUSTED", "stop_first"),
                       ("ALL_DATASETS_EXHAUSTED", "drop"),
                       ("CYCLE_UNTIL_ALL_DATASETS_EXHAUSTED", "cycle")):
        a = flat(ferroloader.DataLoader(mixture((3, 40), (1, 1), seed=2, exhausted=name),
                                        batch_size=4))
        b = flat(ferroloader.DataLoader(mixture((3, 40), (1, 1), seed=2, exhausted=ours),
                                        batch_size=4))
        assert a == b


def test_len_is_the_epochs_batches():
    for exhausted in ("drop", "stop_first", "cycle"):
        loader = ferroloader.DataLoader(mixture(seed=9, exhausted=exhausted), batch_size=3)
        assert len(loader) == len(list(loader))


@time_limit(90)
@pytest.mark.parametrize("layout", [dict(num_workers=2), dict(num_workers=3),
                                    dict(num_workers=2, worker_method="thread"),
                                    dict(num_workers=1, worker_threads=2)])
def test_the_sequence_is_the_same_for_any_workers(layout):
    base = ferroloader.DataLoader(mixture(seed=4), batch_size=3)
    other = ferroloader.DataLoader(mixture(seed=4), batch_size=3, persistent_workers=True,
                                   **layout)
    for _ in range(2):
        assert flat(other) == flat(base)


@time_limit(60)
def test_per_sample_seed_and_stats_work_through_a_mixture():
    class Noisy(Tagged):
        def __getitem__(self, i):
            return torch.rand(()).item() + super().__getitem__(i)

    def make():
        return ferroloader.Mixture({"a": Noisy(0, 6), "b": Noisy(1, 6)}, seed=3)

    a = ferroloader.DataLoader(make(), batch_size=2, seed=1, per_sample_seed=True)
    # (a local class reaches workers only by fork)
    b = ferroloader.DataLoader(make(), batch_size=2, seed=1, per_sample_seed=True, num_workers=2,
                               multiprocessing_context="fork")
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert b.stats().batches == 6


class CountingShards(ferroloader.ShardedDataset):
    """Shard ``s`` holds ``lens[s]`` items ``10_000 + 100 * s + offset``;
    counts the shards it opened (in this process)."""

    def __init__(self, lens):
        self.lens = list(lens)
        self.opened = 0

    def shards(self):
        return list(range(len(self.lens)))

    def shard_len(self, shard):
        return self.lens[shard]

    def iter_shard(self, shard, start=0):
        self.opened += 1
        for o in range(start, self.lens[shard]):
            yield 10_000 + 100 * shard + o


SHARD_LENS = [3, 0, 5, 2, 6]


def sharded_mixture(**kw):
    return ferroloader.Mixture({"map": Tagged(7, 10), "sharded": CountingShards(SHARD_LENS)},
                               weights={"map": 1.0, "sharded": 1.0}, seed=kw.pop("seed", 2),
                               **kw)


@time_limit(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sharded_source_is_read_shard_by_shard(workers):
    """A ShardedDataset source: the draws are the documented ones (its
    shards in a permuted order per pass, each shard's items in order),
    every item once, each shard opened once when one process reads."""
    m = sharded_mixture()
    got = flat(ferroloader.DataLoader(m, batch_size=3, num_workers=workers))
    opened = m._readers[1].ds.opened  # by this process (the workers' copies count their own)
    expected = [m[i] for i in reference([10, 16], [1.0, 1.0], 2, 0,
                                        shards=[None, SHARD_LENS])]
    assert got == expected
    items = [x for x in got if x >= 10_000]
    assert sorted(items) == sorted(10_000 + 100 * s + o for s, n in enumerate(SHARD_LENS)
                                   for o in range(n))
    for s in range(len(SHARD_LENS)):
        mine = [x for x in items if (x - 10_000) // 100 == s]
        assert mine == sorted(mine)
    if workers == 0:
        assert opened == sum(1 for n in SHARD_LENS if n)


@time_limit(90)
def test_a_mixture_with_a_sharded_source_resumes_exactly():
    whole = flat(ferroloader.DataLoader(sharded_mixture(), batch_size=2))
    for k in range(0, len(whole) // 2 + 1, 3):
        sd = _snapshot_after(ferroloader.DataLoader(sharded_mixture(), batch_size=2,
                                                    num_workers=2), k)
        resumed = ferroloader.DataLoader(sharded_mixture(), batch_size=2)
        resumed.load_state_dict(sd)
        assert whole[: 2 * k] + flat(resumed) == whole, k


def test_a_sharded_source_needs_its_shard_lengths():
    class Unknown(CountingShards):
        def shard_len(self, shard):
            return None

    with pytest.raises(ferroloader.ConfigError, match="lengths are not all known"):
        ferroloader.Mixture({"a": Unknown([2, 3])})


# --------------------------------------------------------------------------- #
# resume
# --------------------------------------------------------------------------- #


def _snapshot_after(loader, k: int) -> dict:
    it = iter(loader)
    for _ in range(k):
        next(it)
    sd = loader.state_dict()
    del it
    return sd


@time_limit(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_at_every_position_is_exact(workers):
    """In the second epoch (so the epoch counts), at every batch boundary,
    resumed with 0 or 2 workers either way."""
    kw = dict(batch_size=2)
    whole = ferroloader.DataLoader(mixture(seed=6), **kw)
    flat(whole)
    second = [b.tolist() for b in whole]
    for k in range(len(second) + 1):
        loader = ferroloader.DataLoader(mixture(seed=6), num_workers=workers, **kw)
        flat(loader)
        sd = _snapshot_after(loader, k)
        resumed = ferroloader.DataLoader(mixture(seed=6), num_workers=2 - workers, **kw)
        resumed.load_state_dict(sd)
        assert second[:k] + [b.tolist() for b in resumed] == second, k


@time_limit(90)
@pytest.mark.parametrize("make", ["mixture", "elastic"])
def test_stateful_dataloader_with_workers_resumes_exactly(make):
    """torchdata's loader iterates its sampler twice at a multi-process
    start; an elastic sampler (a mixture's too) keeps its resume position."""
    def loader():
        if make == "mixture":
            return ferroloader.StatefulDataLoader(mixture(seed=3), batch_size=2, num_workers=2)
        sampler = ferroloader.ElasticBatchSampler(20, 2, seed=1)
        return ferroloader.StatefulDataLoader(list(range(20)), batch_sampler=sampler,
                                              num_workers=2)

    whole = flat(loader())
    for k in (1, 3):
        sd = _snapshot_after(loader(), k)
        resumed = loader()
        resumed.load_state_dict(sd)
        assert whole[: 2 * k] + flat(resumed) == whole


@time_limit(120)
def test_resume_on_three_ranks_reads_exactly_the_rest():
    """A snapshot of one rank at every position; three ranks resume it
    (``even=False``: every draw once) and, read global batch by global
    batch, give exactly the rest of the single rank's epoch."""
    whole = flat(ferroloader.DataLoader(mixture(seed=8), batch_size=2))
    for k in range(len(whole) // 2 + 1):
        sd = _snapshot_after(ferroloader.DataLoader(mixture(seed=8), batch_size=2), k)
        ranks = []
        for r in range(3):
            sampler = ferroloader.MixtureBatchSampler(mixture(seed=8), 2, even=False, rank=r,
                                                      world_size=3)
            loader = ferroloader.DataLoader(sampler.mixture, batch_sampler=sampler)
            loader.load_state_dict(sd)
            ranks.append([b.tolist() for b in loader])
        rest = []
        for g in range(max(len(x) for x in ranks)):
            for r in range(3):
                if g < len(ranks[r]):
                    rest.extend(ranks[r][g])
        assert whole[: 2 * k] + rest == whole, k


@time_limit(60)
@pytest.mark.parametrize("k", [0, 3, 6])
def test_new_weights_on_resume_are_followed_from_there(k):
    """Source 0's weight set to 0 at the resume: no item of it after, the
    draws before are the old ones, and every other source is read to its
    end with no item twice."""
    whole = flat(ferroloader.DataLoader(mixture(seed=10), batch_size=2))
    sd = _snapshot_after(ferroloader.DataLoader(mixture(seed=10), batch_size=2), k)
    changed = mixture(seed=10)
    changed.set_weights({"s0": 0.0, "s1": 1.0, "s2": 1.0})
    resumed = ferroloader.DataLoader(changed, batch_size=2)
    resumed.load_state_dict(sd)
    rest = flat(resumed)
    head = whole[: 2 * k]
    assert all(x >= 1000 for x in rest)
    done = head + rest
    for tag, n in ((1, 7), (2, 4)):
        assert sorted(x for x in done if x // 1000 == tag) == [tag * 1000 + i for i in range(n)]
    # deterministic: the same resume gives the same rest, and its own
    # snapshot (two weight segments) resumes exactly again
    again = ferroloader.DataLoader(changed, batch_size=2)
    again.load_state_dict(sd)
    it = iter(again)
    first = [int(x) for x in next(it)] if rest else []
    sd2 = again.state_dict()
    del it
    assert first == rest[:2]
    if rest:
        segs = sd2["epoch"]["elastic_sampler"]["mixture"]
        assert len(segs) == (2 if k else 1) and segs[-1][1] == [0.0, 1.0, 1.0]
        third = ferroloader.DataLoader(changed, batch_size=2)
        third.load_state_dict(sd2)
        assert flat(third) == rest[2:]


def test_a_damaged_mixture_state_is_refused():
    sd = _snapshot_after(ferroloader.DataLoader(mixture(seed=1), batch_size=2), 2)
    sd["epoch"]["elastic_sampler"]["mixture"] = [[0, [1.0, 2.0]]]
    with pytest.raises(ferroloader.ConfigError, match="mixture is not"):
        ferroloader.DataLoader(mixture(seed=1), batch_size=2).load_state_dict(sd)


# --------------------------------------------------------------------------- #
# arguments
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(weights={"s0": 1.0}), "should name every source"),
    (dict(weights={"s0": -1.0, "s1": 1.0}), "finite number >= 0"),
    (dict(weights={"s0": math.nan, "s1": 1.0}), "finite number >= 0"),
    (dict(weights={"s0": 0, "s1": 0}), "all 0"),
    (dict(exhausted="never"), "exhausted should be one of"),
    (dict(num_samples=0), "num_samples should be a positive integer"),
    (dict(seed="x"), "seed should be an int"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ferroloader.ConfigError, match=match):
        ferroloader.Mixture({"s0": Tagged(0, 3), "s1": Tagged(1, 3)}, **kwargs)


def test_sources_must_be_map_style_and_batched():
    class It(tud.IterableDataset):
        def __iter__(self):
            yield 1

    with pytest.raises(ferroloader.ConfigError, match="not a map-style dataset"):
        ferroloader.Mixture({"a": It()})
    with pytest.raises(ferroloader.ConfigError, match="give batch_size"):
        ferroloader.DataLoader(mixture(), batch_size=None)
    with pytest.raises(ferroloader.ConfigError, match="is empty"):
        ferroloader.Mixture({"a": Tagged(0, 0)}, replacement=True)


@pytest.mark.parametrize("exhausted", ["stop_first", "FIRST_DATASET_EXHAUSTED", "cycle"])
def test_an_empty_source_drawn_from_is_refused_where_it_cannot_be_drawn(exhausted):
    """An empty source of non-zero weight under stop_first (it would end the epoch at its
    first draw, as torchdata's FIRST_DATASET_EXHAUSTED does) or cycle (nothing to start a
    pass with) is a ConfigError naming it, at construction and from set_weights, never an
    epoch that silently reads all of the other sources; with weight 0 it is never drawn,
    and drop leaves it out (every item of the others once)."""
    sources = {"a": Tagged(0, 0), "b": Tagged(1, 6)}
    with pytest.raises(ferroloader.ConfigError, match=r"source 'a' is empty and has weight 1\.0"):
        ferroloader.Mixture(sources, exhausted=exhausted)
    m = ferroloader.Mixture(sources, {"a": 0, "b": 1}, exhausted=exhausted)
    assert sorted(flat(ferroloader.DataLoader(m, batch_size=4))) == [1000 + i for i in range(6)]
    with pytest.raises(ferroloader.ConfigError, match="'a' is empty"):
        m.set_weights({"a": 0.5, "b": 1})
    assert m.weights == {"a": 0.0, "b": 1.0}
    m = ferroloader.Mixture(sources, exhausted="drop")
    assert sorted(flat(ferroloader.DataLoader(m, batch_size=4))) == [1000 + i for i in range(6)]


# --------------------------------------------------------------------------- #
# what a loader over a mixture refuses: its order is its draws
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("shuffle", [True, 1, "yes"])
def test_shuffle_is_refused_with_how_to_get_another_order(shuffle):
    """shuffle=True used to be dropped silently; the error says why it has no meaning and
    how to get another order (the mixture's own seed)."""
    with pytest.raises(ferroloader.ConfigError,
                       match=r"(?s)no meaning for a Mixture.*draws.*seed=") as e:
        ferroloader.DataLoader(mixture(), batch_size=2, shuffle=shuffle)
    assert f"shuffle={shuffle!r}" in str(e.value)


@pytest.mark.parametrize("shuffle", [False, None])
def test_shuffle_false_changes_nothing(shuffle):
    assert flat(ferroloader.DataLoader(mixture(seed=4), batch_size=2, shuffle=shuffle)) == \
        flat(ferroloader.DataLoader(mixture(seed=4), batch_size=2))


def test_another_seed_is_another_order():
    """What the shuffle error points to: the mixture's seed changes the order."""
    a = flat(ferroloader.DataLoader(mixture(seed=0), batch_size=2))
    b = flat(ferroloader.DataLoader(mixture(seed=1), batch_size=2))
    assert a != b and sorted(a) == sorted(b)


SAMPLERS = {
    "sampler": lambda m: {"sampler": tud.RandomSampler(m)},
    "sampler_list": lambda m: {"sampler": list(range(len(m)))},
    "distributed": lambda m: {"sampler": tud.DistributedSampler(m, num_replicas=2, rank=0)},
    "batch_sampler": lambda m: {"batch_sampler": tud.BatchSampler(tud.SequentialSampler(m), 2,
                                                                  False)},
    "elastic": lambda m: {"batch_sampler": ferroloader.ElasticBatchSampler(len(m), 2)},
    "mixture_sampler_as_sampler": lambda m: {"sampler": ferroloader.MixtureBatchSampler(m, 2)},
    "another_mixtures": lambda m: {"batch_sampler": ferroloader.MixtureBatchSampler(mixture(), 2)},
}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_a_sampler_that_would_replace_the_draws_is_refused(name):
    """sampler= used to replace the mixture's weighted draws silently (its weights lost);
    a batch sampler other than this mixture's own does the same."""
    m = mixture(seed=2)
    with pytest.raises(ferroloader.ConfigError, match="would replace a Mixture's weighted draws"):
        ferroloader.DataLoader(m, **SAMPLERS[name](m))


@pytest.mark.parametrize("cls", [ferroloader.DataLoader, ferroloader.StatefulDataLoader])
def test_the_mixtures_own_batch_sampler_is_taken(cls):
    """A MixtureBatchSampler of the same mixture passed explicitly (to choose the ranks)
    gives the loader's own draws."""
    m = mixture(seed=5)
    own = ferroloader.MixtureBatchSampler(m, 2, rank=0, world_size=1)
    assert flat(cls(m, batch_sampler=own)) == flat(cls(mixture(seed=5), batch_size=2))


def test_drop_last_must_be_a_bool_as_torch_says():
    """The mixture's batch sampler takes the place of torch's BatchSampler: its check."""
    with pytest.raises(ValueError, match="drop_last should be a boolean value, but got "
                                         "drop_last=yes"):
        ferroloader.DataLoader(mixture(), batch_size=2, drop_last="yes")


def test_a_state_names_the_mixtures_sampler_by_its_path_before_the_package_moved():
    """States saved before ``ferroloader.mixture`` moved to
    ``ferroloader.epoch.mixture`` name the sampler by the old path; a state
    saved now names it the same way, so both load into either version."""
    mix = ferroloader.Mixture({"a": torch.arange(8), "b": torch.arange(100, 104)}, seed=0)
    loader = ferroloader.DataLoader(mix, batch_size=4)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["fingerprint"]["sampler"] == "ferroloader.mixture.MixtureBatchSampler"
    mix = ferroloader.Mixture({"a": torch.arange(8), "b": torch.arange(100, 104)}, seed=0)
    again = ferroloader.DataLoader(mix, batch_size=4)
    again.load_state_dict(state)
    assert len(list(again)) == 2
