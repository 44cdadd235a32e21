"""ferroloader's own exception classes: each has a torch-compatible base, so
``except`` clauses written for ``torch.utils.data`` keep working, and each
engine failure raises its class."""

from __future__ import annotations

import os
import pickle
import time

import ferroloader
import pytest
import torch
from ferroloader import errors
from helpers import needs_test_doubles

# Every class ferroloader raises itself, with the exception torch raises in
# the same place (the class must also subclass it).
TORCH_BASE: dict[type[BaseException], type[BaseException]] = {
    errors.SharedMemoryError: RuntimeError,
    errors.SharedMemoryLimitError: RuntimeError,
    errors.WorkerDiedError: RuntimeError,
    errors.WorkerTimeoutError: RuntimeError,
    errors.ProtocolError: RuntimeError,
    errors.InternalError: RuntimeError,
    # torch's own store raises RuntimeError subclasses (DistStoreError)
    errors.ShardQueueError: RuntimeError,
    # a worker lost where torch's loader has none (a Ray actor): a worker death
    errors.RayWorkerLost: RuntimeError,
    errors.ConfigError: ValueError,
    # raised where torchdata's StatefulDataLoader raises AssertionError
    errors.StateMismatchError: AssertionError,
}


def test_every_error_class_is_listed_with_its_torch_base():
    """The table above names every class in ``ferroloader.errors``; each is a
    FerroloaderError and a subclass of the exception torch raises there."""
    exported = {getattr(errors, name) for name in errors.__all__} - {errors.FerroloaderError}
    # the warning classes: UserWarnings, not errors
    warning_classes = {errors.RebuiltAsTorchWarning, errors.ThreadSafetyWarning,
                       errors.CacheBudgetWarning}
    for w in warning_classes:
        assert issubclass(w, UserWarning) and not issubclass(w, errors.FerroloaderError)
        assert getattr(ferroloader, w.__name__) is w
    assert exported - warning_classes == set(TORCH_BASE)
    for cls, base in TORCH_BASE.items():
        assert issubclass(cls, errors.FerroloaderError), cls
        assert issubclass(cls, base), (cls, base)
        assert getattr(ferroloader, cls.__name__) is cls


@pytest.mark.parametrize("cls", sorted(TORCH_BASE, key=lambda c: c.__name__))
def test_error_classes_survive_pickling(cls):
    """A worker's exception crosses processes pickled (torch's
    ExceptionWrapper keeps the class), so each class round-trips."""
    e = cls("message")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and str(back) == "message"


class _Big(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(4 << 20, dtype=torch.uint8)


@pytest.mark.timeout(60)
def test_shared_memory_limit_is_its_own_runtime_error(monkeypatch):
    """A batch larger than the arena's limit raises SharedMemoryLimitError,
    which ``except RuntimeError`` also catches, naming the variable."""
    monkeypatch.setenv("FERROLOADER_SHM_LIMIT", "2M")
    loader = ferroloader.DataLoader(_Big(), batch_size=2, num_workers=1)
    with pytest.raises(errors.SharedMemoryLimitError, match="FERROLOADER_SHM_LIMIT"):
        next(iter(loader))


@pytest.mark.parametrize(
    "name,value",
    [
        ("FERROLOADER_SHM_LIMIT", "lots"),
        ("FERROLOADER_SHM_LIMIT", "inf"),
        ("FERROLOADER_SHM_LIMIT", "nan"),
        ("FERROLOADER_SHM_LIMIT", "1e30"),
        ("FERROLOADER_SHM_LIMIT", "-5M"),
        ("FERROLOADER_SHM_LIMIT", "0"),
        ("FERROLOADER_SPIN_US", "fast"),
        ("FERROLOADER_SPIN_US", "-1"),
        ("FERROLOADER_SPIN_US", "1e99"),
        ("FERROLOADER_WARN_WAITING", "often"),
        ("FERROLOADER_WARN_WAITING", "1.5"),
        ("FERROLOADER_WARN_WAITING", "0"),
        ("FERROLOADER_DISABLE", "memfs"),
        ("FERROLOADER_DISABLE", "pidfd,cuda"),
    ],
)
@pytest.mark.parametrize("nw", [0, 1])
def test_a_bad_setting_is_a_config_error(monkeypatch, name, value, nw):
    """A setting the engine cannot use is a ConfigError (a ValueError) naming
    it, raised by iter() before any worker starts: never a bare
    OverflowError, a worker that dies, or a value silently ignored."""
    monkeypatch.setenv(name, value)
    loader = ferroloader.DataLoader(list(range(4)), num_workers=nw)
    with pytest.raises(ValueError, match=name) as ei:
        iter(loader)
    assert isinstance(ei.value, errors.ConfigError)


def test_an_unknown_facility_to_disable_names_the_accepted_ones(monkeypatch):
    """A misspelt FERROLOADER_DISABLE entry is refused, naming the variable, the bad name and
    every name it takes, instead of being ignored (the facility would stay on)."""
    monkeypatch.setenv("FERROLOADER_DISABLE", "memfs")
    with pytest.raises(errors.ConfigError) as e:
        iter(ferroloader.DataLoader(list(range(4))))
    assert str(e.value) == (
        "FERROLOADER_DISABLE='memfs' names 'memfs', which is not a facility ferroloader can "
        "turn off; it takes a comma-separated list of memfd, pidfd, cuda-register"
    )


@pytest.mark.parametrize(
    "name,value", [("FERROLOADER_SHM_LIMIT", "1e18"), ("FERROLOADER_SHM_LIMIT", "64T"),
                   ("FERROLOADER_SPIN_US", " 50 "), ("FERROLOADER_WARN_WAITING", "0.5"),
                   # (not memfd or pidfd: the engine reads the list once per process)
                   ("FERROLOADER_DISABLE", " CUDA-register, ")]
)
def test_good_settings_are_taken(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    loader = ferroloader.DataLoader(list(range(6)), batch_size=3, num_workers=2)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5]]


class _Exits(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 3:
            os._exit(7)
        return i


@pytest.mark.timeout(60)
def test_a_dead_worker_is_a_worker_died_error_with_torch_message():
    """A worker that exits mid-epoch raises WorkerDiedError (a RuntimeError)
    with torch's message naming its pid and exit code."""
    loader = ferroloader.DataLoader(_Exits(), batch_size=1, num_workers=1)
    with pytest.raises(errors.WorkerDiedError, match=r"exited unexpectedly with exit code 7"):
        list(loader)


class _Slow(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        time.sleep(3)
        return i


@pytest.mark.timeout(60)
def test_a_timeout_is_a_worker_timeout_error_with_torch_message():
    """``timeout=`` that passes raises WorkerTimeoutError (a RuntimeError)
    with torch's exact message."""
    loader = ferroloader.DataLoader(_Slow(), num_workers=1, timeout=0.5)
    with pytest.raises(errors.WorkerTimeoutError) as ei:
        next(iter(loader))
    assert str(ei.value) == "DataLoader timed out after 0.5 seconds"


class _Raises(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        raise KeyError("user's own")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_user_exceptions_keep_their_type(num_workers):
    """An exception from the user's dataset is re-raised with its own type,
    never wrapped in a ferroloader class."""
    loader = ferroloader.DataLoader(_Raises(), num_workers=num_workers)
    with pytest.raises(KeyError) as ei:
        next(iter(loader))
    assert not isinstance(ei.value, errors.FerroloaderError)


def test_a_panic_at_the_boundary_is_an_internal_error():
    """A Rust panic (a defect) crossing into Python is InternalError, an
    Exception (PyO3's own PanicException is a BaseException that `except
    Exception` misses), naming where it happened."""
    from ferroloader import _core

    needs_test_doubles()

    with pytest.raises(errors.InternalError, match="a deliberate test failed") as e:
        _core._panic_in_guard()
    assert isinstance(e.value, Exception) and isinstance(e.value, RuntimeError)
    # it says how to report it (the README's bug section)
    assert "python -m ferroloader" in str(e.value)
