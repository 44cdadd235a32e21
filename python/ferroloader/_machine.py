"""What the tuner reads from the machine (Linux's ``/proc``): cores, memory
available, a process's PSS, private memory and CPU time, and the room the
file-descriptor limit leaves. Each reader answers a safe default where
``/proc`` is missing."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

# File descriptors the main process holds per worker (its socket, mailbox,
# pidfd, multiprocessing's sentinel and pipes), and a margin for the start.
FDS_PER_WORKER = 6
FDS_MARGIN = 8


def free_fds() -> Optional[tuple[int, int]]:
    """``(limit, free)``: the process's soft limit on open files and how
    many are free under it; ``None`` when unlimited or unknown (no
    ``resource`` module or no ``/proc``)."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        used = sum(1 for fd in os.listdir("/proc/self/fd") if int(fd) < limit)
    except (ImportError, OSError, ValueError):
        return None
    return limit, limit - used


def fd_room() -> int:
    """The workers the free file descriptors leave room for."""
    free = free_fds()
    if free is None:
        return 1 << 16
    return max(1, (free[1] - FDS_MARGIN) // FDS_PER_WORKER)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def _rollup(pid: Any, key: str) -> int:
    """A field of ``/proc/PID/smaps_rollup``, in bytes (0 if unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def private_dirty() -> int:
    """This process's private, written memory: what a forked worker's
    copy can grow to as it touches the objects (their reference counts)."""
    return _rollup("self", "Private_Dirty:")


def pss(pid: int) -> int:
    return _rollup(pid, "Pss:")


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: Any) -> float:
    """CPU seconds of a process, all its threads: its CPU-time clock
    (Linux numbers a process's clock from its pid, as
    ``clock_getcpuclockid`` does), else ``/proc/PID/stat``'s ticks. (A
    tick is 10 ms: read over a 25 ms epoch, a worker's CPU was off by up
    to 40 %.)"""
    if pid == "self":
        return time.process_time()
    if sys.platform.startswith("linux"):
        try:
            return time.clock_gettime(((~int(pid)) << 3) | 2)  # (CPUCLOCK_SCHED)
        except (OSError, ValueError, OverflowError):
            pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return 0.0
