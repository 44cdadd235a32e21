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


@time_limit(240)
def test_world_queue_torchrun_example_resumes_its_checkpoint_on_another_number_of_ranks(
        tmp_path):
    """The sharding guide's torchrun example, run as its docstring says: 2
    ranks read 3 batches each, each saves its own state, stop; 3 ranks
    resume, each from its own state (rank 2 from rank 0's). Every item is
    read exactly once."""
    import json
    import subprocess

    script = os.path.join(ROOT, "examples", "world_queue_torchrun.py")
    out = str(tmp_path / "run")
    os.makedirs(out)
    # (a fresh local Ray cluster where an example starts one, never one
    # another test started here)
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS="local")

    def torchrun(ranks: int, *args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={ranks}", script, "--out", out, *args],
            capture_output=True, text=True, timeout=180, env=env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    torchrun(2, "--stop-after", "3")
    states = []
    for r in range(2):
        with open(os.path.join(out, f"checkpoint-rank{r}.json")) as f:
            states.append(json.load(f))
    # (each holds both ranks' accounts, alike)
    assert [[a["rank"] for a in s["epoch"]["shards"]["accounts"]] for s in states] == [[0, 1]] * 2
    assert states[0]["epoch"]["shards"] == states[1]["epoch"]["shards"]
    torchrun(3, "--resume", out)
    read = []
    for name in os.listdir(out):
        if name.startswith("rank"):
            with open(os.path.join(out, name)) as f:
                read += json.load(f)
    first = [n for n in os.listdir(out) if n.endswith("-first.json")]
    assert len(first) == 2 and len(os.listdir(out)) == 2 + 3 + 3  # (data, 2 checkpoints)
    assert sorted(read) == sorted(f"{s}-{i}" for s in range(12) for i in range(20))
