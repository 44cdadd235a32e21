"""A test that overruns its time limit fails alone: the run goes on, also
when the test is blocked inside the engine's wait for a worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import time_limit

HERE = Path(__file__).parent

INNER = textwrap.dedent(
    """
    import time

    import ferroloader as fl
    import torch.utils.data as tud
    from helpers import time_limit


    class Stuck(tud.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            time.sleep(600)  # in the worker: the main process waits in Rust
            return i


    @time_limit(3)
    def test_blocked_in_the_engine():
        next(iter(fl.DataLoader(Stuck(), num_workers=1)))


    @time_limit(3)
    def test_blocked_in_python():
        time.sleep(600)


    def test_after_them():
        assert list(fl.DataLoader(list(range(4)), batch_size=2, num_workers=1))
    """
)


@time_limit(120)
def test_a_timeout_fails_one_test_and_the_run_goes_on(tmp_path):
    path = tmp_path / "test_inner.py"
    path.write_text(INNER)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(HERE)},
    )
    out = proc.stdout + proc.stderr
    assert "2 failed, 1 passed" in out, out[-3000:]
    assert "Timeout" in out
