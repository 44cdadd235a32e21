"""DataLoader's constructor arguments, drawn by hypothesis, in every worker
mode: ferroloader fails where torch fails, the same way.

Each example draws arguments (zero, negative, huge, wrong types and
contradictory combinations among them), builds torch's loader and
ferroloader's from them, calls ``iter()`` and takes up to two batches.

- Where ferroloader's own arguments are valid, it raises what torch raises
  (type; message at construction, the first line at ``iter()``/``next()``)
  at the same stage, and where torch succeeds it gives torch's batches and
  leaves the global generators as torch does.
- Where they are not, it raises ``ConfigError`` at construction
  (``ValueError`` for ``worker_method``, mirroring torch's proposed
  message), unless torch's own checks refuse the arguments first.
- Never a ``BaseException`` that is not an ``Exception`` (pyo3's
  ``PanicException``), never a hang (each test has a time limit).

torch's side runs with the worker processes that stand for the mode (two
for two worker threads, ``num_workers * worker_threads`` for threads inside
processes, one for ``num_workers="auto"``, which torch's checks see). Where
torch itself would run for minutes or take gigabytes (a huge
``prefetch_factor`` with workers, a huge batch size for an iterable dataset
or with ``drop_last=True``), only its construction is compared, and
ferroloader's run must simply end. Regression tests for the differences
this test found follow the property tests.
"""

from __future__ import annotations

import math
import multiprocessing
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import ferroloader
import pytest
import torch
import torch.utils.data as tud
from helpers import Raised, assert_same, assert_same_rng, ferro_only, rng_after, time_limit
from hypothesis import event, given, note, settings
from hypothesis import strategies as st
from mp_helpers import seed_all

ConfigError = getattr(ferroloader, "ConfigError", ValueError)

# torch's multi-process iterator whose __init__ failed (prefetch_factor=0)
# fails again in its __del__ (no `_shutdown` yet): torch's, not ours
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <function _MultiProcessingDataLoaderIter.__del__"
    ":pytest.PytestUnraisableExceptionWarning"
)

HUGE = (2**31, 2**63)
N = 10


class Stream(tud.IterableDataset):
    """The iterable counterpart of ``torch.arange(10)``."""

    def __iter__(self):
        return iter(range(N))


def make_dataset(kind: str) -> Any:
    return torch.arange(N) if kind == "map" else Stream()


# --------------------------------------------------------------------------- #
# objects that must be fresh on each side (a generator's draws, a sampler's)
# --------------------------------------------------------------------------- #


class Tag(str):
    """A drawn argument built anew for each side (``Tag("gen")``), shown by name."""

    __slots__ = ()


def build(value: Any, dataset: Any) -> Any:
    if not isinstance(value, Tag):
        return value
    if value == "gen":
        return torch.Generator().manual_seed(3)
    if value == "seq_sampler":
        return tud.SequentialSampler(dataset)
    if value == "random_sampler":
        return tud.RandomSampler(range(N), generator=torch.Generator().manual_seed(5))
    if value == "batch_sampler":
        return tud.BatchSampler(tud.SequentialSampler(range(N)), 3, False)
    if value == "not_iterable":
        return object()
    if value == "fork_ctx":
        return multiprocessing.get_context("fork")
    raise AssertionError(value)


# --------------------------------------------------------------------------- #
# strategies
# --------------------------------------------------------------------------- #

# Each argument: values it may take on its own (contradictions arise from
# their combinations: sampler with shuffle, timeout without workers, ...),
# and odd ones: zero, negative, huge, wrong types.
TORCH_ARGS: dict[str, tuple[list[Any], list[Any]]] = {
    "batch_size": ([1, 3, None], [0, -1, *HUGE, 2.0, "4", True, [2]]),
    "shuffle": ([None, True, False], ["yes", 0, []]),
    "sampler": (
        [None, Tag("seq_sampler"), Tag("random_sampler"), [0, 3, 5]], [Tag("not_iterable")]
    ),
    "batch_sampler": ([None, Tag("batch_sampler"), [[0, 1], [2, 3, 4]]], [Tag("not_iterable")]),
    "drop_last": ([True, False], [1, "yes", None]),
    "timeout": ([0, 30], [0.0, False, -1, -0.5, *HUGE, math.inf, math.nan, "1", None, [1]]),
    "prefetch_factor": ([None, 1, 3], [0, -1, *HUGE, 1.5, "2", True, False]),
    "persistent_workers": ([False, True], ["yes", 1, None]),
    "pin_memory": ([False, True], ["yes", None]),
    "in_order": ([True, False], [None, "x"]),
    "generator": ([None, Tag("gen")], ["not a generator", 123]),
    # no spawn or forkserver: a worker's start would take seconds
    "multiprocessing_context": (["fork", Tag("fork_ctx")], ["bogus", 123, None]),
}

OWN_ARGS: dict[str, tuple[list[Any], list[Any]]] = {
    "seed": ([None, 0, 7], [-1, 2**63, 2**64, 2.0, "1", True, [1]]),
    "per_sample_seed": ([False, True], ["yes", None]),
    "worker_method": (["multiprocessing", "thread"], ["threads", None, 1, []]),
    # (no huge count: a valid one would start that many threads)
    "worker_threads": ([1, 2], [0, -1, 2.0, "2", True, None]),
    "sharding": ([None], ["static", 1, Tag("sharding")]),
    "snapshot_every_n_steps": ([1, 0, None, 5], [-1, 2**63, 2.0, "5", True]),
}

MODES = {
    # mode: (ferroloader's worker arguments, torch's num_workers)
    "main": ({"num_workers": 0}, 0),
    "1 process": ({"num_workers": 1}, 1),
    "2 processes": ({"num_workers": 2}, 2),
    "2 threads": ({"num_workers": 2, "worker_method": "thread"}, 2),
    "threads in processes": ({"num_workers": 1, "worker_threads": 2}, 2),
    "auto": ({"num_workers": "auto"}, 1),
}


@st.composite
def arguments(draw: Any, own: bool) -> dict[str, Any]:
    """A few arguments given (the rest left to their defaults), at most two
    of them odd; with ``own``, ferroloader's among them."""
    table = {**TORCH_ARGS, **(OWN_ARGS if own else {})}
    given_ = draw(st.lists(st.sampled_from(sorted(table)), max_size=6, unique=True))
    odd = draw(st.lists(st.sampled_from(given_), max_size=2, unique=True)) if given_ else []
    return {k: draw(st.sampled_from(table[k][1 if k in odd else 0])) for k in given_}


# --------------------------------------------------------------------------- #
# running one side
# --------------------------------------------------------------------------- #


@dataclass
class Run:
    stage: str  # where it failed ("construct", "iter", "next"), or "ok"
    error: Optional[Raised] = None
    batches: list = field(default_factory=list)
    escaped: Optional[BaseException] = None  # a BaseException that is not an Exception
    rng: Any = None


def _failed(stage: str, exc: BaseException) -> Run:
    if isinstance(exc, Exception):
        return Run(stage, Raised.of(exc, norm=True))
    if type(exc).__name__ != "PanicException":
        raise exc  # Ctrl-C, the test's time limit: not the loader's outcome
    return Run(stage, escaped=exc)


def drive(cls: Any, dataset: Any, kwargs: dict[str, Any], *, drain: bool) -> Run:
    """Build, ``iter()``, up to two batches (``drain``); what happened."""
    seed_all(11)
    kwargs = {k: build(v, dataset) for k, v in kwargs.items()}
    loader = it = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            try:
                loader = cls(dataset, **kwargs)
            except BaseException as exc:
                return _failed("construct", exc)
            if not drain:
                return Run("ok")
            try:
                it = iter(loader)
            except BaseException as exc:
                return _failed("iter", exc)
            got = []
            try:
                for _ in range(2):
                    got.append(next(it))
            except StopIteration:
                pass
            except BaseException as exc:
                return _failed("next", exc)
            return Run("ok", batches=got, rng=rng_after())
        finally:
            it = None
            # persistent workers outlive the iterator: end them now
            shutdown = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()


# --------------------------------------------------------------------------- #
# what ferroloader must do
# --------------------------------------------------------------------------- #


def own_error(kw: dict[str, Any]) -> Optional[type]:
    """The error ferroloader's checks of its own arguments raise, in their
    order (dataloader.py), or ``None`` when they pass."""
    nw = kw.get("num_workers", 0)
    if isinstance(nw, str) and nw != "auto":
        return ConfigError
    auto = nw == "auto"
    wm = kw.get("worker_method", "multiprocessing")
    wt = kw.get("worker_threads", 1)
    if auto and (wm != "multiprocessing" or wt != 1):
        return ConfigError
    n = 1 if auto else nw
    if wm not in ("multiprocessing", "thread"):
        return ValueError
    if isinstance(wt, bool) or not isinstance(wt, int) or wt < 1:
        return ConfigError
    if (wt > 1 and wm == "thread") or (wt > 1 and n == 0) or (wm == "thread" and n == 0):
        return ConfigError
    seed = kw.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        return ConfigError
    if kw.get("per_sample_seed") and seed is None:
        return ConfigError
    snap = kw.get("snapshot_every_n_steps", 1)
    if snap is not None and (isinstance(snap, bool) or not isinstance(snap, int) or snap < 0):
        return ConfigError
    if kw.get("sharding") is not None:  # never a ShardedDataset here
        return ConfigError
    prefetch = 2 if kw.get("prefetch_factor") is None else kw["prefetch_factor"]
    if auto and (kw.get("timeout", 0) != 0 or not isinstance(prefetch, int) or prefetch < 1):
        # (checked once torch's checks passed)
        return ConfigError
    return None


def torch_workers(kw: dict[str, Any]) -> int:
    """The worker processes torch runs for ferroloader's (valid) layout."""
    nw = kw.get("num_workers", 0)
    if nw == "auto":
        return 1
    return nw * kw.get("worker_threads", 1)


def torch_can_run(kw: dict[str, Any], kind: str, workers: int) -> bool:
    """Whether torch's loader can run these arguments here: it loops
    ``prefetch_factor * num_workers`` times to fill its window, and builds
    index lists of the batch size for an iterable dataset or
    ``drop_last=True`` (gigabytes for a huge one). ferroloader runs them."""
    bs = kw.get("batch_size", 1)
    prefetch = kw.get("prefetch_factor")
    if workers and type(prefetch) is int and prefetch > 1000:
        return False
    if type(bs) is int and bs > 1000 and (kind == "iterable" or kw.get("drop_last") is True):
        return False
    return True


def same_stage(mode: str, torch_stage: str, ours: str) -> bool:
    if mode == "auto":
        # torch's one worker fills its window at iter(); "auto" starts in
        # the main process, whose sampler first runs at next()
        return {torch_stage, ours} <= {"iter", "next"} or torch_stage == ours
    return torch_stage == ours


def first_line(r: Raised) -> str:
    return r.message.split("\n", 1)[0]


def check(mode: str, kind: str, drawn: dict[str, Any]) -> None:
    base, workers = MODES[mode]
    fkw = {**drawn, **base}
    # a drawn worker_method / worker_threads overrides the mode's
    for k in ("worker_method", "worker_threads"):
        if k in drawn:
            fkw[k] = drawn[k]
    if "sharding" in fkw and isinstance(fkw["sharding"], Tag):
        fkw["sharding"] = ferroloader.Sharding()
    own = own_error(fkw)
    if own is None:
        workers = torch_workers(fkw)
    tkw = {k: v for k, v in fkw.items() if k in TORCH_ARGS}
    tkw["num_workers"] = workers
    if workers and "multiprocessing_context" not in tkw:
        tkw["multiprocessing_context"] = "fork"
        fkw["multiprocessing_context"] = "fork"
    drain = torch_can_run(fkw, kind, workers)
    note(f"ferroloader: {fkw!r}\ntorch: {tkw!r}\ntorch iterated: {drain}")

    ours = drive(ferroloader.DataLoader, make_dataset(kind), fkw, drain=True)
    assert ours.escaped is None, (
        f"a {type(ours.escaped).__name__} (not an Exception) reached the caller at "
        f"{ours.stage}: {ours.escaped}"
    )
    theirs = drive(tud.DataLoader, make_dataset(kind), tkw, drain=drain)
    note(f"torch: {theirs.stage} {theirs.error}\nferroloader: {ours.stage} {ours.error}")
    event(f"torch: {theirs.stage}, ferroloader: {ours.stage}"
          + ("" if drain else " (torch not iterated)"))

    if own is not None:
        assert ours.stage == "construct", "ferroloader accepted invalid arguments of its own"
        assert ours.error is not None
        if theirs.stage == "construct" and theirs.error == ours.error:
            return  # torch's checks refused the arguments first
        assert ours.error.type is own, (
            f"{ours.error.type.__name__} ({ours.error.message}), expected {own.__name__}"
        )
        return
    if not drain:
        # torch's construction only: what it would say after minutes, unknown
        if theirs.stage == "construct" or ours.stage == "construct":
            assert (theirs.stage, theirs.error) == (ours.stage, ours.error)
        return
    assert same_stage(mode, theirs.stage, ours.stage), (
        f"torch: {theirs.stage} {theirs.error}; ferroloader: {ours.stage} {ours.error}"
    )
    if theirs.error is not None:
        assert ours.error is not None
        assert ours.error.type is theirs.error.type, (
            f"{ours.error.type.__name__}: {ours.error.message!r} where torch raises "
            f"{theirs.error.type.__name__}: {theirs.error.message!r}"
        )
        if theirs.stage == "construct":
            assert ours.error.message == theirs.error.message
        else:
            assert first_line(ours.error) == first_line(theirs.error)
        return
    if fkw.get("seed") is not None:
        return  # (the loader's own generator decides the order)
    if not fkw.get("in_order", True) and workers:
        return  # (out of order: whichever worker answers first)
    assert len(ours.batches) == len(theirs.batches)
    for i, (a, b) in enumerate(zip(theirs.batches, ours.batches)):
        assert_same(a, b, f"batch {i}")
    assert_same_rng(theirs.rng, ours.rng)


# --------------------------------------------------------------------------- #
# the properties, one test per worker mode
# --------------------------------------------------------------------------- #

# each example is two loaders' runs (worker starts included): a third of
# the profile's examples per mode keeps the file well within a minute
EXAMPLES = max(5, settings.default.max_examples // 3)
# (the "thorough" profile's 25 times as many examples take longer)
LIMIT = 60 + 3 * EXAMPLES


def _given(own: bool = True) -> Any:
    return given(kind=st.sampled_from(["map", "map", "iterable"]), drawn=arguments(own))


@time_limit(LIMIT)
@_given(own=False)
@settings(max_examples=EXAMPLES * 2)
def test_torch_arguments_in_the_main_process(kind, drawn):
    """torch's arguments alone (the self-check runs this one on torch)."""
    check("main", kind, drawn)


@ferro_only
@time_limit(LIMIT)
@pytest.mark.parametrize("mode", list(MODES))
@_given()
@settings(max_examples=EXAMPLES)
def test_arguments_in_each_worker_mode(mode, kind, drawn):
    """torch's arguments with ferroloader's, now and then invalid, in
    each worker mode."""
    check(mode, kind, drawn)


@ferro_only
@time_limit(LIMIT)
@given(
    num_workers=st.sampled_from([-1, 0, 1, *HUGE, 2.0, "2", "bogus", None, True, [1]]),
    worker_threads=st.sampled_from([1, 2, 2**31, 0]),
    extra=st.fixed_dictionaries(
        {},
        optional={
            k: st.sampled_from([*TORCH_ARGS[k][0], *TORCH_ARGS[k][1]])
            for k in ("prefetch_factor", "persistent_workers", "multiprocessing_context",
                      "timeout")
        },
    ),
)
@settings(max_examples=EXAMPLES * 2)
def test_num_workers_values_at_construction(num_workers, worker_threads, extra):
    """Any num_workers (huge ones too: neither loader is iterated, torch
    would start 2**31 processes) is refused or taken at construction as
    torch does, or with ConfigError for ferroloader's string values."""
    fkw = {"num_workers": num_workers, "worker_threads": worker_threads, **extra}
    own = own_error(fkw)
    ours = drive(ferroloader.DataLoader, make_dataset("map"), fkw, drain=False)
    assert ours.escaped is None
    tkw = {k: v for k, v in fkw.items() if k != "worker_threads"}
    theirs = drive(tud.DataLoader, make_dataset("map"), tkw, drain=False)
    note(f"torch: {theirs.stage} {theirs.error}\nferroloader: {ours.stage} {ours.error}")
    if own is not None:
        assert ours.stage == "construct"
        assert ours.error is not None
        assert ours.error.type is own or ours.error == theirs.error
        return
    assert (theirs.stage, theirs.error) == (ours.stage, ours.error)


# --------------------------------------------------------------------------- #
# regressions
# --------------------------------------------------------------------------- #

PREFETCH_0 = "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
@pytest.mark.parametrize("generator", [False, True], ids=["global", "generator"])
def test_prefetch_factor_0_with_workers_is_torchs_assertion_at_iter(method, generator):
    """prefetch_factor=0 passes torch's construction checks and fails its
    multi-process iterator's: AssertionError at iter(), after the base seed
    was drawn (the generator, or the global one, left as torch leaves it),
    with no worker started; it used to reach the engine's assert (a
    PanicException, not an Exception). A retry fails the same way."""
    def run(cls, **kw):
        seed_all(3)
        gen = torch.Generator().manual_seed(9) if generator else None
        loader = cls(torch.arange(N), batch_size=2, shuffle=True, num_workers=2,
                     prefetch_factor=0, generator=gen, multiprocessing_context="fork", **kw)
        errors = []
        for _ in range(2):
            try:
                iter(loader)
            except Exception as exc:
                errors.append((type(exc), str(exc)))
        return errors, rng_after(), None if gen is None else gen.get_state()

    want = run(tud.DataLoader)
    before = set(multiprocessing.active_children())
    got = run(ferroloader.DataLoader, worker_method=method)
    assert set(multiprocessing.active_children()) <= before
    assert want[0] == [(AssertionError, PREFETCH_0)] * 2
    assert got[0] == want[0]
    assert_same_rng(want[1], got[1])
    if generator:
        assert torch.equal(want[2], got[2])


@ferro_only
@pytest.mark.parametrize("prefetch_factor", [0, False, 1.5])
def test_a_prefetch_factor_auto_cannot_start_with_is_refused(prefetch_factor):
    """num_workers="auto" starts with the given prefetch depth: 0 used to
    become 2 silently, 1.5 to fail once the tuner chose workers."""
    with pytest.raises(ConfigError, match=f"prefetch_factor={prefetch_factor!r}"):
        ferroloader.DataLoader(torch.arange(N), num_workers="auto",
                               prefetch_factor=prefetch_factor)


@ferro_only
@pytest.mark.parametrize("timeout", [5, 0.5, math.nan])
def test_timeout_is_refused_by_auto(timeout):
    """num_workers="auto" starts in the main process, where torch refuses a
    timeout: every such loader used to fail at its first iter()."""
    with pytest.raises(ConfigError, match="timeout="):
        ferroloader.DataLoader(torch.arange(N), num_workers="auto", timeout=timeout)


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("timeout", [math.inf, 1e300, 2**63, 3e6])
@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_a_timeout_torch_cannot_wait_with_is_its_overflow_error_at_next(timeout, method):
    """torch's wait for a batch raises OverflowError at each next() for a
    timeout its selector cannot take (above ~24.8 days); the engine used to
    panic on an infinite one at iter()."""
    def run(cls, **kw):
        loader = cls(torch.arange(N), num_workers=1, timeout=timeout,
                     multiprocessing_context="fork", **kw)
        it = iter(loader)
        out = []
        for _ in range(2):
            try:
                next(it)
            except Exception as exc:
                out.append((type(exc), str(exc)))
        return out

    want = run(tud.DataLoader)
    assert [t for t, _ in want] == [OverflowError] * 2
    assert run(ferroloader.DataLoader, worker_method=method) == want


@time_limit(60)
@pytest.mark.parametrize("kw", [{}, {"worker_method": "thread"}], ids=["processes", "threads"])
def test_a_batch_size_beyond_32_bits_with_workers(kw):
    """A map-style epoch's batches come from its sampler: a batch size
    beyond 32 bits used to fail the engine's spec ('failed to extract
    field IterSpec.batch_size')."""
    def run(lib, **extra):
        loader = lib.DataLoader(torch.arange(N), batch_size=2**32, num_workers=2,
                                multiprocessing_context="fork", **extra)
        return [b.tolist() for b in loader]

    want = run(tud)
    assert run(ferroloader, **({} if ferroloader.DataLoader is tud.DataLoader else kw)) == want


@ferro_only
@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"num_workers": "bogus"}, "num_workers='bogus'"),
        ({"num_workers": "2"}, "num_workers='2'"),
        ({"num_workers": 1, "worker_threads": 0}, "worker_threads=0"),
        ({"num_workers": 1, "worker_threads": 2.0}, "worker_threads=2.0"),
        ({"snapshot_every_n_steps": -1}, "snapshot_every_n_steps=-1"),
        ({"snapshot_every_n_steps": "5"}, "snapshot_every_n_steps='5'"),
        ({"snapshot_every_n_steps": 2.0}, "snapshot_every_n_steps=2.0"),
    ],
    ids=str,
)
def test_ferroloaders_own_arguments_are_config_errors(kwargs, shown):
    """A value only ferroloader takes is refused with ConfigError (a
    ValueError) naming the argument and the value."""
    with pytest.raises(ConfigError) as e:
        ferroloader.DataLoader(torch.arange(N), **kwargs)
    assert type(e.value) is ConfigError
    assert shown in str(e.value)


@ferro_only
@pytest.mark.parametrize("value", [0, None, 5])
def test_snapshot_every_n_steps_as_torchdata_reads_it(value):
    """0 and None (torchdata: no snapshots) and positive counts are kept."""
    loader = ferroloader.DataLoader(torch.arange(N), snapshot_every_n_steps=value)
    assert loader.snapshot_every_n_steps == value


# Differences from torch the property tests found, each fixed.


@ferro_only
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_size_beyond_sys_maxsize_fails_as_in_torch(drop_last):
    def run(lib):
        loader = lib.DataLoader(torch.arange(N), batch_size=2**63, drop_last=drop_last)
        try:
            return [b.tolist() for b in loader]
        except Exception as exc:
            return type(exc), str(exc)

    assert run(ferroloader) == run(tud)


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("seed", [-1, 2**64])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_per_sample_seed_takes_any_int_seed(seed, num_workers):
    """seeds.py: the seeds 'take any Python int, masked to the 64 bits the
    engine mixes'; per_sample_seed=True with a seed outside [0, 2**64)."""
    def run(s):
        loader = ferroloader.DataLoader(torch.arange(N), batch_size=5, seed=s,
                                        per_sample_seed=True, num_workers=num_workers,
                                        multiprocessing_context="fork" if num_workers else None)
        return [b.tolist() for b in loader]

    assert run(seed) == run(seed % 2**64)


@ferro_only
@time_limit(60)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_batch_sampler_that_is_not_iterable_fails_as_in_torch(num_workers):
    def run(lib):
        loader = lib.DataLoader(torch.arange(N), batch_sampler=object(), num_workers=num_workers,
                                multiprocessing_context="fork" if num_workers else None)
        try:
            next(iter(loader))
        except Exception as exc:
            return type(exc), str(exc)

    assert run(ferroloader) == run(tud)
