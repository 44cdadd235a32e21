"""``pin_memory=True``: where batches are pinned, and by whom.

torch copies every batch into page-locked memory on a background thread.
ferroloader's batches already lie in shared memory it owns, so with CUDA the
main process registers each worker's arena with the CUDA runtime torch
loaded (``cudaHostRegister``, once per arena segment) and the tensors built
over a record are pinned as they are: ``tensor.is_pinned()`` is ``True``
and nothing is copied. A record whose tensors were handed to an asynchronous
copy is kept from its worker until that copy has run (``_core.PinArena``).

Where registration is not possible (no CUDA runtime found, the runtime
refuses shared memory, another accelerator) or the batch is not the default
collate's (a ``collate_fn`` may return a type with its own ``pin_memory()``),
batches are pinned on a background thread ahead of the training loop, as
torch's pin thread does (:class:`PinThread`); its results, errors and
warnings are torch's.

``FERROLOADER_DISABLE=cuda-register`` turns registration off (the pin
thread then does torch's copy).
"""

from __future__ import annotations

import collections
import os
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Optional

import torch
import torch.utils.data.dataloader as _tdl
from torch._utils import ExceptionWrapper
from torch.utils.data import _utils
from torch.utils.data._utils import collate as _torch_collate

import ferroloader._core as _core
from ferroloader.collate import default_collate as _ferro_default_collate
from ferroloader.errors import ConfigError

DISABLE = "cuda-register"
PIN_THREAD_NAME = "pt_data_pin"
# How many batches the pin thread takes ahead of the training loop: enough
# to pin the next batch during the loop's step; the workers' own prefetch
# window holds the rest.
PIN_AHEAD = 2

_DEFAULT_COLLATES = (
    _torch_collate.default_collate,
    _torch_collate.default_convert,
    _ferro_default_collate,
)


def _torch_deprecates_pin_memory_device() -> bool:
    """Whether the installed torch ignores ``pin_memory_device`` in favour of
    the current accelerator (newer torch) or pins on it (torch 2.6-2.8):
    read from torch's own iterator, so ferroloader follows whichever torch
    is installed."""
    import inspect

    try:
        source = inspect.getsource(_tdl._BaseDataLoaderIter.__init__)
    except (OSError, TypeError):  # pragma: no cover - no source shipped
        return tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 9)
    return "pin_memory_device is deprecated" in source


_PIN_DEVICE_DEPRECATED = _torch_deprecates_pin_memory_device()


def settings(loader: Any) -> Optional[tuple[Any, Optional[str]]]:
    """``(pin_memory_fn, device)``, or ``None`` when batches are not pinned:
    the pin-memory decision and warnings of ``_BaseDataLoaderIter.__init__``
    (of the installed torch). Its warnings' ``stacklevel`` names the user's
    ``iter(loader)`` (called from the iterators' builders)."""
    if loader.pin_memory_device and not _PIN_DEVICE_DEPRECATED:
        # torch 2.6-2.8: an explicit device is pinned on as given
        if not loader.pin_memory:
            warnings.warn(
                "'pin_memory_device' is set but 'pin_memory' argument is not set, "
                "then device pinned memory won't be used."
                "please set 'pin_memory' to true, if you need to use the device pin memory",
                stacklevel=4,
            )
            return None
        return (_utils.pin_memory.pin_memory, loader.pin_memory_device)
    if loader.pin_memory and loader.pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{loader.pin_memory_device}'.",
            stacklevel=4,
        )
    if loader.pin_memory and not torch.accelerator.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=4,
        )
    pin = loader.pin_memory and torch.accelerator.is_available()
    acc = torch.accelerator.current_accelerator() if pin else None
    device = acc.type if acc is not None else None
    if device == "mps":
        mps_message = (
            "'pin_memory' argument is set as true but not supported on MPS now, "
            + ("device" if _PIN_DEVICE_DEPRECATED else "then device")
            + " pinned memory won't be used."
        )
        warnings.warn(mps_message, stacklevel=4)
        return None
    if not pin:
        return None
    return (_utils.pin_memory.pin_memory, device if _PIN_DEVICE_DEPRECATED else None)


def _disabled() -> bool:
    return DISABLE in _core.disabled_setting()


def cuda_runtime_path() -> Optional[str]:
    """The CUDA runtime library (``libcudart.so.<major>``) mapped in this
    process for torch's CUDA version; ``None`` if there is none (a runtime
    linked statically, or under another name)."""
    major = (torch.version.cuda or "").split(".")[0]
    found: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6:
                    path = fields[5].strip()
                    if os.path.basename(path).startswith("libcudart.so") and path not in found:
                        found.append(path)
    except OSError:
        return None
    # another library may have brought its own runtime: prefer torch's
    for path in found:
        if major and os.path.basename(path).startswith(f"libcudart.so.{major}"):
            return path
    return found[0] if found else None


def current_streams() -> list[tuple[int, int]]:
    """``(device, raw stream)``: torch's current stream on this thread for
    the current device and every device with a context (a copy runs on its
    destination device's current stream). Empty before CUDA is initialised
    (and never initialises it)."""
    if not torch.cuda.is_initialized():
        return []
    current = torch.cuda.current_device()
    devices = [current]
    if _HAS_CONTEXT is not None:
        devices += [
            d for d in range(torch.cuda.device_count()) if d != current and _HAS_CONTEXT(d)
        ]
    return [(d, _raw_stream(d)) for d in devices]


# called at every next() with registered arenas: looked up once
_HAS_CONTEXT = getattr(torch._C, "_cuda_hasPrimaryContext", None)
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(device: int) -> int:
    if _RAW_STREAM is not None:
        return int(_RAW_STREAM(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


# Whether the runtime at a path registers shared memory (asked once).
_registers: dict[str, Optional[str]] = {}


def _cuda_arena() -> Optional[_core.PinArena]:
    if _disabled() or not torch.cuda.is_available():
        return None
    torch.cuda.init()  # pinning initialises CUDA, as torch's pin_memory does
    path = cuda_runtime_path()
    if path is None:
        return None
    try:
        arena = _core.PinArena.cuda(path, current_streams)
    except ConfigError:
        return None
    if path not in _registers:
        _registers[path] = arena.check()
    return arena if _registers[path] is None else None


def _device_type(device: Any) -> Optional[str]:
    if device:
        return str(device).split(":")[0]
    acc = torch.accelerator.current_accelerator()
    return acc.type if acc is not None else None


def _arena(device: Any) -> Optional[_core.PinArena]:
    """Pinned arenas for batches pinned on ``device``, if its runtime
    registers host memory (CUDA's does)."""
    return _cuda_arena() if _device_type(device) == "cuda" else None


def plan(loader: Any, pin: Any) -> tuple[Optional[_core.PinArena], bool]:
    """How a multi-process iterator pins: ``(arena, thread)``. ``arena``:
    pinned arenas (the batches' tensors are pinned where they lie);
    ``thread``: ``pin_memory`` runs on a :class:`PinThread` (always where
    there is no arena, and for batches of a custom ``collate_fn``)."""
    if pin is None:
        return None, False
    arena = _arena(pin[1])
    default_batches = any(loader.collate_fn is f for f in _DEFAULT_COLLATES)
    return arena, arena is None or not default_batches


def inline_where() -> str:
    """Where an error pinning on the training loop's thread (batches over
    pinned arenas: their tensors are pinned already) says it happened: the
    engine re-raises it as torch's pin thread's."""
    return f"in pin memory thread for device {device_index()}"


def device_index() -> int:
    """The device torch's pin thread is bound to (its error messages name it)."""
    try:
        return int(torch.accelerator.current_device_index())
    except (RuntimeError, AttributeError):
        return 0


_Item = tuple[str, Any]
# the engine's getters that make the iterator's position, read through marks
_POSITION = ("_position", "_iterable_position", "_lane_snapshot", "_closed")


class PinThread:
    """torch's pin thread for a ferroloader iterator: it alone takes batches
    from the engine (``_next_unpinned``), pins them and queues them, at most
    ``PIN_AHEAD`` ahead; the training loop's ``next()`` takes them from the
    queue, so a batch that is waiting has been pinned already.

    The iterator's position for ``state_dict()`` is the one before the
    oldest batch taken but not handed over: captured by the thread before
    each take (``marks``), so a snapshot never counts a queued batch as
    delivered. The thread holds only a weak reference to the iterator
    between takes, so a dropped iterator still shuts its workers down.
    """

    def __init__(self, it: Any, pin_fn: Callable[..., Any], device: Any) -> None:
        self._it = weakref.ref(it)
        self._pin_fn = pin_fn
        self._device = device
        self._device_id = device_index()
        self._cond = threading.Condition()
        self._queue: collections.deque[_Item] = collections.deque()
        self._marks: collections.deque[dict[str, Any]] = collections.deque()
        self._last_stats: Any = None
        self._stop = _core.StopFlag()
        self._thread: Optional[threading.Thread] = None
        self._ended = False
        # after stop(): the position as of the last batch handed over
        self._frozen: Optional[dict[str, Any]] = None
        # the training loop's side of the stats (ns): waiting, its own time
        self.wait_ns = 0
        self.loop_ns = 0
        self.pin_ns = 0
        self.batches = 0
        self._left: Optional[int] = None

    # --- the thread ------------------------------------------------------

    @staticmethod
    def _capture(it: Any) -> dict[str, Any]:
        """The iterator's position as the engine reports it now (the
        thread holds the engine)."""
        return {n: getattr(_core.MultiProcessIter, n).__get__(it) for n in _POSITION}

    def _run(self) -> None:
        # as torch's pin thread: one intra-op thread, its name, its device
        torch.set_num_threads(1)
        torch.multiprocessing._set_thread_name(PIN_THREAD_NAME)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.set_device(self._device_id)
        while True:
            with self._cond:
                while len(self._queue) >= PIN_AHEAD and not self._stop.is_stopped:
                    self._cond.wait()
                if self._stop.is_stopped:
                    return
                it = self._it()
                if it is None:
                    return
                self._marks.append(self._capture(it))
            item = self._take(it)
            with self._cond:
                if self._stop.is_stopped:
                    return
                self._last_stats = _core.MultiProcessIter._stats.__get__(it)
                self._queue.append(item)
                self._cond.notify_all()
            del it
            if item[0] == "end":
                return

    def _take(self, it: Any) -> _Item:
        try:
            batch = it._next_unpinned(self._stop)
        except BaseException as e:  # delivered to the training loop
            return ("error", e)
        if batch is None:
            return ("end", None)
        t0 = time.perf_counter_ns()
        try:
            pinned = self._pin_fn(batch, self._device)
        except Exception:
            pinned = ExceptionWrapper(where=f"in pin memory thread for device {self._device_id}")
            return ("error", pinned)
        finally:
            self.pin_ns += time.perf_counter_ns() - t0
        return ("batch", pinned)

    # --- the training loop's side -----------------------------------------

    def next(self) -> Any:
        now = time.perf_counter_ns()
        if self._left is not None:
            self.loop_ns += now - self._left
        if self._ended:
            raise StopIteration
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=PIN_THREAD_NAME, daemon=True)
            self._thread.start()
        with self._cond:
            while not self._queue:
                if not self._thread.is_alive():
                    raise RuntimeError("Pin memory thread exited unexpectedly")
                self._cond.wait(0.1)
            kind, value = self._queue.popleft()
            self._marks.popleft()
            self._cond.notify_all()
        self.wait_ns += time.perf_counter_ns() - now
        if kind == "end":
            self._ended = True
            self._left = None
            raise StopIteration
        self._left = time.perf_counter_ns()
        if kind == "error":
            if isinstance(value, ExceptionWrapper):
                value.reraise()
            raise value
        self.batches += 1
        return value

    def read(self, it: Any, name: str) -> Any:
        """An engine getter as of the last batch handed over."""
        with self._cond:
            if self._marks:
                return self._marks[0][name]
            if self._frozen is not None:
                return self._frozen[name]
            return getattr(_core.MultiProcessIter, name).__get__(it)

    def stats(self, it: Any) -> Any:
        """``_stats`` with the training loop's times measured here and the
        engine's (decode, workers) as of the thread's last take."""
        with self._cond:
            if self._marks:  # the thread holds the engine
                raw = self._last_stats
            else:
                raw = _core.MultiProcessIter._stats.__get__(it)
        if raw is None:
            return ((0, 0, 0, 0, 0), [])
        (_, decode, _, _, _), workers = raw
        return ((self.wait_ns, decode, self.pin_ns, self.loop_ns, self.batches), workers)

    def stop(self) -> None:
        """Stops the thread (within one wait slice) and drops what it queued."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10.0)
        with self._cond:
            if self._marks and self._frozen is None:
                # what was queued is dropped: the epoch's position stays
                # the one before it
                self._frozen = self._marks[0]
            self._queue.clear()
            self._marks.clear()


__all__ = [
    "PinThread",
    "cuda_runtime_path",
    "current_streams",
    "inline_where",
    "plan",
    "settings",
]
