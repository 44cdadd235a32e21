"""What the tuner reads from the machine (Linux's ``/proc``): cores, memory
available, a process's PSS, private memory and CPU time, and the room the
file-descriptor limit leaves. Each reader answers a safe default where
``/proc`` is missing."""

from __future__ import annotations

import os
from typing import Any


def fd_room() -> int:
    """The workers the process's file-descriptor limit leaves room for
    (about six descriptors each, and the ones open now)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return 1 << 16
        return max(1, (soft - len(os.listdir("/proc/self/fd")) - 16) // 6)
    except (ImportError, OSError, ValueError):
        return 1 << 16


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
    """User and system CPU seconds of a process (``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return 0.0
