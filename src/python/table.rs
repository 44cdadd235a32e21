//! Tables (`ferroloader.TableDataset`): Arrow columns imported once per
//! process through the Arrow PyCapsule interface (zero-copy: the arrays keep
//! the producer's buffers, a memory map included, alive), read a row at a
//! time (`ds[i]`) or gathered by index straight into batch leaves, with no
//! Python per row for fixed-width columns. The byte movement is the
//! engine's (`crate::collate::columns`).
//!
//! What a row gives (and so what `default_collate` of rows gives, which a
//! gathered batch equals): integer, float, bool, date, time, timestamp and
//! duration columns a 0-d tensor of the column's width (timestamps and the
//! like as their raw integer counts); a fixed-size list a 1-d tensor; a
//! variable-length list of numbers a 1-d tensor (rows of unequal length
//! cannot be stacked, as torch says); strings and binaries `str` / `bytes`
//! (`None` for a null); dictionary-encoded columns their decoded values. A
//! null in any other column is refused when the table is opened, naming the
//! column.

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_data::ArrayData;
use arrow_schema::DataType;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyDict, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::collate::{Pending, PendingLeaf, Sink, WriteRows};
use super::error::Class;
use super::ffi::{import_arrow_array, import_arrow_stream, DlDtype, FreshTensor};
use super::torch::torch;
use crate::collate::columns::{read_key, Chunked, ChunkedBits};

const INT: u8 = 0;
const UINT: u8 = 1;
const FLOAT: u8 = 2;

fn dl(code: u8, bits: u8) -> DlDtype {
    DlDtype {
        code,
        bits,
        lanes: 1,
    }
}

/// The tensor dtype of a fixed-width Arrow type, if it has one.
fn fixed_dtype(dt: &DataType) -> Option<DlDtype> {
    use DataType::*;
    Some(match dt {
        Int8 => dl(INT, 8),
        Int16 => dl(INT, 16),
        Int32 | Date32 | Time32(_) => dl(INT, 32),
        Int64 | Date64 | Time64(_) | Timestamp(..) | Duration(_) => dl(INT, 64),
        UInt8 => dl(UINT, 8),
        UInt16 => dl(UINT, 16),
        UInt32 => dl(UINT, 32),
        UInt64 => dl(UINT, 64),
        Float16 => dl(FLOAT, 16),
        Float32 => dl(FLOAT, 32),
        Float64 => dl(FLOAT, 64),
        _ => return None,
    })
}

fn is_text(dt: &DataType) -> bool {
    use DataType::*;
    matches!(
        dt,
        Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView
    )
}

/// How a column's rows are read.
#[derive(Clone, Debug)]
enum Kind {
    /// Fixed-width values: one row is `width` elements (`list`: a 1-d
    /// tensor of them; else a 0-d tensor).
    Fixed {
        dtype: DlDtype,
        width: usize,
        list: bool,
    },
    Bool,
    /// Strings or bytes, nulls allowed.
    Text,
    /// Dictionary-encoded: integer keys into each chunk's values.
    Dict {
        key_bytes: usize,
        unsigned: bool,
        values: Box<Kind>,
    },
    /// A variable-length list of fixed-width values.
    List {
        dtype: DlDtype,
        large: bool,
    },
}

fn unsupported(name: &str, dt: &DataType) -> PyErr {
    Class::Config.err(format!(
        "TableDataset: column '{name}' has Arrow type {dt}, which it cannot turn into \
         tensors; cast it, or leave it out with columns="
    ))
}

fn kind_of(name: &str, dt: &DataType) -> PyResult<Kind> {
    if let Some(dtype) = fixed_dtype(dt) {
        return Ok(Kind::Fixed {
            dtype,
            width: 1,
            list: false,
        });
    }
    Ok(match dt {
        DataType::Boolean => Kind::Bool,
        t if is_text(t) => Kind::Text,
        DataType::FixedSizeList(field, n) => match fixed_dtype(field.data_type()) {
            Some(dtype) => Kind::Fixed {
                dtype,
                width: *n as usize,
                list: true,
            },
            None => return Err(unsupported(name, dt)),
        },
        DataType::List(field) | DataType::LargeList(field) => {
            match fixed_dtype(field.data_type()) {
                Some(dtype) => Kind::List {
                    dtype,
                    large: matches!(dt, DataType::LargeList(_)),
                },
                None => return Err(unsupported(name, dt)),
            }
        }
        DataType::Dictionary(key, value) => {
            let Some(k) = fixed_dtype(key).filter(|k| k.code != FLOAT) else {
                return Err(unsupported(name, dt));
            };
            let values = kind_of(name, value)?;
            if !matches!(values, Kind::Fixed { .. } | Kind::Text | Kind::Bool) {
                return Err(unsupported(name, dt));
            }
            Kind::Dict {
                key_bytes: k.itemsize(),
                unsigned: k.code == UINT,
                values: Box::new(values),
            }
        }
        _ => return Err(unsupported(name, dt)),
    })
}

/// The bytes of `rows` fixed-width rows of `data` (its own offset applied),
/// `width` elements of `itemsize` bytes each.
fn fixed_bytes(data: &ArrayData, itemsize: usize, width: usize) -> &[u8] {
    let (values, first) = if width > 1 || matches!(data.data_type(), DataType::FixedSizeList(..)) {
        let child = &data.child_data()[0];
        (child, child.offset() + data.offset() * width)
    } else {
        (data, data.offset())
    };
    let buf = values.buffers()[0].as_slice();
    &buf[first * itemsize..(first + data.len() * width) * itemsize]
}

struct Column {
    name: String,
    kind: Kind,
    chunks: Vec<ArrayRef>,
    /// `chunks`' data, kept so the slices read from it live as long.
    datas: Vec<ArrayData>,
    /// A list column's values per chunk (what its offsets index into).
    list_values: Vec<ArrayData>,
    /// The row where each chunk starts, and the column's length last.
    starts: Vec<usize>,
}

/// Refuses a damaged chunk (a file that pyarrow's quick check passes can
/// still hold one): buffer sizes (arrow's cheap `validate`), and offsets that
/// stay inside their values, so no later read goes out of bounds. UTF-8 is
/// checked per value read; view types, rare, are checked in full.
fn check_chunk(name: &str, c: &ArrayRef) -> PyResult<()> {
    let damaged = |e: String| {
        Class::Config.err(format!(
            "TableDataset: column '{name}' is damaged ({e}); pyarrow's \
             Table.validate(full=True) names the fault"
        ))
    };
    let data = c.to_data();
    data.validate().map_err(|e| damaged(e.to_string()))?;
    match c.data_type() {
        DataType::Utf8View | DataType::BinaryView => {
            data.validate_full().map_err(|e| damaged(e.to_string()))?;
        }
        DataType::Utf8 | DataType::Binary => {
            check_offsets(byte_offsets::<i32>(c)).map_err(damaged)?;
        }
        DataType::LargeUtf8 | DataType::LargeBinary => {
            check_offsets(byte_offsets::<i64>(c)).map_err(damaged)?;
        }
        DataType::List(_) => {
            let l = c.as_list::<i32>();
            let o: Vec<i64> = l.value_offsets().iter().map(|&v| i64::from(v)).collect();
            check_offsets((o, l.values().len())).map_err(damaged)?;
        }
        DataType::LargeList(_) => {
            let l = c.as_list::<i64>();
            check_offsets((l.value_offsets().to_vec(), l.values().len())).map_err(damaged)?;
        }
        DataType::Dictionary(..) => check_chunk(name, c.as_any_dictionary().values())?,
        _ => {}
    }
    Ok(())
}

/// Offsets that never decrease and stay within `len` values.
fn check_offsets((offsets, len): (Vec<i64>, usize)) -> Result<(), String> {
    if offsets.first().is_some_and(|&o| o < 0) {
        return Err("a negative offset".into());
    }
    if offsets.windows(2).any(|w| w[1] < w[0]) {
        return Err("offsets that decrease".into());
    }
    if offsets.last().is_some_and(|&o| o as u64 > len as u64) {
        return Err(format!("an offset past its {len} values"));
    }
    Ok(())
}

/// The offsets of a string or binary chunk, widened, with its value bytes.
fn byte_offsets<O: arrow_array::ArrowNativeTypeOp + Into<i64>>(c: &ArrayRef) -> (Vec<i64>, usize) {
    let d = c.to_data();
    let o: &[O] = d.buffer::<O>(0);
    let o = &o[..(d.len() + 1).min(o.len())];
    (o.iter().map(|&v| v.into()).collect(), d.buffers()[1].len())
}

impl Column {
    fn new(name: String, dt: &DataType, chunks: Vec<ArrayRef>) -> PyResult<Column> {
        // the schema's type: a table without rows still has typed columns
        let kind = kind_of(&name, dt)?;
        for c in &chunks {
            check_chunk(&name, c)?;
        }
        let nulls_ok = matches!(kind, Kind::Text)
            || matches!(&kind, Kind::Dict { values, .. } if matches!(**values, Kind::Text));
        for c in &chunks {
            let child_nulls = match &kind {
                Kind::Fixed { list: true, .. } => c.as_fixed_size_list().values().null_count(),
                Kind::List { large: false, .. } => c.as_list::<i32>().values().null_count(),
                Kind::List { large: true, .. } => c.as_list::<i64>().values().null_count(),
                _ => 0,
            };
            if (c.null_count() > 0 && !nulls_ok) || child_nulls > 0 {
                return Err(Class::Config.err(format!(
                    "TableDataset: column '{name}' has nulls ({} in a chunk of {} rows), which \
                     have no tensor value; fill them (e.g. pyarrow.compute.fill_null) or leave \
                     the column out with columns=",
                    c.null_count() + child_nulls,
                    c.len()
                )));
            }
        }
        let mut starts = vec![0];
        for c in &chunks {
            starts.push(starts.last().expect("one entry") + c.len());
        }
        let datas: Vec<ArrayData> = chunks.iter().map(|c| c.to_data()).collect();
        let list_values = match kind {
            Kind::List { .. } => datas.iter().map(|d| d.child_data()[0].clone()).collect(),
            _ => Vec::new(),
        };
        Ok(Column {
            name,
            kind,
            chunks,
            datas,
            list_values,
            starts,
        })
    }

    fn rows(&self) -> usize {
        *self.starts.last().expect("one entry")
    }

    /// The chunk holding `row` and its place there.
    fn locate(&self, row: usize) -> (usize, usize) {
        let k = self.starts.partition_point(|&s| s <= row) - 1;
        (k, row - self.starts[k])
    }

    fn fixed(&self, dtype: DlDtype, width: usize) -> Chunked<'_> {
        let slices = self
            .datas
            .iter()
            .map(|d| fixed_bytes(d, dtype.itemsize(), width))
            .collect();
        Chunked::new(slices, dtype.itemsize() * width).expect("whole rows per chunk")
    }

    /// The value bytes chunk `k` of a list column's offsets index into.
    fn list_bytes(&self, k: usize, itemsize: usize) -> &[u8] {
        let d = &self.list_values[k];
        &d.buffers()[0].as_slice()[d.offset() * itemsize..(d.offset() + d.len()) * itemsize]
    }

    fn bits(&self) -> ChunkedBits<'_> {
        let chunks = self
            .datas
            .iter()
            .map(|d| (d.buffers()[0].as_slice(), d.offset(), d.len()))
            .collect();
        ChunkedBits::new(chunks).expect("bits cover their rows")
    }
}

/// One text value of a string or binary array.
fn text<'py>(py: Python<'py>, a: &dyn Array, r: usize) -> PyResult<Bound<'py, PyAny>> {
    if a.is_null(r) {
        return Ok(py.None().into_bound(py));
    }
    Ok(match a.data_type() {
        DataType::Utf8 => {
            let s = a.as_string::<i32>();
            let o = s.value_offsets();
            utf8(py, &s.value_data()[o[r] as usize..o[r + 1] as usize])?
        }
        DataType::LargeUtf8 => {
            let s = a.as_string::<i64>();
            let o = s.value_offsets();
            utf8(py, &s.value_data()[o[r] as usize..o[r + 1] as usize])?
        }
        DataType::Utf8View => PyString::new(py, a.as_string_view().value(r)).into_any(),
        DataType::Binary => PyBytes::new(py, a.as_binary::<i32>().value(r)).into_any(),
        DataType::LargeBinary => PyBytes::new(py, a.as_binary::<i64>().value(r)).into_any(),
        DataType::BinaryView => PyBytes::new(py, a.as_binary_view().value(r)).into_any(),
        other => return Err(Class::Internal.err(format!("{other} is not text"))),
    })
}

/// A string value from its bytes: invalid UTF-8 is the `UnicodeDecodeError`
/// pyarrow raises for it, not a string built from bad bytes.
fn utf8<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(PyString::new(py, s).into_any()),
        Err(e) => Err(PyErr::from_value(
            pyo3::exceptions::PyUnicodeDecodeError::new_utf8(py, bytes, e)?.into_any(),
        )),
    }
}

/// A fresh tensor of `shape` and `dtype` filled by `fill`.
fn tensor<'py>(
    py: Python<'py>,
    shape: &[i64],
    dtype: DlDtype,
    fill: impl FnOnce(&mut [u8]) -> bool,
) -> PyResult<Bound<'py, PyAny>> {
    let t = torch(py)?;
    let torch_dtype = t
        .dtype(py, dtype)
        .ok_or_else(|| Class::Config.err(format!("torch has no dtype for {dtype:?}")))?;
    let mut out = FreshTensor::empty(t.empty.bind(py), shape, torch_dtype, dtype.itemsize())?;
    if !fill(out.bytes_mut()) {
        return Err(Class::Internal.err("a table row out of range"));
    }
    Ok(out.into_tensor())
}

const BOOL: DlDtype = DlDtype {
    code: 6,
    bits: 8,
    lanes: 1,
};

/// Rows of one column, written into a record by the worker once it exists.
struct ColumnRows {
    table: Py<ArrowTable>,
    column: usize,
    rows: Vec<i64>,
}

impl WriteRows for ColumnRows {
    fn write_rows(&self, dst: &mut [u8]) -> bool {
        self.table.get().write_leaf(self.column, &self.rows, dst)
    }
}

/// The columns of a table, ready to read by row.
#[pyclass(module = "ferroloader._core", frozen)]
pub struct ArrowTable {
    columns: Vec<Column>,
    rows: usize,
    /// Row `i` of the dataset is row `mapping[i]` of the table (a HF
    /// dataset's `select`/`shuffle` indices).
    mapping: Option<Vec<i64>>,
}

impl ArrowTable {
    /// The table rows of dataset rows `indices`; an `IndexError` for one
    /// out of range (negative indices count from the end, as in a list).
    fn table_rows(&self, indices: &[i64]) -> PyResult<Vec<i64>> {
        let n = self.len() as i64;
        indices
            .iter()
            .map(|&i| {
                let j = if i < 0 { i + n } else { i };
                if j < 0 || j >= n {
                    return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                        "index {i} is out of range for a table of {n} rows"
                    )));
                }
                Ok(match &self.mapping {
                    Some(m) => m[j as usize],
                    None => j,
                })
            })
            .collect()
    }

    fn len(&self) -> usize {
        self.mapping.as_ref().map_or(self.rows, Vec::len)
    }

    fn row_value<'py>(
        &self,
        py: Python<'py>,
        c: &Column,
        row: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (k, r) = c.locate(row);
        match &c.kind {
            Kind::Fixed { dtype, width, list } => {
                let shape: &[i64] = if *list { &[*width as i64] } else { &[] };
                if *width == 0 {
                    return tensor(py, shape, *dtype, |_| true);
                }
                let src = c.fixed(*dtype, *width);
                tensor(py, shape, *dtype, |dst| src.gather(dst, &[row as i64]))
            }
            Kind::Bool => {
                let bits = c.bits();
                tensor(py, &[], BOOL, |dst| bits.gather(dst, &[row as i64]))
            }
            Kind::Text => text(py, c.chunks[k].as_ref(), r),
            Kind::Dict { values, .. } => {
                let d = c.chunks[k].as_any_dictionary();
                let key = self.key(c, k, r)?;
                let vals = d.values();
                match &**values {
                    Kind::Text => text(py, vals.as_ref(), key),
                    other => {
                        let one =
                            Column::new(c.name.clone(), vals.data_type(), vec![vals.clone()])?;
                        debug_assert!(matches!(other, Kind::Fixed { .. } | Kind::Bool));
                        self.row_value(py, &one, key)
                    }
                }
            }
            Kind::List { dtype, large } => {
                let (start, end) = list_range(&c.chunks[k], *large, r);
                let values = c.list_bytes(k, dtype.itemsize());
                let bytes = &values[start * dtype.itemsize()..end * dtype.itemsize()];
                tensor(py, &[(end - start) as i64], *dtype, |dst| {
                    dst.copy_from_slice(bytes);
                    true
                })
            }
        }
    }

    /// Dictionary key of row `r` of chunk `k`, checked against its values.
    fn key(&self, c: &Column, k: usize, r: usize) -> PyResult<usize> {
        let Kind::Dict {
            key_bytes,
            unsigned,
            ..
        } = &c.kind
        else {
            return Err(Class::Internal.err("not a dictionary"));
        };
        let d = c.chunks[k].as_any_dictionary();
        let keys = d.keys().to_data();
        let bytes = fixed_bytes(&keys, *key_bytes, 1);
        let key = read_key(&bytes[r * key_bytes..(r + 1) * key_bytes], *unsigned)
            .and_then(|k| usize::try_from(k).ok())
            .filter(|&k| k < d.values().len())
            .ok_or_else(|| {
                Class::Protocol.err(format!("column '{}': a bad dictionary key", c.name))
            })?;
        Ok(key)
    }

    /// The batch of column `c` for table rows `rows`: a tensor (or a
    /// deferred leaf in a worker) for numbers, a list for text.
    fn gather_column<'py>(
        slf: &Bound<'py, Self>,
        c_index: usize,
        rows: &[i64],
        sink: Sink,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let c = &me.columns[c_index];
        let fixed_shape = |width: usize, list: bool| {
            let mut shape = vec![rows.len() as i64];
            if list {
                shape.push(width as i64);
            }
            shape
        };
        let leaf = |dtype: DlDtype, shape: Vec<i64>| -> PyResult<Option<Bound<'py, PyAny>>> {
            if sink != Sink::Deferred {
                return Ok(None);
            }
            let pending = PendingLeaf {
                dtype,
                shape,
                data: Pending::Column(Box::new(ColumnRows {
                    table: slf.clone().unbind(),
                    column: c_index,
                    rows: rows.to_vec(),
                })),
            };
            Ok(Some(Bound::new(py, pending)?.into_any()))
        };
        match &c.kind {
            Kind::Fixed { dtype, width, list } => {
                let shape = fixed_shape(*width, *list);
                if *width == 0 {
                    // `(B, 0)`: no bytes to read
                    return tensor(py, &shape, *dtype, |_| true);
                }
                if let Some(l) = leaf(*dtype, shape.clone())? {
                    return Ok(l);
                }
                let src = c.fixed(*dtype, *width);
                tensor(py, &shape, *dtype, |dst| src.gather(dst, rows))
            }
            Kind::Bool => {
                if let Some(l) = leaf(BOOL, vec![rows.len() as i64])? {
                    return Ok(l);
                }
                let bits = c.bits();
                tensor(py, &[rows.len() as i64], BOOL, |dst| bits.gather(dst, rows))
            }
            Kind::Dict { values, .. } if matches!(**values, Kind::Fixed { .. } | Kind::Bool) => {
                // decoded rows, stacked as default_collate stacks them
                let items = rows
                    .iter()
                    .map(|&r| me.row_value(py, c, r as usize))
                    .collect::<PyResult<Vec<_>>>()?;
                torch(py)?
                    .stack
                    .bind(py)
                    .call1((PyList::new(py, items)?, 0))
            }
            Kind::Text | Kind::Dict { .. } => {
                let items = rows
                    .iter()
                    .map(|&r| me.row_value(py, c, r as usize))
                    .collect::<PyResult<Vec<_>>>()?;
                // a list with None where a row is null, wherever the null
                // falls (default_collate over rows decides by the first
                // value, and raises when that one is null: a shuffled run
                // would pass or fail by chance)
                Ok(PyList::new(py, items)?.into_any())
            }
            Kind::List { dtype, large } => {
                let mut width = None;
                let mut same = true;
                for &r in rows {
                    let (k, i) = c.locate(r as usize);
                    let (s, e) = list_range(&c.chunks[k], *large, i);
                    same &= *width.get_or_insert(e - s) == e - s;
                }
                if !same {
                    // torch's own error for rows of unequal length
                    let items = rows
                        .iter()
                        .map(|&r| me.row_value(py, c, r as usize))
                        .collect::<PyResult<Vec<_>>>()?;
                    return torch(py)?
                        .stack
                        .bind(py)
                        .call1((PyList::new(py, items)?, 0));
                }
                let w = width.unwrap_or(0);
                let shape = vec![rows.len() as i64, w as i64];
                if let Some(l) = leaf(*dtype, shape.clone())? {
                    return Ok(l);
                }
                tensor(py, &shape, *dtype, |dst| {
                    me.write_lists(c, *dtype, *large, rows, dst);
                    true
                })
            }
        }
    }

    /// Rows of a list column of equal length `dst.len() / rows.len()` elements.
    fn write_lists(&self, c: &Column, dtype: DlDtype, large: bool, rows: &[i64], dst: &mut [u8]) {
        let each = dst.len().checked_div(rows.len()).unwrap_or(0);
        for (out, &r) in dst.chunks_exact_mut(each.max(1)).zip(rows) {
            let (k, i) = c.locate(r as usize);
            let (s, e) = list_range(&c.chunks[k], large, i);
            let values = c.list_bytes(k, dtype.itemsize());
            out.copy_from_slice(&values[s * dtype.itemsize()..e * dtype.itemsize()]);
        }
    }

    /// Writes a deferred leaf (see `gather_column`) into `dst` in a worker.
    pub fn write_leaf(&self, column: usize, rows: &[i64], dst: &mut [u8]) -> bool {
        let Some(c) = self.columns.get(column) else {
            return false;
        };
        match &c.kind {
            Kind::Fixed { width: 0, .. } => true,
            Kind::Fixed { dtype, width, .. } => c.fixed(*dtype, *width).gather(dst, rows),
            Kind::Bool => c.bits().gather(dst, rows),
            Kind::List { dtype, large } => {
                self.write_lists(c, *dtype, *large, rows, dst);
                true
            }
            Kind::Text | Kind::Dict { .. } => false,
        }
    }
}

/// Element range of row `r` of a list chunk (its offsets applied).
fn list_range(a: &ArrayRef, large: bool, r: usize) -> (usize, usize) {
    if large {
        let l = a.as_list::<i64>();
        let o = l.value_offsets();
        (o[r] as usize, o[r + 1] as usize)
    } else {
        let l = a.as_list::<i32>();
        let o = l.value_offsets();
        (o[r] as usize, o[r + 1] as usize)
    }
}

#[pymethods]
impl ArrowTable {
    /// Imports `source`'s columns `names` (all, in order, when `None`):
    /// anything with `__arrow_c_stream__` (a table or a stream of record
    /// batches) or `__arrow_c_array__` (one record batch). `mapping`: row
    /// `i` of the dataset is table row `mapping[i]`.
    #[new]
    #[pyo3(signature = (source, names=None, mapping=None))]
    fn new(
        source: &Bound<'_, PyAny>,
        names: Option<Vec<String>>,
        mapping: Option<Vec<i64>>,
    ) -> PyResult<Self> {
        let py = source.py();
        let (schema, batches): (arrow_schema::SchemaRef, Vec<ArrayRef>) = if source
            .hasattr(pyo3::intern!(py, "__arrow_c_stream__"))?
        {
            let capsule = source.call_method0(pyo3::intern!(py, "__arrow_c_stream__"))?;
            let reader = import_arrow_stream(capsule.cast::<PyCapsule>()?)?;
            let schema = arrow_array::RecordBatchReader::schema(&reader);
            let mut batches = Vec::new();
            for b in reader {
                let b = b.map_err(|e| {
                    pyo3::exceptions::PyValueError::new_err(format!("Arrow stream: {e}"))
                })?;
                batches.push(std::sync::Arc::new(arrow_array::StructArray::from(b)) as ArrayRef);
            }
            (schema, batches)
        } else if source.hasattr(pyo3::intern!(py, "__arrow_c_array__"))? {
            let pair = source.call_method0(pyo3::intern!(py, "__arrow_c_array__"))?;
            let pair = pair.cast::<PyTuple>()?;
            let array = import_arrow_array(
                pair.get_item(0)?.cast::<PyCapsule>()?,
                pair.get_item(1)?.cast::<PyCapsule>()?,
            )?;
            let DataType::Struct(fields) = array.data_type().clone() else {
                return Err(Class::Config.err(
                    "TableDataset: __arrow_c_array__ gave a non-struct array; a table \
                         or record batch is needed",
                ));
            };
            (
                std::sync::Arc::new(arrow_schema::Schema::new(fields)),
                vec![array],
            )
        } else {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "TableDataset needs an Arrow table (an object with __arrow_c_stream__ or \
                     __arrow_c_array__: pyarrow, pandas >= 2.2, polars, DuckDB), a path to an \
                     Arrow IPC file, or a datasets.Dataset; got {}",
                source.get_type().name()?
            )));
        };
        let all: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let names = names.unwrap_or_else(|| all.clone());
        let mut columns = Vec::with_capacity(names.len());
        for name in names {
            if all.iter().filter(|n| **n == name).count() > 1 {
                // a row is a dict by column name: two columns cannot share one
                return Err(Class::Config.err(format!(
                    "TableDataset: the table has more than one column named '{name}'; rename \
                     them, or leave them out with columns="
                )));
            }
            let Some(i) = all.iter().position(|n| *n == name) else {
                let have: Vec<String> = all.iter().map(|n| format!("'{n}'")).collect();
                return Err(pyo3::exceptions::PyKeyError::new_err(format!(
                    "TableDataset: no column '{name}'; the table has [{}]",
                    have.join(", ")
                )));
            };
            let chunks = batches
                .iter()
                .map(|b| b.as_struct().column(i).clone())
                .filter(|c| !c.is_empty())
                .collect();
            columns.push(Column::new(name, schema.field(i).data_type(), chunks)?);
        }
        let rows = batches.iter().map(|b| b.len()).sum();
        for c in &columns {
            debug_assert_eq!(c.rows(), rows);
        }
        if let Some(m) = &mapping {
            if let Some(&bad) = m.iter().find(|&&j| j < 0 || j as usize >= rows) {
                return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                    "TableDataset: the indices mapping names row {bad} of a {rows}-row table"
                )));
            }
        }
        Ok(ArrowTable {
            columns,
            rows,
            mapping,
        })
    }

    fn __len__(&self) -> usize {
        self.len()
    }

    #[getter]
    fn names(&self) -> Vec<String> {
        self.columns.iter().map(|c| c.name.clone()).collect()
    }

    /// Row `i` as a dict of column name to value.
    fn row<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyDict>> {
        super::error::guard("TableDataset's row", || self.row_dict(py, i))
    }

    /// Rows `indices` gathered into a batch: what `default_collate` of the
    /// rows gives.
    fn gather<'py>(slf: &Bound<'py, Self>, indices: Vec<i64>) -> PyResult<Bound<'py, PyDict>> {
        super::error::guard("TableDataset's gather", || {
            gather(slf, &indices, Sink::InProcess)
        })
    }

    fn __traverse__(&self, _visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        Ok(())
    }
}

impl ArrowTable {
    fn row_dict<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyDict>> {
        let r = self.table_rows(&[i])?[0] as usize;
        let out = PyDict::new(py);
        for c in &self.columns {
            out.set_item(&c.name, self.row_value(py, c, r)?)?;
        }
        Ok(out)
    }
}

/// Rows `indices` of the dataset gathered into a batch dict (leaves
/// deferred into the record in a worker).
pub fn gather<'py>(
    slf: &Bound<'py, ArrowTable>,
    indices: &[i64],
    sink: Sink,
) -> PyResult<Bound<'py, PyDict>> {
    let py = slf.py();
    let rows = slf.get().table_rows(indices)?;
    let out = PyDict::new(py);
    for (i, c) in slf.get().columns.iter().enumerate() {
        out.set_item(&c.name, ArrowTable::gather_column(slf, i, &rows, sink)?)?;
    }
    Ok(out)
}
