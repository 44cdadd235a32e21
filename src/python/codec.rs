//! A collated batch in and out of an arena record.
//!
//! Worker: the batch's structure is encoded (natively for plain containers
//! and scalars, by pickle for other objects) with every
//! leaf the engine can place in shared memory (deferred native leaves,
//! CPU tensors, numeric numpy arrays) taken out and numbered; the record is then
//! laid out (`protocol::layout_record`), allocated once, and each leaf is
//! written straight into it.
//!
//! Main: the structure is rebuilt, and leaf `i` becomes
//! a tensor (or array) over the record's memory through DLPack; each
//! holds a share of the record, which is released when the last one dies.

use std::cell::RefCell;
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::collate::{Pending, PendingLeaf};
use super::ffi::{export_capsule, DlDtype, DlView};
use super::torch::torch;
use crate::collate::{gather_rows, stack_into};
use crate::ring::{ArenaReader, ArenaWriter, RecordHandle, RecordRef};
use crate::scheduler::protocol::{layout_record, parse_record, LeafKind};

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
    let Ok(capsule) = obj.call_method0(pyo3::intern!(obj.py(), "__dlpack__")) else {
        return Ok(None);
    };
    let Some(view) = DlView::open(capsule) else {
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

fn limit_error(e: crate::ring::ArenaError) -> PyErr {
    PyRuntimeError::new_err(format!(
        "{e} (FERROLOADER_SHM_LIMIT is the loader's total, split evenly across its workers)"
    ))
}

/// How long a worker at its memory limit waits for the main process to
/// release records (batches in flight, tensors being freed) before failing.
const LIMIT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Records at least this large count against [`RecordBudget`]; smaller ones
/// cost too little memory to be worth any wait.
const BUDGETED_RECORD: usize = 1 << 20;

/// How long a worker over its record budget waits for the main process to
/// release its oldest batch before concluding the training loop keeps
/// batches, and growing instead.
const BUDGET_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

/// Keeps a worker's resident arena at what torch keeps in flight.
///
/// Without it a worker's arena settles at `prefetch_factor + 1` large
/// records (its queued batches plus the one the training loop still holds)
/// and, summed over workers, that is one batch more than torch's peak. A
/// worker with `cap` large records live waits briefly for the loop to drop
/// its oldest batch, which happens as soon as it takes the next one. If the
/// loop keeps batches (`list(loader)`, gradient accumulation) the wait times
/// out once and the worker never waits again: its arena has grown, and
/// waiting would save no memory, only time.
pub struct RecordBudget {
    pub cap: usize,
    holding: bool,
}

impl RecordBudget {
    /// `prefetch_factor` records, but never fewer than two: with one, a
    /// worker could not write its next batch while the loop holds the last.
    pub fn new(prefetch_factor: usize) -> Self {
        RecordBudget {
            cap: prefetch_factor.max(2),
            holding: false,
        }
    }

    fn wait_for_room(&mut self, arena: &mut ArenaWriter, len: usize) {
        if len < BUDGETED_RECORD {
            return;
        }
        if self.holding {
            return;
        }
        arena.reclaim();
        let deadline = std::time::Instant::now() + BUDGET_GRACE;
        while arena.live_records() >= self.cap {
            if std::time::Instant::now() >= deadline {
                self.holding = true;
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
            arena.reclaim();
        }
    }
}

fn alloc_record(
    arena: &mut ArenaWriter,
    budget: &mut RecordBudget,
    len: usize,
) -> PyResult<RecordRef> {
    budget.wait_for_room(arena, len);
    let deadline = std::time::Instant::now() + LIMIT_GRACE;
    loop {
        match arena.alloc(len) {
            Ok(r) => return Ok(r),
            Err(crate::ring::ArenaError::LimitExceeded { .. })
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) => return Err(limit_error(e)),
        }
    }
}

/// Encodes `batch` into a new record of `arena` and publishes it.
pub fn encode_batch(
    py: Python<'_>,
    batch: &Bound<'_, PyAny>,
    arena: &mut ArenaWriter,
    budget: &mut RecordBudget,
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
        out: Vec::new(),
    };
    enc.encode(batch, 0)?;
    let pickle = enc.out;
    let leaves = collector.borrow().leaves.take();
    let layout = layout_record(
        pickle.len(),
        leaves
            .iter()
            .map(|c| (c.dtype, c.kind, c.shape.clone()))
            .collect(),
    );
    let record = py.detach(|| alloc_record(arena, budget, layout.total))?;
    let written = (|| -> PyResult<()> {
        let payload = arena.payload_mut(record);
        payload[..layout.header.len()].copy_from_slice(&layout.header);
        payload[layout.pickle_offset..layout.pickle_offset + pickle.len()].copy_from_slice(&pickle);
        for (c, leaf) in leaves.iter().zip(&layout.leaves) {
            let range = leaf.offset as usize..leaf.offset as usize + leaf.nbytes();
            write_leaf(py, c, arena, record, range)?;
        }
        Ok(())
    })();
    match written {
        Ok(()) => {
            arena.publish(record);
            Ok(record)
        }
        Err(e) => {
            arena.abandon(record);
            Err(e)
        }
    }
}

fn write_leaf(
    py: Python<'_>,
    c: &Collected,
    arena: &mut ArenaWriter,
    record: RecordRef,
    range: std::ops::Range<usize>,
) -> PyResult<()> {
    match &c.data {
        CollectedData::Pending(p) => match &p.get().data {
            Pending::Bytes(b) => {
                arena.payload_mut(record)[range].copy_from_slice(b);
                Ok(())
            }
            Pending::Arrays(arrays) => {
                write_arrays(py, arrays, &mut arena.payload_mut(record)[range])
            }
            Pending::Rows { source, indices } => {
                let t = torch(py)?;
                let capsule = t.to_dlpack.bind(py).call1((source.bind(py),))?;
                let view = DlView::open(capsule).ok_or_else(|| {
                    PyRuntimeError::new_err("TensorDataset tensor is not exportable")
                })?;
                let src = view.contiguous_bytes().ok_or_else(|| {
                    PyRuntimeError::new_err("TensorDataset tensor is not contiguous")
                })?;
                let rows = view.shape()[0] as usize;
                let row_bytes = src.len().checked_div(rows).unwrap_or(0);
                let dst = &mut arena.payload_mut(record)[range];
                if !gather_rows(dst, src, rows, row_bytes, indices) {
                    return Err(PyValueError::new_err("index out of range in TensorDataset"));
                }
                Ok(())
            }
            Pending::Stack(batch) => {
                let out = ring_view(py, c, arena, record, range)?;
                let t = torch(py)?;
                let kwargs = PyDict::new(py);
                kwargs.set_item("out", &out)?;
                t.stack.bind(py).call((batch.bind(py), 0), Some(&kwargs))?;
                Ok(())
            }
        },
        CollectedData::Copy(src) => copy_tensor(py, c, src.bind(py), arena, record, range),
        CollectedData::Array(a) => write_arrays(
            py,
            std::slice::from_ref(a),
            &mut arena.payload_mut(record)[range],
        ),
    }
}

fn write_arrays(py: Python<'_>, arrays: &[Py<PyAny>], dst: &mut [u8]) -> PyResult<()> {
    let mut views = Vec::with_capacity(arrays.len());
    for a in arrays {
        let capsule = a.bind(py).call_method0(pyo3::intern!(py, "__dlpack__"))?;
        views.push(
            DlView::open(capsule)
                .ok_or_else(|| PyRuntimeError::new_err("array is not exportable"))?,
        );
    }
    let mut parts = Vec::with_capacity(views.len());
    for v in &views {
        parts.push(
            v.contiguous_bytes()
                .ok_or_else(|| PyRuntimeError::new_err("array is not contiguous"))?,
        );
    }
    stack_into(dst, &parts);
    Ok(())
}

fn copy_tensor(
    py: Python<'_>,
    c: &Collected,
    src: &Bound<'_, PyAny>,
    arena: &mut ArenaWriter,
    record: RecordRef,
    range: std::ops::Range<usize>,
) -> PyResult<()> {
    let out = ring_view(py, c, arena, record, range)?;
    out.call_method1(pyo3::intern!(py, "copy_"), (src,))?;
    Ok(())
}

/// A worker-side tensor over part of an unpublished record, for torch to
/// write into; dropped before the record is published.
fn ring_view<'py>(
    py: Python<'py>,
    c: &Collected,
    arena: &mut ArenaWriter,
    record: RecordRef,
    range: std::ops::Range<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let ptr = arena.payload_mut(record)[range].as_ptr();
    let capsule = export_capsule(py, ptr, &c.shape, c.dtype, Box::new(()))?;
    torch(py)?.from_dlpack.bind(py).call1((capsule,))
}

/// Rebuilds leaves over a record in the main process.
#[pyclass(module = "ferroloader._core")]
struct LeafLoader {
    record: Arc<RecordHandle>,
    leaves: Vec<crate::scheduler::protocol::Leaf>,
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
            .ok_or_else(|| PyRuntimeError::new_err("DLPack capsule already consumed"))
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (super::ffi::DL_CPU, 0)
    }
}

/// Loads the batch in `record`; its leaves share the record.
pub fn decode_batch<'py>(
    py: Python<'py>,
    reader: &ArenaReader,
    record: RecordRef,
) -> PyResult<Bound<'py, PyAny>> {
    let handle = reader.open(record).ok_or_else(|| {
        PyRuntimeError::new_err("ferroloader: batch record outside the worker's arena")
    })?;
    let parsed =
        parse_record(handle.bytes()).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    let record = Arc::new(handle);
    let mut dec = TreeDecoder {
        py,
        record: &record,
        pos: parsed.pickle.start,
        end: parsed.pickle.end,
        leaves: &parsed.leaves,
        loader: None,
    };
    dec.decode(0)
}

/// Tags of the structure encoding (see [`TreeEncoder`]).
mod tag {
    pub const NONE: u8 = 0;
    pub const TRUE: u8 = 1;
    pub const FALSE: u8 = 2;
    pub const INT: u8 = 3;
    pub const FLOAT: u8 = 4;
    pub const STR: u8 = 5;
    pub const BYTES: u8 = 6;
    pub const LIST: u8 = 7;
    pub const TUPLE: u8 = 8;
    pub const DICT: u8 = 9;
    pub const LEAF: u8 = 10;
    pub const PICKLED: u8 = 11;
}

/// Deeper structures are pickled whole (pickle copes with cycles).
const MAX_DEPTH: usize = 64;

/// The batch's structure in a compact form the main process rebuilds
/// without pickle: exact `dict`, `list`, `tuple`, `str`, `bytes`, `int`,
/// `float`, `bool`, `None` and leaves; any other object (namedtuples, user
/// types) is pickled, its own tensors and arrays still taken out as leaves.
struct TreeEncoder<'a, 'py> {
    py: Python<'py>,
    collector: &'a Bound<'py, LeafCollector>,
    out: Vec<u8>,
}

impl<'py> TreeEncoder<'_, 'py> {
    fn len(&mut self, n: usize) {
        self.out.extend_from_slice(&(n as u32).to_le_bytes());
    }

    fn encode(&mut self, obj: &Bound<'py, PyAny>, depth: usize) -> PyResult<()> {
        use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyString, PyTuple};
        if depth > MAX_DEPTH {
            return self.pickled(obj);
        }
        if obj.is_none() {
            self.out.push(tag::NONE);
        } else if obj.is_exact_instance_of::<PyBool>() {
            self.out.push(if obj.is_truthy()? {
                tag::TRUE
            } else {
                tag::FALSE
            });
        } else if obj.is_exact_instance_of::<PyInt>() {
            match obj.extract::<i64>() {
                Ok(v) => {
                    self.out.push(tag::INT);
                    self.out.extend_from_slice(&v.to_le_bytes());
                }
                Err(_) => return self.pickled(obj),
            }
        } else if let Ok(f) = obj.cast_exact::<PyFloat>() {
            self.out.push(tag::FLOAT);
            self.out.extend_from_slice(&f.value().to_le_bytes());
        } else if let Ok(st) = obj.cast_exact::<PyString>() {
            match st.to_cow() {
                Ok(text) => {
                    self.out.push(tag::STR);
                    self.len(text.len());
                    self.out.extend_from_slice(text.as_bytes());
                }
                Err(_) => return self.pickled(obj),
            }
        } else if let Ok(b) = obj.cast_exact::<PyBytes>() {
            self.out.push(tag::BYTES);
            self.len(b.as_bytes().len());
            self.out.extend_from_slice(b.as_bytes());
        } else if let Ok(l) = obj.cast_exact::<PyList>() {
            self.out.push(tag::LIST);
            self.len(l.len());
            for item in l.iter() {
                self.encode(&item, depth + 1)?;
            }
        } else if let Ok(t) = obj.cast_exact::<PyTuple>() {
            self.out.push(tag::TUPLE);
            self.len(t.len());
            for item in t.iter() {
                self.encode(&item, depth + 1)?;
            }
        } else if let Ok(d) = obj.cast_exact::<PyDict>() {
            self.out.push(tag::DICT);
            self.len(d.len());
            for (k, v) in d.iter() {
                self.encode(&k, depth + 1)?;
                self.encode(&v, depth + 1)?;
            }
        } else if let Some(id) = self.collector.borrow().__call__(self.py, obj)? {
            self.out.push(tag::LEAF);
            self.len(id);
        } else {
            return self.pickled(obj);
        }
        Ok(())
    }

    fn pickled(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<()> {
        let py = self.py;
        let t = torch(py)?;
        let buf = t.bytes_io.bind(py).call0()?;
        let pickler = t.pickler.bind(py).call1((&buf, 5))?;
        pickler.setattr(pyo3::intern!(py, "persistent_id"), self.collector)?;
        pickler.call_method1(pyo3::intern!(py, "dump"), (obj,))?;
        let data: Vec<u8> = buf.call_method0(pyo3::intern!(py, "getvalue"))?.extract()?;
        self.out.push(tag::PICKLED);
        self.len(data.len());
        self.out.extend_from_slice(&data);
        Ok(())
    }
}

struct TreeDecoder<'a, 'py> {
    py: Python<'py>,
    record: &'a Arc<RecordHandle>,
    pos: usize,
    end: usize,
    leaves: &'a [crate::scheduler::protocol::Leaf],
    loader: Option<Bound<'py, LeafLoader>>,
}

fn corrupt() -> PyErr {
    PyRuntimeError::new_err("ferroloader: malformed batch record")
}

impl<'py> TreeDecoder<'_, 'py> {
    fn take(&mut self, n: usize) -> PyResult<&[u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.end)
            .ok_or_else(corrupt)?;
        let bytes = &self.record.bytes()[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn len(&mut self) -> PyResult<usize> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize)
    }

    fn decode(&mut self, depth: usize) -> PyResult<Bound<'py, PyAny>> {
        use pyo3::types::{PyList, PyString, PyTuple};
        let py = self.py;
        if depth > MAX_DEPTH + 1 {
            return Err(corrupt());
        }
        let tag = self.take(1)?[0];
        Ok(match tag {
            tag::NONE => py.None().into_bound(py),
            tag::TRUE => pyo3::types::PyBool::new(py, true).to_owned().into_any(),
            tag::FALSE => pyo3::types::PyBool::new(py, false).to_owned().into_any(),
            tag::INT => {
                let v = i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes"));
                v.into_pyobject(py)?.into_any()
            }
            tag::FLOAT => {
                let v = f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes"));
                v.into_pyobject(py)?.into_any()
            }
            tag::STR => {
                let n = self.len()?;
                let text = std::str::from_utf8(self.take(n)?).map_err(|_| corrupt())?;
                PyString::new(py, text).into_any()
            }
            tag::BYTES => {
                let n = self.len()?;
                PyBytes::new(py, self.take(n)?).into_any()
            }
            tag::LIST => {
                let n = self.len()?;
                let list = PyList::empty(py);
                for _ in 0..n {
                    list.append(self.decode(depth + 1)?)?;
                }
                list.into_any()
            }
            tag::TUPLE => {
                let n = self.len()?;
                let mut items = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    items.push(self.decode(depth + 1)?);
                }
                PyTuple::new(py, items)?.into_any()
            }
            tag::DICT => {
                let n = self.len()?;
                let dict = PyDict::new(py);
                for _ in 0..n {
                    let k = self.decode(depth + 1)?;
                    let v = self.decode(depth + 1)?;
                    dict.set_item(k, v)?;
                }
                dict.into_any()
            }
            tag::LEAF => {
                let id = self.len()?;
                make_leaf(py, self.record, self.leaves, id)?
            }
            tag::PICKLED => {
                let n = self.len()?;
                let data = PyBytes::new(py, self.take(n)?);
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
                let unpickler = t.unpickler.bind(py).call1((buf,))?;
                unpickler.setattr(pyo3::intern!(py, "persistent_load"), loader)?;
                unpickler.call_method0(pyo3::intern!(py, "load"))?
            }
            _ => return Err(corrupt()),
        })
    }
}

/// Leaf `id` of a record: a tensor (or numpy array) over the record's
/// memory, holding a share of it.
fn make_leaf<'py>(
    py: Python<'py>,
    record: &Arc<RecordHandle>,
    leaves: &[crate::scheduler::protocol::Leaf],
    id: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let leaf = leaves
        .get(id)
        .ok_or_else(|| PyRuntimeError::new_err("ferroloader: bad leaf id in a batch record"))?;
    let ptr = record.as_ptr().wrapping_add(leaf.offset as usize);
    let owner: Box<dyn Send> = Box::new(Arc::clone(record));
    let capsule = export_capsule(py, ptr, &leaf.shape, leaf.dtype, owner)?;
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
