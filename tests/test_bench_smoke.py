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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("venv", ["ready", "absent"])
def test_bench_script_help_installs_nothing(tmp_path: Path, flag: str, venv: str) -> None:
    """scripts/bench --help (and -h) prints the usage and exits 0 without creating .venv or
    running pip: the bench's full option list where .venv has torch, else the script's usage.
    Run from a copy whose .venv/bin/pip records any call."""
    import os
    import shutil

    (tmp_path / "scripts").mkdir()
    (tmp_path / "benches").mkdir()
    script = tmp_path / "scripts" / "bench"
    shutil.copy2(ROOT / "scripts" / "bench", script)
    shutil.copy2(BENCH, tmp_path / "benches" / BENCH.name)
    # the entry point imports the bench from its package beside it
    shutil.copytree(ROOT / "benches" / "ferrobench", tmp_path / "benches" / "ferrobench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    called = tmp_path / "pip-called"
    if venv == "ready":
        bin_dir = tmp_path / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        for name, body in (("python", f'exec {sys.executable} "$@"'), ("pip", f"touch {called}")):
            (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
            (bin_dir / name).chmod(0o755)
    proc = subprocess.run(
        [str(script), "--quick", flag], capture_output=True, text=True, timeout=100,
        env=dict(os.environ, PATH=f"/nonexistent:{os.environ['PATH']}"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: "), proc.stdout
    assert "--scenarios" in proc.stdout and "installing" not in proc.stderr
    assert not called.exists(), "pip ran"
    if venv == "ready":
        assert "comma-separated subset of" in proc.stdout  # the bench's own --help
    else:
        assert not (tmp_path / ".venv").exists(), "a venv was created"
