"""A script written for torchdata's StatefulDataLoader resumes the same with
ferroloader after changing only its import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ferro_only, time_limit

SCRIPT = Path(__file__).parent / "scripts" / "resume_torchdata.py"
TORCHDATA_IMPORT = "from torchdata.stateful_dataloader import StatefulDataLoader\n"
FERRO_IMPORT = "from ferroloader import DataLoader as StatefulDataLoader\n"

pytestmark = [ferro_only, time_limit(300)]


def _run(source: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(source)
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=280
    )


def test_script_passes_with_torchdata_and_with_ferroloader(tmp_path):
    """The torchdata resume script passes under StatefulDataLoader, and again
    with its one import line swapped for ferroloader's DataLoader."""
    pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata (a test extra) is not installed"
    )
    source = SCRIPT.read_text()
    assert source.count(TORCHDATA_IMPORT) == 1
    ref = _run(source, tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    swapped = source.replace(TORCHDATA_IMPORT, FERRO_IMPORT)
    imports = [ln for ln in swapped.splitlines() if ln.startswith(("import ", "from "))]
    assert not [ln for ln in imports if "torchdata" in ln]
    ours = _run(swapped, tmp_path)
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert ours.stdout == ref.stdout
