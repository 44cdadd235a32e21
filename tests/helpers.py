"""Shared comparison helpers for the torch-conformance suite.

The expected result of every test is whatever ``torch.utils.data`` produces in
the same process for the same inputs and seeds; these helpers run both sides
and compare the outcomes exactly.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import ferroloader
import numpy as np
import pytest
import torch
import torch.utils.data as tud
from mp_helpers import SELFCHECK, seed_all

TORCH = tud
FERRO = ferroloader
LIBS = {"torch": TORCH, "ferroloader": FERRO}

# a guarantee ferroloader gives and torch does not: skipped when the suite
# checks itself against torch (FERROLOADER_TESTS_SELFCHECK=1, see conftest.py)
ferro_only = pytest.mark.skipif(
    SELFCHECK, reason="a ferroloader guarantee torch does not give (self-check runs torch)"
)


def needs_test_doubles() -> None:
    """Skips a test that needs the module's test doubles (the fake CUDA
    runtime, the deliberate panic) where it was built without them (the
    wheel, or `scripts/bench`'s build); `scripts/test` builds them in."""
    from ferroloader import _core

    if not hasattr(_core, "_FakeCudaRuntime"):
        pytest.skip("ferroloader._core was built without the test-doubles cargo feature "
                    "(scripts/test builds it with them)")


def time_limit(seconds: int) -> pytest.MarkDecorator:
    """Fail the test after `seconds`. The signal method fails that test and
    the run goes on (the thread method ends the whole run); the engine's
    waits release the GIL in slices and take Python's signals between them,
    so SIGALRM reaches a test blocked in one (tests/test_suite_guard.py)."""
    return pytest.mark.timeout(seconds, method="signal")


_ADDR = re.compile(r"0x[0-9a-fA-F]+")


def normalize(msg: str) -> str:
    """Remove object addresses from a message (objects differ between two runs)."""
    return _ADDR.sub("0x?", msg)


# --------------------------------------------------------------------------- #
# deep comparison
# --------------------------------------------------------------------------- #


def _float_same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def tensor_values_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact value equality; NaN equals NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device.type == "meta":
        return True  # meta tensors carry no values
    if a.layout != torch.strided:
        a, b = a.to_dense(), b.to_dense()
    a = a.resolve_conj().resolve_neg()
    b = b.resolve_conj().resolve_neg()
    if a.dtype.is_complex:
        a = torch.view_as_real(a)
        b = torch.view_as_real(b)
    if a.dtype.is_floating_point:
        a = a.detach()
        b = b.detach()
        both_nan = torch.isnan(a) & torch.isnan(b)
        return bool(((a == b) | both_nan).all())
    return torch.equal(a.detach(), b.detach())


def _assert_tensor_same(a: torch.Tensor, b: torch.Tensor, path: str) -> None:
    assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{path}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert a.device == b.device, f"{path}: device {a.device} != {b.device}"
    assert a.layout == b.layout, f"{path}: layout {a.layout} != {b.layout}"
    assert a.requires_grad == b.requires_grad, (
        f"{path}: requires_grad {a.requires_grad} != {b.requires_grad}"
    )
    if a.device.type == "cpu":
        assert a.is_pinned() == b.is_pinned(), (
            f"{path}: is_pinned {a.is_pinned()} != {b.is_pinned()}"
        )
    if a.layout == torch.strided:
        assert a.is_contiguous() == b.is_contiguous(), (
            f"{path}: is_contiguous {a.is_contiguous()} != {b.is_contiguous()}"
        )
        assert a.stride() == b.stride(), f"{path}: stride {a.stride()} != {b.stride()}"
    assert tensor_values_equal(a, b), f"{path}: values differ\n{a}\n!=\n{b}"


def _assert_ndarray_same(a: np.ndarray, b: np.ndarray, path: str) -> None:
    assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}"
    assert a.strides == b.strides, f"{path}: strides {a.strides} != {b.strides}"
    if a.dtype.kind in "fc":
        assert np.array_equal(a, b, equal_nan=True), f"{path}: values differ\n{a}\n!=\n{b}"
    elif a.dtype.kind == "O":
        for i, (x, y) in enumerate(zip(a.ravel().tolist(), b.ravel().tolist())):
            assert_same(x, y, f"{path}.flat[{i}]")
    else:
        assert np.array_equal(a, b), f"{path}: values differ\n{a}\n!=\n{b}"


def assert_same(a: Any, b: Any, path: str = "value") -> None:
    """Deep, exact comparison: same type at every level, same tensors.

    Tensors: same dtype, shape, device, layout, requires_grad, contiguity,
    strides and values (NaN == NaN). numpy: same dtype, shape, strides, values.
    Mappings: same keys in the same order. Sequences: same length, elementwise.
    """
    ta, tb = type(a), type(b)
    assert ta is tb, f"{path}: type {ta!r} != {tb!r} ({a!r} vs {b!r})"
    if isinstance(a, torch.Tensor):
        _assert_tensor_same(a, b, path)
    elif isinstance(a, np.ndarray):
        _assert_ndarray_same(a, b, path)
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        _assert_ndarray_same(np.asarray(a), np.asarray(b), path)
    elif isinstance(a, float):
        assert _float_same(a, b), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, complex):
        assert _float_same(a.real, b.real) and _float_same(a.imag, b.imag), (
            f"{path}: {a!r} != {b!r}"
        )
    elif isinstance(a, (str, bytes, bytearray, int, type(None))):
        assert a == b, f"{path}: {a!r} != {b!r}"
    elif isinstance(a, Mapping):
        ka, kb = list(a.keys()), list(b.keys())
        assert ka == kb, f"{path}: keys {ka!r} != {kb!r}"
        if isinstance(a, defaultdict):
            assert a.default_factory is b.default_factory, f"{path}: default_factory differs"
        for k in ka:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
        _assert_attrs_same(a, b, path)
    elif isinstance(a, Sequence) or isinstance(a, range):
        assert len(a) == len(b), f"{path}: len {len(a)} != {len(b)}"
        if isinstance(a, range):
            assert a == b, f"{path}: {a!r} != {b!r}"
            return
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
        _assert_attrs_same(a, b, path)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _assert_attrs_same(a: Any, b: Any, path: str) -> None:
    da = getattr(a, "__dict__", None)
    db = getattr(b, "__dict__", None)
    if da is None and db is None:
        return
    assert da is not None and db is not None, f"{path}: __dict__ presence differs"
    assert list(da) == list(db), f"{path}: attributes {list(da)} != {list(db)}"
    for k in da:
        assert_same(da[k], db[k], f"{path}.{k}")


# --------------------------------------------------------------------------- #
# outcomes (value or exception)
# --------------------------------------------------------------------------- #


@dataclass
class Raised:
    type: type
    message: str

    @classmethod
    def of(cls, exc: BaseException, norm: bool = False) -> Raised:
        msg = str(exc)
        return cls(type(exc), normalize(msg) if norm else msg)


def outcome(fn: Callable[[], Any]) -> Any:
    """Return fn()'s value, or a Raised record of the exception it raised."""
    try:
        return fn()
    except Exception as exc:
        return Raised.of(exc)


def assert_same_outcome(expected: Any, actual: Any, path: str = "outcome") -> None:
    if isinstance(expected, Raised) or isinstance(actual, Raised):
        assert isinstance(actual, Raised), (
            f"{path}: torch raised {expected.type.__name__}: {expected.message!r}, "
            f"ferroloader returned {actual!r}"
        )
        assert isinstance(expected, Raised), (
            f"{path}: ferroloader raised {actual.type.__name__}: {actual.message!r}, "
            f"torch returned {expected!r}"
        )
        assert actual.type is expected.type, (
            f"{path}: exception type {actual.type.__name__} != torch's "
            f"{expected.type.__name__} ({actual.message!r} vs {expected.message!r})"
        )
        assert actual.message == expected.message, (
            f"{path}: message {actual.message!r} != torch's {expected.message!r}"
        )
    else:
        assert_same(expected, actual, path)


def assert_same_call(torch_fn: Callable[[], Any], ferro_fn: Callable[[], Any]) -> Any:
    """Call both; same value (deep) or same exception type and message."""
    e = outcome(torch_fn)
    a = outcome(ferro_fn)
    assert_same_outcome(e, a)
    return e


def assert_same_error(torch_fn: Callable[[], Any], ferro_fn: Callable[[], Any]) -> Raised:
    """Both calls must raise, with the same exception type and message."""
    e = outcome(torch_fn)
    assert isinstance(e, Raised), f"test bug: torch did not raise, returned {e!r}"
    a = outcome(ferro_fn)
    assert_same_outcome(e, a, "error")
    return e


# --------------------------------------------------------------------------- #
# generators and RNG state
# --------------------------------------------------------------------------- #


def clone_generator(g: torch.Generator) -> torch.Generator:
    c = torch.Generator(device=g.device)
    c.set_state(g.get_state())
    return c




@dataclass
class RngAfter:
    torch_rand: torch.Tensor
    py_random: float
    np_random: float


def rng_after() -> RngAfter:
    return RngAfter(torch.rand(3), random.random(), float(np.random.random()))


def assert_same_rng(e: RngAfter, a: RngAfter, what: str = "global RNG") -> None:
    assert torch.equal(e.torch_rand, a.torch_rand), (
        f"{what}: torch global generator left in a different state "
        f"(torch.rand(3) after: torch {e.torch_rand} vs ferroloader {a.torch_rand})"
    )
    assert e.py_random == a.py_random, f"{what}: python `random` state differs"
    assert e.np_random == a.np_random, f"{what}: numpy global RNG state differs"


# --------------------------------------------------------------------------- #
# running a DataLoader on both sides
# --------------------------------------------------------------------------- #


class Ctx:
    """What a PerRun factory sees: the run's library module, dataset, generators."""

    def __init__(self, lib: Any, side: str) -> None:
        self.lib = lib
        self.side = side
        self.dataset: Any = None
        self.generator: torch.Generator | None = None
        self.generators: list[tuple[str, torch.Generator]] = []

    def gen(self, seed: int, name: str | None = None) -> torch.Generator:
        """A fresh generator seeded with `seed`, whose final state gets compared."""
        g = torch.Generator().manual_seed(seed)
        self.generators.append((name or f"gen({seed})#{len(self.generators)}", g))
        return g


class PerRun:
    """A loader argument built anew for each run: fn(ctx) -> value."""

    def __init__(self, fn: Callable[[Ctx], Any], label: str = "") -> None:
        self.fn = fn
        self.label = label

    def __repr__(self) -> str:
        return self.label or "PerRun"


@dataclass
class RunResult:
    side: str
    construct: Any = None  # Raised if construction failed
    length: Any = None  # len(loader) outcome, or None when not asked
    epochs: list = field(default_factory=list)  # list of lists of batches
    errors: list = field(default_factory=list)  # (epoch, batch_no, Raised)
    warnings: list = field(default_factory=list)  # (category, message)
    rng: RngAfter | None = None
    generator_states: list = field(default_factory=list)  # (name, state)
    log: Any = None  # dataset.log when the dataset records calls
    attrs: dict = field(default_factory=dict)


def run_loader(
    loader_cls: Any,
    lib: Any,
    make_dataset: Callable[[Any], Any],
    seed: int,
    *,
    side: str,
    epochs: Sequence[int | None] = (None, None),
    call_len: bool = True,
    loader_kwargs: dict | None = None,
) -> RunResult:
    """Build a loader from scratch under `seed` and iterate it `len(epochs)` times.

    `epochs[i]` is how many batches to take in epoch i (None: all of them).
    An exception raised while iterating is recorded and the next epoch starts.
    """
    res = RunResult(side=side)
    loader_kwargs = dict(loader_kwargs or {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seed_all(seed)
        ctx = Ctx(lib, side)
        dataset = make_dataset(lib)
        ctx.dataset = dataset
        g = loader_kwargs.get("generator")
        if isinstance(g, torch.Generator) and g is not torch.default_generator:
            ctx.generator = clone_generator(g)
            ctx.generators.append(("loader generator", ctx.generator))
            loader_kwargs["generator"] = ctx.generator
        for k, v in list(loader_kwargs.items()):
            if isinstance(v, PerRun):
                loader_kwargs[k] = v.fn(ctx)
        try:
            loader = loader_cls(dataset, **loader_kwargs)
        except Exception as exc:
            res.construct = Raised.of(exc, norm=True)
            loader = None
        if loader is not None:
            if call_len:
                try:
                    res.length = len(loader)
                except Exception as exc:
                    res.length = Raised.of(exc, norm=True)
            for e_no, limit in enumerate(epochs):
                batches: list = []
                res.epochs.append(batches)
                try:
                    it = iter(loader)
                    src = it if limit is None else itertools.islice(it, limit)
                    for b in src:
                        batches.append(b)
                except Exception as exc:
                    res.errors.append((e_no, len(batches), Raised.of(exc, norm=True)))
                finally:
                    it = None
                    src = None
        res.rng = rng_after()
        res.generator_states = [(n, gg.get_state()) for n, gg in ctx.generators]
        log = getattr(dataset, "log", None)
        res.log = list(log) if isinstance(log, list) else None
    res.warnings = [(w.category, normalize(str(w.message))) for w in caught]
    return res


def compare_runs(e: RunResult, a: RunResult) -> None:
    """Assert that run `a` (ferroloader) reproduces run `e` (torch) exactly."""
    assert_same_outcome(e.construct, a.construct, "DataLoader(...)")
    assert_same_outcome(e.length, a.length, "len(loader)")
    assert len(e.epochs) == len(a.epochs)
    for i, (be, ba) in enumerate(zip(e.epochs, a.epochs)):
        assert len(be) == len(ba), (
            f"epoch {i}: torch yielded {len(be)} batches, ferroloader {len(ba)}"
        )
        for j, (x, y) in enumerate(zip(be, ba)):
            assert_same(x, y, f"epoch {i} batch {j}")
    assert len(e.errors) == len(a.errors), (
        f"errors while iterating: torch {e.errors!r} vs ferroloader {a.errors!r}"
    )
    for (ee, eb, er), (ae, ab, ar) in zip(e.errors, a.errors):
        assert (ee, eb) == (ae, ab), f"error raised at different points: {(ee, eb)} vs {(ae, ab)}"
        assert_same_outcome(er, ar, f"error in epoch {ee} after {eb} batches")
    assert e.warnings == a.warnings, (
        f"warnings differ:\n torch: {e.warnings!r}\n ferroloader: {a.warnings!r}"
    )
    if e.log is not None or a.log is not None:
        assert e.log == a.log, f"dataset calls differ:\n torch: {e.log}\n ferroloader: {a.log}"
    assert_same_rng(e.rng, a.rng)
    assert [n for n, _ in e.generator_states] == [n for n, _ in a.generator_states]
    for (n, se), (_, sa) in zip(e.generator_states, a.generator_states):
        assert torch.equal(se, sa), f"{n}: generator left in a different state"


def run_both(
    make_dataset: Callable[[Any], Any],
    seed: int = 0,
    *,
    epochs: Sequence[int | None] = (None, None),
    call_len: bool = True,
    expected: tuple[Any, Any] | None = None,
    actual: tuple[Any, Any] | None = None,
    **loader_kwargs: Any,
) -> tuple[RunResult, RunResult]:
    """Run torch's DataLoader, then ferroloader's, under identical seeds; compare.

    `make_dataset(lib)` builds the dataset; `lib` is the side's module
    (torch.utils.data or ferroloader). Loader arguments that must be fresh per
    run (samplers, generators they share) are given as PerRun(fn), fn(ctx).
    A `generator=` Generator is cloned so both runs start from its state, and
    its state afterwards is compared. `expected` / `actual` override the
    (DataLoader class, lib module) pairs of the two sides.
    """
    exp_cls, exp_lib = expected or (TORCH.DataLoader, TORCH)
    act_cls, act_lib = actual or (FERRO.DataLoader, FERRO)
    kw = dict(epochs=epochs, call_len=call_len, loader_kwargs=loader_kwargs)
    e = run_loader(exp_cls, exp_lib, make_dataset, seed, side="torch", **kw)
    a = run_loader(act_cls, act_lib, make_dataset, seed, side="ferroloader", **kw)
    compare_runs(e, a)
    return e, a


def same_on(make_input: Callable[[], Any], torch_fn: Callable, ferro_fn: Callable) -> Any:
    """Build the input twice (fresh objects per side, outside the comparison),
    then compare torch_fn(input) with ferro_fn(input): value or exception."""
    x_torch = make_input()
    x_ferro = make_input()
    return assert_same_call(lambda: torch_fn(x_torch), lambda: ferro_fn(x_ferro))


def error_on(make_input: Callable[[], Any], torch_fn: Callable, ferro_fn: Callable) -> Raised:
    """Like same_on, but torch must raise."""
    x_torch = make_input()
    x_ferro = make_input()
    return assert_same_error(lambda: torch_fn(x_torch), lambda: ferro_fn(x_ferro))


def side_by_side(fns: list[Callable[[], Any]], stuck_after: float) -> list[Any]:
    """Runs each function on a thread of its own (ranks, loaders sharing a
    cache); their results. One still running after ``stuck_after`` seconds
    fails the test; an exception in one is raised here."""
    import threading

    out: list[Any] = [None] * len(fns)

    def run(k: int) -> None:
        try:
            out[k] = fns[k]()
        except BaseException as e:  # re-raised below
            out[k] = e

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(stuck_after)
        assert not t.is_alive(), f"a thread was stuck for {stuck_after} s"
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out


def plain(value: Any) -> Any:
    """A batch as nested Python values (tensors as lists), for comparison."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
