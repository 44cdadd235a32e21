//! The single-process loader iterator: `_SingleProcessDataLoaderIter` with
//! index generation, fetch and default collate in one native `__next__`.

use pyo3::exceptions::PyUserWarning;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyType};

use super::collate::Collator;
use super::ffi::{DlView, FreshTensor};
use super::sampler::{BatchSamplerIter, SamplerIter};
use super::torch::{torch, Torch};
use crate::collate::gather_rows;

/// Where the next batch's indices (or samples) come from.
enum Source {
    /// A native `BatchSampler`.
    Batches(Py<BatchSamplerIter>),
    /// A native sampler without batching (`batch_size=None`).
    Indices(Py<SamplerIter>),
    /// Any Python iterator of batches or indices.
    Python(Py<PyAny>),
    /// An `IterableDataset` replica's iterator.
    Iterable { iter: Py<PyAny>, ended: bool },
}

#[pyclass(module = "ferroloader._core")]
pub struct SingleProcessIter {
    source: Source,
    dataset: Py<PyAny>,
    /// `dataset.__getitems__`, when the dataset defines a truthy one.
    getitems: Option<Py<PyAny>>,
    /// The tensors of a `TensorDataset` the engine may gather from directly.
    tensors: Option<Vec<Py<PyAny>>>,
    auto_collation: bool,
    batch_size: usize,
    drop_last: bool,
    /// `None`: torch's default collate, run natively.
    collate_fn: Option<Py<PyAny>>,
    /// `(pin_memory_fn, device)` when batches are pinned.
    pin: Option<(Py<PyAny>, Py<PyAny>)>,
    index_sampler: Py<PyAny>,
    len_called: Option<usize>,
    num_yielded: usize,
}

#[pymethods]
impl SingleProcessIter {
    #[new]
    #[pyo3(signature = (source, dataset, *, iterable, getitems, tensors, auto_collation, batch_size, drop_last, collate_fn, pin, index_sampler, len_called))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        source: &Bound<'_, PyAny>,
        dataset: Py<PyAny>,
        iterable: bool,
        getitems: Option<Py<PyAny>>,
        tensors: Option<Vec<Py<PyAny>>>,
        auto_collation: bool,
        batch_size: usize,
        drop_last: bool,
        collate_fn: Option<Py<PyAny>>,
        pin: Option<(Py<PyAny>, Py<PyAny>)>,
        index_sampler: Py<PyAny>,
        len_called: Option<usize>,
    ) -> PyResult<Self> {
        let py = source.py();
        let source = if iterable {
            Source::Iterable {
                iter: source.clone().unbind(),
                ended: false,
            }
        } else if let Ok(b) = source.cast::<BatchSamplerIter>() {
            Source::Batches(b.clone().unbind())
        } else if let Ok(s) = source.cast::<SamplerIter>() {
            Source::Indices(s.clone().unbind())
        } else {
            Source::Python(source.clone().unbind())
        };
        let t = torch(py)?;
        let collate_fn = match collate_fn {
            Some(f) if t.default_collates.iter().any(|d| d.is(&f)) => None,
            other => other,
        };
        Ok(SingleProcessIter {
            source,
            dataset,
            getitems,
            tensors,
            auto_collation,
            batch_size,
            drop_last,
            collate_fn,
            pin,
            index_sampler,
            len_called,
            num_yielded: 0,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.index_sampler.bind(py).len()
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(mut data) = self.next_data(py)? else {
            return Ok(None);
        };
        if let Some((pin_fn, device)) = &self.pin {
            data = pin_fn.bind(py).call1((data, device))?;
        }
        self.num_yielded += 1;
        if let (Source::Iterable { .. }, Some(reported)) = (&self.source, self.len_called) {
            if self.num_yielded > reported {
                let msg = format!(
                    "Length of IterableDataset {} was reported to be {reported}(when accessing len(dataloader)), but {} samples have been fetched. ",
                    self.dataset.bind(py).str()?,
                    self.num_yielded
                );
                let category = py.get_type::<PyUserWarning>();
                PyErr::warn(py, &category, &std::ffi::CString::new(msg)?, 2)?;
            }
        }
        Ok(Some(data))
    }

    fn __getstate__(&self) -> PyResult<()> {
        Err(pyo3::exceptions::PyNotImplementedError::new_err(
            "SingleProcessIter cannot be pickled",
        ))
    }
}

impl SingleProcessIter {
    fn next_data<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if let Source::Iterable { iter, ended } = &mut self.source {
            if *ended {
                return Ok(None);
            }
            let it = iter.bind(py);
            if !self.auto_collation {
                return match next(it)? {
                    Some(sample) => self.collate(py, sample).map(Some),
                    None => Ok(None),
                };
            }
            let samples = PyList::empty(py);
            while samples.len() < self.batch_size {
                match next(it)? {
                    Some(s) => samples.append(s)?,
                    None => {
                        *ended = true;
                        break;
                    }
                }
            }
            if samples.is_empty() || (self.drop_last && samples.len() < self.batch_size) {
                return Ok(None);
            }
            return self.collate(py, samples.into_any()).map(Some);
        }

        if !self.auto_collation {
            let index = match &self.source {
                Source::Indices(s) => match s.bind(py).borrow_mut().__next__()? {
                    Some(i) => i.into_pyobject(py)?.into_any(),
                    None => return Ok(None),
                },
                Source::Python(it) => match next(it.bind(py))? {
                    Some(i) => i,
                    None => return Ok(None),
                },
                _ => unreachable!("batched sources only with auto-collation"),
            };
            let sample = self.dataset.bind(py).get_item(index)?;
            return self.collate(py, sample).map(Some);
        }

        let samples = match &self.source {
            Source::Batches(b) => {
                let mut b = b.bind(py).borrow_mut();
                if let Some(indices) = b.next_native()? {
                    if let Some(batch) = self.gather(py, indices)? {
                        return Ok(Some(batch));
                    }
                    self.fetch(py, PyList::new(py, indices)?.into_any())?
                } else if b.is_native_batches() {
                    return Ok(None);
                } else {
                    match b.__next__(py)? {
                        Some(list) => self.fetch(py, list.into_any())?,
                        None => return Ok(None),
                    }
                }
            }
            Source::Python(it) => match next(it.bind(py))? {
                Some(indices) => self.fetch(py, indices)?,
                None => return Ok(None),
            },
            _ => unreachable!("sources handled above"),
        };
        self.collate(py, samples).map(Some)
    }

    /// `_MapDatasetFetcher.fetch` before collation.
    fn fetch<'py>(
        &self,
        py: Python<'py>,
        indices: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(getitems) = &self.getitems {
            return getitems.bind(py).call1((indices,));
        }
        let ds = self.dataset.bind(py);
        let out = PyList::empty(py);
        for idx in indices.try_iter()? {
            out.append(ds.get_item(idx?)?)?;
        }
        Ok(out.into_any())
    }

    fn collate<'py>(
        &self,
        py: Python<'py>,
        data: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match &self.collate_fn {
            None => Collator::default(py)?.collate(&data),
            Some(f) => f.bind(py).call1((data,)),
        }
    }

    /// A `TensorDataset` batch under the default collate: each tensor's rows
    /// gathered straight into the batch tensor, giving what
    /// `default_collate([ds[i] for i in indices])` gives. `None` when any
    /// precondition fails; the caller then takes the general path.
    fn gather<'py>(&self, py: Python<'py>, indices: &[i64]) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(tensors) = &self.tensors else {
            return Ok(None);
        };
        if self.collate_fn.is_some() || self.getitems.is_some() || indices.is_empty() {
            return Ok(None);
        }
        let t = torch(py)?;
        if !default_map_collates_tuples_of_tensors(py, t)? {
            return Ok(None);
        }
        let out = PyList::empty(py);
        for tensor in tensors {
            let tensor = tensor.bind(py);
            if !tensor.get_type().is(t.tensor_type.bind(py)) {
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
            let row_elems: i64 = shape[1..].iter().product();
            let row_bytes = view.dtype().itemsize() * row_elems as usize;
            let mut out_shape = shape.to_vec();
            out_shape[0] = indices.len() as i64;
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

fn next<'py>(it: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let it = it.cast::<pyo3::types::PyIterator>()?;
    it.clone().next().transpose()
}
