#!/usr/bin/env python3
"""Side-by-side bench: ``torch.utils.data`` against ``ferroloader`` in one run.

The entry point of ``scripts/bench``; the bench itself is the package beside
this file, ``benches/ferrobench`` (its docstring lists the scenarios and
their targets; ``ferrobench/cli.py`` holds the options and ``main``).

Usage::

    python benches/bench_vs_torch.py [--repeats 7] [--scenarios a,b] [--quick] [--json PATH]
"""

from __future__ import annotations

import sys

# Imported here, not under __main__: a spawned worker runs this file as
# __mp_main__ and so loads the whole bench, as it did when it was one file.
from ferrobench.cli import main

if __name__ == "__main__":
    sys.exit(main())
