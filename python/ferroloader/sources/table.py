"""``TableDataset``: tables (Arrow, pandas, polars, DuckDB, an Arrow IPC file,
a HuggingFace ``datasets.Dataset``) as a map-style dataset whose batches
the engine gathers from the columns, with no Python per row.

``ds[i]`` is a row: a dict of column name to value (a 0-d tensor of the
column's dtype for numbers, bools, dates and timestamps, a 1-d tensor for a
fixed-size or variable-length list of numbers, ``str``/``bytes`` for text,
``None`` for a null text). ``DataLoader`` with the default collate gathers a
batch's rows straight from the Arrow buffers into the batch tensors (in a
worker, into the shared-memory record): the batch is exactly
``default_collate([ds[i] for i in indices])``, then ``transform(batch)``
when a ``transform`` is given. A null in a column that becomes tensors is
refused when the table is opened, naming the column.
"""

from __future__ import annotations

import io
import operator
import os
import sys
from typing import Any, Callable, Optional, Sequence, Union

import ferroloader._core as _core
from ferroloader.collate import default_collate
from ferroloader.dataset import Dataset
from ferroloader.errors import ConfigError
from ferroloader.sources.remote import ShardCache, cache_for, is_url
from ferroloader.sources.shards import ShardedDataset


def _open_ipc(path: str, who: str = "TableDataset") -> Any:
    """A memory-mapped Arrow IPC file (file or stream format) as a pyarrow
    Table whose buffers are the mapping: nothing is read until used, and
    every process that maps the file shares its pages. Anything else (a
    Parquet file, a directory) is a ``ConfigError`` saying what reads it."""
    try:
        import pyarrow as pa
        import pyarrow.ipc as ipc
    except ImportError as e:  # pragma: no cover - pyarrow is a test extra
        raise ImportError("TableDataset over an Arrow IPC file needs pyarrow") from e
    if os.path.isdir(path):
        raise ConfigError(
            f"{who}: {path!r} is a directory, not an Arrow IPC file; for a directory of "
            f"Parquet or Arrow files use ferroloader.TableShards({path!r})"
        )
    source = pa.memory_map(path, "r")
    try:
        return ipc.open_file(source).read_all()
    except pa.ArrowInvalid:
        source.seek(0)
    try:
        return ipc.open_stream(source).read_all()
    except pa.ArrowInvalid as e:
        raise ConfigError(_not_ipc(path, source, who)) from e


def _not_ipc(path: str, source: Any, who: str) -> str:
    """What to say of a file that is not Arrow IPC: a path opens only an
    Arrow IPC file (memory-mapped)."""
    source.seek(0)
    parquet = source.read(4) == _PARQUET_MAGIC or _is_parquet(path)
    what = "a Parquet file, not an Arrow IPC file" if parquet else (
        "not an Arrow IPC file (file or stream format)"
    )
    return (
        f"{who}: {path!r} is {what}; a path opens only an Arrow IPC file "
        "(memory-mapped). For Parquet, read it with pyarrow.parquet.read_table(path) and pass "
        "the table to TableDataset, or use ferroloader.TableShards(path) (one shard per row "
        "group; also takes a directory of Parquet or Arrow files)"
    )


_PARQUET_MAGIC = b"PAR1"
# bytes read from a remote Parquet file's end for its footer (read again
# whole when it is longer)
_FOOTER_GUESS = 64 << 10


class _Pieces(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``pieces`` (offset,
    bytes) were fetched: what pyarrow reads of a Parquet file through a
    ranged read. A read elsewhere is an error, not zeros."""

    def __init__(self, size: int, pieces: list[tuple[int, bytes]]) -> None:
        self._size, self._pieces, self._pos = size, sorted(pieces), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        """Fills ``buffer`` as far as the object goes, across pieces (a short
        read would look like the object's end to pyarrow)."""
        want = min(len(buffer), self._size - self._pos)
        done = 0
        while done < want:
            for start, data in self._pieces:
                if start <= self._pos < start + len(data):
                    n = min(want - done, start + len(data) - self._pos)
                    at = self._pos - start
                    buffer[done : done + n] = data[at : at + n]
                    self._pos += n
                    done += n
                    break
            else:
                break
        if done or want <= 0:
            return done
        raise OSError(f"read at byte {self._pos}, outside the ranges fetched")


def _pandas_table(frame: Any) -> Any:
    """A pandas DataFrame as a pyarrow Table of its columns: the index is
    not a column (torch over the rows would not give it), and a NaN in a
    NumPy float column stays NaN (pyarrow's ``from_pandas`` conversion,
    which pandas' ``__arrow_c_stream__`` uses, makes it a null, which no
    tensor holds); a missing value of a nullable dtype (``pd.NA``) stays a
    null."""
    import numpy as np
    import pyarrow as pa

    table = pa.Table.from_pandas(frame, preserve_index=False)
    for i in range(table.num_columns):
        if table.column(i).null_count == 0:
            continue
        values = frame.iloc[:, i]
        if isinstance(values.dtype, np.dtype) and values.dtype.kind == "f":
            field = table.schema.field(i)
            array = pa.array(values.to_numpy(), type=field.type, from_pandas=False)
            table = table.set_column(i, field, array)
    return table


def _is_pandas_frame(obj: Any) -> bool:
    pd = sys.modules.get("pandas")  # not imported: obj is no DataFrame
    return pd is not None and isinstance(obj, pd.DataFrame)


def _is_hf_dataset(obj: Any) -> bool:
    data = getattr(obj, "data", None)
    return hasattr(obj, "_indices") and hasattr(data, "table") and hasattr(obj, "column_names")


class TableDataset(Dataset[dict[str, Any]]):
    """A map-style dataset over a table; see the module doc.

    ``table``: anything with ``__arrow_c_stream__`` or ``__arrow_c_array__``
    (pyarrow Tables and RecordBatches, polars, DuckDB results), a pandas
    DataFrame (its columns, not its index; NaN in a float column loads as
    NaN), a path to an Arrow IPC file (memory-mapped; for Parquet see
    ``TableShards``), or a ``datasets.Dataset`` (its Arrow table, through
    its ``select``/``shuffle`` indices mapping). The path may be a URL
    (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``): the file
    is downloaded once into ``cache`` (a ``ShardCache``; a default one
    when none is given), kept there while the dataset lives, and mapped
    from there by every process.
    ``columns``: the columns to load, in order (default: all).
    ``transform``: called on each collated batch (a dict), inside the worker.
    With torch's own ``DataLoader``, pass ``collate_fn=ds.collate`` to apply it.

    >>> import pyarrow as pa, ferroloader
    >>> ds = ferroloader.TableDataset(pa.table({"x": [0.5, 1.5, 2.5], "y": [1, 2, 3]}))
    >>> ds[1]
    {'x': tensor(1.5000, dtype=torch.float64), 'y': tensor(2)}
    >>> next(iter(ferroloader.DataLoader(ds, batch_size=3)))
    {'x': tensor([0.5000, 1.5000, 2.5000], dtype=torch.float64), 'y': tensor([1, 2, 3])}
    """

    def __init__(
        self,
        table: Union[Any, str, os.PathLike[str]],
        columns: Optional[Sequence[str]] = None,
        transform: Optional[Callable[[dict[str, Any]], Any]] = None,
        *,
        cache: Optional[ShardCache] = None,
    ) -> None:
        self.transform = transform
        self._columns = None if columns is None else [str(c) for c in columns]
        self._source = table if not isinstance(table, os.PathLike) else os.fspath(table)
        self.cache = cache_for([self._source] if isinstance(self._source, str) else [], cache)
        self._table: Optional[Any] = None
        self._pin: Optional[Any] = None  # a URL's file, kept in the cache while mapped
        self._native()  # open now: a bad table or column fails here, not in a worker

    def _native(self) -> Any:
        """The engine's handle on the columns, opened once per process."""
        if self._table is None:
            src = self._source
            mapping = None
            if isinstance(src, str) and self.cache is not None and is_url(src):
                self._pin = self.cache.pin(src)
                try:
                    arrow = _open_ipc(self._pin.path)
                except ConfigError as e:  # named by its URL, not its place in the cache
                    raise ConfigError(str(e).replace(self._pin.path, src)) from None
            elif isinstance(src, str):
                arrow = _open_ipc(src)
            elif _is_pandas_frame(src):
                arrow = _pandas_table(src)
            elif _is_hf_dataset(src):
                arrow = src.data.table
                if src._indices is not None:
                    mapping = src._indices.column("indices").to_pylist()
            else:
                arrow = src
            self._table = _core.ArrowTable(arrow, self._columns, mapping)
        return self._table

    @property
    def columns(self) -> list[str]:
        return list(self._native().names)

    def __len__(self) -> int:
        return len(self._native())

    def __getitem__(self, index: Any) -> dict[str, Any]:
        return self._native().row(operator.index(index))

    def collate(self, rows: list[dict[str, Any]]) -> Any:
        """``default_collate(rows)``, then the transform: the batch the loader
        gathers, for use as torch's ``collate_fn``."""
        batch = default_collate(rows)
        return batch if self.transform is None else self.transform(batch)

    def __getstate__(self) -> dict[str, Any]:
        # the engine's handle is per process; a worker reopens the source (a
        # path maps the same file, so the pages stay shared)
        state = dict(self.__dict__)
        state["_table"] = None
        state["_pin"] = None
        return state


def _is_parquet(path: str) -> bool:
    return path.endswith((".parquet", ".pq"))


class TableShards(ShardedDataset[dict[str, Any]]):
    """Parquet or Arrow IPC files as a sharded dataset: one shard per
    Parquet row group, one per Arrow file (memory-mapped). ``paths``: files,
    or a directory (its ``*.parquet``, ``*.pq``, ``*.arrow``, ``*.feather``
    and ``*.ipc`` files, sorted). Items are rows as ``TableDataset`` gives
    them (``columns`` selects); with ``DataLoader(..., sharding=...)`` the
    loader assigns shards to ranks and workers (see ``ferroloader.Sharding``).
    Each lane opens one shard's table at a time; rows are collated as
    ``default_collate`` collates them (per row, unlike ``TableDataset``'s
    gather). Needs pyarrow.

    Paths may be URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://``,
    ``file://``; not a remote directory), read through ``cache`` (a
    ``ferroloader.ShardCache``, by default one with its default directory
    and budget): of a Parquet file only its footer and, per shard, the byte
    range of its row group's (selected) columns are fetched; an Arrow file
    whole.

    >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq, ferroloader
    >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
    >>> pq.write_table(pa.table({"y": list(range(10))}), path, row_group_size=5)
    >>> shards = ferroloader.TableShards(path)
    >>> len(shards.shards())
    2
    >>> sorted(int(v) for b in ferroloader.DataLoader(shards, batch_size=4) for v in b["y"])
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """

    _SUFFIXES = (".parquet", ".pq", ".arrow", ".feather", ".ipc")

    def __init__(
        self,
        paths: Union[str, os.PathLike[str], Sequence[Union[str, os.PathLike[str]]]],
        columns: Optional[Sequence[str]] = None,
        cache: Optional[ShardCache] = None,
    ) -> None:
        if isinstance(paths, str) and is_url(paths):
            found = [paths]
        elif isinstance(paths, (str, os.PathLike)) and os.path.isdir(paths):
            root = os.fspath(paths)
            found = sorted(
                os.path.join(root, f) for f in os.listdir(root) if f.endswith(self._SUFFIXES)
            )
        elif isinstance(paths, (str, os.PathLike)):
            found = [os.fspath(paths)]
        else:
            found = [os.fspath(p) for p in paths]
        self.paths = found
        self.columns = None if columns is None else [str(c) for c in columns]
        self._shards: Optional[list[tuple[str, int, int]]] = None
        # a remote Parquet file's footer and each row group's byte range,
        # found by shards() in the main process (workers get them pickled)
        self._footers: dict[str, tuple[int, int]] = {}
        self._spans: dict[tuple[str, int], tuple[int, int]] = {}
        self.cache = cache_for(self.paths, cache)

    def shards(self) -> list[tuple[str, int, int]]:
        """``(path, row group or -1 for a whole Arrow file, rows)`` each."""
        if self._shards is None:

            def one(path: str) -> list[tuple[str, int, int]]:
                if self.cache is not None and is_url(path) and _is_parquet(path):
                    return self._remote_parquet_shards(path)
                if self.cache is not None and is_url(path):
                    with self.cache.open(path) as local:
                        return self._file_shards(path, local)
                return self._file_shards(path, path)

            # remote files' footers are read side by side (each a round trip)
            found = (self.cache.each(one, self.paths) if self.cache is not None
                     else [one(p) for p in self.paths])
            self._shards = [s for shards in found for s in shards]
        return self._shards

    def _file_shards(self, path: str, local: str) -> list[tuple[str, int, int]]:
        if _is_parquet(path):
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(local).metadata
            groups = range(meta.num_row_groups)
            return [(path, g, meta.row_group(g).num_rows) for g in groups]
        return [(path, -1, _open_ipc(local, "TableShards").num_rows)]

    def _remote_parquet_shards(self, url: str) -> list[tuple[str, int, int]]:
        """A remote Parquet file's shards from its footer alone (ranged
        reads): the row groups, and the byte range each shard reads."""
        assert self.cache is not None
        size = self.cache.sizes([url])[0]
        start = max(0, size - _FOOTER_GUESS)
        with self.cache.open(url, start, size) as local, open(local, "rb") as f:
            tail = f.read()
        if len(tail) < 8 or tail[-4:] != _PARQUET_MAGIC:
            raise ConfigError(f"TableShards: {url} is not a Parquet file (no footer magic)")
        need = int.from_bytes(tail[-8:-4], "little") + 8
        if need > len(tail):
            start = size - need
        self._footers[url] = (start, size)
        meta = self._parquet(url, []).metadata
        out = []
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            lo, hi = size, 0
            for i in range(rg.num_columns):
                col = rg.column(i)
                name = col.path_in_schema.split(".")[0]
                if self.columns is not None and name not in self.columns:
                    continue
                first = col.data_page_offset
                if col.has_dictionary_page and col.dictionary_page_offset:
                    first = min(first, col.dictionary_page_offset)
                lo, hi = min(lo, first), max(hi, first + col.total_compressed_size)
            self._spans[(url, g)] = (lo, max(hi, lo))
            out.append((url, g, rg.num_rows))
        return out

    def _parquet(self, url: str, pieces: list[tuple[int, bytes]]) -> Any:
        """A ``ParquetFile`` over the fetched pieces of ``url`` (its footer
        and ``pieces``), reading nothing else."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert self.cache is not None
        start, size = self._footers[url]
        with self.cache.open(url, start, size) as local, open(local, "rb") as f:
            footer = f.read()
        return pq.ParquetFile(pa.PythonFile(_Pieces(size, [(start, footer), *pieces]), mode="r"))

    def shard_len(self, shard: Any) -> int:
        return int(shard[2])

    def _open(self, local: str, group: int) -> Any:
        if group >= 0:
            import pyarrow.parquet as pq

            table = pq.ParquetFile(local).read_row_group(group, columns=self.columns)
        else:
            table = _open_ipc(local, "TableShards")
        return _core.ArrowTable(table, self.columns, None)

    def _rows(self, local: str, group: int, start: int) -> Any:
        table = self._open(local, group)
        return (table.row(i) for i in range(start, len(table)))

    def iter_shard(self, shard: Any, start: int = 0) -> Any:
        path, group, _ = shard
        if (path, group) in self._spans:
            return self._remote_rows(path, group, start)
        if self.cache is not None and is_url(path):
            return self.cache.read(path, lambda local: self._rows(local, group, start))
        return self._rows(path, group, start)

    def _remote_rows(self, url: str, group: int, start: int) -> Any:
        assert self.cache is not None
        lo, hi = self._spans[(url, group)]
        pieces = []
        if hi > lo:
            with self.cache.open(url, lo, hi) as local, open(local, "rb") as f:
                pieces.append((lo, f.read()))
        arrow = self._parquet(url, pieces).read_row_group(group, columns=self.columns)
        table = _core.ArrowTable(arrow, self.columns, None)
        return (table.row(i) for i in range(start, len(table)))

    def _remote(self, shards: Sequence[Any]) -> Optional[tuple[Any, list[Any]]]:
        if self.cache is None:
            return None
        out: list[Any] = []
        for path, group, _ in shards:
            span = self._spans.get((path, group))
            out.append(None if not is_url(path) else (path, span) if span else path)
        return self.cache, out

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)


__all__ = ["TableDataset", "TableShards"]
