"""Runs torch's own DataLoader suite (pytorch/pytorch's
``test/test_dataloader.py``) twice: as written, and with ferroloader in
torch's place (``import ferroloader; ferroloader.patch()`` inserted after
the file's imports: every ``DataLoader`` it builds, by any name, is then
ferroloader's), and compares the outcomes test by test.

Usage: scripts/torch-suite [--rebind] PATH [pytest args...]

``--rebind`` swaps ferroloader in the way code that cannot be edited is
often made to use it instead: torch's names rebound to ferroloader's
class (``torch.utils.data.DataLoader``,
``torch.utils.data.dataloader.DataLoader``, and the file's own
``DataLoader``), no ``patch()``.

PATH is a checkout of the pytorch/pytorch repository, or its
``test/test_dataloader.py`` (the file is not in torch's wheel; it needs
the ``torch.testing._internal`` helpers the wheel does ship, so use the
file of the installed torch's version). Exits 1 when a test that passes
with torch fails with ferroloader, other than those in EXCEPTIONS (each
with its reason, also in docs/development.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from torchdata_suite import compare, run_both

# The line after which ferroloader takes torch's place: the last of the
# file's imports before its first test helper.
ANCHOR = "import operator\n"
SWAP = "import ferroloader\n\nferroloader.patch()\n"
REBIND = (
    "import ferroloader\n"
    "import torch.utils.data\n"
    "import torch.utils.data.dataloader\n\n"
    "torch.utils.data.DataLoader = ferroloader.DataLoader\n"
    "torch.utils.data.dataloader.DataLoader = ferroloader.DataLoader\n"
    "DataLoader = ferroloader.DataLoader\n"
)

# Tests that read what is private to torch's iterator.
EXCEPTIONS: dict[str, str] = {}


def main() -> int:
    args = sys.argv[1:]
    swap = SWAP
    if args[:1] == ["--rebind"]:
        swap, args = REBIND, args[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    src = Path(args[0])
    if src.is_dir():
        src = src / "test" / "test_dataloader.py"
    text = src.read_text()
    if text.count(ANCHOR) != 1:
        print(f"{src}: the line {ANCHOR.strip()!r} was not found once", file=sys.stderr)
        return 2
    ref, got = run_both(src.name, text, text.replace(ANCHOR, ANCHOR + swap), args[1:])
    return compare(ref, got, EXCEPTIONS, "torch", "ferroloader")


if __name__ == "__main__":
    sys.exit(main())
