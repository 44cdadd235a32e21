"""torchdata's ``torchdata.stateful_dataloader`` names, for users who change
that import: ``StatefulDataLoader`` is ferroloader's ``DataLoader`` (its state
methods are the same) with the three things torchdata's class does otherwise
than torch's (its shuffle's draws, and where a worker's failed setup is
raised), ``RandomSampler`` is torchdata's sampler and ``Stateful`` its
protocol."""

from __future__ import annotations

from typing import (
    Any,
    Iterator,
    Optional,
    Protocol,
    Sized,
    TypeVar,
    Union,
    runtime_checkable,
)

import torch
import torch.utils.data as _tud

import ferroloader._core as _core
from ferroloader.dataloader import DataLoader
from ferroloader.patch import register_loader
from ferroloader.sampler import index_source, register_native

_T_co = TypeVar("_T_co", covariant=True)


@runtime_checkable
class Stateful(Protocol):
    """An object with ``state_dict()`` and ``load_state_dict()``: a dataset,
    sampler or iterator whose position the loader's state carries
    (torchdata's protocol of the same name).

    >>> import ferroloader
    >>> class Counter:
    ...     def __init__(self):
    ...         self.n = 0
    ...     def state_dict(self):
    ...         return {"n": self.n}
    ...     def load_state_dict(self, state_dict):
    ...         self.n = state_dict["n"]
    >>> isinstance(Counter(), ferroloader.Stateful)
    True
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class RandomSampler(_tud.Sampler[int]):
    """torchdata's ``RandomSampler`` (``torchdata.stateful_dataloader.sampler``),
    the draws included: without a ``generator`` it seeds a private one from
    the global generator when it is built; each ``iter()`` draws
    ``randperm(n, generator)`` at once (with replacement: ``randint`` in
    chunks of 32), where torch's draws a fresh seed on the first ``next()``.
    Without replacement the permutation is drawn by the engine."""

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
    ) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        if generator is None:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            generator = torch.Generator()
            generator.manual_seed(seed)
        self.generator = generator
        if not isinstance(self.replacement, bool):
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={self.replacement}"
            )
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(
                "num_samples should be a positive integer value, "
                f"but got num_samples={self.num_samples}"
            )

    @property
    def num_samples(self) -> int:
        # the data source's length may change at runtime
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def __iter__(self) -> Iterator[int]:
        native = _native_permutation(self)
        return native if native is not None else _Draws(self)

    def __len__(self) -> int:
        return self.num_samples


class _Draws:
    """torchdata's sampler iterator, for what the engine does not draw (with
    replacement, or ``num_samples`` other than the length)."""

    def __init__(self, sampler: RandomSampler) -> None:
        self.sampler = sampler
        self.n = len(sampler.data_source)
        self.left = sampler.num_samples
        self.perm = self._perm()
        self.pos = 0

    def _perm(self) -> list[int]:
        g = self.sampler.generator
        if self.sampler.replacement:
            return torch.randint(high=self.n, size=(32,), dtype=torch.int64, generator=g).tolist()
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> _Draws:
        return self

    def __next__(self) -> int:
        if self.left == 0:
            raise StopIteration
        if self.pos == len(self.perm):
            self.perm, self.pos = self._perm(), 0
        self.pos += 1
        self.left -= 1
        return self.perm[self.pos - 1]


def _native_permutation(s: RandomSampler) -> Optional[_core.SamplerIter]:
    n = len(s.data_source)
    g = s.generator
    if s.replacement or s.num_samples != n or n == 0 or not isinstance(g, torch.Generator):
        return None
    if g.device.type != "cpu":
        return None
    return _core.SamplerIter.permutation(n, g)


register_native(RandomSampler.__iter__, _native_permutation)


class StatefulDataLoader(DataLoader[_T_co]):
    """``DataLoader`` as torchdata's ``StatefulDataLoader`` behaves:
    ``shuffle=True`` on a map-style dataset samples with torchdata's
    :class:`RandomSampler` (its draws, not torch's), and ``iter()`` with
    workers returns once every worker has set up, raising the first
    error one raised there (``worker_init_fn``, loading a
    replica's state, ``iter(dataset)``), where torch's loader raises it at
    the first ``next()``; and ``state_dict()`` before the first ``iter()``
    (or after ``load_state_dict()``) starts the epoch's iterator, which the
    next ``iter()`` returns. Everything else, state included, is
    ``DataLoader``'s.

    >>> import torch
    >>> from ferroloader.stateful_dataloader import StatefulDataLoader
    >>> loader = StatefulDataLoader(torch.arange(10), batch_size=5, shuffle=True)
    >>> it = iter(loader)
    >>> first = next(it)
    >>> state = loader.state_dict()
    >>> resumed = StatefulDataLoader(torch.arange(10), batch_size=5, shuffle=True)
    >>> resumed.load_state_dict(state)
    >>> [b.tolist() for b in resumed] == [next(it).tolist()]
    True
    """

    # torchdata draws its shuffle once more with workers than without, so
    # an epoch begun on workers continues the same only on workers
    _auto_min_workers = 1

    def _index_stream_after_seed(self, source: Any) -> Any:
        # torchdata's multi-process iterator iterates the sampler again in
        # _reset, after the base seed (its sampler draws when iterated)
        return index_source(self)

    def _workers_started(self, it: Any, fresh: bool) -> None:
        # torchdata's iter() returns once every worker has set up, raising
        # the first set-up error
        if not fresh:
            it._await_setup()
            return
        try:
            it._await_setup()
        except BaseException:
            it._shutdown_workers()
            raise

    @classmethod
    def _default_sampler(
        cls,
        dataset: Any,
        shuffle: bool,
        generator: Optional[torch.Generator],
        seeded: Optional[torch.Generator],
    ) -> Any:
        if shuffle and seeded is None:
            return RandomSampler(dataset, generator=generator)
        return super()._default_sampler(dataset, shuffle, generator, seeded)

    # torchdata's state_dict() before the first iter() (or after a load)
    # starts the epoch's iterator, drawing what iter() draws, and the next
    # iter() returns that iterator
    _iterated: bool = False
    _initial_iterator: Any = None

    def __iter__(self) -> Any:
        it, self._initial_iterator = self._initial_iterator, None
        if it is not None:
            return it
        self._iterated = True
        return super().__iter__()

    def state_dict(self) -> dict[str, Any]:
        if not self._iterated:
            # a loaded state is what this returns until a batch is taken
            # (torchdata's contract), also once the iterator resumed from it
            loaded = super().state_dict() if self._pending_state is not None else None
            self._initial_iterator = super().__iter__()
            self._iterated = True
            if loaded is not None:
                return loaded
        return super().state_dict()

    def load_state_dict(self, state_dict: Union[dict[str, Any], list[dict[str, Any]]]) -> None:
        super().load_state_dict(state_dict)
        self._iterated = False
        self._initial_iterator = None


register_loader("torchdata", StatefulDataLoader)


__all__ = ["RandomSampler", "Stateful", "StatefulDataLoader"]
