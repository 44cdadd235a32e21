//! `collate(batch, collate_fn_map=...)`, walked as torch walks it.
//!
//! At each node: exact type lookup in the registry, then `isinstance` over
//! its keys in insertion order, then containers. Where the registry resolves
//! to one of torch's default functions a native equivalent runs; any input it
//! does not cover exactly (odd dtypes, ragged shapes, subclasses, errors) is
//! handed to that very function, so results and errors are torch's own.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyTuple};

use super::ffi::{DlView, FreshTensor, DL_CPU};
use super::torch::{torch, Torch};
use crate::collate::{stack_into, write_scalars};

/// Where natively collated leaves go.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// Main process: a new tensor per leaf.
    InProcess,
    /// Worker: a [`PendingLeaf`] placeholder, written into the batch's arena
    /// record once the whole batch is laid out.
    Deferred,
}

/// One `collate` call: the registry and the keyword arguments handed to
/// registered functions, built once.
pub struct Collator<'py> {
    py: Python<'py>,
    t: &'static Torch,
    map: Option<Bound<'py, PyDict>>,
    kwargs: Option<Bound<'py, PyDict>>,
    sink: Sink,
    /// Whether the registry collates `torch.Tensor` with torch's default
    /// function (computed on first need).
    tensors_default: Option<bool>,
    /// No TorchFunctionMode is active, so native leaves build what torch's
    /// functions would (checked once per call).
    native: bool,
}

impl<'py> Collator<'py> {
    pub fn new(py: Python<'py>, map: Option<Bound<'py, PyDict>>, sink: Sink) -> PyResult<Self> {
        let t = torch(py)?;
        Ok(Collator {
            py,
            t,
            map,
            kwargs: None,
            sink,
            tensors_default: None,
            native: !t.modes_active(py)?,
        })
    }

    /// `default_collate`: torch's registry.
    pub fn default(py: Python<'py>, sink: Sink) -> PyResult<Self> {
        let t = torch(py)?;
        Self::new(py, Some(t.default_collate_fn_map.bind(py).clone()), sink)
    }

    fn kwargs(&mut self) -> PyResult<Bound<'py, PyDict>> {
        if let Some(k) = &self.kwargs {
            return Ok(k.clone());
        }
        let k = PyDict::new(self.py);
        k.set_item("collate_fn_map", &self.map)?;
        self.kwargs = Some(k.clone());
        Ok(k)
    }

    /// Calls a registered function (or torch's `collate`) on `batch`.
    fn call_registered(
        &mut self,
        f: &Bound<'py, PyAny>,
        batch: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kwargs = self.kwargs()?;
        f.call((batch,), Some(&kwargs))
    }

    fn torch_collate(&mut self, batch: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let f = self.t.torch_collate.bind(self.py).clone();
        self.call_registered(&f, batch)
    }

    /// The registry entry torch's `collate` would pick for `elem`.
    fn lookup(&self, elem: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(map) = &self.map else {
            return Ok(None);
        };
        if let Some(f) = map.get_item(elem.get_type())? {
            return Ok(Some(f));
        }
        for (key, f) in map.iter() {
            if elem.is_instance(&key)? {
                return Ok(Some(f));
            }
        }
        Ok(None)
    }

    pub fn collate(&mut self, batch: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let Some(items) = Items::of(batch) else {
            return self.torch_collate(batch);
        };
        let elem = batch.get_item(0)?;
        if let Some(f) = self.lookup(&elem)? {
            return self.apply(&f, batch, &items, &elem);
        }
        if let Ok(d) = elem.cast_exact::<PyDict>() {
            return self.collate_dict(batch, &items, d);
        }
        if elem.is_exact_instance_of::<PyList>() || elem.is_exact_instance_of::<PyTuple>() {
            return self.collate_sequence(batch, &items, &elem);
        }
        if elem.is_instance_of::<PyTuple>() && elem.hasattr(pyo3::intern!(self.py, "_fields"))? {
            return self.collate_namedtuple(&items, &elem);
        }
        self.torch_collate(batch)
    }

    fn apply(
        &mut self,
        f: &Bound<'py, PyAny>,
        batch: &Bound<'py, PyAny>,
        items: &Items<'py>,
        elem: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fns = &self.t.fns;
        let native = if !self.native && !f.is(&fns.str_) {
            None
        } else if f.is(&fns.tensor) {
            self.stack_tensors(batch, elem)?
        } else if f.is(&fns.ndarray) {
            self.stack_arrays(items)?
        } else if f.is(&fns.int) {
            self.ints(items)?
        } else if f.is(&fns.float) {
            self.floats(items)?
        } else if f.is(&fns.str_) {
            Some(batch.clone())
        } else {
            None
        };
        match native {
            Some(out) => Ok(out),
            None => self.call_registered(f, batch),
        }
    }

    /// `collate_tensor_fn` in the main process: `torch.stack(batch, 0)` for
    /// plain strided tensors (its checks raise for nested and sparse ones).
    fn stack_tensors(
        &mut self,
        batch: &Bound<'py, PyAny>,
        elem: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = self.py;
        if self.sink == Sink::InProcess {
            let plain = elem
                .getattr(pyo3::intern!(py, "layout"))?
                .is(&self.t.strided)
                && !elem.getattr(pyo3::intern!(py, "is_nested"))?.is_truthy()?;
            if !plain {
                return Ok(None);
            }
            return self.t.stack.bind(py).call1((batch, 0)).map(Some);
        }
        // Worker: torch allocates `out` with elem's dtype and shape and stacks
        // into it; the engine does the same into the arena record. One DLPack
        // export reads device, dtype and shape; it refuses nested, sparse and
        // grad-tracking tensors, which go to torch's own function.
        let Ok(capsule) = self.t.to_dlpack.bind(py).call1((elem,)) else {
            return Ok(None);
        };
        let Some(view) = DlView::open(capsule) else {
            return Ok(None);
        };
        let dtype = view.dtype();
        if view.device_type() != DL_CPU || self.t.dtype(py, dtype).is_none() {
            return Ok(None);
        }
        let mut shape: Vec<i64> = Vec::with_capacity(view.shape().len() + 1);
        shape.push(batch.len()? as i64);
        shape.extend_from_slice(view.shape());
        let leaf = PendingLeaf {
            dtype,
            shape,
            data: Pending::Stack(batch.clone().unbind()),
        };
        Ok(Some(Bound::new(py, leaf)?.into_any()))
    }

    /// Whether `collate` of a batch of plain tensors reaches torch's
    /// `collate_tensor_fn` under this registry (what `collate_numpy_array_fn`
    /// recurses into after `torch.as_tensor`).
    fn tensors_collate_by_default(&mut self) -> PyResult<bool> {
        if let Some(known) = self.tensors_default {
            return Ok(known);
        }
        let tensor_type = self.t.tensor_type.bind(self.py);
        let resolved = match &self.map {
            None => None,
            Some(map) => match map.get_item(tensor_type)? {
                Some(f) => Some(f),
                None => {
                    let mut found = None;
                    for (key, f) in map.iter() {
                        if tensor_type.is_subclass(&key)? {
                            found = Some(f);
                            break;
                        }
                    }
                    found
                }
            },
        };
        let known = resolved.is_some_and(|f| f.is(&self.t.fns.tensor));
        self.tensors_default = Some(known);
        Ok(known)
    }

    /// `collate_numpy_array_fn`: each array's bytes copied once into one
    /// tensor, when all are C-contiguous CPU arrays of one dtype and shape.
    fn stack_arrays(&mut self, items: &Items<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = self.py;
        if !self.tensors_collate_by_default()? {
            return Ok(None);
        }
        let nd = self.t.ndarray_type.bind(py);
        let mm = self.t.memmap_type.bind(py);
        let mut views = Vec::with_capacity(items.len());
        for a in items.iter() {
            let ty = a.get_type();
            if !ty.is(nd) && !ty.is(mm) {
                return Ok(None);
            }
            let Some(view) = DlView::of_array(&a) else {
                return Ok(None);
            };
            views.push(view);
        }
        let first = &views[0];
        let (dtype, shape) = (first.dtype(), first.shape().to_vec());
        if views
            .iter()
            .any(|v| v.dtype() != dtype || v.shape() != shape)
        {
            return Ok(None);
        }
        let Some(torch_dtype) = self.t.dtype(py, dtype) else {
            return Ok(None);
        };
        let mut parts = Vec::with_capacity(views.len());
        for v in &views {
            match v.contiguous_bytes() {
                Some(b) => parts.push(b),
                None => return Ok(None),
            }
        }
        let mut out_shape = Vec::with_capacity(shape.len() + 1);
        out_shape.push(views.len() as i64);
        out_shape.extend_from_slice(&shape);
        if self.sink == Sink::Deferred {
            let arrays = items.iter().map(Bound::unbind).collect();
            let leaf = PendingLeaf {
                dtype,
                shape: out_shape,
                data: Pending::Arrays(arrays),
            };
            return Ok(Some(Bound::new(py, leaf)?.into_any()));
        }
        let mut out = FreshTensor::empty(
            self.t.empty.bind(py),
            &out_shape,
            torch_dtype,
            dtype.itemsize(),
        )?;
        stack_into(out.bytes_mut(), &parts);
        Ok(Some(out.into_tensor()))
    }

    /// `collate_int_fn` (`torch.tensor(batch)`) for exact ints that fit
    /// int64, or for all-bool batches.
    fn ints(&mut self, items: &Items<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = self.py;
        let all_bool = items.iter().all(|x| x.is_exact_instance_of::<PyBool>());
        if all_bool {
            let vals: Vec<u8> = items
                .iter()
                .map(|x| x.is_truthy().map(u8::from))
                .collect::<PyResult<_>>()?;
            return self.scalar_tensor(&vals, self.t.bool_.bind(py)).map(Some);
        }
        let mut vals = Vec::with_capacity(items.len());
        for x in items.iter() {
            if !x.is_exact_instance_of::<PyInt>() {
                return Ok(None);
            }
            match x.extract::<i64>() {
                Ok(v) => vals.push(v),
                Err(_) => return Ok(None),
            }
        }
        self.scalar_tensor(&vals, self.t.int64.bind(py)).map(Some)
    }

    /// `collate_float_fn` (`torch.tensor(batch, dtype=torch.float64)`).
    fn floats(&mut self, items: &Items<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut vals = Vec::with_capacity(items.len());
        for x in items.iter() {
            match x.cast_exact::<PyFloat>() {
                Ok(f) => vals.push(f.value()),
                Err(_) => return Ok(None),
            }
        }
        self.scalar_tensor(&vals, self.t.float64.bind(self.py))
            .map(Some)
    }

    fn scalar_tensor<T: bytemuck::Pod>(
        &self,
        vals: &[T],
        dtype: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if self.sink == Sink::Deferred {
            let dl = self.t.dl_dtype(dtype).ok_or_else(|| {
                super::error::Class::Internal.err("no DLPack dtype for a scalar batch")
            })?;
            let leaf = PendingLeaf {
                dtype: dl,
                shape: vec![vals.len() as i64],
                data: Pending::Bytes(bytemuck::cast_slice(vals).to_vec()),
            };
            return Ok(Bound::new(self.py, leaf)?.into_any());
        }
        let mut out = FreshTensor::empty(
            self.t.empty.bind(self.py),
            &[vals.len() as i64],
            dtype,
            std::mem::size_of::<T>(),
        )?;
        write_scalars(out.bytes_mut(), vals);
        Ok(out.into_tensor())
    }

    /// A `dict` sample: a new dict in the first sample's key order. Missing
    /// keys, other sample types and a `TypeError` below go to torch, which
    /// raises (or retries) exactly as it does.
    fn collate_dict(
        &mut self,
        batch: &Bound<'py, PyAny>,
        items: &Items<'py>,
        elem: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        let mut dicts = Vec::with_capacity(items.len());
        for d in items.iter() {
            match d.cast_exact::<PyDict>() {
                Ok(d) => dicts.push(d.clone()),
                Err(_) => return self.torch_collate(batch),
            }
        }
        let out = PyDict::new(py);
        for key in elem.keys().iter() {
            let mut column = Vec::with_capacity(dicts.len());
            for d in &dicts {
                match d.get_item(&key)? {
                    Some(v) => column.push(v),
                    None => return self.torch_collate(batch),
                }
            }
            let column = PyList::new(py, column)?;
            match self.collate(column.as_any()) {
                Ok(v) => out.set_item(&key, v)?,
                Err(e) if e.is_instance_of::<PyTypeError>(py) => return self.torch_collate(batch),
                Err(e) => return Err(e),
            }
        }
        Ok(out.into_any())
    }

    /// A `list` or `tuple` sample: transposed, each column (a tuple, as
    /// torch's `zip` gives) collated; the result is a list either way.
    fn collate_sequence(
        &mut self,
        batch: &Bound<'py, PyAny>,
        items: &Items<'py>,
        elem: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        let is_list = elem.is_exact_instance_of::<PyList>();
        let width = elem.len()?;
        let mut rows = Vec::with_capacity(items.len());
        for s in items.iter() {
            let same_type = s.get_type().is(elem.get_type());
            if !same_type || s.len()? != width {
                return self.torch_collate(batch);
            }
            rows.push(s);
        }
        let out = PyList::empty(py);
        for i in 0..width {
            let column: Vec<Bound<'py, PyAny>> = rows
                .iter()
                .map(|r| r.get_item(i))
                .collect::<PyResult<_>>()?;
            let column = PyTuple::new(py, column)?;
            match self.collate(column.as_any()) {
                Ok(v) => out.append(v)?,
                Err(e) if is_list && e.is_instance_of::<PyTypeError>(py) => {
                    return self.torch_collate(batch)
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out.into_any())
    }

    /// A namedtuple sample: `type(elem)(*columns)`, columns cut to the
    /// shortest sample as `zip` does.
    fn collate_namedtuple(
        &mut self,
        items: &Items<'py>,
        elem: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        let mut width = usize::MAX;
        for s in items.iter() {
            width = width.min(s.len()?);
        }
        let mut fields = Vec::with_capacity(width);
        for i in 0..width {
            let column: Vec<Bound<'py, PyAny>> = items
                .iter()
                .map(|r| r.get_item(i))
                .collect::<PyResult<_>>()?;
            fields.push(self.collate(PyTuple::new(py, column)?.as_any())?);
        }
        elem.get_type().call1(PyTuple::new(py, fields)?)
    }
}

/// The samples of a batch that is a list or a tuple.
pub enum Items<'py> {
    List(Bound<'py, PyList>),
    Tuple(Bound<'py, PyTuple>),
}

impl<'py> Items<'py> {
    fn of(batch: &Bound<'py, PyAny>) -> Option<Self> {
        if let Ok(l) = batch.cast_exact::<PyList>() {
            return Some(Items::List(l.clone()));
        }
        if let Ok(t) = batch.cast_exact::<PyTuple>() {
            return Some(Items::Tuple(t.clone()));
        }
        None
    }

    fn len(&self) -> usize {
        match self {
            Items::List(l) => l.len(),
            Items::Tuple(t) => t.len(),
        }
    }

    fn iter(&self) -> Box<dyn Iterator<Item = Bound<'py, PyAny>> + '_> {
        match self {
            Items::List(l) => Box::new(l.iter()),
            Items::Tuple(t) => Box::new(t.iter()),
        }
    }
}

/// `ferroloader.collate(batch, collate_fn_map=...)`.
#[pyfunction]
#[pyo3(signature = (batch, collate_fn_map=None))]
pub fn collate<'py>(
    py: Python<'py>,
    batch: &Bound<'py, PyAny>,
    collate_fn_map: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let map = match collate_fn_map {
        None => None,
        Some(m) => match m.cast_into::<PyDict>() {
            Ok(d) => Some(d),
            Err(e) => {
                // Not a dict: torch's own collate handles whatever it is.
                let t = torch(py)?;
                let kwargs = PyDict::new(py);
                kwargs.set_item("collate_fn_map", e.into_inner())?;
                return t.torch_collate.bind(py).call((batch,), Some(&kwargs));
            }
        },
    };
    super::error::guard("collate()", || {
        Collator::new(py, map, Sink::InProcess)?.collate(batch)
    })
}

/// What a deferred leaf is made from.
pub enum Pending {
    /// Raw element bytes, already in place order (ints, floats, bools).
    Bytes(Vec<u8>),
    /// A batch of tensors for `torch.stack(batch, 0, out=...)`.
    Stack(Py<PyAny>),
    /// Contiguous CPU arrays (numpy, or a copied tensor), concatenated.
    Arrays(Vec<Py<PyAny>>),
    /// Rows of a `TensorDataset` tensor.
    Rows {
        source: Py<PyAny>,
        indices: Vec<i64>,
    },
    /// Rows of a column of a table (`TableDataset`), which writes them.
    Column(Box<dyn WriteRows>),
}

/// A leaf's source that writes its bytes itself (a table's column rows):
/// false if it no longer can (the table changed under the batch).
pub trait WriteRows: Send + Sync {
    fn write_rows(&self, dst: &mut [u8]) -> bool;
}

/// A batch leaf the worker will write into the arena record: its dtype and
/// shape are known now, its bytes are written once the record exists.
#[pyclass(module = "ferroloader._core", frozen)]
pub struct PendingLeaf {
    pub dtype: super::ffi::DlDtype,
    pub shape: Vec<i64>,
    pub data: Pending,
}
