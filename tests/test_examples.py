"""The examples run: examples/train_cnn.py in its fast form (the complete
training script the README points to), with ferroloader and with torch."""

from __future__ import annotations

import multiprocessing
import os
import runpy
import sys
import warnings

from helpers import time_limit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@time_limit(240)
def test_train_cnn_example_runs_fast_with_ferroloader_and_with_torch(monkeypatch):
    """The CNN example trains (loss falls below its start) on ferroloader's
    loader with workers, and the same script runs on torch's loader, without
    a warning of its own (a loss read with float() warned each epoch)."""
    path = os.path.join(ROOT, "examples", "train_cnn.py")
    module = runpy.run_path(path, run_name="train_cnn")
    # (run this way, the script's classes live in a module workers cannot
    # import: they reach them only by fork; run as a script, they would
    # under any start method)
    was = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("fork", force=True)
    try:
        for extra in ([], ["--torch"]):
            monkeypatch.setattr(sys, "argv", [path])
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                result = module["main"](["--fast", "--workers", "2", "--epochs", "3", *extra])
            own = [f"{w.filename}:{w.lineno}: {w.message}" for w in seen if w.filename == path]
            assert not own, own
            assert result["last_loss"] < result["first_loss"], result
            assert 0.0 <= result["accuracy"] <= 1.0
    finally:
        multiprocessing.set_start_method(was, force=True)
