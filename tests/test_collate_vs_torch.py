"""ferroloader.default_collate / default_convert / collate against torch's.

Every case builds the same input twice (fresh objects for each side) and
asserts ferroloader returns exactly what torch returns (types at every level,
tensor dtype/shape/strides/values), or raises the same exception type with the
same message.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import io
import pickle
import types
import typing
from collections.abc import Mapping, Sequence

import ferroloader
import numpy as np
import pytest
import torch
import torch.utils.data as tud
from helpers import (
    FERRO,
    TORCH,
    PerRun,
    Raised,
    assert_same,
    assert_same_call,
    assert_same_error,
    assert_same_outcome,
    error_on,
    outcome,
    run_both,
    same_on,
)
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data._utils import collate as torch_collate_mod

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The given NumPy array is not writable:UserWarning"),
]

Point = collections.namedtuple("Point", ["x", "y"])
Triple = collections.namedtuple("Triple", ["a", "b", "c"])


class FrozenMapping(Mapping):
    """An immutable Mapping whose constructor takes a dict."""

    def __init__(self, data):
        self._d = dict(data)

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)

    def __eq__(self, other):
        return isinstance(other, FrozenMapping) and self._d == other._d

    def __repr__(self):
        return f"FrozenMapping({self._d!r})"


class StrictMapping(FrozenMapping):
    """A Mapping whose constructor rejects a dict (torch falls back to dict)."""

    def __init__(self, *pairs):
        if pairs and isinstance(pairs[0], dict):
            raise TypeError("StrictMapping takes pairs")
        super().__init__(dict(pairs))


class AttrDict(dict):
    """A dict subclass with an extra attribute (copy.copy keeps it)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.tag = "attr"


class FrozenSeq(Sequence):
    def __init__(self, items):
        self._items = list(items)

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self):
        return len(self._items)

    def __eq__(self, other):
        return isinstance(other, FrozenSeq) and self._items == other._items

    def __repr__(self):
        return f"FrozenSeq({self._items!r})"


class SubArray(np.ndarray):
    pass


class TaggedList(list):
    def __init__(self, *a):
        super().__init__(*a)
        self.tag = "t"


class Pair(typing.NamedTuple):
    left: int
    right: str = "r"


@dataclasses.dataclass
class DataPoint:
    v: int


class MyTensor(torch.Tensor):
    pass


def _readonly(a):
    a.flags.writeable = False
    return a


class MyInt(int):
    pass


class MyFloat(float):
    pass


class MyStr(str):
    pass


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


def _stack3(make):
    return lambda: [make(i) for i in range(3)]


def _nd(dtype, shape=(2, 3)):
    return _stack3(lambda i: (np.arange(int(np.prod(shape))).reshape(shape) + i).astype(dtype))


# name -> () -> batch (a list of samples)
BATCHES = {
    # Python scalars
    "int": _stack3(lambda i: i * 7 - 3),
    "int_big": _stack3(lambda i: 2**62 + i),
    "int_overflow": lambda: [2**70, 1],
    "int64_limits": lambda: [-(2**63), 2**63 - 1],
    "int_2_63": lambda: [2**63, 0],
    "int_negative_overflow": lambda: [-(2**63) - 1, 0],
    "bool": _stack3(lambda i: i == 1),
    "bool_then_int": lambda: [True, 2, False],
    "int_then_bool": lambda: [2, True],
    "float": _stack3(lambda i: i / 3),
    "float_special": lambda: [float("nan"), float("inf"), -0.0, float("-inf"), 5e-324],
    "int_then_float": lambda: [1, 2.5, 3],
    "float_then_int": lambda: [2.5, 1],
    "complex": lambda: [1 + 2j, 3j],
    "int_then_str": lambda: [1, "a"],
    "float_then_none": lambda: [1.0, None],
    "int_subclass": _stack3(lambda i: MyInt(i)),
    "int_enum": _stack3(lambda i: Color(1 + i % 2)),
    "float_subclass": _stack3(lambda i: MyFloat(i / 2)),
    "str_subclass": _stack3(lambda i: MyStr(f"m{i}")),
    "str": _stack3(lambda i: f"s{i}"),
    "str_empty": lambda: ["", ""],
    "bytes": _stack3(lambda i: bytes([i, 255])),
    "bytearray": _stack3(lambda i: bytearray([i, i + 1])),
    "none": lambda: [None, None],
    "range": lambda: [range(3), range(1, 4)],
    "object": lambda: [types.SimpleNamespace(a=1), types.SimpleNamespace(a=2)],
    "empty_batch": lambda: [],
    # tensors
    "tensor_f32": _stack3(lambda i: torch.arange(6, dtype=torch.float32).reshape(2, 3) * i),
    "tensor_f64": _stack3(lambda i: torch.tensor([i / 7, -i], dtype=torch.float64)),
    "tensor_f16": _stack3(lambda i: torch.tensor([i / 7], dtype=torch.float16)),
    "tensor_bf16": _stack3(lambda i: torch.tensor([i / 7, 1e30], dtype=torch.bfloat16)),
    "tensor_c64": _stack3(lambda i: torch.tensor([i + 1j], dtype=torch.complex64)),
    "tensor_c128": _stack3(lambda i: torch.tensor([[i - 1j]], dtype=torch.complex128)),
    "tensor_bool": _stack3(lambda i: torch.tensor([i % 2 == 0, True])),
    "tensor_u8": _stack3(lambda i: torch.tensor([i, 255], dtype=torch.uint8)),
    "tensor_i8": _stack3(lambda i: torch.tensor([i, -128], dtype=torch.int8)),
    "tensor_i16": _stack3(lambda i: torch.tensor([i], dtype=torch.int16)),
    "tensor_i32": _stack3(lambda i: torch.tensor([i], dtype=torch.int32)),
    "tensor_i64": _stack3(lambda i: torch.tensor([i, 2**62])),
    "tensor_u16": _stack3(lambda i: torch.tensor([i], dtype=torch.int32).to(torch.uint16)),
    "tensor_u32": _stack3(lambda i: torch.tensor([i], dtype=torch.int64).to(torch.uint32)),
    "tensor_u64": _stack3(lambda i: torch.tensor([i], dtype=torch.int64).to(torch.uint64)),
    "tensor_f8e4m3": _stack3(lambda i: torch.tensor([i / 2]).to(torch.float8_e4m3fn)),
    "tensor_0d": _stack3(lambda i: torch.tensor(i * 1.5)),
    "tensor_empty": _stack3(lambda i: torch.zeros(0, 4)),
    "tensor_nan": _stack3(lambda i: torch.tensor([float("nan"), i])),
    "tensor_transposed": _stack3(lambda i: (torch.arange(12.0).reshape(3, 4) + i).t()),
    "tensor_sliced": _stack3(lambda i: torch.arange(20)[i::3][:4]),
    "tensor_expanded": _stack3(lambda i: torch.tensor([i]).expand(2, 3)),
    "tensor_channels_last": _stack3(
        lambda i: torch.zeros(1, 2, 3, 3).add(i).to(memory_format=torch.channels_last)
    ),
    "tensor_channels_last_3d": _stack3(
        lambda i: torch.zeros(2, 3, 3).add(i).to(memory_format=torch.contiguous_format)
    ),
    "tensor_offset_views": lambda: list(torch.arange(12.0).reshape(4, 3)),
    "tensor_requires_grad": _stack3(lambda i: torch.full((2,), i * 1.0, requires_grad=True)),
    "tensor_conj": _stack3(lambda i: torch.tensor([i + 2j]).conj()),
    "tensor_neg_view": _stack3(lambda i: torch.tensor([i + 2j]).conj().imag),
    "tensor_mixed_dtype": lambda: [torch.tensor([1], dtype=torch.int32), torch.tensor([2.5])],
    "tensor_mixed_dtype_2": lambda: [torch.tensor([1.5]), torch.tensor([True])],
    "tensor_shape_mismatch": lambda: [torch.zeros(3), torch.zeros(4)],
    "tensor_ndim_mismatch": lambda: [torch.zeros(3), torch.zeros(1, 3)],
    "tensor_then_ndarray": lambda: [torch.zeros(2), np.zeros(2)],
    "tensor_then_int": lambda: [torch.zeros(2), 3],
    "tensor_then_none": lambda: [torch.zeros(2), None],
    "tensor_subclass": _stack3(lambda i: torch.nn.Parameter(torch.ones(2) * i)),
    "tensor_sparse": _stack3(lambda i: torch.eye(2).to_sparse() * i),
    "tensor_custom_subclass": _stack3(lambda i: torch.full((2,), float(i)).as_subclass(MyTensor)),
    "tensor_meta": _stack3(lambda i: torch.empty(2, 3, device="meta")),
    "tensor_int64_limits": lambda: [torch.tensor([-(2**63)]), torch.tensor([2**63 - 1])],
    # numpy arrays
    **{
        f"np_{dt}": _nd(dt)
        for dt in (
            "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
            "float16", "float32", "float64", "complex64", "complex128",
        )
    },
    "np_0d": _stack3(lambda i: np.array(i * 0.5)),
    "np_readonly": _stack3(lambda i: _readonly(np.arange(4) + i)),
    "np_empty": _stack3(lambda i: np.zeros((0, 2), dtype=np.int32)),
    "np_noncontig": _stack3(lambda i: (np.arange(24, dtype=np.float32).reshape(4, 6) + i)[:, ::2]),
    "np_fortran": _stack3(lambda i: np.asfortranarray(np.arange(6.0).reshape(2, 3) + i)),
    "np_negative_stride": _stack3(lambda i: np.arange(5)[::-1]),
    "np_bigendian": _stack3(lambda i: np.arange(3, dtype=">i4")),
    "np_longdouble": _stack3(lambda i: np.zeros(2, dtype=np.longdouble)),
    "np_datetime": _stack3(lambda i: np.zeros(2, dtype="M8[s]")),
    "np_void": _stack3(lambda i: np.zeros(2, dtype="V4")),
    "np_structured": _stack3(lambda i: np.zeros(2, dtype=[("a", "i4"), ("b", "f4")])),
    "np_str": _stack3(lambda i: np.array(["a", "bc"])),
    "np_bytes": _stack3(lambda i: np.array([b"a", b"bc"])),
    "np_object": _stack3(lambda i: np.array([1, None], dtype=object)),
    "np_shape_mismatch": lambda: [np.zeros(2), np.zeros(3)],
    "np_dtype_mix": lambda: [np.zeros(2, dtype=np.float32), np.zeros(2, dtype=np.int64)],
    "np_then_tensor": lambda: [np.zeros(2), torch.zeros(2)],
    "np_subclass": _stack3(lambda i: (np.arange(3) + i).view(SubArray)),
    "np_matrix": _stack3(lambda i: np.asmatrix(np.eye(2) * i)),
    # numpy scalars
    "np_scalar_f32": _stack3(lambda i: np.float32(i / 3)),
    "np_scalar_f64": _stack3(lambda i: np.float64(i / 3)),
    "np_scalar_f16": _stack3(lambda i: np.float16(i / 3)),
    "np_scalar_i8": _stack3(lambda i: np.int8(-i)),
    "np_scalar_i32": _stack3(lambda i: np.int32(i)),
    "np_scalar_i64": _stack3(lambda i: np.int64(i)),
    "np_scalar_u8": _stack3(lambda i: np.uint8(i)),
    "np_scalar_u64": _stack3(lambda i: np.uint64(i)),
    "np_scalar_bool": _stack3(lambda i: np.bool_(i % 2)),
    "np_scalar_c64": _stack3(lambda i: np.complex64(i + 1j)),
    "np_scalar_mixed": lambda: [np.float32(1.5), np.int64(2), np.float64(0.25)],
    "np_scalar_then_int": lambda: [np.int16(3), 4],
    "np_scalar_then_float": lambda: [np.float32(3), 4.5],
    "np_scalar_str": _stack3(lambda i: np.str_(f"s{i}")),
    "np_scalar_bytes": _stack3(lambda i: np.bytes_(b"x")),
    "np_scalar_datetime": _stack3(lambda i: np.datetime64(i, "s")),
    # containers
    "tuple": _stack3(lambda i: (i, float(i), f"s{i}")),
    "tuple_of_str": _stack3(lambda i: (f"a{i}", f"b{i}")),
    "list": _stack3(lambda i: [i, f"s{i}"]),
    "list_of_str": _stack3(lambda i: [f"a{i}", f"b{i}"]),
    "dict": _stack3(lambda i: {"a": i, "b": torch.tensor([i]), "s": f"s{i}"}),
    "dict_of_str": _stack3(lambda i: {"s": f"s{i}"}),
    "dict_int_keys": _stack3(lambda i: {2: i, 1: float(i), (0, 1): "k"}),
    "dict_nested": _stack3(
        lambda i: {"o": {"i": [np.int64(i), {"deep": (torch.tensor(i), "x")}]}, "n": [i]}
    ),
    "dict_missing_key": lambda: [{"a": 1, "b": 2}, {"a": 3}],
    "dict_key_order": lambda: [{"a": 1, "b": 2.0}, {"b": 3.0, "a": 4}],
    "typed_namedtuple": _stack3(lambda i: Pair(i, f"p{i}")),
    "dataclass": _stack3(lambda i: DataPoint(i)),
    "tensor_nonleaf": lambda: [torch.ones(2, requires_grad=True) * 2 for _ in range(3)],
    "dict_extra_key": lambda: [{"a": 1}, {"a": 3, "b": 4}],
    "dict_none_value": lambda: [{"a": None}, {"a": None}],
    "ordered_dict": _stack3(lambda i: collections.OrderedDict([("z", i), ("a", f"s{i}")])),
    "defaultdict": _stack3(lambda i: collections.defaultdict(list, {"k": i})),
    "attr_dict": _stack3(lambda i: AttrDict(k=i)),
    "frozen_mapping": _stack3(lambda i: FrozenMapping({"k": i, "s": "x"})),
    "strict_mapping": _stack3(lambda i: StrictMapping(("k", i))),
    "namedtuple": _stack3(lambda i: Point(i, float(i))),
    "namedtuple_str": _stack3(lambda i: Point(f"x{i}", torch.tensor([i]))),
    "namedtuple_nested": _stack3(lambda i: Triple(Point(i, i), [i, "s"], {"k": np.float32(i)})),
    "frozen_seq": _stack3(lambda i: FrozenSeq([i, i + 1])),
    "tagged_list": _stack3(lambda i: TaggedList([i, f"s{i}"])),
    "list_unequal": lambda: [[1, 2], [3]],
    "tuple_unequal": lambda: [(1, 2), (3, 4, 5)],
    "namedtuple_mixed_with_tuple": lambda: [Point(1, 2), (3, 4)],
    "list_then_tuple": lambda: [[1, 2], (3, 4)],
    "tuple_then_list": lambda: [(1, 2), [3, 4]],
    "dict_then_list": lambda: [{"a": 1}, [1]],
    "list_of_none": lambda: [[None, 1], [None, 2]],
    "list_empty": lambda: [[], []],
    "tuple_empty": lambda: [(), ()],
    "dict_empty": lambda: [{}, {}],
    "mix": _stack3(
        lambda i: {
            "img": torch.full((3, 2, 2), i, dtype=torch.uint8),
            "feat": np.full((4,), i / 3, dtype=np.float32),
            "label": i,
            "w": i / 7,
            "name": f"n{i}",
            "raw": b"r",
            "pair": (np.int32(i), torch.tensor(float(i))),
            "meta": {"ok": i % 2 == 0, "ids": [i, i + 1], "pt": Point(i, "p")},
        }
    ),
}


@pytest.mark.parametrize("name", list(BATCHES))
def test_default_collate(name):
    """default_collate gives torch's result (values, dtypes, types, structure) for every batch
    kind."""
    make = BATCHES[name]
    same_on(make, TORCH.default_collate, FERRO.default_collate)


@pytest.mark.parametrize("name", list(BATCHES))
def test_default_convert_each_sample(name):
    """default_convert of each sample equals torch's."""
    batch = BATCHES[name]
    for i in range(len(batch())):
        same_on(lambda i=i: batch()[i], TORCH.default_convert, FERRO.default_convert)


@pytest.mark.parametrize("name", list(BATCHES))
def test_default_convert_whole_batch(name):
    """default_convert of a whole batch equals torch's."""
    batch = BATCHES[name]
    same_on(batch, TORCH.default_convert, FERRO.default_convert)


@pytest.mark.parametrize("name", list(BATCHES))
def test_collate_with_default_map(name):
    """collate(batch, collate_fn_map=<the lib's default map>) == default_collate."""
    batch = BATCHES[name]
    same_on(
        batch,
        lambda b: torch_collate_mod.collate(
            b, collate_fn_map=torch_collate_mod.default_collate_fn_map
        ),
        lambda b: FERRO.collate(b, collate_fn_map=FERRO.default_collate_fn_map),
    )


def test_default_collate_is_exported_from_dataloader_module_names():
    """default_collate and default_convert are exported under torch's names."""
    assert callable(ferroloader.default_collate)
    assert callable(ferroloader.default_convert)
    assert callable(ferroloader.collate)
    assert isinstance(ferroloader.default_collate_fn_map, dict) or isinstance(
        ferroloader.default_collate_fn_map, collections.abc.MutableMapping
    )
    # the same keys as torch's registry, in the same order
    assert list(ferroloader.default_collate_fn_map) == list(
        torch_collate_mod.default_collate_fn_map
    )


# --------------------------------------------------------------------------- #
# the structure rules, spelled out (still compared with torch, not hard-coded)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "batch",
    [
        lambda: [("a", 1), ("b", 2)],
        lambda: [{"s": "a"}, {"s": "b"}],
        lambda: [["a", 1], ["b", 2]],
        lambda: [Point("a", 1), Point("b", 2)],
        lambda: [(b"x", 1), (b"y", 2)],
    ],
    ids=["tuple", "dict", "list", "namedtuple", "bytes_tuple"],
)
def test_str_container_types(batch):
    """Batches of str containers collate to torch's types and values."""
    e = TORCH.default_collate(batch())
    a = FERRO.default_collate(batch())
    assert_same(e, a)
    # types of the string leaf specifically (tuple in a tuple, list in a dict, ...)
    leaf_e = e["s"] if isinstance(e, dict) else e[0]
    leaf_a = a["s"] if isinstance(a, dict) else a[0]
    assert type(leaf_e) is type(leaf_a)


def test_tensor_batch_is_a_new_tensor_not_a_view_of_input():
    """A collated tensor batch is new memory, not a view of an input tensor, as in torch."""
    def run(lib):
        samples = [torch.arange(3.0) for _ in range(2)]
        out = lib.default_collate(samples)
        samples[0][0] = 100.0  # must not show through the batch
        return out

    assert_same(run(TORCH), run(FERRO))


def test_default_convert_tensor_is_identity():
    """default_convert returns a tensor itself, as torch does."""
    t = torch.arange(3)
    assert TORCH.default_convert(t) is t
    assert FERRO.default_convert(t) is t


def test_default_convert_ndarray_shares_memory():
    """default_convert of an ndarray shares its memory, as torch's does."""
    def run(lib):
        a = np.arange(4, dtype=np.float32)
        t = lib.default_convert(a)
        a[0] = 42
        return t

    assert_same(run(TORCH), run(FERRO))


def test_default_collate_ndarray_does_not_share_memory():
    """default_collate of ndarrays copies them, as torch's does."""
    def run(lib):
        arrs = [np.arange(4, dtype=np.float32) for _ in range(2)]
        t = lib.default_collate(arrs)
        arrs[0][0] = 42
        return t

    assert_same(run(TORCH), run(FERRO))


def test_default_collate_str_batch_identity():
    """A batch of strings collates to the same list object torch returns."""
    batch = ["a", "b"]
    # torch returns the very list it was given for a batch of str
    assert (TORCH.default_collate(batch) is batch) == (FERRO.default_collate(batch) is batch)


def _tensor_leaves(x, path="batch"):
    if isinstance(x, torch.Tensor):
        yield path, x
    elif isinstance(x, collections.abc.Mapping):
        for k in x:
            yield from _tensor_leaves(x[k], f"{path}[{k!r}]")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _tensor_leaves(v, f"{path}[{i}]")


def storage_facts(t):
    st_ = t.untyped_storage()
    return {
        "storage_offset": t.storage_offset(),
        "storage_nbytes": st_.nbytes(),
        "resizable": st_.resizable(),
        "is_shared": t.is_shared(),
        "is_pinned": t.is_pinned(),
        "aligned_64": t.data_ptr() % 64 == 0 if st_.nbytes() else True,
    }


def tensor_behaviour(t):
    """What a training loop might do with a batch tensor; outcomes only."""
    out = {}
    c = t.detach().clone()
    out["pickle"] = outcome(lambda: pickle.loads(pickle.dumps(c)))
    buf = io.BytesIO()
    out["save_load"] = outcome(lambda: (torch.save(t.detach(), buf), buf.seek(0),
                                        torch.load(buf))[2])
    out["numpy"] = outcome(
        lambda: t.detach().numpy().tolist() if t.dtype not in (torch.bfloat16,) else None
    )
    out["inplace_add"] = outcome(lambda: t.detach().add_(1) if t.dtype != torch.bool else None)
    out["resize"] = outcome(lambda: tuple(t.detach().resize_(0).shape))
    out["share_memory"] = outcome(lambda: t.detach().share_memory_().is_shared())
    return out


STORAGE_BATCHES = [n for n in BATCHES if n.startswith(("tensor_", "np_")) or n in (
    "int", "float", "bool", "dict", "mix", "tuple", "namedtuple")]


@pytest.mark.parametrize("name", STORAGE_BATCHES)
def test_collated_tensors_own_their_storage_like_torch(name):
    """Each collated leaf: its own storage, of torch's size and offset, resizable, aligned."""
    make = BATCHES[name]
    e = outcome(lambda: TORCH.default_collate(make()))
    a = outcome(lambda: FERRO.default_collate(make()))
    if isinstance(e, Raised) or isinstance(a, Raised):
        assert_same_call(lambda: e if not isinstance(e, Raised) else _reraise(e),
                         lambda: a if not isinstance(a, Raised) else _reraise(a))
        return
    le, la = list(_tensor_leaves(e)), list(_tensor_leaves(a))
    assert [p for p, _ in le] == [p for p, _ in la]
    for (path, te), (_, ta) in zip(le, la):
        if te.layout != torch.strided:
            continue
        assert storage_facts(te) == storage_facts(ta), path
        # leaves never share storage with one another
    ptrs = [t.untyped_storage().data_ptr() for _, t in la if t.untyped_storage().nbytes()]
    assert len(ptrs) == len(set(ptrs)), "collated leaves share one storage"


def _reraise(r):
    raise r.type(r.message)


@pytest.mark.parametrize("name", ["tensor_f32", "tensor_bf16", "tensor_bool", "np_float64",
                                  "int", "float", "mix", "tensor_transposed",
                                  "tensor_requires_grad"])
def test_collated_tensors_behave_like_torch(name):
    """Collated tensors have torch's strides, contiguity, requires_grad and storage behaviour."""
    make = BATCHES[name]
    e = list(_tensor_leaves(TORCH.default_collate(make())))
    a = list(_tensor_leaves(FERRO.default_collate(make())))
    for (path, te), (_, ta) in zip(e, a):
        be, ba = tensor_behaviour(te), tensor_behaviour(ta)
        for k in be:
            assert_same_outcome(be[k], ba[k], f"{path}.{k}")


# --------------------------------------------------------------------------- #
# errors, spelled out
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "name",
    [
        "none",
        "list_unequal",
        "tuple_unequal",
        "np_str",
        "np_object",
        "np_bytes",
        "tensor_shape_mismatch",
        "tensor_ndim_mismatch",
        "tensor_then_ndarray",
        "tensor_then_int",
        "int_then_str",
        "complex",
        "object",
        "empty_batch",
        "dict_missing_key",
        "int_overflow",
        "np_negative_stride",
        "np_bigendian",
        "np_datetime",
        "tensor_sparse",
        "dict_then_list",
    ],
)
def test_collate_errors(name):
    """Uncollatable batches raise torch's exception type and message."""
    make = BATCHES[name]
    error_on(make, TORCH.default_collate, FERRO.default_collate)


def test_collate_error_nested_in_dict():
    """An uncollatable value deep inside dicts raises torch's error."""
    batch = lambda: [{"a": {"b": [1, None]}}, {"a": {"b": [2, None]}}]  # noqa: E731
    error_on(batch, TORCH.default_collate, FERRO.default_collate)


def test_collate_nested_tensor_error():
    """Nested tensors that cannot be stacked raise torch's error."""
    def batch():
        nt = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
        return [nt, nt]

    error_on(batch, TORCH.default_collate, FERRO.default_collate)


# --------------------------------------------------------------------------- #
# collate(batch, collate_fn_map=...)
# --------------------------------------------------------------------------- #


def _maps(lib_collate):
    """name -> collate_fn_map whose functions call back into `lib_collate`."""

    def cat_tensors(batch, *, collate_fn_map=None):
        return torch.cat(batch)

    def ints_as_sum(batch, *, collate_fn_map=None):
        return sum(batch)

    def numbers_as_tuple(batch, *, collate_fn_map=None):
        return tuple(batch)

    def seq_recurse(batch, *, collate_fn_map=None):
        return ("seq", lib_collate([list(x)[::-1] for x in batch], collate_fn_map=None))

    default_map = (
        torch_collate_mod.default_collate_fn_map
        if lib_collate is torch_collate_mod.collate
        else FERRO.default_collate_fn_map
    )
    return {
        "none": None,
        "empty": {},
        "default_minus_tensor": {k: v for k, v in default_map.items() if k is not torch.Tensor},
        "default_minus_int": {k: v for k, v in default_map.items() if k is not int},
        "default_reversed": dict(reversed(list(default_map.items()))),
        "tensor_only": {torch.Tensor: cat_tensors},
        "int_only": {int: ints_as_sum},
        "tuple_key": {(int, float): numbers_as_tuple, torch.Tensor: cat_tensors},
        "bool_first": {bool: numbers_as_tuple, int: ints_as_sum},
        "int_catches_bool": {int: ints_as_sum, bool: numbers_as_tuple},
        "object": {object: numbers_as_tuple},
        "sequence": {list: seq_recurse, str: numbers_as_tuple},
    }


MAP_NAMES = list(_maps(torch_collate_mod.collate))
MAP_BATCHES = ["int", "bool", "float", "tensor_f32", "tuple", "dict", "list", "mix",
               "namedtuple", "str", "np_float32", "list_of_str", "none", "np_scalar_f32",
               "int_subclass", "tensor_subclass"]


@pytest.mark.parametrize("batch_name", MAP_BATCHES)
@pytest.mark.parametrize("map_name", MAP_NAMES)
def test_collate_with_custom_map(map_name, batch_name):
    """collate() with a custom collate_fn_map gives torch's result."""
    make = BATCHES[batch_name]
    tmap = _maps(torch_collate_mod.collate)[map_name]
    fmap = _maps(FERRO.collate)[map_name]
    same_on(
        make,
        lambda b: torch_collate_mod.collate(b, collate_fn_map=tmap),
        lambda b: FERRO.collate(b, collate_fn_map=fmap),
    )


def test_collate_without_map_keyword():
    """collate() without collate_fn_map behaves as torch's."""
    make = BATCHES["dict"]
    same_on(make, torch_collate_mod.collate, FERRO.collate)


def test_collate_map_positional_is_rejected():
    """Passing collate_fn_map positionally fails as in torch."""
    assert_same_error(
        lambda: torch_collate_mod.collate([1, 2], {}),
        lambda: FERRO.collate([1, 2], {}),
    )


# --------------------------------------------------------------------------- #
# extending default_collate_fn_map
# --------------------------------------------------------------------------- #


class MyType:
    def __init__(self, v):
        self.v = v

    def __repr__(self):
        return f"MyType({self.v})"

    def __eq__(self, other):
        return type(other) is type(self) and other.v == self.v


class MySubType(MyType):
    pass


class MyDict(dict):
    pass


def _collate_mytype(batch, *, collate_fn_map=None):
    return ("my", torch.tensor([b.v for b in batch]), collate_fn_map is not None)


def _collate_int_custom(batch, *, collate_fn_map=None):
    return ("int!", tuple(batch))


def _collate_tensor_custom(batch, *, collate_fn_map=None):
    return torch.cat(batch) * 2


def _collate_ndarray_custom(batch, *, collate_fn_map=None):
    return ("nd", len(batch))


def _collate_mydict(batch, *, collate_fn_map=None):
    return sorted(k for d in batch for k in d)


def _collate_str_custom(batch, *, collate_fn_map=None):
    return "|".join(batch)


REGISTRATIONS = {
    "new_type": [(MyType, _collate_mytype)],
    "new_type_subclass_lookup": [(MyType, _collate_mytype)],
    "override_int": [(int, _collate_int_custom)],
    "add_bool": [(bool, _collate_int_custom)],
    "override_tensor": [(torch.Tensor, _collate_tensor_custom)],
    "override_ndarray": [(np.ndarray, _collate_ndarray_custom)],
    "override_str": [(str, _collate_str_custom)],
    "dict_subclass": [(MyDict, _collate_mydict)],
    "tuple_key": [((MyType, complex), _collate_int_custom)],
}

REG_SAMPLES = {
    "new_type": lambda i: {"m": MyType(i), "x": i},
    "new_type_subclass_lookup": lambda i: [MySubType(i), torch.tensor([i])],
    "override_int": lambda i: {"a": i, "b": [i, float(i)], "c": True},
    "add_bool": lambda i: (i % 2 == 0, i),
    "override_tensor": lambda i: {"t": torch.tensor([i, i]), "n": np.array([i])},
    "override_ndarray": lambda i: (np.arange(3) + i, torch.zeros(1)),
    "override_str": lambda i: {"s": f"s{i}", "t": (f"a{i}", 1)},
    "dict_subclass": lambda i: [MyDict(k=i), {"k": i}],
    "tuple_key": lambda i: [MyType(i), complex(i, 1)],
}


def _register(registry, entries):
    for key, fn in entries:
        registry[key] = fn


@pytest.mark.parametrize("name", list(REGISTRATIONS))
def test_registry_extension_default_collate(name, collate_registries):
    """A type registered in the shared collate registry is collated as torch collates it."""
    torch_map, ferro_map = collate_registries
    _register(torch_map, REGISTRATIONS[name])
    _register(ferro_map, REGISTRATIONS[name])
    sample = REG_SAMPLES[name]
    assert_same_call(
        lambda: TORCH.default_collate([sample(i) for i in range(3)]),
        lambda: FERRO.default_collate([sample(i) for i in range(3)]),
    )


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("name", list(REGISTRATIONS))
def test_registry_extension_dataloader(name, bs, collate_registries):
    """A registered collate function is used by the loader as by torch's."""
    torch_map, ferro_map = collate_registries
    _register(torch_map, REGISTRATIONS[name])
    _register(ferro_map, REGISTRATIONS[name])
    sample = REG_SAMPLES[name]

    class DS(tud.Dataset):
        def __getitem__(self, i):
            return sample(i)

        def __len__(self):
            return 5

    run_both(lambda lib: DS(), seed=0, batch_size=bs)


def test_registry_removal_is_honoured(collate_registries):
    """Deleting the int entry makes ints a collate error, in both."""
    torch_map, ferro_map = collate_registries
    torch_map.pop(int, None)
    ferro_map.pop(int, None)
    assert_same_error(lambda: TORCH.default_collate([1, 2]), lambda: FERRO.default_collate([1, 2]))


def test_registry_cleanup_restores_behaviour():
    """Removing a registry entry restores the default behaviour."""
    # runs after the registry tests: nothing of theirs may be left behind
    assert MyType not in FERRO.default_collate_fn_map
    assert_same_call(lambda: TORCH.default_collate([1, 2]), lambda: FERRO.default_collate([1, 2]))


# --------------------------------------------------------------------------- #
# hypothesis: random nested samples
# --------------------------------------------------------------------------- #

TORCH_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
    torch.int64,
]
NP_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "float32", "float64", "complex64", "complex128"]
NP_SCALARS = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_, np.float16]
NAMEDTUPLES = [Point, Triple]

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)


def leaf_schemas():
    return st.one_of(
        st.tuples(st.just("tensor"), st.sampled_from(TORCH_DTYPES), shapes,
                  st.sampled_from(["contig", "transposed", "sliced", "expanded"])),
        st.tuples(st.just("ndarray"), st.sampled_from(NP_DTYPES), shapes,
                  st.sampled_from(["contig", "sliced", "fortran"])),
        st.tuples(st.just("npscalar"), st.sampled_from(NP_SCALARS)),
        st.just(("int",)),
        st.just(("float",)),
        st.just(("bool",)),
        st.just(("str",)),
        st.just(("bytes",)),
    )


def schemas():
    return st.recursive(
        leaf_schemas(),
        lambda inner: st.one_of(
            st.tuples(st.just("dict"),
                      st.dictionaries(st.sampled_from("abcdef"), inner, min_size=0, max_size=3)),
            st.tuples(st.just("list"), st.lists(inner, min_size=0, max_size=3)),
            st.tuples(st.just("tuple"), st.lists(inner, min_size=0, max_size=3)),
            st.sampled_from(NAMEDTUPLES).flatmap(
                lambda cls: st.tuples(
                    st.just("namedtuple"),
                    st.just(cls),
                    st.lists(inner, min_size=len(cls._fields), max_size=len(cls._fields)),
                )
            ),
        ),
        max_leaves=6,
    )


def _tensor(dtype, shape, layout, rng):
    if layout == "expanded" and len(shape) >= 1:
        base_shape = (1, *shape[1:])
    else:
        base_shape = shape
    if layout == "transposed":
        base_shape = tuple(reversed(shape))
    if layout == "sliced":
        base_shape = (*shape[:-1], shape[-1] * 2) if shape else shape
    vals = np.asarray(rng.standard_normal(base_shape) * 50)
    t = torch.as_tensor(vals)
    if dtype.is_complex:
        t = torch.complex(t, t * 0.5).to(dtype)
    elif dtype == torch.bool:
        t = t > 0
    else:
        t = t.to(dtype)
    if dtype.is_floating_point and t.numel() > 0 and rng.random() < 0.2:
        t.view(-1)[0] = float("nan")
    if layout == "transposed":
        t = t.permute(tuple(reversed(range(t.dim()))))
    elif layout == "sliced" and shape:
        t = t[..., ::2]
    elif layout == "expanded" and shape:
        t = t.expand(*shape)
    return t


def _ndarray(dtype, shape, layout, rng):
    full = (*shape[:-1], shape[-1] * 2) if (layout == "sliced" and shape) else shape
    vals = np.asarray(rng.standard_normal(full) * 50)
    if np.dtype(dtype).kind in "ui":
        vals = np.abs(vals) if np.dtype(dtype).kind == "u" else vals
        a = vals.astype(np.int64).astype(dtype)
    elif np.dtype(dtype).kind == "b":
        a = vals > 0
    elif np.dtype(dtype).kind == "c":
        a = (vals + 1j * vals).astype(dtype)
    else:
        a = vals.astype(dtype)
    a = np.asarray(a)
    if layout == "sliced" and shape:
        a = a[..., ::2]
    elif layout == "fortran":
        a = np.asfortranarray(a)
    return a


def make_value(schema, rng):
    kind = schema[0]
    if kind == "tensor":
        return _tensor(schema[1], schema[2], schema[3], rng)
    if kind == "ndarray":
        return _ndarray(schema[1], schema[2], schema[3], rng)
    if kind == "npscalar":
        v = rng.standard_normal() * 10
        return schema[1](v > 0) if schema[1] is np.bool_ else schema[1](abs(v))
    if kind == "int":
        return int(rng.integers(-(2**40), 2**40))
    if kind == "float":
        return float(rng.standard_normal()) if rng.random() > 0.1 else float("nan")
    if kind == "bool":
        return bool(rng.random() > 0.5)
    if kind == "str":
        return "s" * int(rng.integers(0, 4))
    if kind == "bytes":
        return bytes(rng.integers(0, 256, size=int(rng.integers(0, 4))).astype(np.uint8))
    if kind == "dict":
        return {k: make_value(v, rng) for k, v in schema[1].items()}
    if kind == "list":
        return [make_value(v, rng) for v in schema[1]]
    if kind == "tuple":
        return tuple(make_value(v, rng) for v in schema[1])
    if kind == "namedtuple":
        return schema[1](*(make_value(v, rng) for v in schema[2]))
    raise AssertionError(kind)


PERTURBATIONS = ["none", "none_leaf", "shape", "dtype", "drop_item", "swap_type"]


def perturb(value, how, rng):
    """Make one sample differ from the others so that collate may raise."""
    if how == "none_leaf":
        return _replace_first_leaf(value, lambda leaf: None)
    if how == "shape":
        return _replace_first_leaf(
            value,
            lambda leaf: torch.cat([leaf.reshape(-1), leaf.reshape(-1)])
            if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 else
            (np.concatenate([leaf.ravel(), leaf.ravel()]) if isinstance(leaf, np.ndarray)
             and leaf.ndim > 0 else leaf),
        )
    if how == "dtype":
        return _replace_first_leaf(
            value,
            lambda leaf: leaf.to(torch.float64) if isinstance(leaf, torch.Tensor) else
            (leaf.astype(np.float64) if isinstance(leaf, np.ndarray) else
             (float(leaf) if isinstance(leaf, int) else leaf)),
        )
    if how == "drop_item":
        return _drop_first(value)
    if how == "swap_type":
        return _replace_first_leaf(
            value,
            lambda leaf: leaf.numpy() if isinstance(leaf, torch.Tensor) and leaf.dtype not in (
                torch.bfloat16,) and not leaf.requires_grad else
            (torch.from_numpy(np.ascontiguousarray(leaf)) if isinstance(leaf, np.ndarray)
             else "swapped"),
        )
    return value


def _replace_first_leaf(value, fn):
    done = [False]

    def rec(v):
        if done[0]:
            return v
        if isinstance(v, dict):
            return {k: rec(x) for k, x in v.items()}
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            return type(v)(*(rec(x) for x in v))
        if isinstance(v, tuple):
            return tuple(rec(x) for x in v)
        if isinstance(v, list):
            return [rec(x) for x in v]
        done[0] = True
        return fn(v)

    return rec(value)


def _drop_first(value):
    if isinstance(value, dict) and value:
        k = next(iter(value))
        return {kk: vv for kk, vv in value.items() if kk != k}
    if isinstance(value, list) and value:
        return value[1:]
    if isinstance(value, tuple) and not hasattr(value, "_fields") and value:
        return value[1:]
    return value


@given(
    schema=schemas(),
    batch_size=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    how=st.sampled_from(PERTURBATIONS),
    victim=st.integers(0, 3),
)
def test_hypothesis_default_collate(schema, batch_size, seed, how, victim):
    """For random nested batches, default_collate equals torch's, errors included."""
    def batch():
        rng = np.random.default_rng(seed)
        samples = [make_value(schema, rng) for _ in range(batch_size)]
        if how != "none":
            i = victim % batch_size
            samples[i] = perturb(samples[i], how, rng)
        return samples

    same_on(batch, TORCH.default_collate, FERRO.default_collate)


@given(schema=schemas(), seed=st.integers(0, 2**32 - 1))
def test_hypothesis_default_convert(schema, seed):
    """For random nested samples, default_convert equals torch's."""
    def sample():
        return make_value(schema, np.random.default_rng(seed))

    same_on(sample, TORCH.default_convert, FERRO.default_convert)


@given(schema=schemas(), batch_size=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_hypothesis_loader_collates_like_torch(schema, batch_size, seed):
    """The same random samples through both DataLoaders (the Rust collate in the loop)."""

    class DS(tud.Dataset):
        def __init__(self):
            rng = np.random.default_rng(seed)
            self.items = [make_value(schema, rng) for _ in range(5)]

        def __getitem__(self, i):
            return copy.deepcopy(self.items[i])

        def __len__(self):
            return 5

    run_both(lambda lib: DS(), seed=seed % 1000, batch_size=batch_size)


# --------------------------------------------------------------------------- #
# torch's global defaults (default dtype, default device) shape collate output
# --------------------------------------------------------------------------- #


DEFAULTS_BATCHES = ["int", "float", "bool", "int_then_float", "float_then_int", "tuple", "mix",
                    "np_float32", "np_int64", "np_scalar_f32", "np_scalar_mixed",
                    "tensor_f32", "dict", "np_0d", "bool_then_int"]


@pytest.fixture
def default_dtype():
    saved = torch.get_default_dtype()
    yield torch.set_default_dtype
    torch.set_default_dtype(saved)


@pytest.fixture
def default_device():
    """Sets the default device for one test, then unsets it: setting it back
    to get_default_device()'s answer ('cpu') would leave a DeviceContext
    mode active for the rest of the session, and native paths stand aside
    under any TorchFunctionMode."""
    from torch.overrides import _get_current_function_mode_stack

    before = list(_get_current_function_mode_stack())
    saved = torch.get_default_device() if before else None
    yield torch.set_default_device
    torch.set_default_device(saved)
    assert list(_get_current_function_mode_stack()) == before


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", DEFAULTS_BATCHES)
def test_default_collate_under_default_dtype(name, dtype, default_dtype):
    """Collated Python floats follow torch's default dtype as torch's do."""
    default_dtype(dtype)
    same_on(BATCHES[name], TORCH.default_collate, FERRO.default_collate)
    same_on(lambda: BATCHES[name]()[0], TORCH.default_convert, FERRO.default_convert)


@pytest.mark.parametrize(
    "device",
    [
        "meta",
        pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                      reason="needs CUDA")),
    ],
)
@pytest.mark.parametrize("name", DEFAULTS_BATCHES)
def test_default_collate_under_default_device(name, device, default_device):
    """With torch.set_default_device(d), torch's collate builds number and numpy
    leaves on d (think d='cuda'); 'meta' stands in for an accelerator."""
    default_device(device)
    same_on(BATCHES[name], TORCH.default_collate, FERRO.default_collate)
    same_on(lambda: BATCHES[name]()[0], TORCH.default_convert, FERRO.default_convert)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_loader_under_default_dtype(dtype, default_dtype):
    """Loader batches under another default dtype equal torch's."""
    default_dtype(dtype)

    class DS(tud.Dataset):
        def __getitem__(self, i):
            return {"mixed": [i, i / 2][i % 2], "np": np.float32(i), "f": i / 3}

        def __len__(self):
            return 6

    run_both(lambda lib: DS(), seed=0, batch_size=2,
             sampler=PerRun(lambda ctx: [1, 0, 3, 2, 5, 4], "order"))


@pytest.mark.parametrize(
    "make",
    [
        lambda: (1, 2, 3),
        lambda: (torch.zeros(2), torch.ones(2)),
        lambda: ({"a": 1}, {"a": 2}),
        lambda: np.arange(4.0),
        lambda: np.arange(6).reshape(3, 2),
        lambda: torch.arange(6).reshape(3, 2),
        lambda: "abc",
        lambda: b"abc",
        lambda: range(4),
        lambda: collections.deque([1, 2]),
        lambda: {0: 5, 1: 6},
        lambda: FrozenSeq([1.5, 2.5]),
        lambda: [],
        lambda: (),
    ],
    ids=["tuple_ints", "tuple_tensors", "tuple_dicts", "ndarray_1d", "ndarray_2d", "tensor",
         "str", "bytes", "range", "deque", "dict", "sequence", "empty_list",
         "empty_tuple"],
)
def test_default_collate_batch_container_types(make):
    """The batch itself need not be a list: whatever torch does with it."""
    same_on(make, TORCH.default_collate, FERRO.default_collate)
    same_on(make, TORCH.default_convert, FERRO.default_convert)
    same_on(make, torch_collate_mod.collate, FERRO.collate)


def test_default_collate_generator_batch():
    """A generator passed as a batch is handled as torch handles it."""
    make = lambda: (x for x in [1, 2])  # noqa: E731
    same_on(make, TORCH.default_collate, FERRO.default_collate)
    same_on(make, torch_collate_mod.collate, FERRO.collate)
    g = make()
    # default_convert leaves an object it does not know unchanged: the same object
    assert (TORCH.default_convert(g) is g) == (FERRO.default_convert(g) is g)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "enable_grad"])
@pytest.mark.parametrize("name", ["tensor_requires_grad", "tensor_nonleaf", "tensor_f32", "mix"])
def test_default_collate_under_grad_modes(name, mode):
    """Collation under no_grad and inference_mode gives torch's tensors and flags."""
    ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
           "enable_grad": torch.enable_grad}[mode]

    def collate_in_mode(fn):
        def run(batch):
            with ctx():
                out = fn(batch)
            return out, [(p, t.requires_grad, t.is_inference(), t.grad_fn is None)
                         for p, t in _tensor_leaves(out)]

        return run

    same_on(BATCHES[name], collate_in_mode(TORCH.default_collate),
            collate_in_mode(FERRO.default_collate))
