"""TableDataset: batches gathered from Arrow columns equal default_collate
of the rows (and torch's DataLoader over the same dataset), for every
column type, chunking and source."""

from __future__ import annotations

import os
import pickle
from typing import Any

import ferroloader as fl
import numpy as np
import pytest
import torch
from helpers import assert_same, assert_same_outcome, outcome, time_limit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow", reason="TableDataset tests need pyarrow (a test extra)")


def torch_batches(ds, **kw) -> list:
    return list(torch.utils.data.DataLoader(ds, **kw))


def ferro_batches(ds, **kw) -> list:
    return list(fl.DataLoader(ds, **kw))


def _chunked(arr: Any, cuts: list[int]) -> Any:
    """``arr`` as a chunked array cut at ``cuts``."""
    bounds = [0, *sorted({c % (len(arr) + 1) for c in cuts}), len(arr)]
    return pa.chunked_array(
        [arr.slice(a, b - a) for a, b in zip(bounds, bounds[1:])], type=arr.type
    )


NUMERIC = {
    "int8": (pa.int8(), np.int8),
    "int16": (pa.int16(), np.int16),
    "int32": (pa.int32(), np.int32),
    "int64": (pa.int64(), np.int64),
    "uint8": (pa.uint8(), np.uint8),
    "uint16": (pa.uint16(), np.uint16),
    "uint32": (pa.uint32(), np.uint32),
    "uint64": (pa.uint64(), np.uint64),
    "float16": (pa.float16(), np.float16),
    "float32": (pa.float32(), np.float32),
    "float64": (pa.float64(), np.float64),
}


def column(kind: str, n: int, rng: np.random.Generator, null_text: bool) -> Any:
    if kind in NUMERIC:
        t, dt = NUMERIC[kind]
        vals = (rng.random(n) * 100).astype(dt)
        return pa.array(vals, t)
    if kind == "bool":
        return pa.array(rng.random(n) < 0.5)
    if kind == "timestamp":
        return pa.array(rng.integers(0, 10**12, n).astype("datetime64[ms]"))
    if kind == "date32":
        return pa.array(rng.integers(0, 30000, n).astype(np.int32), pa.date32())
    if kind == "fixed_list":
        return pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 3).astype(np.float32)), 3)
    if kind == "list":
        # equal lengths: default_collate stacks them
        return pa.array([list(rng.integers(0, 9, 2)) for _ in range(n)], pa.list_(pa.int32()))
    if kind == "string":
        vals = [f"s{int(v)}" for v in rng.integers(0, 50, n)]
        if null_text:
            vals = [None if i % 3 == 0 else v for i, v in enumerate(vals)]
        return pa.array(vals, pa.string())
    if kind == "large_string":
        return pa.array([f"L{i}" for i in range(n)], pa.large_string())
    if kind == "binary":
        return pa.array([bytes([i % 256, 7]) for i in range(n)], pa.binary())
    if kind == "dict_string":
        return pa.array(
            [["a", "bb", "c"][int(v)] for v in rng.integers(0, 3, n)]
        ).dictionary_encode()
    if kind == "dict_int":
        return pa.array(rng.integers(0, 4, n)).dictionary_encode()
    raise AssertionError(kind)


KINDS = [
    *NUMERIC,
    "bool",
    "timestamp",
    "date32",
    "fixed_list",
    "list",
    "string",
    "large_string",
    "binary",
    "dict_string",
    "dict_int",
]


def make_table(kinds: list[str], n: int, cuts: list[int], seed: int, null_text: bool) -> Any:
    rng = np.random.default_rng(seed)
    cols = {f"c{i}_{k}": _chunked(column(k, n, rng, null_text), cuts) for i, k in enumerate(kinds)}
    return pa.table(cols)


@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=5),
    n=st.integers(1, 40),
    cuts=st.lists(st.integers(0, 60), max_size=6),
    seed=st.integers(0, 2**16),
    null_text=st.booleans(),
    picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=12),
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_gathered_batches_equal_default_collate_of_rows(kinds, n, cuts, seed, null_text, picks):
    """For generated tables (every column type, many chunks, nulls in text),
    a gathered batch equals torch's default_collate of the rows, key for
    key, dtype for dtype; a text column with nulls is a list with None
    where a row is null, wherever the null falls (default_collate raises
    when the first row's is null)."""
    ds = fl.TableDataset(make_table(kinds, n, cuts, seed, null_text))
    idx = [p % n for p in picks]
    want = outcome(lambda: _collate_rows([ds[i] for i in idx]))
    got = outcome(lambda: ferro_batches(ds, batch_sampler=[idx])[0])
    assert_same_outcome(want, got)


def _collate_rows(rows: list[dict[str, Any]]) -> Any:
    """torch's default_collate of the rows, with each text column a list
    (with its Nones) as the table gathers it."""
    text = {k for k in rows[0] if any(isinstance(r[k], (str, bytes)) or r[k] is None
                                      for r in rows)}
    out = torch.utils.data.default_collate([{k: v for k, v in r.items() if k not in text}
                                            for r in rows])
    out.update({k: [r[k] for r in rows] for k in text})
    return {k: out[k] for k in rows[0]}


def test_a_text_column_with_nulls_is_a_list_wherever_the_null_falls():
    """A batch that begins with a null string is a list with None there,
    as one whose null comes later is (not default_collate's TypeError
    over rows, which would make a shuffled run pass or fail by chance)."""
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"text": [None, "a", "b", None, "c", "d"], "label": [1, 1, 0, 1, 0, 1]})
    ds = fl.TableDataset(df[df.label == 1])
    for nw in (0, 2):
        got = [b["text"] for b in fl.DataLoader(ds, batch_size=2, num_workers=nw)]
        assert got == [[None, "a"], [None, "d"]]


@time_limit(120)
@pytest.mark.parametrize("nw", [0, 2])
def test_loader_batches_equal_torchs_over_the_same_table(nw):
    """Shuffled, 2 workers or none: ferroloader's gathered batches equal
    torch's DataLoader calling ds[i] per row over the same TableDataset."""
    ds = fl.TableDataset(make_table(KINDS, 57, [10, 11, 30], 3, False))
    torch.manual_seed(0)
    want = torch_batches(ds, batch_size=8, shuffle=True, num_workers=nw)
    torch.manual_seed(0)
    got = ferro_batches(ds, batch_size=8, shuffle=True, num_workers=nw)
    assert_same(want, got)


def test_rows_are_what_torch_users_expect():
    """A row is a dict: 0-d tensors of the column's dtype, 1-d for lists,
    str/bytes/None for text, decoded dictionary values."""
    t = pa.table(
        {
            "i": pa.array([1, 2], pa.int32()),
            "f": pa.array([0.5, 1.5], pa.float64()),
            "b": pa.array([True, False]),
            "ts": pa.array(np.array([5, 6]).astype("datetime64[s]")),
            "v": pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, 3.0, 4.0]), 2),
            "s": pa.array(["x", None]),
            "d": pa.array(["p", "q"]).dictionary_encode(),
        }
    )
    row = fl.TableDataset(t)[1]
    assert list(row) == ["i", "f", "b", "ts", "v", "s", "d"]
    assert row["i"].dtype == torch.int32 and row["i"].dim() == 0 and int(row["i"]) == 2
    assert row["f"].dtype == torch.float64
    assert row["b"].dtype == torch.bool and not bool(row["b"])
    assert row["ts"].dtype == torch.int64 and int(row["ts"]) == 6
    assert torch.equal(row["v"], torch.tensor([3.0, 4.0], dtype=torch.float64))
    assert row["s"] is None and row["d"] == "q"
    assert fl.TableDataset(t)[-1]["i"] == 2
    with pytest.raises(IndexError):
        fl.TableDataset(t)[2]


def test_nulls_and_unsupported_types_are_refused_naming_the_column():
    """A null in a numeric column, or a column type with no tensor value,
    is a ConfigError (ValueError) naming the column when the table opens;
    an unknown column is a KeyError; rows of lists of unequal length raise
    torch's own stacking error, as default_collate would."""
    with pytest.raises(ValueError, match="'x' has nulls"):
        fl.TableDataset(pa.table({"x": pa.array([1, None, 3])}))
    with pytest.raises(ValueError, match=r"'m'.*cannot turn into"):
        fl.TableDataset(pa.table({"m": pa.array([{"a": 1}])}))
    ds = fl.TableDataset(pa.table({"x": [1, 2], "y": [3, 4]}), columns=["y"])
    assert ds.columns == ["y"]
    with pytest.raises(KeyError, match=r"no column .z.; the table has \[.x.\]"):
        fl.TableDataset(pa.table({"x": [1]}), columns=["z"])
    ragged = fl.TableDataset(pa.table({"l": pa.array([[1, 2], [3]], pa.list_(pa.int64()))}))
    with pytest.raises(RuntimeError) as err_t:
        torch_batches(ragged, batch_size=2)
    with pytest.raises(RuntimeError) as err_f:
        ferro_batches(ragged, batch_size=2)
    assert str(err_t.value) == str(err_f.value)


class Marker:
    """A transform that records where it ran."""

    def __call__(self, batch: dict) -> dict:
        batch["pid"] = torch.tensor(os.getpid())
        batch["x2"] = batch["x"] * 2
        return batch


@pytest.mark.parametrize("nw", [0, 2])
def test_transform_runs_under_a_torch_function_mode(nw):
    """Under a TorchFunctionMode (torch.set_default_device) the gather stands
    aside for torch's collate, and the transform still runs on the batch."""
    ds = fl.TableDataset(pa.table({"x": list(range(8))}), transform=Marker())
    torch.set_default_device("cpu")
    try:
        got = ferro_batches(ds, batch_size=4, num_workers=nw)
    finally:
        torch.set_default_device(None)
    assert all("pid" in b and torch.equal(b["x2"], b["x"] * 2) for b in got)


@pytest.mark.parametrize("nw", [0, 2])
def test_transform_runs_on_the_collated_batch_in_the_worker(nw):
    """transform= gets the collated batch (a dict) and runs inside the
    worker; with torch's loader, collate_fn=ds.collate gives the same."""
    ds = fl.TableDataset(pa.table({"x": list(range(20))}), transform=Marker())
    got = ferro_batches(ds, batch_size=5, num_workers=nw)
    pids = {int(b.pop("pid")) for b in got}
    assert (pids == {os.getpid()}) == (nw == 0)
    want = torch_batches(ds, batch_size=5, collate_fn=ds.collate)
    for b in want:
        b.pop("pid")
    assert_same(want, got)


def test_sources_pandas_polars_batches_ipc_and_hf(tmp_path):
    """pandas and polars frames, record batches, Arrow IPC files (file and
    stream format, memory-mapped) and a HF datasets.Dataset through its
    select/shuffle indices give the same rows as the pyarrow table."""
    t = make_table(["int32", "float32", "string", "bool"], 30, [7], 1, False)
    ref = fl.TableDataset(t)
    want = [ref[i] for i in range(30)]
    sources: list[Any] = [t.combine_chunks().to_batches()[0]]
    pd = pytest.importorskip("pandas")
    sources.append(pd.DataFrame(t.to_pandas()))
    try:
        import polars as pl

        sources.append(pl.from_arrow(t))
    except ImportError:  # pragma: no cover - polars is a test extra
        pass
    for fmt in ("file", "stream"):
        path = tmp_path / f"t.{fmt}"
        with pa.OSFile(str(path), "wb") as sink:
            writer = (pa.ipc.new_file if fmt == "file" else pa.ipc.new_stream)(sink, t.schema)
            writer.write_table(t)
            writer.close()
        sources.append(str(path))
    for src in sources:
        ds = fl.TableDataset(src)
        assert_same(want, [ds[i] for i in range(30)])
        assert_same(fl.default_collate(want[:8]), ferro_batches(ds, batch_size=8, num_workers=1)[0])
        pickle.loads(pickle.dumps(ds))  # picklable for spawned workers
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset(t).shuffle(seed=3).select(range(20))
    ds = fl.TableDataset(hf)
    order = hf["c0_int32"]
    assert [int(ds[i]["c0_int32"]) for i in range(20)] == order
    torch.manual_seed(1)
    want = torch_batches(ds, batch_size=6, shuffle=True, num_workers=2)
    torch.manual_seed(1)
    assert_same(want, ferro_batches(ds, batch_size=6, shuffle=True, num_workers=2))


@time_limit(120)
def test_every_sampler_and_a_resume():
    """Weighted, subset, distributed and user samplers give torch's
    batches; a snapshot mid-epoch resumes with another num_workers."""
    ds = fl.TableDataset(make_table(["int64", "string", "fixed_list"], 40, [13], 5, False))
    samplers = [
        lambda: torch.utils.data.WeightedRandomSampler(torch.rand(40), 25),
        lambda: torch.utils.data.SubsetRandomSampler(list(range(5, 33))),
        lambda: torch.utils.data.DistributedSampler(ds, num_replicas=3, rank=1, seed=4),
        lambda: [3, 1, 4, 1, 5, 9, 2, 6],
    ]
    for make in samplers:
        torch.manual_seed(2)
        want = torch_batches(ds, batch_size=4, sampler=make(), num_workers=2)
        torch.manual_seed(2)
        assert_same(want, ferro_batches(ds, batch_size=4, sampler=make(), num_workers=2))
    torch.manual_seed(0)
    whole = ferro_batches(ds, batch_size=4, shuffle=True)
    torch.manual_seed(0)
    first = fl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    sd = first.state_dict()
    del it
    resumed = fl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=0)
    resumed.load_state_dict(sd)
    assert_same(whole, head + list(resumed))


@time_limit(120)
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_a_directory_of_parquet_and_arrow_files_is_a_sharded_dataset(tmp_path, mode):
    """TableShards over a directory (Parquet row groups and an Arrow file,
    one shard each): every row exactly once per epoch across 2 ranks with
    workers, rows as TableDataset gives them; static order independent of
    num_workers."""
    pq = pytest.importorskip("pyarrow.parquet")
    t = make_table(["int64", "float32", "string"], 90, [], 4, False).rename_columns(
        ["i", "f", "s"]
    )
    pq.write_table(t.slice(0, 50), str(tmp_path / "a.parquet"), row_group_size=12)
    pq.write_table(t.slice(50, 25), str(tmp_path / "b.parquet"), row_group_size=25)
    with pa.OSFile(str(tmp_path / "c.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, t.schema) as w:
            w.write_table(t.slice(75))
    ds = fl.TableShards(tmp_path)
    assert len(ds.shards()) == 5 + 1 + 1 and len(ds) == 90
    want = sorted(int(x) for x in t.column("i").to_pylist())
    seen: list[int] = []
    orders = {}
    for rank in range(2):
        for nw in (0, 2):
            loader = fl.DataLoader(
                ds,
                batch_size=4,
                shuffle=True,
                seed=1,
                num_workers=nw,
                sharding=fl.Sharding(mode=mode, rank=rank, world_size=2, even=False),
            )
            batches = list(loader)
            assert all(set(b) == {"i", "f", "s"} for b in batches)
            got = [int(x) for b in batches for x in b["i"]]
            orders[(rank, nw)] = got
            if nw == 2:
                seen += got
    assert sorted(seen) == want
    if mode == "static":
        assert orders[(0, 0)] == orders[(0, 2)] and orders[(1, 0)] == orders[(1, 2)]


# --------------------------------------------------------------------------- #
# Tables users hand in that are empty, odd or damaged
# --------------------------------------------------------------------------- #


def _zero_row_sources() -> list[Any]:
    pa = pytest.importorskip("pyarrow", reason="pyarrow is a test extra")
    out = [pa.table({"x": pa.array([], pa.int64()), "s": pa.array([], pa.string())})]
    pd = pytest.importorskip("pandas", reason="pandas is a test extra")
    out.append(pd.DataFrame({"x": np.array([], dtype=np.int64)}))
    pl = pytest.importorskip("polars", reason="polars is a test extra")
    out.append(pl.DataFrame({"x": pl.Series([], dtype=pl.Int64)}))
    return out


@pytest.mark.parametrize("nw", [0, 2])
def test_a_table_without_rows_yields_no_batches(nw):
    """A zero-row table's columns keep their types (the schema's), and the
    loader yields no batch, as torch's does over an empty dataset."""
    for src in _zero_row_sources():
        ds = fl.TableDataset(src)
        assert len(ds) == 0
        assert list(fl.DataLoader(ds, batch_size=4, num_workers=nw)) == []
        assert list(torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=ds.collate)) == []


def test_table_shards_over_a_directory_with_an_empty_part(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is a test extra")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": pa.array([], pa.int64())}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"x": pa.array([1, 2, 3], pa.int64())}), tmp_path / "part-1.parquet")
    got = [b["x"].tolist() for b in fl.DataLoader(fl.TableShards(str(tmp_path)), batch_size=2)]
    assert sorted(x for b in got for x in b) == [1, 2, 3]


@pytest.mark.parametrize("nw", [0, 2])
def test_a_width_zero_fixed_size_list_gives_empty_rows(nw):
    """A fixed_size_list of width 0 is a valid column: (0,) per row, (B, 0)
    per batch, as torch's default_collate stacks the rows."""
    pa = pytest.importorskip("pyarrow", reason="pyarrow is a test extra")
    t = pa.table({"v": pa.array([[], [], []], pa.list_(pa.float32(), 0)), "i": [1, 2, 3]})
    ds = fl.TableDataset(t)
    assert ds[1]["v"].shape == (0,) and ds[1]["v"].dtype == torch.float32
    want = list(torch.utils.data.DataLoader(ds, batch_size=2))
    assert_same(want, list(fl.DataLoader(ds, batch_size=2, num_workers=nw)))


def test_duplicate_column_names_are_refused_by_name():
    pa = pytest.importorskip("pyarrow", reason="pyarrow is a test extra")
    t = pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["a", "a"])
    with pytest.raises(fl.ConfigError, match="more than one column named 'a'"):
        fl.TableDataset(t)
    cols = [pa.array([1, 2]), pa.array([3, 4]), pa.array([5, 6])]
    t = pa.Table.from_arrays(cols, names=["a", "a", "b"])
    assert fl.TableDataset(t, columns=["b"])[1] == {"b": torch.tensor(6)}


@pytest.mark.parametrize("nw", [0, 2])
def test_invalid_utf8_is_a_unicode_error_not_a_panic(nw):
    """A string column with invalid UTF-8 (which pyarrow's quick validate()
    passes) raises UnicodeDecodeError for that row, as pyarrow's per-row
    read does; with workers torch's wrapper re-raises it."""
    pa = pytest.importorskip("pyarrow", reason="pyarrow is a test extra")
    offsets = pa.py_buffer(np.array([0, 2, 4], np.int32).tobytes())
    bad = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"ok\xff\xfe")])
    ds = fl.TableDataset(pa.table({"s": bad}))
    assert ds[0] == {"s": "ok"}
    with pytest.raises(UnicodeDecodeError):
        ds[1]
    with pytest.raises(Exception, match=r"UnicodeDecodeError|invalid utf-8") as e:
        list(fl.DataLoader(ds, batch_size=2, num_workers=nw))
    assert isinstance(e.value, (UnicodeDecodeError, RuntimeError))


_DAMAGE = """
import random, sys
import ferroloader as fl
raw = open(sys.argv[1], "rb").read()
outcomes = {"ok": 0, "error": 0}
for seed in range(40):
    rng = random.Random(seed)
    data = bytearray(raw)
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(len(data) // 4, len(data))
        data[at] = rng.randrange(256)
    path = sys.argv[2]
    open(path, "wb").write(bytes(data))
    try:
        ds = fl.TableDataset(path)
        for i in range(len(ds)):
            ds[i]
        for _ in fl.DataLoader(ds, batch_size=7):
            pass
        outcomes["ok"] += 1
    except Exception:
        outcomes["error"] += 1
print(outcomes)
"""


@time_limit(120)
def test_randomly_damaged_arrow_files_are_errors_never_crashes(tmp_path):
    """40 Arrow IPC files with random bytes overwritten: each loads or raises
    an Exception; no Rust panic (a BaseException), no crash of the process."""
    pa = pytest.importorskip("pyarrow", reason="pyarrow is a test extra")
    import subprocess
    import sys

    import pyarrow.ipc as ipc

    n = 200
    t = pa.table(
        {
            "i": np.arange(n, dtype=np.int64),
            "f": np.linspace(0, 1, n, dtype=np.float32),
            "s": [f"row {k} " * (k % 5) for k in range(n)],
            "l": [[k, k + 1] for k in range(n)],  # equal lengths: batches stack
        }
    )
    src = tmp_path / "t.arrow"
    with ipc.new_file(str(src), t.schema) as w:
        w.write_table(t, max_chunksize=64)
    script = tmp_path / "damage.py"
    script.write_text(_DAMAGE)
    proc = subprocess.run(
        [sys.executable, str(script), str(src), str(tmp_path / "bad.arrow")],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PanicException" not in proc.stderr
    counts = eval(proc.stdout.strip().splitlines()[-1])  # the script's dict
    assert counts["ok"] + counts["error"] == 40


def test_a_parquet_path_or_a_directory_says_what_reads_it(tmp_path):
    """A path to a Parquet file (or a directory, or any non-Arrow file) is a
    ConfigError (a ValueError) saying a path opens only an Arrow IPC file
    and what to use instead, never pyarrow's 'Expected to read ... metadata
    bytes'."""
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), str(path))
    for src in (str(path), path, str(tmp_path / "train.bin")):
        if str(src).endswith(".bin"):
            os.replace(path, src)
        with pytest.raises(fl.ConfigError, match="a Parquet file, not an Arrow IPC file") as e:
            fl.TableDataset(src)
        assert "pyarrow.parquet.read_table(path)" in str(e.value)
        assert "ferroloader.TableShards" in str(e.value)
    other = tmp_path / "notes.txt"
    other.write_text("no table here, just some text long enough to hold a header")
    with pytest.raises(ValueError, match="is not an Arrow IPC file"):
        fl.TableDataset(str(other))
    with pytest.raises(fl.ConfigError, match=r"is a directory.*ferroloader\.TableShards"):
        fl.TableDataset(str(tmp_path))


def test_a_pandas_frames_index_is_not_a_column_and_nan_loads_as_nan():
    """A filtered DataFrame (an index other than a RangeIndex) gives its
    columns only, and NaN in a float column loads as NaN, as torch's loader
    over the frame's rows gives it; a real missing value (pd.NA in a
    nullable column) is still refused as a null."""
    pd = pytest.importorskip("pandas", reason="pandas is a test extra")
    frame = pd.DataFrame(
        {"x": [1.0, -1.0, np.nan, 3.0, 4.0], "y": np.arange(5, dtype=np.int64),
         "h": np.array([0.5, np.nan, 1.0, 2.0, 0.0], dtype=np.float16)}
    )
    picked = frame[frame.y != 1]  # index [0, 2, 3, 4]: kept by pyarrow as a column
    ds = fl.TableDataset(picked)
    assert ds.columns == ["x", "y", "h"]

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(picked)

        def __getitem__(self, i: int) -> dict:
            row = picked.iloc[i]
            return {"x": torch.tensor(row["x"], dtype=torch.float64),
                    "y": torch.tensor(int(row["y"])),
                    "h": torch.tensor(float(row["h"]), dtype=torch.float16)}

    want = torch_batches(Rows(), batch_size=2)
    for nw in (0, 1):
        got = ferro_batches(ds, batch_size=2, num_workers=nw)
        assert [sorted(b) for b in got] == [["h", "x", "y"]] * 2
        for w, g in zip(want, got):
            for k in w:
                assert torch.equal(w[k].isnan(), g[k].isnan()), k
                assert torch.equal(w[k].nan_to_num(), g[k].nan_to_num()), k
                assert w[k].dtype == g[k].dtype, k
    assert torch.isnan(ds[1]["x"])
    with pytest.raises(fl.ConfigError, match="'z' has nulls"):
        fl.TableDataset(pd.DataFrame({"z": pd.array([1.0, None], dtype="Float64")}))
