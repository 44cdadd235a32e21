//! A collated batch in and out of an arena record.
//!
//! Worker: the batch's structure is encoded as a tree (`crate::record::tree`:
//! natively for plain containers and scalars, by pickle for other objects)
//! with every leaf the engine can place in shared memory (deferred native
//! leaves, CPU tensors, numeric numpy arrays) taken out and numbered; the
//! record is then laid out (`RecordLayout`), allocated once from the
//! worker's `Records`, and each leaf is written straight into it.
//!
//! Main: the structure is rebuilt, and leaf `i` becomes
//! a tensor (or array) over the record's memory through DLPack; each
//! holds a share of the record, which is released when the last one dies.

use std::cell::RefCell;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::collate::{Pending, PendingLeaf};
use super::error::Class;
use super::ffi::{record_leaf_capsule, with_tensor_over, DlView};
use super::torch::torch;
use crate::collate::{gather_rows, stack_into};
use crate::pin::Held;
use crate::record::tree::MAX_DEPTH;
use crate::record::{
    DecodeError, DlDtype, Leaf, LeafKind, ParsedRecord, RecordLayout, Token, TreeReader, TreeWriter,
};
use crate::ring::RecordRef;
use crate::worker::Records;

struct Collected {
    dtype: DlDtype,
    kind: LeafKind,
    shape: Vec<i64>,
    data: CollectedData,
}

enum CollectedData {
    Pending(Py<PendingLeaf>),
    Copy(Py<PyAny>),
    Array(Py<PyAny>),
}

/// The `persistent_id` of the worker's pickler.
#[pyclass(module = "ferroloader._core", unsendable)]
struct LeafCollector {
    leaves: RefCell<Vec<Collected>>,
}

#[pymethods]
impl LeafCollector {
    fn __call__(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        let collected = if let Ok(p) = obj.cast::<PendingLeaf>() {
            let leaf = p.get();
            Collected {
                dtype: leaf.dtype,
                kind: LeafKind::Tensor,
                shape: leaf.shape.clone(),
                data: CollectedData::Pending(p.clone().unbind()),
            }
        } else {
            let t = torch(py)?;
            let ty = obj.get_type();
            if ty.is(t.tensor_type.bind(py)) {
                match tensor_leaf(py, obj)? {
                    Some(c) => c,
                    None => return Ok(None),
                }
            } else if ty.is(t.ndarray_type.bind(py)) {
                match array_leaf(obj)? {
                    Some(c) => c,
                    None => return Ok(None),
                }
            } else {
                return Ok(None);
            }
        };
        let mut leaves = self.leaves.borrow_mut();
        leaves.push(collected);
        Ok(Some(leaves.len() - 1))
    }
}

/// A tensor made by user code: copied into the record if it is a plain,
/// contiguous CPU tensor that is its whole storage and needs no autograd
/// history. Anything else pickles as torch's own pickling does (keeping
/// strides, storage offset and storage).
fn tensor_leaf(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Option<Collected>> {
    let t = torch(py)?;
    if obj
        .getattr(pyo3::intern!(py, "requires_grad"))?
        .is_truthy()?
        || !obj.getattr(pyo3::intern!(py, "layout"))?.is(&t.strided)
        || !obj
            .call_method0(pyo3::intern!(py, "is_contiguous"))?
            .is_truthy()?
        || obj.getattr(pyo3::intern!(py, "is_nested"))?.is_truthy()?
        || !obj
            .getattr(pyo3::intern!(py, "device"))?
            .getattr(pyo3::intern!(py, "type"))?
            .eq("cpu")?
    {
        return Ok(None);
    }
    let Some(dtype) = t.dl_dtype(&obj.getattr(pyo3::intern!(py, "dtype"))?) else {
        return Ok(None);
    };
    // Only a tensor that is its whole storage: torch's pickling keeps a
    // view's storage offset and the storage around it.
    let offset: usize = obj
        .call_method0(pyo3::intern!(py, "storage_offset"))?
        .extract()?;
    let nbytes: usize = obj.getattr(pyo3::intern!(py, "nbytes"))?.extract()?;
    let storage_bytes: usize = obj
        .call_method0(pyo3::intern!(py, "untyped_storage"))?
        .call_method0(pyo3::intern!(py, "nbytes"))?
        .extract()?;
    if offset != 0 || nbytes != storage_bytes {
        return Ok(None);
    }
    let shape: Vec<i64> = obj.getattr(pyo3::intern!(py, "shape"))?.extract()?;
    Ok(Some(Collected {
        dtype,
        kind: LeafKind::Tensor,
        shape,
        data: CollectedData::Copy(obj.clone().unbind()),
    }))
}

/// A numpy array made by user code: copied if C-contiguous and numeric.
fn array_leaf(obj: &Bound<'_, PyAny>) -> PyResult<Option<Collected>> {
    let Some(view) = DlView::of_array(obj) else {
        return Ok(None);
    };
    if view.contiguous_bytes().is_none() || torch(obj.py())?.dtype(obj.py(), view.dtype()).is_none()
    {
        return Ok(None);
    }
    Ok(Some(Collected {
        dtype: view.dtype(),
        kind: LeafKind::Ndarray,
        shape: view.shape().to_vec(),
        data: CollectedData::Array(obj.clone().unbind()),
    }))
}

/// Encodes `batch` into a new record of `records` and publishes it.
pub fn encode_batch(
    py: Python<'_>,
    batch: &Bound<'_, PyAny>,
    records: &mut Records,
) -> PyResult<RecordRef> {
    let collector = Bound::new(
        py,
        LeafCollector {
            leaves: RefCell::new(Vec::new()),
        },
    )?;
    let mut enc = TreeEncoder {
        py,
        collector: &collector,
        out: TreeWriter::new(),
    };
    enc.encode(batch, 0)?;
    let tree = enc.out.into_bytes();
    let leaves = collector.borrow().leaves.take();
    let layout = RecordLayout::new(
        tree.len(),
        leaves
            .iter()
            .map(|c| (c.dtype, c.kind, c.shape.clone()))
            .collect(),
    );
    let record = py.detach(|| records.alloc(layout.total))?;
    let written = (|| -> PyResult<()> {
        layout.write_head(records.payload_mut(record), &tree);
        for (c, leaf) in leaves.iter().zip(&layout.leaves) {
            write_leaf(py, c, records, record, leaf.range())?;
        }
        Ok(())
    })();
    match written {
        Ok(()) => {
            records.publish(record);
            Ok(record)
        }
        Err(e) => {
            records.abandon(record);
            Err(e)
        }
    }
}

fn write_leaf(
    py: Python<'_>,
    c: &Collected,
    records: &mut Records,
    record: RecordRef,
    range: std::ops::Range<usize>,
) -> PyResult<()> {
    let dst = &mut records.payload_mut(record)[range];
    let from_dlpack = torch(py)?.from_dlpack.bind(py);
    match &c.data {
        CollectedData::Pending(p) => match &p.get().data {
            Pending::Bytes(b) => {
                without_gil(py, b.len(), || dst.copy_from_slice(b));
                Ok(())
            }
            Pending::Arrays(arrays) => write_arrays(py, arrays, dst),
            Pending::Rows { source, indices } => {
                let t = torch(py)?;
                let capsule = t.to_dlpack.bind(py).call1((source.bind(py),))?;
                let view = DlView::open(capsule)
                    .ok_or_else(|| Class::Internal.err("TensorDataset tensor is not exportable"))?;
                let src = view
                    .contiguous_bytes()
                    .ok_or_else(|| Class::Internal.err("TensorDataset tensor is not contiguous"))?;
                let rows = view.shape()[0] as usize;
                let row_bytes = src.len().checked_div(rows).unwrap_or(0);
                let n = dst.len();
                if !without_gil(py, n, || gather_rows(dst, src, rows, row_bytes, indices)) {
                    // `Fetcher::gather` checked the indices against these rows.
                    return Err(Class::Internal.err("TensorDataset changed size mid-batch"));
                }
                Ok(())
            }
            Pending::Column(rows) => {
                if !rows.write_rows(dst) {
                    return Err(Class::Internal.err("a table column changed under a batch"));
                }
                Ok(())
            }
            Pending::Stack(batch) => with_tensor_over(from_dlpack, dst, &c.shape, c.dtype, |out| {
                let kwargs = PyDict::new(py);
                kwargs.set_item("out", out)?;
                torch(py)?
                    .stack
                    .bind(py)
                    .call((batch.bind(py), 0), Some(&kwargs))?;
                Ok(())
            }),
        },
        CollectedData::Copy(src) => with_tensor_over(from_dlpack, dst, &c.shape, c.dtype, |out| {
            out.call_method1(pyo3::intern!(py, "copy_"), (src.bind(py),))?;
            Ok(())
        }),
        CollectedData::Array(a) => write_arrays(py, std::slice::from_ref(a), dst),
    }
}

fn write_arrays(py: Python<'_>, arrays: &[Py<PyAny>], dst: &mut [u8]) -> PyResult<()> {
    let mut views = Vec::with_capacity(arrays.len());
    for a in arrays {
        views.push(
            DlView::of_array(a.bind(py))
                .ok_or_else(|| Class::Internal.err("array is not exportable"))?,
        );
    }
    let mut parts = Vec::with_capacity(views.len());
    for v in &views {
        parts.push(
            v.contiguous_bytes()
                .ok_or_else(|| Class::Internal.err("array is not contiguous"))?,
        );
    }
    without_gil(py, dst.len(), || stack_into(dst, &parts));
    Ok(())
}

/// Copies of at least this many bytes run without the GIL: other worker
/// threads (`worker_method="thread"`) and the training loop go on meanwhile.
/// Smaller ones keep it (taking it back can wait for another thread).
const RELEASE_GIL_BYTES: usize = 256 << 10;

/// `copy()`, which moves `bytes` bytes, without the GIL when that is large.
fn without_gil<R: Send>(py: Python<'_>, bytes: usize, copy: impl FnOnce() -> R + Send) -> R {
    if bytes >= RELEASE_GIL_BYTES {
        py.detach(copy)
    } else {
        copy()
    }
}

/// Rebuilds leaves over a record in the main process.
#[pyclass(module = "ferroloader._core")]
struct LeafLoader {
    record: Arc<Held>,
    leaves: Vec<Leaf>,
}

#[pymethods]
impl LeafLoader {
    fn __call__<'py>(&self, py: Python<'py>, pid: usize) -> PyResult<Bound<'py, PyAny>> {
        make_leaf(py, &self.record, &self.leaves, pid)
    }
}

/// Hands one capsule to `numpy.from_dlpack`.
#[pyclass(module = "ferroloader._core")]
struct DlpackHolder {
    capsule: Option<Py<PyAny>>,
}

#[pymethods]
impl DlpackHolder {
    #[pyo3(signature = (*_args, **_kwargs))]
    fn __dlpack__(
        &mut self,
        _args: &Bound<'_, pyo3::types::PyTuple>,
        _kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        self.capsule
            .take()
            .ok_or_else(|| Class::Internal.err("DLPack capsule already consumed"))
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (super::ffi::DL_CPU, 0)
    }
}

/// Loads the batch in an opened record; its leaves share the record.
pub fn decode_batch<'py>(py: Python<'py>, handle: Held) -> PyResult<Bound<'py, PyAny>> {
    let parsed = ParsedRecord::parse(handle.bytes()).map_err(crate::Error::from)?;
    let record = Arc::new(handle);
    let mut dec = TreeDecoder {
        py,
        record: &record,
        tree: TreeReader::new(&record.bytes()[parsed.tree.clone()]),
        leaves: &parsed.leaves,
        loader: None,
    };
    dec.decode(0)
}

/// Builds the tree of a batch: exact `dict`, `list`, `tuple`, `str`,
/// `bytes`, `int`, `float`, `bool`, `None` natively, leaves by number, any
/// other object (namedtuples, user types) pickled with its own tensors and
/// arrays still taken out as leaves.
struct TreeEncoder<'a, 'py> {
    py: Python<'py>,
    collector: &'a Bound<'py, LeafCollector>,
    out: TreeWriter,
}

impl<'py> TreeEncoder<'_, 'py> {
    fn encode(&mut self, obj: &Bound<'py, PyAny>, depth: usize) -> PyResult<()> {
        use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyString, PyTuple};
        if depth > MAX_DEPTH {
            return self.pickled(obj);
        }
        if obj.is_none() {
            self.out.put(Token::None);
        } else if obj.is_exact_instance_of::<PyBool>() {
            self.out.put(Token::Bool(obj.is_truthy()?));
        } else if obj.is_exact_instance_of::<PyInt>() {
            match obj.extract::<i64>() {
                Ok(v) => self.out.put(Token::Int(v)),
                Err(_) => return self.pickled(obj),
            }
        } else if let Ok(f) = obj.cast_exact::<PyFloat>() {
            self.out.put(Token::Float(f.value()));
        } else if let Ok(st) = obj.cast_exact::<PyString>() {
            match st.to_cow() {
                Ok(text) => self.out.put(Token::Str(fits(&*text, "a str")?)),
                Err(_) => return self.pickled(obj),
            }
        } else if let Ok(b) = obj.cast_exact::<PyBytes>() {
            self.out.put(Token::Bytes(fits(b.as_bytes(), "a bytes")?));
        } else if let Ok(l) = obj.cast_exact::<PyList>() {
            self.out.put(Token::List(l.len()));
            for item in l.iter() {
                self.encode(&item, depth + 1)?;
            }
        } else if let Ok(t) = obj.cast_exact::<PyTuple>() {
            self.out.put(Token::Tuple(t.len()));
            for item in t.iter() {
                self.encode(&item, depth + 1)?;
            }
        } else if let Ok(d) = obj.cast_exact::<PyDict>() {
            self.out.put(Token::Dict(d.len()));
            for (k, v) in d.iter() {
                self.encode(&k, depth + 1)?;
                self.encode(&v, depth + 1)?;
            }
        } else if let Some(id) = self.collector.borrow().__call__(self.py, obj)? {
            self.out.put(Token::Leaf(id));
        } else {
            return self.pickled(obj);
        }
        Ok(())
    }

    fn pickled(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<()> {
        let py = self.py;
        let t = torch(py)?;
        let buf = t.bytes_io.bind(py).call0()?;
        let pickler = t.pickler.bind(py).call1((&buf, 5, self.collector))?;
        pickler.call_method1(pyo3::intern!(py, "dump"), (obj,))?;
        let data: Vec<u8> = buf.call_method0(pyo3::intern!(py, "getvalue"))?.extract()?;
        self.out
            .put(Token::Pickled(fits(&data, "a pickled element")?));
        Ok(())
    }
}

/// `v` if its length fits the record's 32-bit lengths: an element of 4 GiB
/// or more in a batch is a clear error, not a length cut short.
fn fits<'v, T: AsRef<[u8]> + ?Sized>(v: &'v T, what: &str) -> PyResult<&'v T> {
    let n = v.as_ref().len();
    if u32::try_from(n).is_err() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{what} of {n} bytes in a batch: elements that cross from a worker to the \
             training process are under 4 GiB each (tensors and arrays of any size are not \
             limited); return it as a tensor or numpy array, or split it"
        )));
    }
    Ok(v)
}

/// Rebuilds a batch from its tree, leaves as tensors over the record.
struct TreeDecoder<'a, 'py> {
    py: Python<'py>,
    record: &'a Arc<Held>,
    tree: TreeReader<'a>,
    leaves: &'a [Leaf],
    loader: Option<Bound<'py, LeafLoader>>,
}

impl<'py> TreeDecoder<'_, 'py> {
    fn decode(&mut self, depth: usize) -> PyResult<Bound<'py, PyAny>> {
        use pyo3::types::{PyList, PyString, PyTuple};
        let py = self.py;
        if depth > MAX_DEPTH + 1 {
            return Err(crate::Error::from(DecodeError("tree depth")).into());
        }
        let token = self.tree.next_token().map_err(crate::Error::from)?;
        Ok(match token {
            Token::None => py.None().into_bound(py),
            Token::Bool(b) => pyo3::types::PyBool::new(py, b).to_owned().into_any(),
            Token::Int(v) => v.into_pyobject(py)?.into_any(),
            Token::Float(v) => v.into_pyobject(py)?.into_any(),
            Token::Str(s) => PyString::new(py, s).into_any(),
            Token::Bytes(b) => PyBytes::new(py, b).into_any(),
            Token::List(n) => {
                let list = PyList::empty(py);
                for _ in 0..n {
                    list.append(self.decode(depth + 1)?)?;
                }
                list.into_any()
            }
            Token::Tuple(n) => {
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.decode(depth + 1)?);
                }
                PyTuple::new(py, items)?.into_any()
            }
            Token::Dict(n) => {
                let dict = PyDict::new(py);
                for _ in 0..n {
                    let k = self.decode(depth + 1)?;
                    let v = self.decode(depth + 1)?;
                    dict.set_item(k, v)?;
                }
                dict.into_any()
            }
            Token::Leaf(id) => make_leaf(py, self.record, self.leaves, id)?,
            Token::Pickled(data) => {
                let data = PyBytes::new(py, data);
                let loader = match &self.loader {
                    Some(l) => l.clone(),
                    None => {
                        let l = Bound::new(
                            py,
                            LeafLoader {
                                record: Arc::clone(self.record),
                                leaves: self.leaves.to_vec(),
                            },
                        )?;
                        self.loader = Some(l.clone());
                        l
                    }
                };
                let t = torch(py)?;
                let buf = t.bytes_io.bind(py).call1((data,))?;
                let unpickler = t.unpickler.bind(py).call1((buf, loader))?;
                unpickler.call_method0(pyo3::intern!(py, "load"))?
            }
        })
    }
}

/// Leaf `id` of a record: a tensor (or numpy array) over the record's
/// memory, holding a share of it.
fn make_leaf<'py>(
    py: Python<'py>,
    record: &Arc<Held>,
    leaves: &[Leaf],
    id: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let leaf = leaves
        .get(id)
        .ok_or_else(|| crate::Error::from(DecodeError("leaf number")))?;
    let capsule = record_leaf_capsule(py, record, leaf)?;
    let t = torch(py)?;
    match leaf.kind {
        LeafKind::Tensor => t.from_dlpack.bind(py).call1((capsule,)),
        LeafKind::Ndarray => {
            let holder = Bound::new(
                py,
                DlpackHolder {
                    capsule: Some(capsule.unbind()),
                },
            )?;
            t.np_from_dlpack.bind(py).call1((holder,))
        }
    }
}
