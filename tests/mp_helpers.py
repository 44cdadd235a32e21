"""Datasets and helpers for the multi-process tests.

Everything a worker process may need (dataset classes, ``worker_init_fn``,
``collate_fn``, batch types) lives at module level here, so that it pickles
by reference and a ``spawn`` / ``forkserver`` worker can import it. This module
imports only the standard library, torch and numpy: never ``ferroloader``
(the side under test is handed in as ``lib``) and never pytest.

The ``/proc`` helpers (children, process states, fds, mappings, /dev/shm) are
Linux-only and used by the main (test) process.
"""

from __future__ import annotations

import collections
import ctypes
import os
import random
import re
import signal
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.utils.data as tud

SELFCHECK = os.environ.get("FERROLOADER_TESTS_SELFCHECK") == "1"

# A module attribute that a test sets in the main process: a forked worker
# sees the new value, a spawned / forkserver worker imports this module afresh
# and sees the default.
MAIN_MARKER = "imported"

Point = collections.namedtuple("Point", ["x", "y"])


# --------------------------------------------------------------------------- #
# samples
# --------------------------------------------------------------------------- #

SAMPLE_KINDS = (
    "int",
    "float",
    "tensor",
    "numpy",
    "str",
    "dict",
    "tuple",
    "namedtuple",
    "nested",
)


def make_sample(i: int, kind: str) -> Any:
    if kind == "int":
        return i
    if kind == "float":
        return i / 4
    if kind == "tensor":
        return torch.arange(6, dtype=torch.float32).reshape(2, 3) * i
    if kind == "numpy":
        return np.arange(4, dtype=np.int32) + i
    if kind == "str":
        return f"s{i}"
    if kind == "dict":
        return {
            "x": torch.full((3,), float(i)),
            "y": i,
            "name": f"n{i}",
            "arr": np.array([i, -i], dtype=np.float64),
        }
    if kind == "tuple":
        return (i, torch.tensor([i, i + 1], dtype=torch.int16), f"t{i}")
    if kind == "namedtuple":
        return Point(x=i, y=torch.tensor(float(i)))
    if kind == "nested":
        return {
            "pair": (torch.tensor([i]), [i * 2, f"k{i}"]),
            "meta": {"id": i, "vals": np.full((2, 2), i, dtype=np.uint8)},
        }
    raise ValueError(kind)


class MapDataset(tud.Dataset):
    """Map-style dataset of `n` samples of one kind."""

    def __init__(self, n: int, kind: str = "int") -> None:
        self.n = n
        self.kind = kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return make_sample(i, self.kind)


class JitterDataset(MapDataset):
    """MapDataset whose samples take 0-8 ms each (pseudo-random per index), so
    that workers finish out of order and the loader must reorder."""

    def __getitem__(self, i: int) -> Any:
        time.sleep(((i * 7) % 5) * 0.002)
        return make_sample(i, self.kind)


class PidDataset(tud.Dataset):
    """Each sample records the pid that produced it and how many samples the
    dataset replica had produced before it (state kept by the replica)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        self.calls += 1
        return {"i": i, "calls": self.calls, "pid": os.getpid()}


# above the length from which the engine hands a live iterator's
# permutation over to a resume beside it (``src/sampler/recent.rs``)
LARGE = 70_001


class Indices(tud.Dataset):
    """``dataset[i] == i`` for ``n`` samples (by default ``LARGE``: long
    enough that each layout change, or a resume beside the live iterator,
    takes the epoch's permutation over instead of drawing it again)."""

    def __init__(self, n: int = LARGE) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class GetitemsDataset(tud.Dataset):
    """Defines ``__getitems__``; samples say which method built them and where."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"i": i, "via": "getitem", "pid": os.getpid()}

    def __getitems__(self, indices: list) -> list:
        return [{"i": i, "via": "getitems", "pid": os.getpid()} for i in indices]


def collate_with_pid(batch: list) -> dict:
    """A custom collate_fn: records the process that ran it."""
    return {
        "items": list(batch),
        "sum": torch.tensor(sum(batch)),
        "pid": os.getpid(),
    }


def collate_tensor_and_array(batch: list) -> dict:
    """A custom collate_fn returning a tensor, an ndarray and plain objects."""
    return {
        "t": torch.stack([torch.as_tensor(s) for s in batch]),
        "a": np.stack([np.asarray(s) for s in batch]),
        "n": len(batch),
        "tag": "custom",
    }


class RngDataset(tud.Dataset):
    """Draws from the worker's global generators.

    Each sample carries the draws made for it (these depend on which worker
    served which index, i.e. on the dispatch order) and the draws made at the
    replica's first call (these depend only on the worker's seeding)."""

    def __init__(self, n: int, info_fn: Callable[[], Any]) -> None:
        self.n = n
        self.info_fn = info_fn
        self.first: Optional[dict] = None

    def __len__(self) -> int:
        return self.n

    def _draw(self) -> dict:
        return {
            "torch_initial_seed": torch.initial_seed(),
            "random": random.random(),
            "numpy": float(np.random.rand()),
            "torch_rand": torch.rand(2),
        }

    def __getitem__(self, i: int) -> dict:
        info = self.info_fn()
        if self.first is None:
            self.first = {"wid": -1 if info is None else info.id, **self._draw()}
        return {
            "i": i,
            "wid": -1 if info is None else info.id,
            "first": dict(self.first),
            "now": self._draw(),
        }


class WorkerInfoDataset(tud.Dataset):
    """Returns what ``get_worker_info()`` says inside the worker."""

    def __init__(self, n: int, info_fn: Callable[[], Any]) -> None:
        self.n = n
        self.info_fn = info_fn

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        info = self.info_fn()
        # Mutate the replica: the main process's dataset must not see this.
        self.touched_by = os.getpid()
        if info is None:
            return {"i": i, "info": None}
        return {
            "i": i,
            "id": info.id,
            "num_workers": info.num_workers,
            "seed": info.seed,
            "dataset_is_self": info.dataset is self,
            "dataset_type": type(info.dataset).__name__,
            "pid": os.getpid(),
        }


class MarkerDataset(tud.Dataset):
    """Returns the worker's view of ``MAIN_MARKER`` (fork vs spawn)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple:
        return (i, MAIN_MARKER, torch.tensor([i, i * i]))


def collate_marker(batch: list) -> dict:
    """A custom collate_fn reporting the worker's view of MAIN_MARKER."""
    return {
        "i": [s[0] for s in batch],
        "t": torch.stack([s[2] for s in batch]),
        "marker": MAIN_MARKER,
        "pid": os.getpid(),
    }


def record_init(path: str, info_fn: Callable[[], Any], worker_id: int) -> None:
    """A worker_init_fn (use with functools.partial): appends one line per call."""
    info = info_fn()
    info_id = None if info is None else info.id
    with open(path, "a") as f:
        f.write(f"{worker_id} {os.getpid()} {info_id}\n")


def read_init_log(path: str) -> list:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            wid, pid, info_id = line.split()
            out.append((int(wid), int(pid), None if info_id == "None" else int(info_id)))
    return out


class FetchLogDataset(tud.Dataset):
    """Appends every fetched index to a file (workers share it)."""

    def __init__(self, n: int, path: str) -> None:
        self.n = n
        self.path = path

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        with open(self.path, "a") as f:
            f.write(f"{i}\n")
        return i


def count_lines(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for _ in f)


class SlowDataset(tud.Dataset):
    """Sleeps `delay` seconds for indices >= slow_from (or only those in `only`)."""

    def __init__(
        self, n: int, delay: float, slow_from: int = 0, only: Optional[tuple] = None
    ) -> None:
        self.n = n
        self.delay = delay
        self.slow_from = slow_from
        self.only = only

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        slow = i in self.only if self.only is not None else i >= self.slow_from
        if slow:
            time.sleep(self.delay)
        return i


class SharedCountDataset(tud.Dataset):
    """Holds a multiprocessing Value (and its lock), as a dataset counting
    the samples its workers read does: it may travel to a spawned worker
    only while the process starts."""

    def __init__(self, n: int, method: str) -> None:
        import multiprocessing

        self.n = n
        self.count = multiprocessing.get_context(method).Value("i", 0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        with self.count.get_lock():
            self.count.value += 1
        return i


class TensorDataset(tud.Dataset):
    """Samples are float32 tensors of `numel` elements filled with the index."""

    def __init__(self, n: int, numel: int) -> None:
        self.n = n
        self.numel = numel

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((self.numel,), float(i), dtype=torch.float32)


class ArrayDataset(tud.Dataset):
    """Samples are numpy float32 arrays of `numel` elements filled with the index."""

    def __init__(self, n: int, numel: int) -> None:
        self.n = n
        self.numel = numel

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full((self.numel,), float(i), dtype=np.float32)


# --------------------------------------------------------------------------- #
# faults
# --------------------------------------------------------------------------- #


class TwoArgError(Exception):
    """An exception that cannot be rebuilt from a single message argument."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


class FailingDataset(tud.Dataset):
    """Raises at index `fail_at` (set it to None to stop failing)."""

    def __init__(self, n: int, fail_at: Optional[int], kind: str = "value") -> None:
        self.n = n
        self.fail_at = fail_at
        self.kind = kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.fail_at:
            if self.kind == "value":
                raise ValueError(f"bad sample {i}")
            if self.kind == "key":
                raise KeyError(f"missing key {i}")
            if self.kind == "twoarg":
                raise TwoArgError(7, f"detail {i}")
            raise RuntimeError(f"runtime {i}")
        return i


def failing_collate(batch: list) -> Any:
    if 5 in batch:
        raise ValueError(f"collate refused {batch}")
    return torch.tensor(batch)


def failing_init(worker_id: int) -> None:
    if worker_id == 1:
        raise ValueError(f"init failed in worker {worker_id}")


class DyingDataset(tud.Dataset):
    """At index `die_at` the worker writes '<pid> <time>' to `stamp` and dies.

    how: 'sigkill' (os.kill SIGKILL), 'exit3' (os._exit(3)), 'segv' (reads
    address 0 through ctypes)."""

    def __init__(self, n: int, die_at: Optional[int], how: str, stamp: str) -> None:
        self.n = n
        self.die_at = die_at
        self.how = how
        self.stamp = stamp

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.die_at:
            with open(self.stamp, "w") as f:
                f.write(f"{os.getpid()} {time.time()!r}\n")
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.how == "exit3":
                os._exit(3)
            elif self.how == "segv":
                ctypes.string_at(0)
            time.sleep(60)
        return i


def read_stamp(path: str) -> tuple:
    with open(path) as f:
        pid, t = f.read().split()
    return int(pid), float(t)


# --------------------------------------------------------------------------- #
# iterable datasets
# --------------------------------------------------------------------------- #


class ShardedIterable(tud.IterableDataset):
    """Worker w yields lengths[w] items (w * 1000 + k); without workers, all shards
    one after another. `info_fn` is the side's get_worker_info."""

    def __init__(self, lengths: list, info_fn: Callable[[], Any], kind: str = "int") -> None:
        self.lengths = list(lengths)
        self.info_fn = info_fn
        self.kind = kind

    def _item(self, v: int) -> Any:
        if self.kind == "int":
            return v
        return {"v": torch.tensor([v, -v]), "name": f"v{v}", "pid": os.getpid()}

    def __iter__(self):
        info = self.info_fn()
        shards = range(len(self.lengths)) if info is None else [info.id]
        for w in shards:
            for k in range(self.lengths[w]):
                yield self._item(w * 1000 + k)


class SizedIterable(tud.IterableDataset):
    """Every replica yields range(n) and reports `reported` as its length."""

    def __init__(self, n: int, reported: int) -> None:
        self.n = n
        self.reported = reported

    def __len__(self) -> int:
        return self.reported

    def __iter__(self):
        yield from range(self.n)

    def __repr__(self) -> str:
        return f"SizedIterable(n={self.n}, reported={self.reported})"


class FailingIterable(tud.IterableDataset):
    """Worker w yields w*100 + k for k < n and raises after `fail_after` items
    in worker `fail_worker`."""

    def __init__(self, n: int, fail_worker: int, fail_after: int, info_fn: Callable) -> None:
        self.n = n
        self.fail_worker = fail_worker
        self.fail_after = fail_after
        self.info_fn = info_fn

    def __iter__(self):
        info = self.info_fn()
        wid = 0 if info is None else info.id
        for k in range(self.n):
            if wid == self.fail_worker and k == self.fail_after:
                raise ValueError(f"replica {wid} failed at item {k}")
            yield wid * 100 + k


class UnshardedIterable(tud.IterableDataset):
    """Every replica yields the same items (torch duplicates them per worker)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        yield from range(self.n)


# --------------------------------------------------------------------------- #
# pin_memory
# --------------------------------------------------------------------------- #


class PinnableBatch:
    """A custom batch type with its own pin_memory(), as torch documents."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self.pinned_by_method = False

    def pin_memory(self) -> PinnableBatch:
        self.data = self.data.pin_memory()
        self.pinned_by_method = True
        return self


def collate_pinnable(batch: list) -> PinnableBatch:
    return PinnableBatch(torch.tensor(batch))


# --------------------------------------------------------------------------- #
# running one side
# --------------------------------------------------------------------------- #


@dataclass
class Run:
    epochs: list
    rng: tuple  # (torch.rand(3), random.random(), np.random.rand()) after the run
    generator_state: Optional[torch.Tensor] = None
    warnings: list = field(default_factory=list)
    dataset: Any = None


def seed_all(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators alike."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def run_side(
    lib: Any,
    make_dataset: Callable[[Any], Any],
    *,
    seed: int = 0,
    epochs: int = 1,
    generator_seed: Optional[int] = None,
    **loader_kwargs: Any,
) -> Run:
    """Seed everything, build `lib.DataLoader(make_dataset(lib), **kw)`, run
    `epochs` full epochs; record batches, warnings and the RNG state after."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seed_all(seed)
        gen = None
        if generator_seed is not None:
            gen = torch.Generator().manual_seed(generator_seed)
            loader_kwargs["generator"] = gen
        dataset = make_dataset(lib)
        loader = lib.DataLoader(dataset, **loader_kwargs)
        out = []
        for _ in range(epochs):
            out.append(list(loader))
        del loader
        rng = (torch.rand(3), random.random(), float(np.random.rand()))
    return Run(
        epochs=out,
        rng=rng,
        generator_state=None if gen is None else gen.get_state(),
        warnings=[(w.category, str(w.message)) for w in caught],
        dataset=dataset,
    )


def live_workers() -> set:
    """This process's live worker processes (``spawned``); an ended worker
    is reaped when its iterator goes."""
    return {pid for pid in spawned() if pid_state(pid) not in (None, "Z")}


def strip(value: Any, keys: tuple = ("pid",)) -> Any:
    """Remove the given keys from every dict in a (nested) batch."""
    if isinstance(value, dict):
        return {k: strip(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [strip(v, keys) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(strip(v, keys) for v in value)
    return value


def pids_in(value: Any) -> set:
    """Every value under a 'pid' key in a (nested) batch."""
    found: set = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "pid":
                if isinstance(v, torch.Tensor):
                    found.update(int(x) for x in v.reshape(-1).tolist())
                elif isinstance(v, (list, tuple)):
                    found.update(int(x) for x in v)
                else:
                    found.add(int(v))
            else:
                found |= pids_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            found |= pids_in(v)
    return found


# --------------------------------------------------------------------------- #
# /proc helpers (main process)
# --------------------------------------------------------------------------- #


def proc_stat(pid: int) -> Optional[tuple]:
    """(state, ppid) of a process, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    rest = data[data.rindex(")") + 2 :].split()
    return rest[0], int(rest[1])


def pid_state(pid: int) -> Optional[str]:
    st = proc_stat(pid)
    return None if st is None else st[0]


def children_of(pid: int) -> set:
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        if st is not None and st[1] == pid:
            out.add(int(name))
    return out


def _is_helper(pid: int, what: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return what in f.read()
    except OSError:
        return False


def spawned(pid: Optional[int] = None) -> set:
    """The worker processes ``pid`` (this one by default) started: its
    children, and the children its fork server forked for it (under
    ``forkserver``, Python 3.14's default, a worker is the server's child,
    not ours), less multiprocessing's helpers (the fork server and the
    resource tracker, which outlive the loaders that started them)."""
    pid = os.getpid() if pid is None else pid
    out = set()
    for k in children_of(pid):
        if _is_helper(k, b"forkserver"):
            out |= children_of(k)
        elif not _is_helper(k, b"resource_tracker"):
            out.add(k)
    return out


def descendants_of(pid: int) -> set:
    out: set = set()
    frontier = [pid]
    while frontier:
        kids = children_of(frontier.pop())
        frontier.extend(kids - out)
        out |= kids
    return out


def wait_until(cond: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def alive(pids: set, zombie_is_dead: bool = False) -> dict:
    """The pids among `pids` that still exist, with their state."""
    out = {}
    for p in pids:
        s = pid_state(p)
        if s is None or (zombie_is_dead and s == "Z"):
            continue
        out[p] = s
    return out


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_targets() -> list:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return sorted(out)


@dataclass
class Mapping:
    lo: int
    hi: int
    perms: str
    path: str

    @property
    def size(self) -> int:
        return self.hi - self.lo


def read_maps(pid: str = "self") -> list:
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].strip() if len(parts) > 5 else ""
            out.append(Mapping(lo, hi, parts[1], path))
    return out


def mapping_of(addr: int) -> Optional[Mapping]:
    for m in read_maps():
        if m.lo <= addr < m.hi:
            return m
    return None


def memfd_bytes() -> int:
    return sum(m.size for m in read_maps() if "memfd:" in m.path)


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


_FOREIGN_TORCH_SHM = re.compile(r"torch_(\d+)_")


def shm_names() -> set:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def new_shm(before: set, after: set, our_pids: set) -> set:
    """Names in `after` not in `before`, minus torch segments of processes
    that are not ours (other test runs on a shared machine) and POSIX
    semaphores (``sem.*``: multiprocessing's locks of whatever else runs,
    e.g. another pytest-xdist worker's spawn tests; ferroloader's transport
    uses memfd, eventfd and sockets, never a semaphore)."""
    out = set()
    for name in after - before:
        m = _FOREIGN_TORCH_SHM.match(name)
        if m and int(m.group(1)) not in our_pids:
            continue
        if name.startswith("sem."):
            continue
        out.add(name)
    return out


def collate_strided(batch: list) -> dict:
    """Custom collate whose tensors are views: a transpose (non-contiguous)
    and a slice with a storage offset, next to a contiguous one and an
    array, so strides and offsets must come through as torch's pickling
    keeps them."""
    stacked = torch.stack([torch.as_tensor(b) for b in batch]).double()
    return {
        "t": stacked.transpose(0, 1),
        "s": stacked[1:],
        "c": stacked.contiguous(),
        # A copy: torch moves `stacked`'s storage into shared memory when it
        # pickles the views above, so a numpy view of it would dangle in torch.
        "a": stacked.numpy().copy(),
    }


class RefusesToUnpickle(torch.utils.data.Dataset):
    """Pickles fine; unpickling (in a spawned worker) raises."""

    def __init__(self) -> None:
        self.n = 4  # a state to set, so unpickling calls __setstate__

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i

    def __setstate__(self, state: dict) -> None:
        raise ValueError("this dataset cannot be rebuilt here")
