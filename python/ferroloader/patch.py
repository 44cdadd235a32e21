"""``ferroloader.patch()``: frameworks that build torch's ``DataLoader``
build ferroloader's.

Some frameworks construct ``torch.utils.data.DataLoader`` themselves, by a
name bound when they were imported: HF ``accelerate``'s ``prepare`` (and so
the ``transformers`` ``Trainer``), ``webdataset``'s ``WebLoader``. While a
patch is active, ``torch.utils.data.DataLoader`` and every such name in a
module already imported that is bound to torch's class are ferroloader's
``DataLoader`` (a subclass of torch's, so ``isinstance`` checks still
hold); undoing the patch puts each name back. A module imported while the
patch is active binds ferroloader's class and keeps it.

    with ferroloader.patch():
        loader = accelerator.prepare(loader)    # accelerate rebuilds it here
        trainer.train()                         # transformers builds its loaders

    ferroloader.patch()                         # for the rest of the process
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType, TracebackType
from typing import Optional

import torch.utils.data.dataloader as _tdl

_TORCH_DATALOADER = _tdl.DataLoader
_lock = threading.Lock()


class Patch:
    """An active patch (see the module doc): ``undo()``, or leave the
    ``with`` block, to put torch's class back."""

    def __init__(self) -> None:
        from ferroloader.dataloader import DataLoader

        # only names bound to torch's class now: a patch inside another
        # changes (and so undoes) nothing the outer one did
        self._replaced: list[tuple[ModuleType, str]] = []
        with _lock:
            for module in list(sys.modules.values()):
                if not isinstance(module, ModuleType) or module.__name__.startswith(
                    "ferroloader"
                ):
                    continue
                for name, value in list(getattr(module, "__dict__", {}).items()):
                    if value is _TORCH_DATALOADER:
                        setattr(module, name, DataLoader)
                        self._replaced.append((module, name))

    @property
    def modules(self) -> list[str]:
        """The modules whose names were rebound."""
        return sorted({m.__name__ for m, _ in self._replaced})

    def undo(self) -> None:
        with _lock:
            for module, name in self._replaced:
                setattr(module, name, _TORCH_DATALOADER)
            self._replaced.clear()

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
    """Makes torch's ``DataLoader`` names resolve to ferroloader's until the
    returned ``Patch`` is undone (at the end of a ``with`` block)."""
    return Patch()


__all__ = ["Patch", "patch"]
