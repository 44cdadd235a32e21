//! `_MapDatasetFetcher` / `_IterableDatasetFetcher` plus collation: what
//! one task turns into, in the main process or in a worker.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyType};
use pyo3::{PyTraverseError, PyVisit};

use super::collate::{Collator, Pending, PendingLeaf, Sink};
use super::ffi::{DlView, FreshTensor};
use super::table::{gather as gather_table, ArrowTable};
use super::torch::{torch, Torch};
use crate::collate::gather_rows;

pub struct Fetcher {
    pub dataset: Py<PyAny>,
    /// `dataset.__getitems__`, when the dataset defines a truthy one.
    getitems: Option<Py<PyAny>>,
    /// The tensors of a `TensorDataset` the engine may gather from directly.
    tensors: Option<Vec<Py<PyAny>>>,
    /// `None`: torch's default collate, run natively.
    collate_fn: Option<Py<PyAny>>,
    sink: Sink,
    /// A `TableDataset`'s columns and its batch `transform`: batches are
    /// gathered from the table, not made of rows.
    table: Option<(Py<ArrowTable>, Option<Py<PyAny>>)>,
    /// Nanoseconds spent collating since the last `take_collate_ns` (the
    /// rest of a fetch call is the dataset's).
    collate_ns: std::sync::atomic::AtomicU64,
}

/// How Python hands a table over: `(columns, transform)`.
pub type TableArg = (Py<ArrowTable>, Option<Py<PyAny>>);

impl Fetcher {
    /// Reports the Python objects held, for the cycle collector.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.dataset)?;
        visit.call(&self.getitems)?;
        visit.call(&self.collate_fn)?;
        for t in self.tensors.iter().flatten() {
            visit.call(t)?;
        }
        if let Some((table, transform)) = &self.table {
            visit.call(table)?;
            visit.call(transform)?;
        }
        Ok(())
    }

    pub fn new(
        py: Python<'_>,
        dataset: Py<PyAny>,
        getitems: Option<Py<PyAny>>,
        tensors: Option<Vec<Py<PyAny>>>,
        collate_fn: Option<Py<PyAny>>,
        sink: Sink,
        table: Option<TableArg>,
    ) -> PyResult<Self> {
        let t = torch(py)?;
        let collate_fn = match collate_fn {
            Some(f) if t.default_collates.iter().any(|d| d.is(&f)) => None,
            other => other,
        };
        Ok(Fetcher {
            dataset,
            getitems,
            tensors,
            collate_fn,
            sink,
            table,
            collate_ns: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Collate time since the last call (stage statistics).
    pub fn take_collate_ns(&self) -> u64 {
        self.collate_ns
            .swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// A `TableDataset` batch under the default collate: gathered from the
    /// columns (deferred into the record in a worker), then the dataset's
    /// `transform`. `None` when the batch is not the table's to gather.
    fn gather_table<'py>(
        &self,
        py: Python<'py>,
        indices: &[i64],
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some((table, transform)) = &self.table else {
            return Ok(None);
        };
        if self.collate_fn.is_some() || torch(py)?.modes_active(py)? {
            return Ok(None);
        }
        let table = table.bind(py);
        Ok(Some(match transform {
            // the transform sees real tensors, so they are made first
            Some(f) => f
                .bind(py)
                .call1((gather_table(table, indices, Sink::InProcess)?,))?,
            None => gather_table(table, indices, self.sink)?.into_any(),
        }))
    }

    /// An auto-collated batch for integer indices from a native sampler.
    pub fn batch_from_ints<'py>(
        &self,
        py: Python<'py>,
        indices: &[i64],
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(batch) = self.gather(py, indices)? {
            return Ok(batch);
        }
        if let Some(batch) = self.gather_table(py, indices)? {
            return Ok(batch);
        }
        if self.getitems.is_some() {
            return self.batch_from_obj(py, PyList::new(py, indices)?.into_any());
        }
        // `[dataset[i] for i in indices]`, without building the index list.
        let ds = self.dataset.bind(py);
        let mut samples = Vec::with_capacity(indices.len());
        for &i in indices {
            samples.push(ds.get_item(i)?);
        }
        self.collate(py, PyList::new(py, samples)?.into_any())
    }

    /// An auto-collated batch for any index container (given to
    /// `__getitems__` as is, as torch does).
    pub fn batch_from_obj<'py>(
        &self,
        py: Python<'py>,
        indices: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if self.table.is_some() {
            if let Ok(ints) = indices.extract::<Vec<i64>>() {
                if let Some(batch) = self.gather_table(py, &ints)? {
                    return Ok(batch);
                }
            }
        }
        let samples = if let Some(getitems) = &self.getitems {
            getitems.bind(py).call1((indices,))?
        } else {
            let ds = self.dataset.bind(py);
            let out = PyList::empty(py);
            for idx in indices.try_iter()? {
                out.append(ds.get_item(idx?)?)?;
            }
            out.into_any()
        };
        self.collate(py, samples)
    }

    /// `batch_size=None`: one sample, through `collate_fn` (default_convert).
    pub fn sample<'py>(
        &self,
        py: Python<'py>,
        index: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sample = self.dataset.bind(py).get_item(index)?;
        self.collate(py, sample)
    }

    /// `_IterableDatasetFetcher.fetch`: `None` stands for its StopIteration.
    pub fn batch_from_iterator<'py>(
        &self,
        py: Python<'py>,
        it: &Bound<'py, PyAny>,
        batch: Option<usize>,
        drop_last: bool,
        ended: &mut bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if *ended {
            return Ok(None);
        }
        let Some(n) = batch else {
            return match next(it)? {
                Some(sample) => self.collate(py, sample).map(Some),
                None => Ok(None),
            };
        };
        let samples = PyList::empty(py);
        while samples.len() < n {
            match next(it)? {
                Some(s) => samples.append(s)?,
                None => {
                    *ended = true;
                    break;
                }
            }
        }
        if samples.is_empty() || (drop_last && samples.len() < n) {
            return Ok(None);
        }
        self.collate(py, samples.into_any()).map(Some)
    }

    /// `collate_fn(data)`, natively when it is torch's default (and then a
    /// `TableDataset`'s transform, which applies to every default-collated
    /// batch, gathered or not).
    pub fn collate<'py>(
        &self,
        py: Python<'py>,
        data: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t0 = std::time::Instant::now();
        let out = self.collate_untimed(py, data);
        self.collate_ns.fetch_add(
            crate::stats::since(t0),
            std::sync::atomic::Ordering::Relaxed,
        );
        out
    }

    fn collate_untimed<'py>(
        &self,
        py: Python<'py>,
        data: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match &self.collate_fn {
            None => match &self.table {
                // the transform sees real tensors
                Some((_, Some(transform))) => {
                    let batch = Collator::default(py, Sink::InProcess)?.collate(&data)?;
                    transform.bind(py).call1((batch,))
                }
                _ => Collator::default(py, self.sink)?.collate(&data),
            },
            Some(f) => f.bind(py).call1((data,)),
        }
    }

    /// A `TensorDataset` batch under the default collate: each tensor's rows
    /// gathered in one pass, giving what `default_collate([ds[i] for i in
    /// indices])` gives. `None` when any precondition fails; the caller then
    /// takes the general path, which raises torch's own errors.
    fn gather<'py>(&self, py: Python<'py>, indices: &[i64]) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(tensors) = &self.tensors else {
            return Ok(None);
        };
        if self.collate_fn.is_some() || self.getitems.is_some() || indices.is_empty() {
            return Ok(None);
        }
        let t = torch(py)?;
        if t.modes_active(py)? || !default_map_collates_tuples_of_tensors(py, t)? {
            return Ok(None);
        }
        let out = PyList::empty(py);
        for tensor in tensors {
            let tensor = tensor.bind(py);
            if !tensor.get_type().is(t.tensor_type.bind(py)) || !plain_data(tensor)? {
                return Ok(None);
            }
            let Ok(capsule) = t.to_dlpack.bind(py).call1((tensor,)) else {
                return Ok(None);
            };
            let Some(view) = DlView::open(capsule) else {
                return Ok(None);
            };
            let shape = view.shape();
            let (Some(&rows), Some(dtype)) = (shape.first(), t.dtype(py, view.dtype())) else {
                return Ok(None);
            };
            let Some(src) = view.contiguous_bytes() else {
                return Ok(None);
            };
            let rows = rows as usize;
            if indices.iter().any(|&i| i < 0 || i as usize >= rows) {
                return Ok(None);
            }
            let row_elems: i64 = shape[1..].iter().product();
            let row_bytes = view.dtype().itemsize() * row_elems as usize;
            let mut out_shape = shape.to_vec();
            out_shape[0] = indices.len() as i64;
            if self.sink == Sink::Deferred {
                let leaf = PendingLeaf {
                    dtype: view.dtype(),
                    shape: out_shape,
                    data: Pending::Rows {
                        source: tensor.clone().unbind(),
                        indices: indices.to_vec(),
                    },
                };
                out.append(Bound::new(py, leaf)?)?;
                continue;
            }
            let mut batch =
                FreshTensor::empty(t.empty.bind(py), &out_shape, dtype, view.dtype().itemsize())?;
            if !gather_rows(batch.bytes_mut(), src, rows, row_bytes, indices) {
                return Ok(None);
            }
            out.append(batch.into_tensor())?;
        }
        Ok(Some(out.into_any()))
    }
}

/// Whether torch's default registry would collate a tuple sample as a
/// sequence and its tensors with `collate_tensor_fn` (true unless a user
/// registered something that catches them).
fn default_map_collates_tuples_of_tensors(py: Python<'_>, t: &Torch) -> PyResult<bool> {
    let map = t.default_collate_fn_map.bind(py);
    let tensor_type = t.tensor_type.bind(py);
    let tensor_fn = map.get_item(tensor_type)?;
    if !tensor_fn.is_some_and(|f| f.is(&t.fns.tensor)) {
        return Ok(false);
    }
    let tuple_type = py.get_type::<pyo3::types::PyTuple>();
    resolves_to_nothing(map, &tuple_type)
}

fn resolves_to_nothing(map: &Bound<'_, PyDict>, ty: &Bound<'_, PyType>) -> PyResult<bool> {
    for key in map.keys() {
        if ty.is_subclass(&key)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A tensor whose values are its bytes: no autograd history to keep (a
/// stacked batch would require grad), no lazy conjugate or negative bit.
pub fn plain_data(tensor: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = tensor.py();
    Ok(!tensor
        .getattr(pyo3::intern!(py, "requires_grad"))?
        .is_truthy()?
        && !tensor
            .call_method0(pyo3::intern!(py, "is_conj"))?
            .is_truthy()?
        && !tensor
            .call_method0(pyo3::intern!(py, "is_neg"))?
            .is_truthy()?)
}

/// `next(it)`, with StopIteration as `None`.
pub fn next<'py>(it: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let it = it.cast::<pyo3::types::PyIterator>()?;
    it.clone().next().transpose()
}
