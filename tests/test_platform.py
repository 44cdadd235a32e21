"""Without the Linux facilities the engine uses beyond POSIX (simulated with
FERROLOADER_DISABLE): importing and num_workers=0 work; without memfd_create
multi-process loading raises one clear error saying what is missing;
without pidfd_open it works, finding deaths by probing pids."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from helpers import ferro_only, time_limit

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, sys.argv[1])
    import torch
    import ferroloader as fl
    import mp_helpers as mh
    # (a __main__ guard: under forkserver, Python 3.14's default, and
    # spawn, the workers import this script)
    if __name__ == "__main__":
        data = list(range(10))
        assert [int(b) for b in fl.DataLoader(data, batch_size=1)] == data
        print("nw=0 ok", flush=True)
        try:
            got = [int(b) for b in fl.DataLoader(data, batch_size=1, num_workers=2)]
        except Exception as e:
            print(f"nw=2 raised {type(e).__module__}.{type(e).__name__}: {e}", flush=True)
            sys.exit(0)
        assert got == data, got
        print("nw=2 ok", flush=True)
        # a worker killed mid-epoch is still named, within bounded time
        ds = mh.DyingDataset(8, die_at=2, how="sigkill", stamp=sys.argv[2])
        t0 = time.monotonic()
        try:
            list(fl.DataLoader(ds, batch_size=1, num_workers=1))
        except RuntimeError as e:
            print(f"death named after {time.monotonic() - t0:.1f} s: {e}", flush=True)
    """
)


def _run(tmp_path, disable: str) -> str:
    script = tmp_path / "probe.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, FERROLOADER_DISABLE=disable)
    proc = subprocess.run(
        [sys.executable, str(script), TESTS_DIR, str(tmp_path / "stamp")],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@ferro_only
@time_limit(200)
def test_without_memfd_one_process_works_and_workers_raise_a_clear_error(tmp_path):
    """No memfd_create: num_workers=0 loads; num_workers=2 raises
    SharedMemoryError naming memfd_create and the kernel it needs."""
    out = _run(tmp_path, "memfd")
    assert "nw=0 ok" in out
    assert "nw=2 raised ferroloader.errors.SharedMemoryError" in out, out
    assert "memfd_create" in out and "Linux 3.17" in out, out


@ferro_only
@time_limit(200)
def test_without_pidfd_workers_work_and_deaths_are_still_named(tmp_path):
    """No pidfd_open: workers load the same batches, and a killed worker is
    named (pid and signal) within a few seconds, found by probing."""
    out = _run(tmp_path, "pidfd")
    assert "nw=2 ok" in out, out
    line = next(x for x in out.splitlines() if x.startswith("death named after"))
    assert "killed by signal" in line, line
    assert float(line.split()[3]) < 10.0, line


_THREADS_SCRIPT = textwrap.dedent(
    """
    import ferroloader as fl
    try:
        list(fl.DataLoader(list(range(4)), num_workers=2, worker_method="thread"))
    except Exception as e:
        print(f"threads raised {type(e).__module__}.{type(e).__name__}: {e}", flush=True)
    else:
        print("threads ok", flush=True)
    """
)


@ferro_only
@time_limit(100)
def test_without_memfd_thread_workers_are_named_in_the_error(tmp_path):
    """No memfd_create: worker threads also hand batches over through memfd shared memory,
    so they raise the same SharedMemoryError, whose text says loading with workers (processes
    or threads) needs it, not multi-process loading alone."""
    script = tmp_path / "threads.py"
    script.write_text(_THREADS_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90,
        env=dict(os.environ, FERROLOADER_DISABLE="memfd"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "threads raised ferroloader.errors.SharedMemoryError" in out, out
    assert "loading with workers (worker processes or worker threads" in out, out
    assert "memfd_create" in out and "Linux 3.17" in out and "use num_workers=0" in out, out
    assert "multi-process" not in out, out
