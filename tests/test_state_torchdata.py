"""A script written for torchdata's StatefulDataLoader resumes the same with
ferroloader after changing only its import; ``ferroloader.StatefulDataLoader``
reports a worker's failed setup at ``iter()`` as torchdata does, where
``DataLoader`` follows torch (the first ``next()``)."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import ferroloader as fl
import pytest
import torch
import torch.utils.data as tud
from helpers import ferro_only, time_limit

SCRIPT = Path(__file__).parent / "scripts" / "resume_torchdata.py"
TORCHDATA_IMPORT = "from torchdata.stateful_dataloader import StatefulDataLoader\n"
FERRO_IMPORT = "from ferroloader.stateful_dataloader import StatefulDataLoader\n"

pytestmark = [ferro_only]


def _run(source: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(source)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=280)


@time_limit(300)
def test_script_passes_with_torchdata_and_with_ferroloader(tmp_path):
    """The torchdata resume script passes under StatefulDataLoader, and again
    with its one import line swapped for ferroloader's."""
    pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata (a test extra) is not installed"
    )
    source = SCRIPT.read_text()
    assert source.count(TORCHDATA_IMPORT) == 1
    ref = _run(source, tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    swapped = source.replace(TORCHDATA_IMPORT, FERRO_IMPORT)
    imports = [ln for ln in swapped.splitlines() if ln.startswith(("import ", "from "))]
    assert not [ln for ln in imports if "torchdata" in ln]
    ours = _run(swapped, tmp_path)
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert ours.stdout == ref.stdout


def _fail_in_worker_1(worker_id: int) -> None:
    if worker_id == 1:
        raise ValueError("worker 1 could not set up")


class _BadFirstItem(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 0:
            raise KeyError("item 0")
        return i


class _IterFailsOnSecondEpoch(tud.IterableDataset):
    """Each replica's second ``iter()`` raises (counted in the replica)."""

    def __init__(self) -> None:
        self.epochs = 0

    def __iter__(self) -> Iterator[int]:
        self.epochs += 1
        if self.epochs == 2:
            raise RuntimeError("cannot open epoch 2")
        info = tud.get_worker_info()
        assert info is not None
        return iter(range(info.id, 8, info.num_workers))


def _no_children_left() -> bool:
    return not multiprocessing.active_children()


@time_limit(60)
def test_stateful_loader_raises_a_failed_worker_init_at_iter():
    dl = fl.StatefulDataLoader(
        list(range(40)), batch_size=4, num_workers=2, worker_init_fn=_fail_in_worker_1
    )
    with pytest.raises(ValueError, match="worker 1 could not set up"):
        iter(dl)
    assert dl._iterator is None
    assert _no_children_left()


@time_limit(60)
def test_dataloader_raises_a_failed_worker_init_at_next_as_torch_does():
    seen = []
    for cls in (tud.DataLoader, fl.DataLoader):
        dl = cls(list(range(40)), batch_size=4, num_workers=2, worker_init_fn=_fail_in_worker_1)
        it = iter(dl)  # no error yet, in either
        got: list[Any] = []
        with pytest.raises(ValueError, match="worker 1 could not set up"):
            while True:
                got.append(next(it))
        seen.append([b.tolist() for b in got])
        del it
    assert seen[0] == seen[1] == [[0, 1, 2, 3]]


@time_limit(60)
def test_stateful_loader_reports_a_failing_item_at_next_not_at_iter():
    """Only setup errors move to iter(): a dataset's error stays the batch's,
    and the batches after it still come, as in torch."""
    dl = fl.StatefulDataLoader(_BadFirstItem(), batch_size=2, num_workers=2)
    it = iter(dl)
    with pytest.raises(KeyError, match="item 0"):
        next(it)
    assert [b.tolist() for b in it] == [[2, 3], [4, 5], [6, 7]]


@time_limit(60)
def test_stateful_loader_raises_a_persistent_replicas_failed_iter_at_iter():
    dl = fl.StatefulDataLoader(
        _IterFailsOnSecondEpoch(), batch_size=None, num_workers=2, persistent_workers=True
    )
    assert sorted(dl) == list(range(8))
    with pytest.raises(RuntimeError, match="cannot open epoch 2"):
        iter(dl)


class _Draws(tud.Dataset):
    """Each item with a draw from the worker's global generator (the base
    seed shows in it)."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, int(torch.randint(0, 1 << 30, ()).item())


def _shuffled(cls: Any, num_workers: int, generator: bool, persistent: bool) -> Any:
    g = torch.Generator().manual_seed(5) if generator else None
    return cls(
        _Draws(),
        batch_size=4,
        shuffle=True,
        num_workers=num_workers,
        persistent_workers=persistent,
        generator=g,
    )


def _epochs(cls: Any, num_workers: int, generator: bool, persistent: bool) -> list[Any]:
    torch.manual_seed(123)
    dl = _shuffled(cls, num_workers, generator, persistent)
    out: list[Any] = [[(a.tolist(), b.tolist()) for a, b in dl] for _ in range(3)]
    return [*out, torch.randint(0, 1 << 30, (2,)).tolist()]


CONFIGS = [(0, False, False), (0, True, False), (2, False, False), (2, True, True)]


@time_limit(120)
@pytest.mark.parametrize(("num_workers", "generator", "persistent"), CONFIGS)
def test_stateful_loader_draws_what_torchdatas_draws(num_workers, generator, persistent):
    """torchdata's shuffle draws otherwise than torch's (its own sampler,
    drawn when iterated, twice with workers): every batch, every worker draw
    and the global generator after three epochs are torchdata's."""
    torchdata = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata (a test extra) is not installed"
    )
    theirs = _epochs(torchdata.StatefulDataLoader, num_workers, generator, persistent)
    assert _epochs(fl.StatefulDataLoader, num_workers, generator, persistent) == theirs


def _resumed(cls: Any, num_workers: int, generator: bool, persistent: bool) -> list[Any]:
    """One epoch, two batches of the next, a state (through JSON for
    ferroloader's), and the rest of that epoch from it on a new loader."""

    def make() -> Any:
        return _shuffled(cls, num_workers, generator, persistent)

    torch.manual_seed(123)
    dl = make()
    first = [(a.tolist(), b.tolist()) for a, b in dl]
    it = iter(dl)
    head = [(a.tolist(), b.tolist()) for a, b in itertools.islice(it, 2)]
    saved = dl.state_dict()
    if cls is fl.StatefulDataLoader:
        saved = json.loads(json.dumps(saved))  # torchdata's holds its sampler's tensor
    del it, dl
    torch.manual_seed(999)  # the state, not the global generator, decides
    again = make()
    again.load_state_dict(saved)
    return [first, head + [(a.tolist(), b.tolist()) for a, b in again]]


@time_limit(120)
@pytest.mark.parametrize(("num_workers", "generator", "persistent"), CONFIGS)
def test_stateful_loader_resumes_as_torchdatas_does(num_workers, generator, persistent):
    """A state taken in the second epoch resumes into the rest of the
    uninterrupted run, as torchdata's own resume does. Workers' draws are
    torchdata's resumed ones (neither keeps a worker's global generator);
    without workers ferroloader's state holds the global generator, so the
    draws are the uninterrupted run's, where torchdata's are not."""
    torchdata = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata (a test extra) is not installed"
    )
    theirs = _resumed(torchdata.StatefulDataLoader, num_workers, generator, persistent)
    ours = _resumed(fl.StatefulDataLoader, num_workers, generator, persistent)
    uninterrupted = _epochs(torchdata.StatefulDataLoader, num_workers, generator, persistent)
    assert ours[0] == theirs[0] == uninterrupted[0]
    assert [i for i, _ in ours[1]] == [i for i, _ in theirs[1]] == [i for i, _ in uninterrupted[1]]
    assert ours[1] == (uninterrupted[1] if num_workers == 0 else theirs[1])


class _CountingMap(tud.Dataset):
    """A map-style dataset with state methods (its state lives in each
    worker's replica), as torchdata's test suite's DummyMapDataset."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.fetched = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.fetched += 1
        return i

    def state_dict(self) -> dict[str, Any]:
        return {"fetched": self.fetched}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fetched = state["fetched"]


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("persistent", [False, True])
def test_state_dict_right_after_a_load_is_the_loaded_state(num_workers, persistent):
    """torchdata's contract: state_dict() after load_state_dict() and before
    a batch is taken returns the loaded state (also now that it started the
    resumed iterator), and the resume then gives the rest of the epoch
    (torchdata's test_load_state_before_initial_state_dict)."""
    persistent = persistent and num_workers > 0

    def make():
        # (a lambda collate_fn reaches workers only by fork)
        return fl.StatefulDataLoader(
            _CountingMap(20), batch_size=2, num_workers=num_workers,
            persistent_workers=persistent, collate_fn=lambda b: b,
            multiprocessing_context="fork" if num_workers else None,
        )

    dl = make()
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = dl.state_dict()
    rest = list(it)
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert list(resumed) == rest
