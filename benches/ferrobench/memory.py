"""Peak memory of the process tree (summed RSS and PSS from /proc), and the
fresh child processes that measure it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Dict, List, Optional, Tuple

from . import ENTRY


def _children(pid: int) -> List[int]:
    kids: List[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
        return kids
    except OSError:
        pass
    for entry in os.listdir("/proc"):  # fallback: scan parents
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def _tree(pid: int) -> List[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def _mem_kib(pid: int) -> Tuple[int, int]:
    """(RSS, PSS) of one process in KiB; PSS falls back to RSS."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                    break
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                    break
    except (OSError, ValueError):
        pass
    return rss, pss or rss


class TreeMemSampler(threading.Thread):
    """Samples the summed RSS and PSS of this process and its descendants."""

    def __init__(self, interval: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak_rss = self.peak_pss = 0
        self.max_procs = 0
        self._stop_event = threading.Event()

    def sample(self) -> None:
        pids = _tree(os.getpid())
        mems = [_mem_kib(p) for p in pids]
        self.peak_rss = max(self.peak_rss, sum(m[0] for m in mems))
        self.peak_pss = max(self.peak_pss, sum(m[1] for m in mems))
        self.max_procs = max(self.max_procs, len(pids))

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.sample()


def _file_pss_kib(pid: int, path: str) -> int:
    """PSS of ``pid``'s mappings of ``path`` (KiB)."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if not line[0].isupper() or line.split()[0].count("-") == 1:
                    inside = line.rstrip().endswith(path)
                elif inside and line.startswith("Pss:"):
                    total += int(line.split()[1])
    except (OSError, ValueError):
        pass
    return total


def run_marked_child(flag: str, arg: str, mark: str, quick: bool, timeout: int) -> Dict[str, Any]:
    """Runs the entry point (bench_vs_torch.py) as ``flag arg`` in a fresh
    process, in a session of its own; the JSON it prints after ``mark``.
    Its output goes to files, not pipes, and its session is killed when it
    ends: a worker a peer leaves behind (torchdata's forked ones can hang)
    would otherwise hold the pipes open, and this wait, forever."""
    cmd = [sys.executable, ENTRY, flag, arg]
    if quick:
        cmd.append("--quick")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            rc: Optional[int] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    for line in stdout.splitlines():
        if line.startswith(mark):
            result: Dict[str, Any] = json.loads(line[len(mark) :])
            return result
    state = f"rc={rc}" if rc is not None else f"timed out after {timeout} s"
    raise RuntimeError(f"child {flag} {arg} failed ({state}):\n{stderr[-3000:]}")
