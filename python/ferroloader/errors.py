"""The exceptions ferroloader itself raises.

Each is a subclass of :class:`FerroloaderError` and of the exception torch
raises in the same place, so ``except RuntimeError`` written for
``torch.utils.data`` still catches it, and ``except ferroloader.WorkerDiedError``
catches just that case. Exceptions raised by your own code (a dataset, a
``collate_fn``) are never wrapped: they reach you with their own type, as
torch re-raises them.
"""

from __future__ import annotations

from typing import Any, Optional


class FerroloaderError(Exception):
    """Base class of every error the loader's engine raises itself.

    >>> import ferroloader
    >>> try:
    ...     ferroloader.Sharding(mode="round-robin")
    ... except ferroloader.FerroloaderError as e:
    ...     print(type(e).__name__)
    ConfigError
    """


class SharedMemoryError(FerroloaderError, RuntimeError):
    """Shared memory for a worker (its mailbox or arena) could not be
    created or mapped, e.g. too many open files or no ``memfd_create``.
    A ``RuntimeError``, as torch raises there.

    >>> import ferroloader
    >>> issubclass(ferroloader.SharedMemoryError, RuntimeError)
    True
    """


class SharedMemoryLimitError(SharedMemoryError):
    """A worker's arena reached its share of ``FERROLOADER_SHM_LIMIT``: the
    training loop holds too many batches. Release them sooner or raise the
    limit (``FERROLOADER_SHM_LIMIT=8G``, say).

    >>> import ferroloader
    >>> issubclass(ferroloader.SharedMemoryLimitError, ferroloader.SharedMemoryError)
    True
    """


class WorkerDiedError(FerroloaderError, RuntimeError):
    """A worker process ended (a signal, ``os._exit``, the OOM killer) while
    the loader still expected batches from it. torch raises ``RuntimeError``;
    the message is torch's, naming the pid and the signal or exit code.

    >>> import os, ferroloader, torch
    >>> class Dies(torch.utils.data.Dataset):
    ...     def __len__(self):
    ...         return 4
    ...     def __getitem__(self, i):
    ...         os._exit(3)
    >>> try:
    ...     next(iter(ferroloader.DataLoader(Dies(), num_workers=1)))
    ... except ferroloader.WorkerDiedError as e:
    ...     print("exit code 3" in str(e))
    True
    """


class RayWorkerLost(WorkerDiedError):
    """A Ray worker (``worker_method="ray"``) was lost and could not be
    replaced: its actor died more times than ``RayWorkers(max_restarts=)``
    allows, or an ``IterableDataset``'s replica died (it cannot move to
    another actor), or no node could take a new one. The message says which
    worker, on which node, what it was reading (the task's indices or
    lane), and how its process ended as far as Ray knows it (an exit code
    where Ray recorded one; ``os._exit`` and signals leave Ray none);
    ``worker_id``, ``node_ip``, ``exit_code`` and ``task`` hold the same.
    A ``WorkerDiedError``, so ``except RuntimeError`` catches it as torch's
    worker deaths.

    >>> import ferroloader
    >>> issubclass(ferroloader.RayWorkerLost, ferroloader.WorkerDiedError)
    True
    """

    def __init__(self, message: str, worker_id: Optional[int] = None,
                 node_ip: Optional[str] = None, exit_code: Optional[int] = None,
                 task: Any = None) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.node_ip = node_ip
        self.exit_code = exit_code
        self.task = task

    def __reduce__(self) -> Any:
        return (type(self), (self.args[0], self.worker_id, self.node_ip, self.exit_code,
                             self.task))


class WorkerTimeoutError(FerroloaderError, RuntimeError):
    """No batch arrived within the loader's ``timeout``. torch raises
    ``RuntimeError``, with the same message.

    >>> import time, ferroloader, torch
    >>> class Stuck(torch.utils.data.Dataset):
    ...     def __len__(self):
    ...         return 4
    ...     def __getitem__(self, i):
    ...         time.sleep(5)
    >>> try:
    ...     next(iter(ferroloader.DataLoader(Stuck(), num_workers=1, timeout=0.2)))
    ... except ferroloader.WorkerTimeoutError as e:
    ...     print(e)
    DataLoader timed out after 0.2 seconds
    """


class ProtocolError(FerroloaderError, RuntimeError):
    """A message or batch record from a worker did not parse, or the
    connection to a worker failed: a bug or memory corruption, never a
    user error. Please report it (``python -m ferroloader`` prints what a
    report needs).

    >>> import ferroloader
    >>> issubclass(ferroloader.ProtocolError, RuntimeError)
    True
    """


class ConfigError(FerroloaderError, ValueError):
    """A ferroloader setting (an argument torch's loader does not have, or a
    ``FERROLOADER_*`` environment variable) has a value that cannot be
    used. A ``ValueError``, as torch raises for its own arguments.

    >>> import ferroloader
    >>> try:
    ...     ferroloader.DataLoader(range(4), per_sample_seed=True)
    ... except ValueError as e:
    ...     print(e)
    per_sample_seed=True needs seed= (the seeds derive from it)
    """


class StateMismatchError(ConfigError, AssertionError):
    """A loaded state cannot resume this loader as configured (e.g. another
    ``num_workers`` where the position lives in the workers' replicas).
    Raised at the ``iter()`` after ``load_state_dict()``, where torchdata's
    ``StatefulDataLoader`` raises ``AssertionError``; also a ``ValueError``,
    like every other refused state.

    >>> import ferroloader
    >>> issubclass(ferroloader.StateMismatchError, (ValueError, AssertionError))
    True
    """


class ShardQueueError(FerroloaderError, RuntimeError):
    """The job's shared shard queue (``Sharding(across="world")``) lost its
    store, or a rank's account of an epoch did not come: the message names
    the store. Restart the job from the ranks' last states.

    >>> import ferroloader
    >>> issubclass(ferroloader.ShardQueueError, RuntimeError)
    True
    """


class InternalError(FerroloaderError, RuntimeError):
    """An invariant of the engine did not hold: a bug in ferroloader. Please
    report it with its message and the output of ``python -m ferroloader``.

    >>> import ferroloader
    >>> issubclass(ferroloader.InternalError, RuntimeError)
    True
    """


class RebuiltAsTorchWarning(UserWarning):
    """A framework (accelerate, Lightning, transformers, webdataset) built
    its own subclass of torch's ``DataLoader`` over the dataset of a
    ferroloader loader: torch's engine serves that loader. Given once per
    framework; silence it with a warnings filter.

    >>> import warnings, ferroloader
    >>> warnings.filterwarnings("ignore", category=ferroloader.RebuiltAsTorchWarning)
    """


class CacheBudgetWarning(UserWarning):
    """A ``ShardCache`` budget below what a loader's readers keep open
    between batches (each lane or worker one shard): the readers then let
    go of their shards after every batch and open them again, and a shard
    evicted meanwhile is downloaded again (``stats().remote.redownloads``
    counts them). Slower, and on cloud storage paid for; never stuck. The
    warning gives the budget the readers need; it comes once per cache.

    >>> import ferroloader
    >>> issubclass(ferroloader.CacheBudgetWarning, UserWarning)
    True
    """


class ThreadSafetyWarning(UserWarning):
    """A dataset given to worker threads holds an object that threads
    cannot share safely (an open file read with seek and read, a random
    generator whose draws then depend on thread timing, a sqlite connection
    bound to its thread). The warning names the attribute and what to use
    instead.

    >>> import random, warnings, ferroloader, torch
    >>> class Noisy(torch.utils.data.Dataset):
    ...     def __init__(self):
    ...         self.rng = random.Random(0)
    ...     def __len__(self):
    ...         return 4
    ...     def __getitem__(self, i):
    ...         return self.rng.random()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = list(ferroloader.DataLoader(Noisy(), num_workers=2, worker_method="thread"))
    >>> any(w.category is ferroloader.ThreadSafetyWarning for w in caught)
    True
    """


__all__ = [
    "CacheBudgetWarning",
    "ConfigError",
    "FerroloaderError",
    "InternalError",
    "ProtocolError",
    "RayWorkerLost",
    "RebuiltAsTorchWarning",
    "ShardQueueError",
    "SharedMemoryError",
    "SharedMemoryLimitError",
    "StateMismatchError",
    "ThreadSafetyWarning",
    "WorkerDiedError",
    "WorkerTimeoutError",
]
