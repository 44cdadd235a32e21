"""The package's shape holds: imports run down its layers, with no circle
(the contracts in ``pyproject.toml``, checked by import-linter, which sees
imports inside functions too, so none can dodge a circle), and no module
grows past 500 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ferroloader
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(ferroloader.__file__).parent


def test_imports_run_down_the_layers_without_a_circle():
    pytest.importorskip("importlinter", reason="import-linter is a test extra")
    out = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command;"
                          "lint_imports_command()", str(ROOT / "pyproject.toml")],
                         capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout, out.stdout[-2000:]


def test_no_module_over_500_lines():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
             for p in PACKAGE.rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > 500} == {}
