"""DataLoader.stats(): per-stage timings, always counted, readable from the
loader; and the opt-in FERROLOADER_WARN_WAITING warning naming the slowest
stage."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import ferroloader as fl
import pytest
import torch
import torch.utils.data as tud
from helpers import ferro_only, time_limit

pytestmark = ferro_only


class SlowItems(tud.Dataset):
    """Each item sleeps ``delay`` seconds in __getitem__."""

    def __init__(self, n: int = 32, delay: float = 0.002) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.full((16,), i)


def slow_collate(batch: list) -> torch.Tensor:
    time.sleep(0.01)
    return torch.stack(batch)


@time_limit(120)
@pytest.mark.parametrize("nw", [0, 2])
def test_stats_count_batches_and_time_each_stage(nw):
    """Batches are counted across epochs; fetch time is at least what the
    dataset slept; the loop's time between batches is counted; with a slow
    collate_fn, collate time is at least what it slept. Only lower bounds
    of what the code slept: load lengthens any stage, so which of two
    stages is slower is asserted on stats built here (below), not timed."""
    loader = fl.DataLoader(SlowItems(), batch_size=8, num_workers=nw, persistent_workers=nw > 0)
    for _ in range(2):
        for _ in loader:
            time.sleep(0.003)
    s = loader.stats()
    assert s.batches == 8
    assert sum(w.batches for w in s.workers) == 8
    assert s.fetch >= 0.9 * 0.002 * 8 * sum(w.batches for w in s.workers)
    assert s.loop >= 0.9 * 0.003 * 7  # at least 7 of the 8 gaps between batches
    assert 0.0 < s.waiting_share < 1.0
    text = str(s)
    assert "8 batches" in text and "work: fetch" in text and "main: wait" in text
    assert f"slowest stage: {s.limiting_stage()}" in text
    slow = fl.DataLoader(SlowItems(8, 0.0), batch_size=4, num_workers=nw, collate_fn=slow_collate)
    list(slow)
    assert slow.stats().collate >= 0.9 * 0.01 * 2
    assert slow.stats().batches == 2


@pytest.mark.parametrize("stage", ["fetch", "collate", "transfer", "decode", "pin"])
def test_the_limiting_stage_is_the_one_with_the_most_time_per_batch(stage):
    """Workers' stages per batch a worker made (two workers, 3 batches
    each), the main process's per batch handed over (6)."""
    base = {"fetch": 0.01, "collate": 0.01, "transfer": 0.01}
    worker = dict(base, **({stage: 0.05} if stage in base else {}))
    workers = [fl.WorkerStats(**worker, batches=3) for _ in range(2)]
    main = {k: (0.6 if k == stage else 0.01) for k in ("decode", "pin")}
    s = fl.LoaderStats(batches=6, wait=0.0, loop=0.0, workers=workers, **main)
    assert s.limiting_stage() == stage


class _Stream(tud.IterableDataset):
    """``n`` ints, split between workers (an epoch ended by exhaustion)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(wid, self.n, nw))


class _Shards(fl.ShardedDataset):
    """Shards of ``lens[s]`` ints each (lanes that run out)."""

    def __init__(self, lens: list) -> None:
        self.lens = lens

    def shards(self) -> list:
        return list(range(len(self.lens)))

    def iter_shard(self, shard: int, start: int = 0):
        return iter(range(1000 * shard + start, 1000 * shard + self.lens[shard]))

    def shard_len(self, shard: int) -> int:
        return self.lens[shard]


def _datasets(nw: int):
    """(name, dataset, loader kwargs, batches per epoch)."""
    return [
        ("tensors", tud.TensorDataset(torch.arange(470.0).reshape(-1, 1)), {}, 47),
        ("list", list(range(470)), {}, 47),
        # each worker's replica ends with a short batch
        ("iterable", _Stream(470), {}, 48 if nw == 2 else 47),
        ("sharded", _Shards([90, 130, 70, 180]), {"sharding": fl.Sharding(mode="dynamic")}, 47),
    ]


@time_limit(120)
@pytest.mark.parametrize(
    "nw,method,persistent",
    [
        (0, "multiprocessing", False),
        (2, "multiprocessing", False),
        (2, "multiprocessing", True),
        (2, "thread", False),
        (2, "thread", True),
    ],
)
def test_stats_count_every_batch_the_workers_made(nw, method, persistent):
    """Right after an epoch ends (no waiting for a report), the workers'
    batches add up to the batches yielded, each worker's included, and
    their stages are timed: the last reports of a worker are not lost when
    non-persistent workers shut down or persistent ones go idle. Map-style
    data (TensorDataset, a list), an iterable that runs out, sharded lanes
    that run out. An epoch broken early is counted as far as it went."""
    for name, ds, extra, per_epoch in _datasets(nw):
        loader = fl.DataLoader(
            ds,
            batch_size=10,
            num_workers=nw,
            worker_method=method,
            persistent_workers=persistent,
            **extra,
        )
        for epoch in range(1, 3):
            assert sum(1 for _ in loader) == per_epoch, name
            s = loader.stats()
            assert s.batches == per_epoch * epoch, name
            assert len(s.workers) == max(nw, 1), name
            assert sum(w.batches for w in s.workers) == per_epoch * epoch, (name, s.workers)
            assert all(w.batches > 0 and w.fetch > 0 for w in s.workers), (name, s.workers)
            assert s.fetch > 0 and s.transfer >= 0, name
            if nw:
                assert s.transfer > 0, name
        it = iter(loader)
        next(it)
        next(it)
        del it
        s = loader.stats()
        assert s.batches == per_epoch * 2 + 2, name
        assert sum(w.batches for w in s.workers) >= s.batches, name
        str(s)


_WARN = textwrap.dedent(
    """
    import sys, time, warnings
    sys.path.insert(0, sys.argv[1])
    import ferroloader as fl
    from test_stats import SlowItems
    loader = fl.DataLoader(SlowItems(600, 0.0005), batch_size=2, num_workers=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in loader:
            if sys.argv[2] == "slow-loop":
                time.sleep(0.005)
    print("|".join(str(w.message) for w in caught if "ferroloader" in str(w.message)))
    """
)


@time_limit(120)
@pytest.mark.parametrize("loop", ["fast-loop", "slow-loop"])
def test_waiting_warning_is_opt_in_and_names_the_stage(tmp_path, loop):
    """With FERROLOADER_WARN_WAITING=0.5 a loop that mostly waits on data
    gets one warning naming fetch; a loop that is the bottleneck gets none;
    without the variable nobody is warned."""
    script = tmp_path / "warn.py"
    script.write_text(_WARN)
    here = os.path.dirname(os.path.abspath(__file__))

    def run(env: dict) -> str:
        proc = subprocess.run(
            [sys.executable, str(script), here, loop],
            capture_output=True,
            text=True,
            timeout=100,
            env={**os.environ, **env},
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip()

    warned = run({"FERROLOADER_WARN_WAITING": "0.5"})
    if loop == "fast-loop":
        assert warned.count("waited for data") == 1, warned
        assert "slowest stage is fetch" in warned
    else:
        assert warned == ""
    assert run({"FERROLOADER_WARN_WAITING": ""}) == ""
