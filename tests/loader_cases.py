"""Datasets, samplers and cases shared by the test_loader_*_vs_torch files.

Each dataset is built fresh per run from `lib` (torch.utils.data or
ferroloader), so neither loader sees state the other left behind.
"""

from __future__ import annotations

import collections

import numpy as np
import torch
import torch.utils.data as tud
from helpers import FERRO, TORCH

N = 10  # dataset length: batch sizes 3 and 7 leave a partial last batch

Point = collections.namedtuple("Point", ["x", "y"])
Record = collections.namedtuple("Record", ["name", "value", "tags"])


# --------------------------------------------------------------------------- #
# datasets (each built fresh per run from `lib`, the side's module)
# --------------------------------------------------------------------------- #


class ListDataset(tud.Dataset):
    """Map-style dataset over a list built by `make(i)`; logs the indices it gets."""

    def __init__(self, make, n=N):
        self.items = [make(i) for i in range(n)]
        self.log = []

    def __getitem__(self, index):
        self.log.append(("getitem", type(index).__name__, index))
        return self.items[index]

    def __len__(self):
        return len(self.items)

    def __repr__(self):
        return f"ListDataset(n={len(self.items)})"


class GetItemsDataset(ListDataset):
    """Defines __getitems__: the loader must call it with the batch's index list."""

    def __getitems__(self, indices):
        self.log.append(("getitems", type(indices).__name__, list(indices)))
        return [("batched", self.items[i]) for i in indices]


class DictKeyDataset(tud.Dataset):
    """Map-style dataset with string keys (needs a custom sampler)."""

    def __init__(self):
        self.data = {f"k{i}": i * 10 for i in range(N)}
        self.log = []

    def __getitem__(self, key):
        self.log.append(("getitem", type(key).__name__, key))
        return {"key": key, "value": self.data[key]}

    def __len__(self):
        return len(self.data)


class RangeIterable(tud.IterableDataset):
    """IterableDataset without __len__."""

    def __init__(self, n=N, make=None):
        self.n = n
        self.make = make or (lambda i: i)
        self.log = []

    def __iter__(self):
        self.log.append(("iter",))
        for i in range(self.n):
            yield self.make(i)

    def __repr__(self):
        return f"RangeIterable(n={self.n})"


class SizedIterable(RangeIterable):
    """IterableDataset with a __len__ that may under-report (to trigger torch's warning)."""

    def __init__(self, n=N, reported=None, make=None):
        super().__init__(n, make)
        self.reported = n if reported is None else reported

    def __len__(self):
        return self.reported

    def __repr__(self):
        return f"SizedIterable(n={self.n}, reported={self.reported})"


def _t(make):
    return lambda lib: ListDataset(make)


def _noncontig(i):
    return torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2] + i


def _transposed(i):
    return (torch.arange(12, dtype=torch.float64).reshape(3, 4) * i).t()


def _expanded(i):
    return torch.tensor([float(i)]).expand(3, 4)


def _channels_last(i):
    return (torch.arange(24, dtype=torch.float32).reshape(1, 2, 3, 4) + i).to(
        memory_format=torch.channels_last
    )


def _np(dtype):
    def make(i):
        return (np.arange(6).reshape(2, 3) + i).astype(dtype)

    return make


MAP_DATASETS = {
    "int": _t(lambda i: i),
    "negative_big_int": _t(lambda i: -(2**40) + i),
    "float": _t(lambda i: i / 3),
    "float_special": _t(lambda i: [float("nan"), float("inf"), -0.0, 1e308, -1.5][i % 5]),
    "bool": _t(lambda i: i % 3 == 0),
    "str": _t(lambda i: f"s{i}"),
    "bytes": _t(lambda i: bytes([65 + i, 66])),
    "tuple": _t(lambda i: (i, float(i), f"x{i}")),
    "list": _t(lambda i: [i, i * 2, i * 3]),
    "dict": _t(lambda i: {"a": i, "b": float(i), "c": f"c{i}"}),
    "nested_dict": _t(
        lambda i: {"outer": {"inner": [i, (i, i + 1)], "t": torch.full((2,), i)}, "s": "k"}
    ),
    "ordered_dict": _t(lambda i: collections.OrderedDict([("z", i), ("a", [i, i])])),
    "namedtuple": _t(lambda i: Point(i, float(i))),
    "namedtuple_nested": _t(lambda i: Record(f"r{i}", torch.tensor([i, i]), [i, "t"])),
    "tensor_f32_2d": _t(lambda i: torch.arange(6, dtype=torch.float32).reshape(2, 3) * i),
    "tensor_f64_0d": _t(lambda i: torch.tensor(i * 0.5, dtype=torch.float64)),
    "tensor_i64": _t(lambda i: torch.arange(4) + i),
    "tensor_i32": _t(lambda i: torch.arange(4, dtype=torch.int32) - i),
    "tensor_i16": _t(lambda i: torch.arange(3, dtype=torch.int16) * i),
    "tensor_i8": _t(lambda i: torch.arange(3, dtype=torch.int8) - i),
    "tensor_u8": _t(lambda i: torch.arange(5, dtype=torch.uint8) + i),
    "tensor_bf16": _t(lambda i: torch.linspace(0, 1, 5, dtype=torch.bfloat16) * i),
    "tensor_f16": _t(lambda i: torch.linspace(0, 1, 5, dtype=torch.float16) + i),
    "tensor_c64": _t(lambda i: torch.tensor([1 + 2j, i - 1j], dtype=torch.complex64)),
    "tensor_c128": _t(lambda i: torch.tensor([i + 0.5j], dtype=torch.complex128)),
    "tensor_bool": _t(lambda i: torch.tensor([i % 2 == 0, True, False])),
    "tensor_0d_int": _t(lambda i: torch.tensor(i)),
    "tensor_empty": _t(lambda i: torch.zeros(0, 3)),
    "tensor_nan": _t(lambda i: torch.tensor([float("nan"), i, float("-inf")])),
    "tensor_noncontig": _t(_noncontig),
    "tensor_transposed": _t(_transposed),
    "tensor_expanded": _t(_expanded),
    "tensor_channels_last": _t(_channels_last),
    "tensor_requires_grad": _t(lambda i: torch.full((2,), float(i), requires_grad=True)),
    "np_f32": _t(_np(np.float32)),
    "np_f64": _t(_np(np.float64)),
    "np_f16": _t(_np(np.float16)),
    "np_i8": _t(_np(np.int8)),
    "np_i16": _t(_np(np.int16)),
    "np_i32": _t(_np(np.int32)),
    "np_i64": _t(_np(np.int64)),
    "np_u8": _t(_np(np.uint8)),
    "np_u16": _t(_np(np.uint16)),
    "np_u32": _t(_np(np.uint32)),
    "np_u64": _t(_np(np.uint64)),
    "np_bool": _t(_np(np.bool_)),
    "np_c64": _t(_np(np.complex64)),
    "np_c128": _t(_np(np.complex128)),
    "np_0d": _t(lambda i: np.array(i * 1.5)),
    "np_noncontig": _t(lambda i: (np.arange(12, dtype=np.float32).reshape(3, 4) + i)[:, ::2]),
    "np_fortran": _t(lambda i: np.asfortranarray(np.arange(6.0).reshape(2, 3) + i)),
    "np_scalar_f32": _t(lambda i: np.float32(i) / 4),
    "np_scalar_f64": _t(lambda i: np.float64(i) / 4),
    "np_scalar_i64": _t(lambda i: np.int64(i)),
    "np_scalar_i16": _t(lambda i: np.int16(i)),
    "np_scalar_u8": _t(lambda i: np.uint8(i)),
    "np_scalar_bool": _t(lambda i: np.bool_(i % 2)),
    "np_str_array": _t(lambda i: np.array(["a", "b"])),
    "np_object_array": _t(lambda i: np.array([i, "x"], dtype=object)),
    "none": _t(lambda i: None),
    "complex_py": _t(lambda i: complex(i, 1)),
    "mixed_int_float": _t(lambda i: i if i % 2 else float(i)),
    "mix": _t(
        lambda i: {
            "image": torch.full((3, 2, 2), i, dtype=torch.uint8),
            "feat": np.full((4,), i, dtype=np.float32),
            "label": i % 3,
            "weight": i / 7,
            "name": f"item{i}",
            "raw": b"\x00" * (i % 2 + 1),
            "pair": (np.int32(i), torch.tensor(float(i))),
            "meta": {"ok": i % 2 == 0, "ids": [i, i + 1]},
        }
    ),
    "getitems": lambda lib: GetItemsDataset(lambda i: {"v": i, "t": torch.tensor([i, -i])}),
    "torch_tensor_dataset": lambda lib: TORCH.TensorDataset(
        torch.randn(N, 32), torch.randint(0, 5, (N,))
    ),
    "ferro_tensor_dataset": lambda lib: FERRO.TensorDataset(
        torch.randn(N, 32), torch.randint(0, 5, (N,))
    ),
    "lib_tensor_dataset": lambda lib: lib.TensorDataset(
        torch.randn(N, 32), torch.randint(0, 5, (N,))
    ),
    "lib_tensor_dataset_3": lambda lib: lib.TensorDataset(
        torch.arange(N, dtype=torch.float64),
        torch.randn(N, 2, 3).transpose(1, 2),
        torch.randint(0, 2, (N,), dtype=torch.bool),
    ),
}


# --------------------------------------------------------------------------- #


class UserSampler(tud.Sampler):
    """A Python sampler that draws from the global torch RNG while iterating."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        order = list(range(self.n - 1, -1, -1))
        for i in order:
            if torch.rand(()) < 0.3:
                yield (i * 7) % self.n
            yield i

    def __len__(self):
        return 2 * self.n


class UserBatchSampler(tud.Sampler):
    """Batches of varying size, one of them drawn from the global RNG."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        start = 0
        size = 1
        while start < self.n:
            yield list(range(start, min(start + size, self.n)))
            start += size
            size = int(torch.randint(1, 4, ()).item())

    def __len__(self):
        return self.n



def _user_sampler(ctx):
    return UserSampler(len(ctx.dataset))


ITERABLES = {
    "ints_nolen": lambda lib: RangeIterable(),
    "ints_len": lambda lib: SizedIterable(),
    "empty": lambda lib: RangeIterable(0),
    "dicts": lambda lib: RangeIterable(make=lambda i: {"x": torch.full((2,), i), "s": str(i)}),
    "numpy": lambda lib: RangeIterable(make=lambda i: np.full((3,), i, dtype=np.int16)),
    "tuples": lambda lib: SizedIterable(make=lambda i: (i, float(i) / 2, torch.tensor([i]))),
    "chain": lambda lib: lib.ChainDataset([RangeIterable(4), SizedIterable(5)]),
    "chain_plus": lambda lib: RangeIterable(3) + SizedIterable(4),
}


def _samplers():
    """name -> fn(ctx) building a sampler over ctx.dataset, from ctx.lib's classes."""

    def lib_sampler(cls_name, *args_fn, **kw):
        def build(ctx, cls_from=None):
            lib = cls_from or ctx.lib
            cls = getattr(lib, cls_name)
            resolved = {k: (v(ctx) if callable(v) else v) for k, v in kw.items()}
            return cls(*(a(ctx) if callable(a) else a for a in args_fn), **resolved)

        return build

    ds = lambda ctx: ctx.dataset  # noqa: E731
    gen = lambda seed: (lambda ctx: ctx.gen(seed))  # noqa: E731
    return {
        "sequential": lib_sampler("SequentialSampler", ds),
        "random": lib_sampler("RandomSampler", ds),
        "random_gen": lib_sampler("RandomSampler", ds, generator=gen(11)),
        "random_repl": lib_sampler("RandomSampler", ds, replacement=True),
        "random_repl_gen_40": lib_sampler(
            "RandomSampler", ds, replacement=True, num_samples=40, generator=gen(12)
        ),
        "random_num_samples_small": lib_sampler("RandomSampler", ds, num_samples=4),
        "random_num_samples_big": lib_sampler("RandomSampler", ds, num_samples=25),
        "random_num_samples_multiple": lib_sampler(
            "RandomSampler", ds, num_samples=2 * N, generator=gen(13)
        ),
        "subset_random": lib_sampler(
            "SubsetRandomSampler", lambda ctx: [8, 1, 5, 3, 9, 0]
        ),
        "subset_random_gen": lib_sampler(
            "SubsetRandomSampler", lambda ctx: range(2, 9), generator=gen(14)
        ),
        "weighted": lib_sampler(
            "WeightedRandomSampler", lambda ctx: [0.1, 0.5, 2.0, 0, 1, 1, 3, 0.2, 0.2, 4], 15
        ),
        "weighted_noreplace_gen": lib_sampler(
            "WeightedRandomSampler",
            lambda ctx: torch.tensor([1.0, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
            7,
            replacement=False,
            generator=gen(15),
        ),
        "distributed": lib_sampler(
            "DistributedSampler", ds, num_replicas=3, rank=1, shuffle=True, seed=4
        ),
        "distributed_noshuffle_droplast": lib_sampler(
            "DistributedSampler", ds, num_replicas=4, rank=3, shuffle=False, drop_last=True
        ),
    }


SAMPLERS = _samplers()


def identity_collate(batch):
    return batch
