"""``python -m ferroloader``: what a bug report needs to know about this
installation (versions, platform, the kernel facilities the engine uses,
the ``FERROLOADER_*`` settings in force)."""

from __future__ import annotations

import os
import platform
import sys


def _facility(name: str) -> str:
    """Whether this kernel offers ``name`` to this process (``memfd`` or
    ``pidfd``), tried the way the engine uses it."""
    try:
        if name == "memfd":
            os.close(os.memfd_create("ferroloader-probe", os.MFD_CLOEXEC))
        else:
            os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as e:
        return f"missing ({e.__class__.__name__}: {e})"
    return "available"


def report() -> str:
    """The report ``python -m ferroloader`` prints, one ``name: value`` a line."""
    import numpy
    import torch

    import ferroloader

    lines = [
        f"ferroloader: {ferroloader.__version__} ({os.path.dirname(ferroloader.__file__)})",
        f"python: {sys.version.split()[0]} ({platform.python_implementation()})",
        f"torch: {torch.__version__} (CUDA available: {torch.cuda.is_available()})",
        f"numpy: {numpy.__version__}",
        f"platform: {platform.platform()} ({platform.machine()})",
        f"cpus: {os.cpu_count()}",
        f"memfd: {_facility('memfd')}",
        f"pidfd: {_facility('pidfd')}",
    ]
    settings = sorted(k for k in os.environ if k.startswith("FERROLOADER_"))
    lines += [f"{k}={os.environ[k]}" for k in settings] or ["FERROLOADER_*: none set"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
