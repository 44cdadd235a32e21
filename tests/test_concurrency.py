"""Several threads on one generator, one sampler iterator, one loader.

On a free-threaded build (3.14t) these threads run at once; with the GIL
they interleave wherever a call releases it. Either way no draw may be
lost or repeated, no index or batch handed out twice or skipped, and a
call that cannot wait its turn says so. Each race below had a test that
failed before its fix on 3.14t (see docs/guide/threads.md)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Callable

import ferroloader
import pytest
import torch
import torch.utils.data as tud
from helpers import time_limit


def _in_threads(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """``fn(k)`` in ``n`` threads started together; their results, the
    first error raised in any of them re-raised."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            barrier.wait()
            out[k] = fn(k)
        except BaseException as e:  # re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]
    return out


# --------------------------------------------------------------------------- #
# one generator: every draw is torch's, made whole
# --------------------------------------------------------------------------- #


@time_limit(120)
@pytest.mark.parametrize("replacement", [False, True])
def test_threads_sharing_a_generator_lose_no_draw(replacement):
    # every epoch draws the same amount from the generator (two
    # permutations, the second cut to nothing; or n randints in chunks), so
    # whatever the interleaving the generator must end where as many epochs
    # one after another leave it. Without replacement each epoch is one of
    # the permutations drawn in that sequence, none twice (a lost update
    # would hand two threads the same one); with replacement the values
    # drawn are, all together, those of the sequence.
    n, threads, rounds = 400, 4, 150
    g = torch.Generator().manual_seed(7)
    got = _in_threads(threads, lambda k: [
        tuple(ferroloader.RandomSampler(range(n), replacement=replacement, generator=g))
        for _ in range(rounds)])
    epochs = [e for t in got for e in t]
    ref = torch.Generator().manual_seed(7)
    if replacement:
        want = [tuple(tud.RandomSampler(range(n), replacement=True, generator=ref))
                for _ in range(threads * rounds)]
        assert Counter(i for e in epochs for i in e) == Counter(i for e in want for i in e)
    else:
        perms = {tuple(torch.randperm(n, generator=ref).tolist())
                 for _ in range(2 * threads * rounds)}
        assert len(set(epochs)) == len(epochs) and set(epochs) <= perms
    assert torch.equal(g.get_state(), ref.get_state())


@time_limit(120)
def test_threads_seeding_from_the_global_generator_lose_no_draw():
    # RandomSampler(generator=None) seeds a private generator from the
    # global one when iteration starts: a draw per epoch, from every thread
    n, threads, rounds = 8, 4, 1500
    saved = torch.get_rng_state()
    try:
        torch.manual_seed(11)
        got = _in_threads(
            threads,
            lambda k: [tuple(ferroloader.RandomSampler(range(n))) for _ in range(rounds)],
        )
        after = torch.get_rng_state()
        # each epoch seeds from one draw of the global generator: the
        # epochs are those of as many draws one after another, in any order
        torch.manual_seed(11)
        want = [tuple(tud.RandomSampler(range(n))) for _ in range(threads * rounds)]
        assert Counter(e for t in got for e in t) == Counter(want)
        assert torch.equal(after, torch.get_rng_state())
    finally:
        torch.set_rng_state(saved)


# --------------------------------------------------------------------------- #
# one sampler iterator: threads take turns
# --------------------------------------------------------------------------- #


@time_limit(120)
@pytest.mark.parametrize("cls", ["RandomSampler", "SequentialSampler", "SubsetRandomSampler"])
def test_threads_sharing_a_sampler_iterator_take_turns(cls):
    n = 60000
    g = torch.Generator().manual_seed(3)
    if cls == "SubsetRandomSampler":
        make: Callable[[Any], Any] = lambda lib, g: lib.SubsetRandomSampler(  # noqa: E731
            list(range(0, 2 * n, 2)), generator=g)
    elif cls == "RandomSampler":
        make = lambda lib, g: lib.RandomSampler(range(n), generator=g)  # noqa: E731
    else:
        make = lambda lib, g: lib.SequentialSampler(range(n))  # noqa: E731
    want = list(make(tud, torch.Generator().manual_seed(3)))
    for _ in range(4):
        g.manual_seed(3)
        it = iter(make(ferroloader, g))

        def drain(_k: int) -> list[int]:
            mine = []
            for i in it:  # noqa: B023 - the iterator of this round
                mine.append(i)
            return mine

        got = _in_threads(4, drain)
        # each index once, in total those torch yields
        assert Counter(i for t in got for i in t) == Counter(want)


# --------------------------------------------------------------------------- #
# one loader: next(), state_dict() and stats() from several threads
# --------------------------------------------------------------------------- #


class Slow(tud.Dataset):
    """Samples that take a moment, so that next() waits while others ask."""

    def __init__(self, n: int = 96, delay: float = 0.001) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.tensor([i, i * i])


LAYOUTS = [
    pytest.param({"num_workers": 0}, id="main"),
    pytest.param({"num_workers": 2}, id="processes"),
    pytest.param({"num_workers": 2, "worker_method": "thread"}, id="threads"),
    pytest.param({"num_workers": 1, "worker_threads": 2}, id="threads-in-a-process"),
]


@time_limit(120)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_state_and_stats_while_another_thread_waits_in_next(layout):
    loader = ferroloader.DataLoader(Slow(), batch_size=4, shuffle=True,
                                    generator=torch.Generator().manual_seed(5), **layout)
    it = iter(loader)
    done = threading.Event()

    def consume(_k: int) -> list[torch.Tensor]:
        try:
            return list(it)
        finally:
            done.set()

    def watch(_k: int) -> int:
        reads = 0
        while not done.is_set():
            assert isinstance(loader.state_dict(), dict)
            loader.stats()
            reads += 1
        return reads

    out = _in_threads(3, lambda k: consume(k) if k == 0 else watch(k))
    batches = out[0]
    want = list(tud.DataLoader(Slow(), batch_size=4, shuffle=True,
                               generator=torch.Generator().manual_seed(5)))
    assert len(batches) == len(want)
    for a, b in zip(batches, want):
        assert torch.equal(a, b)
    assert out[1] > 0 and out[2] > 0


@time_limit(120)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_threads_sharing_a_loader_iterator_each_get_the_following_batch(layout):
    loader = ferroloader.DataLoader(Slow(160), batch_size=4, **layout)
    it = iter(loader)

    def drain(_k: int) -> list[torch.Tensor]:
        mine = []
        for b in it:
            mine.append(b)
            loader.stats()
        return mine

    got = _in_threads(4, drain)
    firsts = sorted(int(b[0, 0]) for t in got for b in t)
    assert firsts == list(range(0, 160, 4))
    # and each batch whole, its rows in order
    for t in got:
        for b in t:
            start = int(b[0, 0])
            assert b[:, 0].tolist() == list(range(start, start + 4))


@time_limit(120)
def test_many_loaders_at_once_each_get_torchs_batches():
    def one(k: int) -> list[torch.Tensor]:
        kw = [{"num_workers": 0}, {"num_workers": 2, "worker_method": "thread"},
              {"num_workers": 1, "worker_threads": 2}, {"num_workers": 2}][k % 4]
        loader = ferroloader.DataLoader(Slow(48, 0.0005), batch_size=4, shuffle=True,
                                        generator=torch.Generator().manual_seed(k), **kw)
        return list(loader)

    got = _in_threads(6, one)
    for k, batches in enumerate(got):
        want = list(tud.DataLoader(Slow(48, 0.0005), batch_size=4, shuffle=True,
                                   generator=torch.Generator().manual_seed(k)))
        assert len(batches) == len(want)
        assert all(torch.equal(a, b) for a, b in zip(batches, want))


class CallsBack(tud.Dataset):
    """A dataset whose __getitem__ asks its own loader for its state."""

    loader: Any = None

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        self.loader.state_dict()
        return i


@time_limit(60)
def test_a_call_back_into_the_iterator_from_its_own_next_is_a_clear_error():
    ds = CallsBack()
    loader = ferroloader.DataLoader(ds, batch_size=2)
    ds.loader = loader
    with pytest.raises(RuntimeError, match="from inside its own next"):
        next(iter(loader))
