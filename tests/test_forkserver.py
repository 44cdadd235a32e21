"""Workers that start warm under forkserver: the server is started when the
loader is built, with torch, numpy, ferroloader's worker module and the
dataset's module preloaded, and the batches (worker seeds included) stay
torch's. Each side runs in a fresh `python -c` interpreter, where the main
module is not a file (as in a notebook or pytest) and no fork server runs
yet."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

from helpers import assert_same, ferro_only, time_limit

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

_CHILD = textwrap.dedent(
    """
    import multiprocessing as mp, pickle, sys, time
    sys.path.insert(0, sys.argv[1])
    import torch
    if sys.argv[2] == "torch":
        import torch.utils.data as lib
        info = lib.get_worker_info
    else:
        import ferroloader as lib
        from ferroloader.hosts import forkserver
        info = lib.get_worker_info
    import mp_helpers as mh

    ctx = mp.get_context("forkserver")
    loader = lib.DataLoader(
        mh.RngDataset(12, info), batch_size=2, num_workers=2, multiprocessing_context=ctx,
        generator=torch.Generator().manual_seed(3),
    )
    report = {}
    if sys.argv[2] != "torch":
        pid = forkserver.server_pid()
        report["started_at_construction"] = pid is not None
        report["preload"] = list(mp.forkserver._forkserver._preload_modules)

        def has_torch():
            with open(f"/proc/{pid}/maps") as f:
                return "libtorch" in f.read()

        deadline = time.monotonic() + 120
        while not has_torch() and time.monotonic() < deadline:
            time.sleep(0.05)
        report["server_has_torch"] = has_torch()
    epochs = [list(loader) for _ in range(2)]
    sys.stdout.buffer.write(pickle.dumps((report, epochs)))
    """
)


def _run(lib: str) -> tuple:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, TESTS_DIR, lib],
        capture_output=True,
        timeout=240,
        cwd=TESTS_DIR,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return pickle.loads(proc.stdout)


@ferro_only
@time_limit(300)
def test_forkserver_workers_fork_from_a_warm_server_with_torchs_batches():
    """With forkserver, building the loader starts the fork server with
    torch, ferroloader's worker module and the dataset's module preloaded
    (the server has torch mapped before any worker starts); two epochs give
    torch's batches and worker seeds."""
    _, expected = _run("torch")
    report, got = _run("ferroloader")
    assert report["started_at_construction"], report
    for name in ("__main__", "torch", "numpy", "ferroloader.hosts.entry", "mp_helpers"):
        assert name in report["preload"], report
    assert report["server_has_torch"], report
    assert_same(expected, got)


@ferro_only
def test_a_loader_built_while_a_child_imports_main_starts_no_server(monkeypatch):
    """The fork server imports the main module to preload it; a loader built
    at that module's top level must not start a server from inside the
    server (one would start the next)."""
    import multiprocessing
    from multiprocessing import forkserver as mp_forkserver

    import ferroloader
    from ferroloader.hosts import forkserver

    server = mp_forkserver._forkserver
    monkeypatch.setattr(server, "_forkserver_pid", None)
    monkeypatch.setattr(server, "_preload_modules", ["__main__"])
    started = []
    monkeypatch.setattr(server, "ensure_running", lambda: started.append(True))
    ctx = multiprocessing.get_context("forkserver")
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    ferroloader.DataLoader(list(range(4)), num_workers=2, multiprocessing_context=ctx)
    assert started == []
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", False)
    loader = ferroloader.DataLoader(list(range(4)), num_workers=2, multiprocessing_context=ctx)
    assert started == [True]
    assert forkserver.preload_for(loader)[:3] == ["torch", "numpy", "ferroloader.hosts.entry"]


@ferro_only
def test_building_a_loader_leaves_the_start_method_unset():
    """Building a loader with workers does not fix the process's start
    method (torch's does not): set_start_method() still works after it."""
    code = textwrap.dedent(
        """
        import multiprocessing as mp
        import ferroloader
        ferroloader.DataLoader(list(range(4)), num_workers=2)
        assert mp.get_start_method(allow_none=True) is None
        mp.set_start_method("spawn")
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
