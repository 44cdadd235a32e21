"""``ferroloader.patch()``: loaders that frameworks build with torch's class
are built by ferroloader's engine.

Some frameworks construct ``torch.utils.data.DataLoader`` themselves: HF
``accelerate``'s ``prepare`` (and so the ``transformers`` ``Trainer``),
``webdataset``'s ``WebLoader``, Lightning's ``Fabric.setup_dataloaders`` for a
loader built by torch's class. While a patch is active, constructing torch's
``DataLoader`` (by any name: ``torch.utils.data.DataLoader``, a module's own
import of it, a user's alias) returns ferroloader's ``DataLoader``, and
constructing torchdata's ``StatefulDataLoader`` returns ferroloader's
``StatefulDataLoader``, built from the same arguments.

No name is rebound: ``torch.utils.data.DataLoader`` stays torch's class, so
``isinstance(loader, DataLoader)`` holds for torch's loaders and for
ferroloader's (a subclass) alike, and loaders built before the patch or
handed in by a library are still recognised and prepared. Subclasses of
torch's class (yours, or a library's) are built as they are.

    with ferroloader.patch():
        loader = accelerator.prepare(loader)    # accelerate rebuilds it here
        trainer.train()                         # transformers builds its loaders

    ferroloader.patch()                         # for the rest of the process

Outside a patch, when a framework builds torch's ``DataLoader`` over the
dataset of a ferroloader loader (it rebuilt that loader as torch's), a
:class:`~ferroloader.errors.RebuiltAsTorchWarning` says so, once per
framework.

What this does to torch's class: ``import ferroloader`` alone changes
nothing. The first ``patch()``, or the first ferroloader ``DataLoader``
built, gives ``torch.utils.data.DataLoader`` a ``__new__`` (the hook above,
which returns ``object.__new__(cls)`` unless a patch or a rebuild applies)
and a ``__signature__`` that answers what ``inspect.signature`` answered
before, for torch's class and every subclass: tools that read the
signature (``help()``, Lightning's and accelerate's argument inspection)
see the class's own ``__init__`` arguments, not ``(*args, **kwargs)``.
"""

from __future__ import annotations

import inspect
import sys
import threading
import warnings
import weakref
from types import TracebackType
from typing import Any, Optional

import torch.utils.data.dataloader as _tdl

from ferroloader.errors import ConfigError, RebuiltAsTorchWarning

_TORCH_DATALOADER = _tdl.DataLoader
_lock = threading.Lock()
# patches active now (nested or concurrent ones count once each)
_active = 0

# Datasets of ferroloader loaders, by id (weak: a dataset is not kept alive
# for this; one that cannot be weakly referenced is not recorded).
_ferro_datasets: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
# those of loaders over the job's shared queue (Sharding(across="world")),
# which a framework must not rebuild
_queue_datasets: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_warned: set[str] = set()

# Packages that build loaders for their users; a torch loader one of them
# builds over a ferroloader loader's dataset is a rebuild.
_FRAMEWORKS = (
    "accelerate",
    "lightning",
    "lightning_fabric",
    "pytorch_lightning",
    "transformers",
    "webdataset",
)


def _new(cls: type, *args: Any, **kwargs: Any) -> Any:
    """``__new__`` of torch's ``DataLoader`` (and so of its subclasses).
    A call without arguments is an unpickling or a copy: left alone."""
    if (args or kwargs) and (_active or _ferro_datasets):
        if _queue_datasets:
            _refuse_queue_rebuild(cls, args, kwargs)
        ours = _ferro_class(cls)
        if _active and ours is not None:
            return _build(ours, cls, args, kwargs)
        if not _active and _rebuilt_by_framework(cls, args, kwargs):
            if ours is not None:
                return _build(ours, cls, args, kwargs)
            _warn_rebuilt(cls)
    return object.__new__(cls)


# ferroloader's loader classes, by the library whose class each stands
# for ("torch", "torchdata"): each registers itself when its module is
# imported, so this module imports neither (no import circle).
_ours: dict[str, type] = {}


def register_loader(library: str, cls: type) -> None:
    """Names ferroloader's class that a patch builds in place of
    ``library``'s loader class."""
    _ours[library] = cls


def _ferro_class(cls: type) -> Optional[type]:
    """ferroloader's class for torch's ``DataLoader`` or torchdata's
    ``StatefulDataLoader`` (``None`` for any other class)."""
    if cls is _TORCH_DATALOADER:
        return _ours.get("torch")
    if cls.__name__ == "StatefulDataLoader" and cls.__module__.startswith(
        "torchdata.stateful_dataloader"
    ):
        return _ours.get("torchdata")
    return None


def _build(ours: type, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    loader: Any = object.__new__(ours)
    if not issubclass(ours, cls):
        # Python runs __init__ only on an instance of the class called
        ours.__init__(loader, *args, **kwargs)
    return loader


def _rebuilt_by_framework(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A framework's code is building a loader over the dataset of a
    ferroloader loader (its rebuild of that loader)."""
    ours = _ours.get("torch")
    if ours is not None and issubclass(cls, ours):
        return False
    dataset = args[0] if args else kwargs.get("dataset")
    if _ferro_datasets.get(id(dataset)) is not dataset:
        return False
    return _calling_framework() is not None


def _refuse_queue_rebuild(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A framework rebuilding a loader over the job's shared queue, or over
    a wrapper of its dataset (accelerate's ``IterableDatasetShard``), would
    split a rank's share of the queue again across the ranks (or read it
    on one rank and broadcast it): items would be lost. Refused, with the
    way around."""
    dataset = args[0] if args else kwargs.get("dataset")
    ours = any(d is not None and _queue_datasets.get(id(d)) is d
               for d in (dataset, getattr(dataset, "dataset", None)))
    framework = _calling_framework() if ours else None
    if framework is None:
        return
    raise ConfigError(
        f"{framework} is rebuilding a ferroloader DataLoader over the job's shared queue "
        f"(Sharding(across='world')) as {cls.__qualname__}, to split its batches across the "
        "ranks itself: the queue already gives each rank its own items, so that split would "
        "lose most of them. Give the loader to the training loop as it is (accelerate: "
        "iterate it without accelerator.prepare; transformers' Trainer: return it from an "
        "overridden get_train_dataloader()); see the frameworks page of ferroloader's guide"
    )


def _warn_rebuilt(cls: type) -> None:
    framework = _calling_framework() or "a framework"
    if framework in _warned:
        return
    _warned.add(framework)
    warnings.warn(
        f"{framework} built {cls.__qualname__}, a subclass of torch's DataLoader, over the "
        "dataset of a ferroloader DataLoader (it rebuilt that loader), so torch's engine "
        "serves it. Silence this with warnings.filterwarnings('ignore', "
        "category=ferroloader.errors.RebuiltAsTorchWarning).",
        RebuiltAsTorchWarning,
        stacklevel=4,
    )


def _calling_framework() -> Optional[str]:
    """The framework package whose code is constructing the loader, if any:
    the first caller outside torch and ferroloader."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        top = module.split(".", 1)[0]
        if top not in ("torch", "ferroloader", "typing"):
            return top if top in _FRAMEWORKS else None
        frame = frame.f_back
    return None


def record_dataset(dataset: Any, shared_queue: bool = False) -> None:
    """Remembers a ferroloader loader's dataset (for the rebuild warning),
    and whether the loader reads it through the job's shared queue (a
    rebuild is then refused)."""
    _install()
    try:
        _ferro_datasets[id(dataset)] = dataset
        if shared_queue:
            _queue_datasets[id(dataset)] = dataset
    except TypeError:
        pass  # not weakly referenceable (a list, a tuple)


class _InitSignature:
    """``__signature__`` of torch's ``DataLoader`` and its subclasses while
    the hook is installed: the signature ``inspect`` gives without the hook
    (the nearest ``__init__`` in the class's MRO, without ``self``).
    ``None`` for a class with a ``__new__`` of its own (``inspect`` then
    reads it as usual); instances have none."""

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Optional[inspect.Signature]:
        if instance is not None or owner is None:
            raise AttributeError("__signature__")
        for klass in owner.__mro__:
            if "__new__" in vars(klass) and klass is not _TORCH_DATALOADER:
                return None
            init = vars(klass).get("__init__")
            if init is not None:
                sig = inspect.signature(init)
                return sig.replace(parameters=list(sig.parameters.values())[1:])
        return None


_installed = False


def _install() -> None:
    """Gives torch's ``DataLoader`` the hook, once, when it is first needed
    (a patch, or a ferroloader loader whose rebuild must be recognised):
    importing ferroloader leaves torch's class as it is. Inherited by every
    subclass, the hook leaves them alone."""
    global _installed
    with _lock:
        if _installed:
            return
        _TORCH_DATALOADER.__signature__ = _InitSignature()  # type: ignore[attr-defined]
        _TORCH_DATALOADER.__new__ = staticmethod(_new)  # type: ignore[method-assign]
        _installed = True


class Patch:
    """An active patch (see the module doc): ``undo()``, or leave the
    ``with`` block, to end it.

    >>> import torch.utils.data as tud, ferroloader
    >>> p = ferroloader.patch()
    >>> type(tud.DataLoader(range(4))).__module__
    'ferroloader.dataloader'
    >>> p.undo()
    >>> p.active, type(tud.DataLoader(range(4))).__module__
    (False, 'torch.utils.data.dataloader')
    """

    def __init__(self) -> None:
        global _active
        _install()
        with _lock:
            _active += 1
        self._live = True

    @property
    def active(self) -> bool:
        return self._live

    def undo(self) -> None:
        global _active
        with _lock:
            if self._live:
                self._live = False
                _active -= 1

    def __enter__(self) -> Patch:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.undo()


def patch() -> Patch:
    """Makes constructing torch's ``DataLoader`` (and torchdata's
    ``StatefulDataLoader``) build ferroloader's, until the returned
    ``Patch`` is undone (at the end of a ``with`` block). No name is
    rebound: ``torch.utils.data.DataLoader`` stays torch's class.

    >>> import torch.utils.data as tud, ferroloader
    >>> with ferroloader.patch():
    ...     loader = tud.DataLoader(range(4), batch_size=2)
    >>> isinstance(loader, ferroloader.DataLoader), isinstance(loader, tud.DataLoader)
    (True, True)
    """
    return Patch()


def active() -> bool:
    """Whether a patch is active."""
    return _active > 0


__all__ = ["Patch", "active", "patch", "record_dataset", "register_loader"]
