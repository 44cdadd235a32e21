"""Smoke test of the side-by-side bench (benches/bench_vs_torch.py) in --quick mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benches" / "bench_vs_torch.py"
SCENARIOS = ("int64", "tensords", "collate")


@pytest.mark.timeout(300)
def test_bench_quick_reports_a_ratio_per_scenario(tmp_path: Path) -> None:
    """A --quick run exits 0 and writes a positive median ratio for each scenario."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--scenarios",
            ",".join(SCENARIOS),
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads(out.read_text())["scenarios"]
    for name in SCENARIOS:
        ratio = results[name]["ratio"]
        assert isinstance(ratio, (int, float)) and ratio > 0, (name, results[name])
