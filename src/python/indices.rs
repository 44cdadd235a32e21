//! The epoch's stream of indices, as both iterators draw it: a native
//! `BatchSampler`, a native sampler without batching, or any Python
//! iterator (a user's sampler or batch sampler), recorded when the sampler
//! saves its own state.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use super::fetch::next;
use super::sampler::{BatchSamplerIter, SamplerIter};

pub enum Indices {
    Batches(Py<BatchSamplerIter>),
    Single(Py<SamplerIter>),
    Python(Py<PyAny>),
    Recorded(Py<Recorder>),
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
            Indices::Recorded(r) => visit.call(r),
        }
    }

    pub fn of(source: &Bound<'_, PyAny>) -> Self {
        if let Ok(b) = source.cast::<BatchSamplerIter>() {
            Indices::Batches(b.clone().unbind())
        } else if let Ok(s) = source.cast::<SamplerIter>() {
            Indices::Single(s.clone().unbind())
        } else if let Ok(r) = source.cast::<Recorder>() {
            Indices::Recorded(r.clone().unbind())
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
                Ok(b.next_list(py)?.map(|list| Item::Object(list.into_any())))
            }
            Indices::Single(s) => Ok(s.bind(py).borrow_mut().next_one()?.map(Item::Index)),
            Indices::Python(it) => Ok(next(it.bind(py))?.map(Item::Object)),
            Indices::Recorded(r) => Ok(r.get().draw(py)?.map(Item::Object)),
        }
    }
}

/// The index stream of a sampler that saves its own state (torchdata's
/// `Stateful`): the sampler's state says where the epoch's draws stand,
/// so the batches drawn but not yet handed over at a snapshot must travel
/// in the state. The engine draws from the sampler through this and keeps
/// the recent batches by sequence number; no Python code sits in between.
#[pyclass(frozen, module = "ferroloader._core")]
pub struct Recorder {
    source: Py<PyAny>,
    book: Mutex<Book>,
}

struct Book {
    /// Re-sent first on a resume (the batches in flight at the snapshot),
    /// not counted again.
    front: VecDeque<Py<PyAny>>,
    /// `(sequence number, batch)`, the most recent `keep`.
    recent: VecDeque<(u64, Py<PyAny>)>,
    keep: usize,
    /// The sequence number of the next batch drawn from the sampler.
    count: u64,
    /// Whether the sampler has been drawn from (its state then is its own).
    pulled: bool,
}

impl Recorder {
    /// Never held across a call into Python: another thread may take the
    /// GIL meanwhile and ask for the book (`state_dict()`).
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn draw<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        {
            let mut book = self.book();
            if let Some(first) = book.front.pop_front() {
                return Ok(Some(first.into_bound(py)));
            }
            book.pulled = true;
        }
        let Some(item) = next(self.source.bind(py))? else {
            return Ok(None);
        };
        let mut book = self.book();
        let seq = book.count;
        book.count += 1;
        if book.recent.len() == book.keep {
            book.recent.pop_front();
        }
        if book.keep > 0 {
            book.recent.push_back((seq, item.clone().unbind()));
        }
        Ok(Some(item))
    }
}

#[pymethods]
impl Recorder {
    /// Draws from `source`, keeping the last `keep` batches; a resumed
    /// epoch starts counting at `count` and re-sends `kept`'s batches
    /// (`(sequence number, batch)`) first.
    #[new]
    #[pyo3(signature = (source, keep, count=0, kept=Vec::new()))]
    fn new(
        py: Python<'_>,
        source: Py<PyAny>,
        keep: usize,
        count: u64,
        kept: Vec<(u64, Py<PyAny>)>,
    ) -> Self {
        let front = kept.iter().map(|(_, b)| b.clone_ref(py)).collect();
        let mut recent: VecDeque<_> = kept.into();
        while recent.len() > keep {
            recent.pop_front();
        }
        let book = Book {
            front,
            recent,
            keep,
            count,
            pulled: false,
        };
        Recorder {
            source,
            book: Mutex::new(book),
        }
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.draw(py)
    }

    /// Whether the sampler has been drawn from since this was made.
    #[getter]
    fn pulled(&self) -> bool {
        self.book().pulled
    }

    /// The batches with sequence numbers `seqs`, `None` for one no longer
    /// kept.
    fn batches(&self, py: Python<'_>, seqs: Vec<u64>) -> Vec<Option<Py<PyAny>>> {
        let book = self.book();
        seqs.iter()
            .map(|s| {
                book.recent
                    .iter()
                    .find(|(seq, _)| seq == s)
                    .map(|(_, b)| b.clone_ref(py))
            })
            .collect()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.source)?;
        // a traversal runs with the GIL and no other thread inside `draw`'s
        // critical sections (they call no Python), so the lock is free
        if let Ok(book) = self.book.try_lock() {
            for b in &book.front {
                visit.call(b)?;
            }
            for (_, b) in &book.recent {
                visit.call(b)?;
            }
        }
        Ok(())
    }
}

/// An epoch's index stream resumed at a snapshot taken `drawn` batches in,
/// with the batches numbered `pending` then in flight: those handed over
/// are drawn and dropped (natively for the built-in samplers, without
/// building them), those in flight are drawn again and come first. Returns
/// the stream and the sequence numbers it re-sends, in order.
#[pyfunction]
pub fn resume_stream<'py>(
    source: Bound<'py, PyAny>,
    drawn: u64,
    pending: Vec<u64>,
) -> PyResult<(Bound<'py, PyAny>, Vec<u64>)> {
    let py = source.py();
    let first = pending.iter().copied().min().unwrap_or(drawn);
    let builtin =
        source.is_instance_of::<BatchSamplerIter>() || source.is_instance_of::<SamplerIter>();
    let skipped: u64 = if builtin {
        source
            .call_method1(pyo3::intern!(py, "_skip"), (first,))?
            .extract()?
    } else {
        let mut n = 0;
        while n < first && next(&source)?.is_some() {
            n += 1;
        }
        n
    };
    if skipped < first {
        return Err(past_end(drawn, skipped));
    }
    let wanted: HashSet<u64> = pending.into_iter().collect();
    let (mut seqs, mut kept) = (Vec::new(), Vec::new());
    for seq in first..drawn {
        // (a bare StopIteration here would end iter() as an empty epoch)
        let Some(item) = next(&source)? else {
            return Err(past_end(drawn, seq));
        };
        if wanted.contains(&seq) {
            seqs.push(seq);
            kept.push(item);
        }
    }
    if kept.is_empty() {
        return Ok((source, seqs));
    }
    let prepends = match source.cast::<BatchSamplerIter>() {
        Ok(b) => b.borrow().is_native_batches(),
        Err(_) => source.is_instance_of::<SamplerIter>(),
    };
    if prepends {
        let kept = pyo3::types::PyList::new(py, kept)?;
        source.call_method1(pyo3::intern!(py, "_prepend"), (kept,))?;
        return Ok((source, seqs));
    }
    // any other stream: the re-drawn batches first, then the stream's own
    let pairs = seqs
        .iter()
        .copied()
        .zip(kept.into_iter().map(Bound::unbind));
    let front = Recorder::new(py, source.unbind(), 0, 0, pairs.collect());
    Ok((Bound::new(py, front)?.into_any(), seqs))
}

/// A loaded state past the end of this loader's epoch.
fn past_end(drawn: u64, batches: u64) -> PyErr {
    super::error::Class::Config.err(format!(
        "iter(): the state given to load_state_dict() is {drawn} batches into the epoch, \
         but this loader's epoch has {batches}"
    ))
}
