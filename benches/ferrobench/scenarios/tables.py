"""TableDataset against torch over pyarrow and HF datasets, and the memory of
a memory-mapped table (table, table_w2, table_mem)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Any, Callable, Dict, Iterable, List, Tuple

import numpy as np
import torch
import torch.utils.data as tud

from .. import ENTRY
from ..harness import Check, Settings, Skip, import_ferro, probe_workers, timed_rate
from ..memory import TreeMemSampler, _file_pss_kib, _tree

# --- tables (TableDataset) ---------------------------------------------------

TABLE_BATCH = 256


def _pa() -> Any:
    try:
        import pyarrow as pa
    except ImportError as e:
        raise Skip("skipped: needs pyarrow (pip install -e '.[test]')") from e
    return pa


def make_bench_table(rows: int, text: bool = True) -> Any:
    """8 numeric columns (int64 and float32 in turn) and a string column."""
    pa = _pa()
    rng = np.random.default_rng(0)
    cols: Dict[str, Any] = {}
    for k in range(8):
        if k % 2:
            cols[f"f{k}"] = pa.array(rng.random(rows, dtype=np.float32))
        else:
            cols[f"i{k}"] = pa.array(rng.integers(0, 1 << 30, rows, dtype=np.int64))
    if text:
        cols["text"] = pa.array([f"token-{v}" for v in rng.integers(0, 10**6, rows)])
    return pa.table(cols)


class ArrowRows(tud.Dataset):
    """The natural per-row dataset over a pyarrow table."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return self.table.slice(i, 1).to_pylist()[0]


class ArrowTake(ArrowRows):
    """What a careful user writes today: one pyarrow ``take`` per batch
    (used with an identity collate_fn)."""

    def __getitems__(self, indices: List[int]) -> Dict[str, Any]:
        sub = self.table.take(indices)
        out: Dict[str, Any] = {}
        for name in sub.column_names:
            col = sub.column(name)
            if col.type.equals(self.table.schema.field(name).type) and name != "text":
                out[name] = torch.from_numpy(col.to_numpy())
            else:
                out[name] = col.to_pylist()
        return out


def _identity(batch: Any) -> Any:
    return batch


def batches_step(make: Callable[[], Iterable[Any]], n: int, rows: int) -> Callable[[], float]:
    """A step of ``n`` batches of a loader kept across steps (a new epoch
    when one ends); reports the rows read."""
    state: Dict[str, Any] = {"loader": make(), "it": None}

    def step() -> float:
        for _ in range(n):
            try:
                if state["it"] is None:
                    raise StopIteration
                next(state["it"])
            except StopIteration:
                state["it"] = iter(state["loader"])
                next(state["it"])
        return float(n * rows)

    return step


def _table_checks(st: Settings, fl: Any, nw: int) -> List[Check]:
    pa = _pa()
    rows = 50_000 if st.quick else 1_000_000
    table = make_bench_table(rows)
    numeric = [c for c in table.column_names if c != "text"]
    kw: Dict[str, Any] = dict(batch_size=TABLE_BATCH, shuffle=True)
    if nw:
        kw.update(num_workers=nw, persistent_workers=True)
    n = 2 if st.quick else 16
    ours = batches_step(
        lambda: fl.DataLoader(fl.TableDataset(table, numeric), **kw), n, TABLE_BATCH
    )
    ours_text = batches_step(lambda: fl.DataLoader(fl.TableDataset(table), **kw), n, TABLE_BATCH)
    per_row = batches_step(
        lambda: tud.DataLoader(ArrowRows(table.select(numeric)), **kw), n, TABLE_BATCH
    )
    per_row_text = batches_step(lambda: tud.DataLoader(ArrowRows(table), **kw), n, TABLE_BATCH)
    take = batches_step(
        lambda: tud.DataLoader(ArrowTake(table.select(numeric)), collate_fn=_identity, **kw),
        n,
        TABLE_BATCH,
    )
    steps: List[Tuple[Check, Callable[[], float], Callable[[], float]]] = [
        (Check("rows/s, numeric", "rows/s", "torch, per-row pyarrow", target=10.0), per_row, ours),
        (Check("rows/s, numeric", "rows/s", "torch, __getitems__ take", target=1.0), take, ours),
        (
            Check("rows/s, with a string column", "rows/s", "torch, per-row pyarrow", target=1.0),
            per_row_text,
            ours_text,
        ),
    ]
    try:
        import datasets

        hf = datasets.Dataset(table.select(numeric)).with_format("torch")
        hf_step = batches_step(lambda: tud.DataLoader(hf, **kw), n, TABLE_BATCH)
        steps.insert(
            1,
            (
                Check("rows/s, numeric", "rows/s", "torch, HF with_format", target=10.0),
                hf_step,
                ours,
            ),
        )
    except ImportError:
        pass
    del pa
    for _, base, mine in steps:  # warm: workers started, pages touched
        base()
        mine()
    for _ in range(st.repeats):
        for check, base, mine in steps:
            check.add(timed_rate(base, st.min_time), timed_rate(mine, st.min_time))
    return [c for c, _, _ in steps]


def sc_table(st: Settings, fl: Any) -> List[Check]:
    return _table_checks(st, fl, 0)


def sc_table_w2(st: Settings, fl: Any) -> List[Check]:
    probe_workers(fl)
    return _table_checks(st, fl, 2)


TABLE_MEM_MARK = "@@TABLEMEM@@"


def table_mem_child(path: str) -> None:
    """Fresh process: one shuffled 2-worker epoch over the IPC file; prints
    the peak summed PSS of the process tree, and the PSS of the file's
    mappings summed over the tree at the epoch's end."""
    fl = import_ferro()
    gc.collect()
    base = TreeMemSampler()
    base.sample()
    sampler = TreeMemSampler(interval=0.05)
    sampler.start()
    try:
        ds = fl.TableDataset(path)
        loader = fl.DataLoader(ds, batch_size=4096, shuffle=True, num_workers=2)
        it = iter(loader)
        rows = 0
        file_pss = 0
        for b in it:
            rows += len(b["i0"])
            if rows >= len(ds) - 4096:
                file_pss = sum(_file_pss_kib(p, path) for p in _tree(os.getpid()))
        del it, loader
    finally:
        sampler.stop()
    result = {
        "base_pss_kib": base.peak_pss,
        "peak_pss_kib": sampler.peak_pss,
        "file_pss_kib": file_pss,
        "rows": rows,
    }
    print(TABLE_MEM_MARK + json.dumps(result), flush=True)


def _table_mem_run(path: str) -> Dict[str, Any]:
    cmd = [sys.executable, ENTRY, "--_table-mem-child", path]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(TABLE_MEM_MARK)), None)
    if line is None:
        raise RuntimeError(f"table memory child failed:\n{proc.stderr[-3000:]}")
    out: Dict[str, Any] = json.loads(line[len(TABLE_MEM_MARK) :])
    return out


def _write_ipc(path: str, rows: int) -> None:
    pa = _pa()
    schema = make_bench_table(1, text=False).schema
    chunk = 1 << 20
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for start in range(0, rows, chunk):
            writer.write_table(make_bench_table(min(chunk, rows - start), text=False))


def sc_table_mem(st: Settings, fl: Any) -> List[Check]:
    """Workers share a memory-mapped table's pages (no copy per worker):
    the job's memory beyond the same job over a tiny file (the workers' own
    interpreters) stays near the file's size plus the batches in flight."""
    probe_workers(fl)
    import tempfile

    size = (64 if st.quick else 1024) << 20
    rows = size // 48  # 4 int64 and 4 float32 columns
    check = Check("peak tree PSS, table's share", "MiB", "file + batches in flight", target=1.1)
    check.higher_is_better = False
    with tempfile.TemporaryDirectory() as tmp:
        path, tiny = os.path.join(tmp, "table.arrow"), os.path.join(tmp, "tiny.arrow")
        _write_ipc(path, rows)
        _write_ipc(tiny, 4096 * 4)
        file_mib = os.path.getsize(path) / 2**20
        # in flight: prefetch_factor 2 x 2 workers, and the batch in use
        in_flight = 5 * 4096 * 48 / 2**20
        notes = []
        for _ in range(2 if st.quick else 1):
            small, big = _table_mem_run(tiny), _table_mem_run(path)
            share = (big["peak_pss_kib"] - small["peak_pss_kib"]) / 1024
            check.add(file_mib + in_flight, share)
            notes.append(
                f"whole job {(big['peak_pss_kib'] - big['base_pss_kib']) / 1024:.0f} MiB, "
                f"the file's mappings {big['file_pss_kib'] / 1024:.0f} MiB"
            )
        check.note = f"file {file_mib:.0f} MiB ({rows:,} rows); " + "; ".join(notes)
    return [check]
