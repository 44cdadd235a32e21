//! The epoch's stream of indices, as both iterators draw it: a native
//! `BatchSampler`, a native sampler without batching, or any Python
//! iterator (a user's sampler or batch sampler).

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use super::fetch::next;
use super::sampler::{BatchSamplerIter, SamplerIter};

pub enum Indices {
    Batches(Py<BatchSamplerIter>),
    Single(Py<SamplerIter>),
    Python(Py<PyAny>),
}

/// One draw from the stream.
pub enum Item<'py> {
    /// A batch of integer indices from a native sampler.
    Batch(Vec<i64>),
    /// One integer index (`batch_size=None`).
    Index(i64),
    /// Whatever a Python iterator yielded (a batch or a single index).
    Object(Bound<'py, PyAny>),
}

impl Indices {
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Indices::Batches(b) => visit.call(b),
            Indices::Single(s) => visit.call(s),
            Indices::Python(it) => visit.call(it),
        }
    }

    pub fn of(source: &Bound<'_, PyAny>) -> Self {
        if let Ok(b) = source.cast::<BatchSamplerIter>() {
            Indices::Batches(b.clone().unbind())
        } else if let Ok(s) = source.cast::<SamplerIter>() {
            Indices::Single(s.clone().unbind())
        } else {
            Indices::Python(source.clone().unbind())
        }
    }

    /// The next draw; `None` at the end of the epoch.
    pub fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<Item<'py>>> {
        match self {
            Indices::Batches(b) => {
                let mut b = b.bind(py).borrow_mut();
                if let Some(v) = b.next_native()? {
                    return Ok(Some(Item::Batch(v.to_vec())));
                }
                if b.is_native_batches() {
                    return Ok(None);
                }
                Ok(b.__next__(py)?.map(|list| Item::Object(list.into_any())))
            }
            Indices::Single(s) => Ok(s.bind(py).borrow_mut().__next__()?.map(Item::Index)),
            Indices::Python(it) => Ok(next(it.bind(py))?.map(Item::Object)),
        }
    }
}
