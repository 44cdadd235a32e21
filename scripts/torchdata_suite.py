"""Runs torchdata's own StatefulDataLoader resume suite twice: as written
(with torchdata's class), and with ferroloader's in its place (its one import
line swapped: ``ferroloader.stateful_dataloader``), and compares the
outcomes test by test.

Usage: scripts/torchdata-suite [--dataloader] PATH [pytest args...]

``--dataloader`` swaps in ``ferroloader.DataLoader`` itself, which follows
torch where torchdata's class differs from it (one test, listed).

PATH is a checkout of the pytorch/data repository, or its
``test/stateful_dataloader/test_state_dict.py``. The file is not in
torchdata's wheel (and torchdata publishes no source distribution), so it is
not part of the test command; see docs/development.md. Exits 1 when a test that
passes with torchdata fails with ferroloader, other than those listed in
EXCEPTIONS (each with its reason, also in docs/development.md).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

IMPORT = "from torchdata.stateful_dataloader import Stateful, StatefulDataLoader\n"
SWAPPED = "from ferroloader.stateful_dataloader import Stateful, StatefulDataLoader\n"
SWAPPED_DATALOADER = (
    "from ferroloader.stateful_dataloader import Stateful\n"
    "from ferroloader import DataLoader as StatefulDataLoader\n"
)

# Tests that read torchdata's private state layout.
EXCEPTIONS = {
    "TestInitialState_shard0::test_initial_state": "reads state['_snapshot']['_worker_snapshots']",
    "TestInitialState_shard0::test_load_state_after_initial_state_dict": "reads state['_snapshot']",
    "TestDynamicStateIterableDataset_shard0::test": "reads state['_snapshot'] worker states",
    "TestDatasetIteratorStateDuplication_shard0::test": "reads state['_snapshot'] and "
    "state['fetcher_state']",
    "TestSingleIterCalled_shard0::test_inline": "reads state['dataset_state'] layout",
    "TestSingleIterCalled_shard0::test_inline_iter": "reads state['fetcher_state']",
    "TestSingleIterCalled_shard0::test_mp": "reads state['_snapshot']",
    "TestSingleIterCalled_shard0::test_mp_iter": "reads state['_snapshot']",
    "TestOutOfOrderWithCheckpointing::test_out_of_order_iterable_ds_one_completed_worker": (
        "reads state['_snapshot'] fetcher_ended"
    ),
    "TestOutOfOrderWithCheckpointing::test_out_of_order_iterable_ds_no_completed_workers": (
        "reads state['_snapshot'] fetcher_ended"
    ),
}
# With ferroloader.DataLoader: where torchdata's class differs from torch's.
EXCEPTIONS_DATALOADER = {
    "TestInitialState_shard0::test_init_error": "expects worker_init_fn's error at iter(); "
    "torch (and so ferroloader.DataLoader) raises it at the first next()",
}


def _outcomes(test_file: Path, extra: list[str]) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "report.xml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--timeout",
                "300",
                f"--junitxml={report}",
                str(test_file),
                *extra,
            ],
            cwd=test_file.parent,
            check=False,
        )
        out: dict[str, str] = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            kinds = {child.tag for child in case}
            if kinds & {"failure", "error"}:
                out[name] = "failed"
            elif "skipped" in kinds:
                out[name] = "skipped"
            else:
                out[name] = "passed"
        return out


def main() -> int:
    args = sys.argv[1:]
    plain = bool(args) and args[0] == "--dataloader"
    if plain:
        args = args[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    swapped = SWAPPED_DATALOADER if plain else SWAPPED
    exceptions = {**EXCEPTIONS, **EXCEPTIONS_DATALOADER} if plain else EXCEPTIONS
    src = Path(args[0])
    if src.is_dir():
        src = src / "test" / "stateful_dataloader" / "test_state_dict.py"
    text = src.read_text()
    if text.count(IMPORT) != 1:
        print(f"{src}: the StatefulDataLoader import line was not found once", file=sys.stderr)
        return 2
    extra = args[1:]
    ref, got = run_both(src.name, text, text.replace(IMPORT, swapped), extra)
    name = "ferroloader.DataLoader" if plain else "ferroloader's StatefulDataLoader"
    return compare(ref, got, exceptions, "torchdata", name)


def run_both(
    name: str, theirs: str, ours: str, extra: list[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Each outcome of test file ``name`` as written (``theirs``) and as
    swapped (``ours``), each run in a directory of its own."""
    with tempfile.TemporaryDirectory() as d:
        outcomes = []
        for side, body in (("theirs", theirs), ("ours", ours)):
            path = Path(d) / side / name
            path.parent.mkdir()
            path.write_text(body)
            outcomes.append(_outcomes(path, extra))
    return outcomes[0], outcomes[1]


def compare(
    ref: dict[str, str], got: dict[str, str], exceptions: dict[str, str], theirs: str, ours: str
) -> int:
    """Prints how the tests that pass with ``theirs`` fare with ``ours`` in
    its place; 1 if one fails that is not excepted."""
    passing = sorted(t for t, o in ref.items() if o == "passed")
    regressions = [t for t in passing if got.get(t) != "passed" and t not in exceptions]
    excepted = [t for t in passing if got.get(t) != "passed" and t in exceptions]
    both = [t for t in passing if got.get(t) == "passed"]
    print(f"\n{theirs} passes {len(passing)} of {len(ref)} tests")
    print(f"{ours} in its place passes {len(both)} of those")
    for t in excepted:
        print(f"  excepted: {t}: {exceptions[t]}")
    for t in regressions:
        print(f"  FAILS: {t}")
    print(f"{len(both)} passed, {len(regressions)} failed, {len(excepted)} skipped")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
