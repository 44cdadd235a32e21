//! The main process side of multi-process loading, as a Python iterator:
//! draws indices (a sampler may be Python), releases the GIL while the
//! engine sleeps, builds batches from records and re-raises workers'
//! exceptions. Dispatch, reordering, polling and liveness are the engine's
//! (`crate::scheduler::Loader`).

use std::os::fd::OwnedFd;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::{PyTraverseError, PyVisit};

use super::codec::decode_batch;
use super::error::Class;
use super::ffi::adopt_fd;
use super::indices::{Indices, Item};
use super::loader::{resumed_from, warn_past_reported_len, ResumedArg};
use super::pinning::{counts_tuple, PinArena, PinCountsTuple};
use super::shards::{snapshot_to_py, AddressBatches, ShardPlan, Snapshot};
use super::stats::{MainTimes, StatsTuple};
use super::torch::torch;
use super::turns::{with_mut, with_ref};
use crate::pin::Held;
use crate::scheduler::{Loader, Next, Payload, Resumed, Waiter, WorkerPool};
use crate::wire::protocol::TaskIndices;
use crate::wire::transport::{Blocking, Watched};

/// Releases the GIL around the engine's blocking waits and delivers
/// signals (Ctrl-C) between them; a raised [`StopFlag`] ends the wait too.
struct Gil<'py, 'a>(Python<'py>, Option<&'a StopFlag>);

impl Blocking for Gil<'_, '_> {
    fn blocking<R: Send>(&mut self, f: impl FnOnce() -> R + Send) -> R {
        self.0.detach(f)
    }
}

impl Waiter for Gil<'_, '_> {
    type Error = PyErr;
    fn check_interrupts(&mut self) -> PyResult<()> {
        if self.1.is_some_and(StopFlag::is_set) {
            return Err(pyo3::exceptions::PyInterruptedError::new_err(
                "ferroloader: the pin thread was asked to stop",
            ));
        }
        self.0.check_signals()
    }
}

/// Asks a thread waiting in `_next_unpinned` to stop (within one
/// interrupt slice): the pin thread's off switch.
#[pyclass(frozen, module = "ferroloader._core")]
#[derive(Default)]
pub struct StopFlag(std::sync::atomic::AtomicBool);

impl StopFlag {
    fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

#[pymethods]
impl StopFlag {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }

    #[getter]
    fn is_stopped(&self) -> bool {
        self.is_set()
    }
}

enum Source {
    Indices(Indices),
    /// An `IterableDataset`: every task is "the next batch of this size"
    /// (`None`: one sample) from the worker's own replica. (A sharded
    /// epoch's lanes draw nothing: the engine makes their tasks.)
    Iterable(Option<u32>),
    /// Elastic sharding: batches of shard addresses.
    Addresses(Py<AddressBatches>),
}

impl Source {
    fn new(source: &Bound<'_, PyAny>, iterable: Option<Option<u32>>) -> Source {
        if let Ok(batches) = source.cast::<AddressBatches>() {
            return Source::Addresses(batches.clone().unbind());
        }
        match iterable {
            Some(n) => Source::Iterable(n),
            None => Source::Indices(Indices::of(source)),
        }
    }

    /// The next task's indices (`None`: the sampler is exhausted).
    fn draw(&self, py: Python<'_>) -> PyResult<Option<TaskIndices>> {
        Ok(Some(match self {
            Source::Iterable(n) => TaskIndices::Iterable(*n),
            Source::Addresses(batches) => match batches.bind(py).borrow_mut().next_batch() {
                Some(a) => TaskIndices::Addresses(a),
                None => return Ok(None),
            },
            Source::Indices(indices) => match indices.next(py)? {
                None => return Ok(None),
                Some(Item::Batch(v)) => TaskIndices::Ints(v),
                Some(Item::Index(i)) => TaskIndices::Int(i),
                Some(Item::Object(obj)) => {
                    let b = torch(py)?.dumps.bind(py).call1((obj,))?;
                    TaskIndices::Pickled(b.cast_into::<PyBytes>()?.as_bytes().to_vec())
                }
            },
        }))
    }
}

#[pyclass(subclass, module = "ferroloader._core")]
pub struct MultiProcessIter {
    core: Loader,
    source: Source,
    iterable: bool,
    timeout: Option<(Duration, String)>,
    pin: Option<(Py<PyAny>, Py<PyAny>)>,
    /// Where a pinning error says it happened (torch's pin thread).
    pin_where: String,
    /// Pinned arenas: batches are pinned where they lie (`pin` then finds
    /// their tensors pinned already).
    pin_arena: Option<Py<PinArena>>,
    index_sampler: Py<PyAny>,
    dataset: Py<PyAny>,
    len_called: Option<usize>,
    num_yielded: usize,
    /// The epoch ran to its end.
    ended: bool,
    /// Where a resumed epoch took up (the default: the epoch's start).
    resumed: Resumed,
    /// The last wait ran past `timeout`: a worker is stuck, so a teardown
    /// need not wait for it to answer `Shutdown`.
    timed_out: bool,
    times: MainTimes,
    /// Closed from outside the epoch (`loader.close()`): the error each
    /// later `next()` raises, rather than a silent end.
    closed_error: Option<Py<PyAny>>,
}

/// How an epoch's multi-process iterator runs: one object across the
/// boundary, a dict of these keys (built by `ferroloader.run.iterators`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct IterSpec {
    iterable: bool,
    batch_size: Option<u64>,
    auto_collation: bool,
    prefetch_factor: usize,
    in_order: bool,
    persistent: bool,
    timeout: f64,
    timeout_text: String,
    pin: Option<(Py<PyAny>, Py<PyAny>)>,
    pin_where: Option<String>,
    index_sampler: Py<PyAny>,
    len_called: Option<usize>,
    pin_arena: Option<Py<PinArena>>,
    /// A sharded epoch: its lanes' plan.
    lanes: Option<Py<ShardPlan>>,
    /// A resumed iterable epoch: `(next_worker, exhausted)`, where the
    /// round-robin starts and the workers that get no task.
    round_robin: Option<(usize, Vec<bool>)>,
    /// A resumed epoch: where it took up.
    resumed: Option<ResumedArg>,
}

#[pymethods]
impl MultiProcessIter {
    /// Takes the started workers' sockets and the epoch's plan, and starts
    /// the epoch: the lanes or the round-robin set up, the window filled.
    #[new]
    fn new(
        workers: Vec<(i32, i32)>,
        source: &Bound<'_, PyAny>,
        dataset: Py<PyAny>,
        spec: IterSpec,
    ) -> PyResult<Self> {
        super::error::guard("the loader's iter()", move || {
            let py = source.py();
            if spec.prefetch_factor == 0 {
                // torch's check, where torch makes it (its iterator's __init__)
                return Err(pyo3::exceptions::PyAssertionError::new_err(
                    "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter",
                ));
            }
            // Python's own limit for a blocking wait, which torch's queue.get
            // meets (an OverflowError at the first batch there)
            let timeout_at = match spec.timeout {
                t if t > 0.0 => Some(Duration::try_from_secs_f64(t).map_err(|_| {
                    pyo3::exceptions::PyOverflowError::new_err("timeout value is too large")
                })?),
                _ => None,
            };
            let IterSpec {
                iterable,
                batch_size,
                auto_collation,
                prefetch_factor,
                in_order,
                persistent,
                timeout: _,
                timeout_text,
                pin,
                pin_where,
                index_sampler,
                len_called,
                pin_arena,
                lanes,
                round_robin,
                resumed,
            } = spec;
            let workers = workers
                .into_iter()
                .map(|(fd, pid)| Ok((adopt_fd(fd)?, pid)))
                .collect::<PyResult<Vec<(OwnedFd, i32)>>>()?;
            let pool = WorkerPool::new(workers)?;
            // an iterable's batch is cut by its worker, counted in 32 bits: a
            // larger batch_size (torch takes any) cuts the same batches of any
            // replica that fits in memory
            let batch_size = batch_size.map(|b| u32::try_from(b).unwrap_or(u32::MAX));
            let iterable_batch = iterable.then_some(if auto_collation { batch_size } else { None });
            let mut it = MultiProcessIter {
                core: Loader::new(pool, prefetch_factor, in_order, persistent),
                source: Source::new(source, iterable_batch),
                iterable,
                timeout: timeout_at.map(|t| (t, timeout_text)),
                pin,
                pin_where: pin_where.unwrap_or_default(),
                pin_arena,
                index_sampler,
                dataset,
                len_called,
                num_yielded: 0,
                ended: false,
                resumed: resumed.map(resumed_from).unwrap_or_default(),
                timed_out: false,
                times: MainTimes::default(),
                closed_error: None,
            };
            if let Some(plan) = lanes {
                let plan = plan.borrow(py);
                it.core
                    .start_lanes_with(plan.plan.clone(), plan.work_source(py))?;
            }
            if let Some((next_worker, exhausted)) = round_robin {
                it.core.restore_round_robin(next_worker, &exhausted)?;
            }
            it.prime(py)?;
            Ok(it)
        })
    }

    /// Persistent workers: a new epoch over `source` (torch's `_reset`);
    /// a sharded one over `plan`'s lanes.
    #[pyo3(signature = (source, len_called, plan=None, resumed=None))]
    fn _reset_epoch(
        &mut self,
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        len_called: Option<usize>,
        plan: Option<PyRef<'_, ShardPlan>>,
        resumed: Option<ResumedArg>,
    ) -> PyResult<()> {
        let iterable_batch = match self.source {
            Source::Iterable(n) => Some(n),
            Source::Indices(_) | Source::Addresses(_) => None,
        };
        self.source = Source::new(source, iterable_batch);
        self.len_called = len_called;
        self.num_yielded = 0;
        self.ended = false;
        self.resumed = resumed.map(resumed_from).unwrap_or_default();
        let source = &self.source;
        self.core
            .restart_epoch(&mut Gil(py, None), &mut || source.draw(py))?;
        if let Some(plan) = plan {
            self.core
                .start_lanes_with(plan.plan.clone(), plan.work_source(py))?;
        }
        self.prime(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.source {
            Source::Indices(i) => i.traverse(&visit)?,
            Source::Addresses(b) => visit.call(b)?,
            Source::Iterable(_) => {}
        }
        if let Some((f, d)) = &self.pin {
            visit.call(f)?;
            visit.call(d)?;
        }
        if let Some(a) = &self.pin_arena {
            visit.call(a)?;
        }
        if let Some(e) = &self.closed_error {
            visit.call(e)?;
        }
        visit.call(&self.index_sampler)?;
        visit.call(&self.dataset)
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        // (without borrowing: another thread's next() may hold the object)
        slf
    }

    fn __len__(slf: &Bound<'_, Self>) -> PyResult<usize> {
        let py = slf.py();
        with_ref(slf, "len()", |it| it.index_sampler.bind(py).len())?
    }

    fn __next__<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = slf.py();
        // (another thread inside next() may be waiting for a batch,
        // detached: each thread gets the following batch in turn)
        with_mut(slf, "next()", |mut it| {
            let (got, panicked) =
                super::error::guard_panic("the loader's next()", || it.next_batch(py));
            if panicked {
                // after a panic the engine's state cannot be trusted
                it.core.close();
            }
            got
        })
    }

    /// `(drawn, pending, ended)`: tasks drawn from the index stream this
    /// epoch, the sequence numbers among them not yet handed over, and
    /// whether the epoch is over, in the epoch's numbering (also after a
    /// resume). Read between batches without pausing the workers.
    #[getter]
    fn _position(slf: &Bound<'_, Self>) -> PyResult<(u64, Vec<u64>, bool)> {
        with_ref(slf, "_position", |it| {
            let (drawn, pending) = it.core.position();
            let (drawn, pending) = it.resumed.position(drawn, &pending);
            (drawn, pending, it.ended)
        })
    }

    /// An iterable epoch's position per worker: `(delivered, states,
    /// exhausted, next_worker, done)` (see `crate::scheduler::IterablePosition`).
    #[getter]
    #[allow(clippy::type_complexity)]
    fn _iterable_position<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(
        Vec<u64>,
        Vec<Option<Bound<'py, PyBytes>>>,
        Vec<bool>,
        usize,
        Vec<bool>,
    )> {
        let py = slf.py();
        with_ref(slf, "_iterable_position", |it| {
            let p = it.resumed.iterable(it.core.iterable_position());
            let states = p
                .states
                .iter()
                .map(|s| s.as_ref().map(|b| PyBytes::new(py, b)))
                .collect();
            (p.delivered, states, p.exhausted, p.next_worker, p.done)
        })
    }

    /// A sharded epoch's position: `(positions, next_lane, handed, rest)`;
    /// `None` for other epochs.
    #[getter]
    fn _lane_snapshot(slf: &Bound<'_, Self>) -> PyResult<Option<Snapshot>> {
        with_ref(slf, "_lane_snapshot", |it| {
            it.core.lane_snapshot().map(snapshot_to_py)
        })
    }

    /// Waits until every worker that was given a task has set up, and
    /// raises the first error one raised while it did (torchdata's
    /// `iter()`); the batches stay queued.
    fn _await_setup(&mut self, py: Python<'_>) -> PyResult<()> {
        let source = &self.source;
        let timeout = self.timeout.as_ref().map(|(t, s)| (*t, s.as_str()));
        let failed = self
            .core
            .await_setup(&mut Gil(py, None), &mut || source.draw(py), timeout)?;
        match failed {
            Some(bytes) => Err(reraise(py, &bytes)),
            None => Ok(()),
        }
    }

    /// Stage timings (ns) since this iterator began: the main process's
    /// `(wait, decode, pin, loop, batches)` and each worker's `(fetch,
    /// collate, transfer, batches)`.
    #[getter]
    fn _stats(slf: &Bound<'_, Self>) -> PyResult<StatsTuple> {
        with_ref(slf, "_stats", |it| {
            it.times.tuple(it.core.worker_times().to_vec())
        })
    }

    /// The iterator stopped its workers (after a failure, or at the end of a
    /// non-persistent epoch): it cannot serve another epoch.
    #[getter]
    fn _closed(slf: &Bound<'_, Self>) -> PyResult<bool> {
        with_ref(slf, "_closed", |it| it.core.is_closed())
    }

    /// Holds back new tasks (`True`) so that the epoch drains: what is in
    /// flight is handed over, then `next()` stops without ending the epoch
    /// (`_held` stays true, `_position` says not ended). `False` lets tasks
    /// go out again and fills the window. Between batches only.
    fn _hold(&mut self, py: Python<'_>, held: bool) -> PyResult<()> {
        self.core.hold(held);
        if held {
            Ok(())
        } else {
            self.prime(py)
        }
    }

    #[getter]
    fn _held(slf: &Bound<'_, Self>) -> PyResult<bool> {
        with_ref(slf, "_held", |it| it.core.is_held())
    }

    /// Answers not yet handed over (in flight or waiting their turn).
    #[getter]
    fn _in_flight(slf: &Bound<'_, Self>) -> PyResult<usize> {
        with_ref(slf, "_in_flight", |it| it.core.in_flight())
    }

    /// A new `prefetch_factor` from the next batch on: a deeper window is
    /// filled at once, a shallower one as batches are handed over.
    fn _set_prefetch_factor(&mut self, py: Python<'_>, prefetch_factor: usize) -> PyResult<()> {
        if prefetch_factor == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "prefetch_factor must be positive",
            ));
        }
        self.core.set_prefetch_factor(prefetch_factor);
        if self.core.is_held() {
            Ok(())
        } else {
            self.prime(py)
        }
    }

    /// The last wait for a batch ran past the loader's `timeout`.
    #[getter]
    fn _timed_out(slf: &Bound<'_, Self>) -> PyResult<bool> {
        with_ref(slf, "_timed_out", |it| it.timed_out)
    }

    /// Stops every worker: a Shutdown frame, then the socket is closed so a
    /// worker that misses the frame still sees EOF. With `grace`, the
    /// worker processes are then ended (waited for, then SIGTERM, then
    /// SIGKILL; see `scheduler::pool::end_processes`), without the GIL.
    /// `error`: what each later `next()` raises (a close from outside the
    /// epoch), rather than ending the epoch silently.
    #[pyo3(signature = (grace=None, error=None))]
    fn _close(&mut self, py: Python<'_>, grace: Option<f64>, error: Option<Py<PyAny>>) {
        if error.is_some() && !self.core.is_closed() {
            self.closed_error = error;
        }
        self.core.close();
        if let Some(arena) = &self.pin_arena {
            arena.get().pinning.close();
        }
        if let Some(grace) = grace {
            let grace = Duration::from_secs_f64(grace.max(0.0));
            let procs = self.core.processes();
            py.detach(|| crate::scheduler::pool::end_processes(&procs, grace));
        }
    }

    fn __getstate__(&self) -> PyResult<()> {
        Err(pyo3::exceptions::PyNotImplementedError::new_err(
            "MultiProcessIter cannot be pickled",
        ))
    }

    /// The next batch, not pinned (`None` at the end of the epoch): what
    /// the pin thread takes from the engine. A raised `stop` ends a wait
    /// with `InterruptedError`.
    #[pyo3(signature = (stop=None))]
    fn _next_unpinned<'py>(
        &mut self,
        py: Python<'py>,
        stop: Option<PyRef<'py, StopFlag>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let got = self.take(py, stop.as_deref());
        if matches!(got, Ok(Some(_))) {
            self.times.batches += 1;
        }
        got
    }

    /// The pinned arenas' counters (see `PinArena.counts`), if pinned.
    #[getter]
    fn _pin_counts(slf: &Bound<'_, Self>) -> PyResult<Option<PinCountsTuple>> {
        with_ref(slf, "_pin_counts", |it| {
            it.pin_arena
                .as_ref()
                .map(|a| counts_tuple(&a.get().pinning))
        })
    }
}

impl Drop for MultiProcessIter {
    fn drop(&mut self) {
        // no next() will fence what its batches' owners free from now on
        if let Some(arena) = &self.pin_arena {
            arena.get().pinning.close();
        }
    }
}

impl MultiProcessIter {
    /// Fills the prefetch window (torch's `_reset`'s loop).
    fn prime(&mut self, py: Python<'_>) -> PyResult<()> {
        let source = &self.source;
        self.core.prime(&mut || source.draw(py))
    }

    /// One `__next__`, with the iterator borrowed.
    fn next_batch<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.core.is_closed() {
            return match &self.closed_error {
                Some(e) => Err(PyErr::from_value(e.bind(py).clone())),
                None => Ok(None),
            };
        }
        self.times.enter();
        if let Some(arena) = &self.pin_arena {
            arena.get().tick(py);
        }
        let Some(data) = self.take(py, None)? else {
            return Ok(None);
        };
        let data = match &self.pin {
            Some((pin_fn, device)) => {
                let t2 = std::time::Instant::now();
                let pinned = pin_fn
                    .bind(py)
                    .call1((data, device))
                    .map_err(|e| as_pin_thread_error(py, e, &self.pin_where))?;
                self.times.pin += crate::stats::since(t2);
                pinned
            }
            None => data,
        };
        self.times.leave();
        self.times.maybe_warn(py, self.core.worker_times())?;
        Ok(Some(data))
    }

    /// The next batch as the engine hands it over, decoded (`None` at the
    /// end of the epoch); counts its wait and decode times.
    fn take<'py>(
        &mut self,
        py: Python<'py>,
        stop: Option<&StopFlag>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.core.is_closed() {
            return Ok(None);
        }
        let t0 = std::time::Instant::now();
        let (worker, payload) = loop {
            match self.core.step() {
                Next::Yield { worker, data } => break (worker, data),
                Next::Stop => {
                    self.ended = self.core.stop_is_final();
                    return Ok(None);
                }
                Next::Wait => self.wait(py, stop)?,
            }
        };
        self.times.wait += crate::stats::since(t0);
        // `_process_data`: refill first, then hand over or re-raise.
        let source = &self.source;
        self.core.put_task(&mut || source.draw(py))?;
        let t1 = std::time::Instant::now();
        let data = match payload {
            Payload::Batch(record) => {
                let handle = self.core.open(worker, record)?;
                let held = match &self.pin_arena {
                    Some(arena) => {
                        let pinning = &arena.get().pinning;
                        if pinning.is_registered(worker, record.segment) {
                            pinning.hold(worker, handle)
                        } else {
                            // a new segment is page-locked (slow): not under the GIL
                            py.detach(|| pinning.hold(worker, handle))
                        }
                    }
                    None => Held::plain(handle),
                };
                decode_batch(py, held)?
            }
            Payload::Error(bytes) => return Err(reraise(py, &bytes)),
        };
        self.times.decode += crate::stats::since(t1);
        self.num_yielded += 1;
        if self.iterable {
            warn_past_reported_len(
                py,
                self.dataset.bind(py),
                self.len_called,
                self.num_yielded,
                true,
            )?;
        }
        Ok(Some(data))
    }

    /// Blocks until at least one answer arrives, a worker fails, or the
    /// timeout passes (the engine's wait, with the GIL released).
    fn wait(&mut self, py: Python<'_>, stop: Option<&StopFlag>) -> PyResult<()> {
        let source = &self.source;
        let timeout = self.timeout.as_ref().map(|(t, s)| (*t, s.as_str()));
        let started = std::time::Instant::now();
        let waited = self
            .core
            .wait(&mut Gil(py, stop), &mut || source.draw(py), timeout);
        self.timed_out = waited.is_err() && timeout.is_some_and(|(t, _)| started.elapsed() >= t);
        waited
    }
}

/// Ends worker processes the engine does not hold (a start that failed
/// part way), as it ends its own: `grace` to exit, then SIGTERM, then
/// SIGKILL. They are not reaped (their `multiprocessing` handles join them).
#[pyfunction]
pub fn end_processes(py: Python<'_>, pids: Vec<i32>, grace: f64) {
    let watched: Vec<Watched> = pids.into_iter().map(Watched::new).collect();
    let procs: Vec<&Watched> = watched.iter().collect();
    let grace = Duration::from_secs_f64(grace.max(0.0));
    py.detach(|| crate::scheduler::pool::end_processes(&procs, grace));
}

/// The prefetch window: the most tasks in flight at once (the engine's
/// one definition, for the Python side's bookkeeping).
#[pyfunction]
pub fn prefetch_window(prefetch_factor: usize, num_workers: usize) -> usize {
    crate::scheduler::window(prefetch_factor, num_workers)
}

/// An exception pinning a batch, raised as torch's pin thread re-raises
/// it (an `ExceptionWrapper` naming where); a `BaseException` that is not
/// an `Exception` (Ctrl-C) passes as it is.
fn as_pin_thread_error(py: Python<'_>, e: PyErr, place: &str) -> PyErr {
    if !e.is_instance_of::<pyo3::exceptions::PyException>(py) {
        return e;
    }
    let info = (e.get_type(py), e.value(py).clone(), e.traceback(py));
    let raised = torch(py).and_then(|t| {
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("exc_info", info)?;
        kwargs.set_item("where", place)?;
        t.exception_wrapper
            .bind(py)
            .call((), Some(&kwargs))?
            .call_method0("reraise")
    });
    match raised {
        Err(e) => e,
        Ok(_) => Class::Internal.err("ExceptionWrapper.reraise returned"),
    }
}

/// The user's exception a worker serialised (an `ExceptionWrapper`), raised
/// here as torch re-raises it.
fn reraise(py: Python<'_>, bytes: &[u8]) -> PyErr {
    let raised = torch(py)
        .and_then(|t| t.loads.bind(py).call1((PyBytes::new(py, bytes),)))
        .and_then(|wrapper| wrapper.call_method0("reraise"));
    match raised {
        Err(e) => e,
        Ok(_) => Class::Internal.err("ExceptionWrapper.reraise returned"),
    }
}
