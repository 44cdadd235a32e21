//! The worker process's Python side: a [`Host`] that calls the dataset and
//! collate and encodes batches; the protocol around it is
//! `crate::worker::serve` (the lifecycle is drawn there).

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::codec::encode_batch;
use super::collate::Sink;
use super::error::Class;
use super::fetch::Fetcher;
use super::ffi::adopt_fd;
use super::torch::torch;
use crate::scheduler::protocol::TaskIndices;
use crate::worker::{serve, Blocking, Config, Host, Records, Reply};

struct PyHost<'py> {
    py: Python<'py>,
    fetcher: Fetcher,
    iterable: bool,
    auto_collation: bool,
    drop_last: bool,
    make_iter: Py<PyAny>,
    wrap_exception: Py<PyAny>,
    iterator: Option<Py<PyAny>>,
    /// `worker_init_fn` raised: the first task answers with this.
    init_exception: Option<Vec<u8>>,
    ended: bool,
    epochs: usize,
    /// Called at the start of every epoch (per-sample seeding's epoch count).
    on_epoch: Option<Py<PyAny>>,
    /// An iterable replica with state methods: returns its pickled state
    /// (sent with each batch, for snapshots).
    state_fn: Option<Py<PyAny>>,
}

impl Blocking for PyHost<'_> {
    fn blocking<R: Send>(&mut self, f: impl FnOnce() -> R + Send) -> R {
        self.py.detach(f)
    }
}

impl<'py> PyHost<'py> {
    /// The user's exception as a pickled `ExceptionWrapper`.
    fn wrap(&self, e: PyErr) -> PyResult<Vec<u8>> {
        let wrapped = self
            .wrap_exception
            .bind(self.py)
            .call1((e.into_value(self.py),))?;
        Ok(wrapped.cast_into::<PyBytes>()?.as_bytes().to_vec())
    }

    /// Fetch and collate one task. `Ok(None)`: the replica is exhausted.
    fn fetch(&mut self, indices: TaskIndices) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = self.py;
        match indices {
            TaskIndices::Ints(v) => self.fetcher.batch_from_ints(py, &v).map(Some),
            TaskIndices::Int(i) => self
                .fetcher
                .sample(py, i.into_pyobject(py)?.into_any())
                .map(Some),
            TaskIndices::Pickled(b) => {
                let obj = torch(py)?.loads.bind(py).call1((PyBytes::new(py, &b),))?;
                if self.auto_collation {
                    self.fetcher.batch_from_obj(py, obj).map(Some)
                } else {
                    self.fetcher.sample(py, obj).map(Some)
                }
            }
            TaskIndices::Iterable(n) => {
                let it = self
                    .iterator
                    .as_ref()
                    .ok_or_else(|| Class::Internal.err("no dataset iterator"))?
                    .bind(py)
                    .clone();
                let mut ended = self.ended;
                let out = self.fetcher.batch_from_iterator(
                    py,
                    &it,
                    n.map(|n| n as usize),
                    self.drop_last,
                    &mut ended,
                );
                self.ended = ended;
                out
            }
        }
    }
}

impl Host for PyHost<'_> {
    type Error = PyErr;

    fn start_epoch(&mut self) {
        let first = self.epochs == 0;
        self.epochs += 1;
        if let Some(f) = &self.on_epoch {
            if let Err(e) = f.bind(self.py).call0() {
                self.init_exception = self.wrap(e).ok();
                return;
            }
        }
        // A failed `worker_init_fn` is reported by the first task instead.
        if !self.iterable || (first && self.init_exception.is_some()) {
            return;
        }
        self.ended = false;
        match self.make_iter.bind(self.py).call0() {
            Ok(it) => self.iterator = Some(it.unbind()),
            Err(e) => self.init_exception = self.wrap(e).ok(),
        }
    }

    fn state_after_batch(&mut self) -> PyResult<Option<Vec<u8>>> {
        let Some(f) = &self.state_fn else {
            return Ok(None);
        };
        let state = f.bind(self.py).call0()?;
        Ok(Some(state.cast_into::<PyBytes>()?.as_bytes().to_vec()))
    }

    fn run(&mut self, indices: TaskIndices, records: &mut Records) -> PyResult<Reply> {
        if let Some(payload) = self.init_exception.take() {
            return Ok(Reply::Failed(payload));
        }
        let py = self.py;
        let outcome = self
            .fetch(indices)
            .and_then(|b| b.map(|b| encode_batch(py, &b, records)).transpose());
        match outcome {
            Ok(Some(record)) => Ok(Reply::Batch(record)),
            Ok(None) if self.iterable => Ok(Reply::Exhausted),
            Ok(None) => Err(Class::Internal.err("map-style fetch ended")),
            Err(e) if self.iterable && e.is_instance_of::<PyStopIteration>(py) => {
                Ok(Reply::Exhausted)
            }
            // torch's worker wraps `Exception`s only: `SystemExit`,
            // `KeyboardInterrupt` and the like end the worker, and the main
            // process reports its exit (a `RuntimeError`), as torch does.
            Err(e) if !e.is_instance_of::<pyo3::exceptions::PyException>(py) => Err(e),
            Err(e) => Ok(Reply::Failed(self.wrap(e)?)),
        }
    }
}

/// Serves tasks until the main process says stop or goes away.
#[pyfunction]
#[pyo3(signature = (fd, *, dataset, iterable, auto_collation, drop_last, collate_fn, getitems, tensors, main_pid, shm_initial, shm_limit, prefetch_factor, make_iter, wrap_exception, init_exception, on_epoch=None, state_fn=None))]
#[allow(clippy::too_many_arguments)]
pub fn worker_loop(
    py: Python<'_>,
    fd: i32,
    dataset: Py<PyAny>,
    iterable: bool,
    auto_collation: bool,
    drop_last: bool,
    collate_fn: Option<Py<PyAny>>,
    getitems: Option<Py<PyAny>>,
    tensors: Option<Vec<Py<PyAny>>>,
    main_pid: i32,
    shm_initial: usize,
    shm_limit: usize,
    prefetch_factor: usize,
    make_iter: Py<PyAny>,
    wrap_exception: Py<PyAny>,
    init_exception: Option<Vec<u8>>,
    on_epoch: Option<Py<PyAny>>,
    state_fn: Option<Py<PyAny>>,
) -> PyResult<()> {
    let fd = adopt_fd(fd)?;
    let fetcher = Fetcher::new(py, dataset, getitems, tensors, collate_fn, Sink::Deferred)?;
    let mut host = PyHost {
        py,
        fetcher,
        iterable,
        auto_collation,
        drop_last,
        make_iter,
        wrap_exception,
        iterator: None,
        init_exception,
        ended: false,
        epochs: 0,
        on_epoch,
        state_fn,
    };
    let config = Config {
        main_pid,
        shm_initial,
        shm_limit,
        prefetch_factor,
    };
    serve(&mut host, fd, config)
}
