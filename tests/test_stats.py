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
def test_stats_count_batches_and_time_the_stage_that_takes_it(nw):
    """Batches are counted across epochs; fetch time is at least what the
    dataset slept, and is the slowest stage; the loop's time between
    batches is counted; with a slow collate_fn, collate is the slowest."""
    loader = fl.DataLoader(SlowItems(), batch_size=8, num_workers=nw, persistent_workers=nw > 0)
    for _ in range(2):
        for _ in loader:
            time.sleep(0.003)
    if nw:
        time.sleep(0.2)  # the workers' last report
    s = loader.stats()
    assert s.batches == 8
    assert sum(w.batches for w in s.workers) >= (8 if nw == 0 else 6)
    assert s.fetch >= 0.9 * 0.002 * 8 * sum(w.batches for w in s.workers)
    assert s.limiting_stage() == "fetch"
    assert s.loop >= 0.9 * 0.003 * 7  # at least 7 of the 8 gaps between batches
    assert 0.0 < s.waiting_share < 1.0
    text = str(s)
    assert "8 batches" in text and "work: fetch" in text and "main: wait" in text
    slow = fl.DataLoader(SlowItems(8, 0.0), batch_size=4, num_workers=nw, collate_fn=slow_collate)
    list(slow)
    if nw:
        time.sleep(0.2)
    assert slow.stats().limiting_stage() == "collate"
    assert slow.stats().batches == 2


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
