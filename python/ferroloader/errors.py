"""The exceptions ferroloader itself raises.

Each is a subclass of :class:`FerroloaderError` and of the exception torch
raises in the same place, so ``except RuntimeError`` written for
``torch.utils.data`` still catches it, and ``except ferroloader.WorkerDiedError``
catches just that case. Exceptions raised by your own code (a dataset, a
``collate_fn``) are never wrapped: they reach you with their own type, as
torch re-raises them.
"""

from __future__ import annotations


class FerroloaderError(Exception):
    """Base class of every error the loader's engine raises itself."""


class SharedMemoryError(FerroloaderError, RuntimeError):
    """Shared memory for a worker (its mailbox or arena) could not be
    created or mapped, e.g. too many open files or no ``memfd_create``."""


class SharedMemoryLimitError(SharedMemoryError):
    """A worker's arena reached its share of ``FERROLOADER_SHM_LIMIT``: the
    training loop holds too many batches. Release them sooner or raise the
    limit."""


class WorkerDiedError(FerroloaderError, RuntimeError):
    """A worker process ended (a signal, ``os._exit``, the OOM killer) while
    the loader still expected batches from it. torch raises ``RuntimeError``."""


class WorkerTimeoutError(FerroloaderError, RuntimeError):
    """No batch arrived within the loader's ``timeout``. torch raises
    ``RuntimeError``."""


class ProtocolError(FerroloaderError, RuntimeError):
    """A message or batch record from a worker did not parse, or the
    connection to a worker failed: a bug or memory corruption, never a
    user error."""


class ConfigError(FerroloaderError, ValueError):
    """A ferroloader setting (an environment variable) has a value that
    cannot be used."""


class StateMismatchError(ConfigError, AssertionError):
    """A loaded state cannot resume this loader as configured (e.g. another
    ``num_workers`` where the position lives in the workers' replicas).
    Raised at the ``iter()`` after ``load_state_dict()``, where torchdata's
    ``StatefulDataLoader`` raises ``AssertionError``; also a ``ValueError``,
    like every other refused state."""


class InternalError(FerroloaderError, RuntimeError):
    """An invariant of the engine did not hold; please report it."""


class RebuiltAsTorchWarning(UserWarning):
    """A framework (accelerate, Lightning, transformers, webdataset) built
    torch's ``DataLoader`` over the dataset of a ferroloader loader outside
    ``ferroloader.patch()``: torch's engine serves that loader."""


class ThreadSafetyWarning(UserWarning):
    """A dataset given to worker threads holds an object that threads
    cannot share safely (an open file read with seek and read, a random
    generator whose draws then depend on thread timing, a sqlite connection
    bound to its thread)."""


__all__ = [
    "ConfigError",
    "FerroloaderError",
    "InternalError",
    "ProtocolError",
    "RebuiltAsTorchWarning",
    "SharedMemoryError",
    "SharedMemoryLimitError",
    "StateMismatchError",
    "ThreadSafetyWarning",
    "WorkerDiedError",
    "WorkerTimeoutError",
]
