"""Datasets: subclasses of torch's, so both loaders and ``isinstance`` checks
accept them. ``random_split`` draws its permutation in Rust."""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any, Optional, Sequence, TypeVar, Union, cast

import torch
import torch.utils.data.dataset as _td

import ferroloader._core as _core

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


class Dataset(_td.Dataset[_T_co]):
    __doc__ = _td.Dataset.__doc__

    def __add__(self, other: _td.Dataset[_T_co]) -> ConcatDataset[_T_co]:
        return ConcatDataset([self, other])


class IterableDataset(_td.IterableDataset[_T_co], Dataset[_T_co]):
    __doc__ = _td.IterableDataset.__doc__

    def __add__(self, other: _td.Dataset[_T_co]) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


class TensorDataset(_td.TensorDataset, Dataset[tuple[torch.Tensor, ...]]):
    """Dataset wrapping tensors; with the default collate the loader gathers a
    whole batch from each tensor in one pass."""


class StackDataset(_td.StackDataset, Dataset[Any]):
    __doc__ = _td.StackDataset.__doc__


class ConcatDataset(_td.ConcatDataset[_T_co], Dataset[_T_co]):
    __doc__ = _td.ConcatDataset.__doc__


class ChainDataset(_td.ChainDataset, IterableDataset[Any]):
    __doc__ = _td.ChainDataset.__doc__


class Subset(_td.Subset[_T_co], Dataset[_T_co]):
    __doc__ = _td.Subset.__doc__


def random_split(
    dataset: _td.Dataset[_T],
    lengths: Sequence[Union[int, float]],
    generator: Optional[torch.Generator] = torch.default_generator,
) -> list[Subset[_T]]:
    """Same split and same generator consumption as
    ``torch.utils.data.random_split``; the permutation is drawn in Rust."""
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        subset_lengths: list[int] = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            subset_lengths.append(math.floor(len(dataset) * frac))  # type: ignore[arg-type]
        remainder = len(dataset) - sum(subset_lengths)  # type: ignore[arg-type]
        for i in range(remainder):
            subset_lengths[i % len(subset_lengths)] += 1
        lengths = subset_lengths
        for i, length in enumerate(lengths):
            if length == 0:
                warnings.warn(
                    f"Length of split at index {i} is 0. This might result in an empty dataset.",
                    stacklevel=2,
                )
    if sum(lengths) != len(dataset):  # type: ignore[arg-type]
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    total = sum(lengths)
    if isinstance(total, int) and (
        generator is None
        or (isinstance(generator, torch.Generator) and generator.device.type == "cpu")
    ):
        indices = _core.randperm(total, generator)
    else:
        indices = torch.randperm(total, generator=generator).tolist()  # type: ignore[arg-type]
    int_lengths = cast(Sequence[int], lengths)
    return [
        Subset(dataset, indices[offset - length : offset])
        for offset, length in zip(itertools.accumulate(int_lengths), int_lengths)
    ]


__all__ = [
    "ChainDataset",
    "ConcatDataset",
    "Dataset",
    "IterableDataset",
    "StackDataset",
    "Subset",
    "TensorDataset",
    "random_split",
]
