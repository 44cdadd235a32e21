//! The main process side of multi-process loading.
//!
//! One socket and one arena per worker. `__next__` follows torch's
//! `_next_data` through the [`Scheduler`]; when nothing is ready it polls
//! every worker socket and pidfd at once with the GIL released, in slices
//! short enough to deliver Ctrl-C promptly. A worker that dies is reported
//! with its pid and signal or exit code as soon as its pidfd fires.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::{PyTraverseError, PyVisit};
use rustix::event::{PollFd, PollFlags};

use super::codec::decode_batch;
use super::ffi::adopt_fd;
use super::indices::{Indices, Item};
use super::loader::warn_past_reported_len;
use super::torch::torch;
use crate::ring::{ArenaReader, Dir, Mailbox, RecordRef, Segment};
use crate::scheduler::protocol::{FromWorker, TaskIndices, ToWorker, ON_SOCKET};
use crate::scheduler::transport::{poll_fds, spin_wait, Conn, Exit, ReadState, Watched};
use crate::scheduler::{Next, Scheduler};

/// The longest the main process sleeps without checking for signals.
const SIGNAL_SLICE: Duration = Duration::from_millis(50);
/// How long the main process keeps checking the mailboxes before sleeping.
const SPIN: Duration = Duration::from_micros(100);
/// Bytes per mailbox ring.
const MAILBOX_BYTES: usize = 256 << 10;

enum Payload {
    Batch(RecordRef),
    Error(Vec<u8>),
}

struct WorkerLink {
    conn: Option<Conn>,
    mailbox: Mailbox,
    /// Messages for the worker not yet in its mailbox (it was full).
    outbox: std::collections::VecDeque<Vec<u8>>,
    process: Watched,
    arena: ArenaReader,
    /// Still expected to answer (not shut down, not told to stop).
    running: bool,
}

enum Source {
    Indices(Indices),
    /// An `IterableDataset`: every task is "the next batch of this size"
    /// (`None`: one sample) from the worker's own replica.
    Iterable(Option<u32>),
}

#[pyclass(subclass, module = "ferroloader._core")]
pub struct MultiProcessIter {
    workers: Vec<WorkerLink>,
    sched: Scheduler<Payload>,
    source: Source,
    iterable: bool,
    persistent: bool,
    timeout: Option<(Duration, String)>,
    pin: Option<(Py<PyAny>, Py<PyAny>)>,
    index_sampler: Py<PyAny>,
    dataset: Py<PyAny>,
    len_called: Option<usize>,
    num_yielded: usize,
    shutdown: bool,
    /// Batches that arrived out of order and are handed over as they came
    /// (`in_order=False`).
    early: std::collections::VecDeque<(usize, Payload)>,
}

fn io_err(e: std::io::Error) -> PyErr {
    PyRuntimeError::new_err(format!("ferroloader: lost contact with a worker: {e}"))
}

fn make_source(source: &Bound<'_, PyAny>, iterable: Option<Option<u32>>) -> Source {
    match iterable {
        Some(n) => Source::Iterable(n),
        None => Source::Indices(Indices::of(source)),
    }
}

#[pymethods]
impl MultiProcessIter {
    #[new]
    #[pyo3(signature = (workers, source, dataset, *, iterable, batch_size, auto_collation, prefetch_factor, in_order, persistent, timeout, timeout_text, pin, index_sampler, len_called))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        workers: Vec<(i32, i32)>,
        source: &Bound<'_, PyAny>,
        dataset: Py<PyAny>,
        iterable: bool,
        batch_size: Option<u32>,
        auto_collation: bool,
        prefetch_factor: usize,
        in_order: bool,
        persistent: bool,
        timeout: f64,
        timeout_text: String,
        pin: Option<(Py<PyAny>, Py<PyAny>)>,
        index_sampler: Py<PyAny>,
        len_called: Option<usize>,
    ) -> PyResult<Self> {
        let mut links = Vec::with_capacity(workers.len());
        for (fd, pid) in workers {
            let mut conn = Conn::new(adopt_fd(fd)?);
            conn.set_nonblocking(true).map_err(io_err)?;
            let mailbox = Mailbox::create(MAILBOX_BYTES).map_err(|e| {
                PyRuntimeError::new_err(format!(
                    "ferroloader: cannot create shared memory for worker {} ({e}); \
                     multi-process loading needs Linux 3.17 or later (memfd_create); \
                     use num_workers=0",
                    links.len()
                ))
            })?;
            let mut body = Vec::new();
            ToWorker::Mailbox.encode(&mut body);
            conn.send_frame_blocking(&body, Some(mailbox.fd()))
                .map_err(io_err)?;
            links.push(WorkerLink {
                conn: Some(conn),
                mailbox,
                outbox: std::collections::VecDeque::new(),
                process: Watched::new(pid),
                arena: ArenaReader::new(),
                running: true,
            });
        }
        let n = links.len();
        let iterable_batch = iterable.then_some(if auto_collation { batch_size } else { None });
        Ok(MultiProcessIter {
            workers: links,
            sched: Scheduler::new(n, prefetch_factor, in_order, persistent),
            source: make_source(source, iterable_batch),
            iterable,
            persistent,
            timeout: (timeout > 0.0).then(|| (Duration::from_secs_f64(timeout), timeout_text)),
            pin,
            index_sampler,
            dataset,
            len_called,
            num_yielded: 0,
            shutdown: false,
            early: std::collections::VecDeque::new(),
        })
    }

    /// Fills the prefetch window (`_reset`'s loop).
    fn _prime(&mut self, py: Python<'_>) -> PyResult<()> {
        for _ in 0..self.sched.max_tasks() {
            self.try_put_index(py)?;
        }
        Ok(())
    }

    /// Persistent workers: a new epoch over `source` (torch's `_reset`).
    fn _reset_epoch(
        &mut self,
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        len_called: Option<usize>,
    ) -> PyResult<()> {
        let iterable_batch = match self.source {
            Source::Iterable(n) => Some(n),
            _ => None,
        };
        self.source = make_source(source, iterable_batch);
        self.len_called = len_called;
        self.num_yielded = 0;
        self.early.clear();
        self.sched.reset();
        let mut waiting = 0usize;
        for w in 0..self.workers.len() {
            self.send(w, &ToWorker::Resume)?;
            waiting += 1;
        }
        // Results of the previous epoch still in flight are dropped (their
        // records released) until every worker has acknowledged.
        while waiting > 0 {
            let got = self.pump(py, true)?;
            waiting = waiting.saturating_sub(got);
            if waiting > 0 && got == 0 {
                self.sleep(py, SIGNAL_SLICE)?;
                self.check_deaths(py)?;
                py.check_signals()?;
            }
        }
        self._prime(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Source::Indices(i) = &self.source {
            i.traverse(&visit)?;
        }
        if let Some((f, d)) = &self.pin {
            visit.call(f)?;
            visit.call(d)?;
        }
        visit.call(&self.index_sampler)?;
        visit.call(&self.dataset)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.index_sampler.bind(py).len()
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.shutdown {
            return Ok(None);
        }
        loop {
            let (worker, payload) = if let Some(early) = self.early.pop_front() {
                early
            } else {
                match self.sched.next_step() {
                    Next::Yield { worker, data } => (worker, data),
                    Next::Stop => {
                        if !self.persistent {
                            self.close();
                        }
                        return Ok(None);
                    }
                    Next::Wait => {
                        self.wait(py)?;
                        continue;
                    }
                }
            };
            // `_process_data`: refill first, then hand over or re-raise.
            self.try_put_index(py)?;
            let data = match payload {
                Payload::Batch(record) => decode_batch(py, &self.workers[worker].arena, record)?,
                Payload::Error(bytes) => {
                    let wrapper = torch(py)?
                        .loads
                        .bind(py)
                        .call1((PyBytes::new(py, &bytes),))?;
                    wrapper.call_method0("reraise")?;
                    return Err(PyRuntimeError::new_err("ExceptionWrapper.reraise returned"));
                }
            };
            let data = match &self.pin {
                Some((pin_fn, device)) => pin_fn.bind(py).call1((data, device))?,
                None => data,
            };
            self.num_yielded += 1;
            self.warn_if_past_len(py)?;
            return Ok(Some(data));
        }
    }

    /// Stops every worker: a Shutdown frame, then the socket is closed so a
    /// worker that misses the frame still sees EOF.
    fn _close(&mut self) {
        self.close();
    }

    fn __getstate__(&self) -> PyResult<()> {
        Err(pyo3::exceptions::PyNotImplementedError::new_err(
            "MultiProcessIter cannot be pickled",
        ))
    }
}

impl MultiProcessIter {
    fn close(&mut self) {
        self.shutdown = true;
        for w in 0..self.workers.len() {
            let _ = self.send(w, &ToWorker::Shutdown);
            let link = &mut self.workers[w];
            if let Some(conn) = link.conn.as_mut() {
                let _ = conn.flush();
            }
            link.conn = None;
            link.running = false;
        }
    }

    fn send(&mut self, worker: usize, msg: &ToWorker) -> PyResult<()> {
        if self.workers[worker].conn.is_none() {
            return Ok(());
        }
        let mut body = Vec::new();
        msg.encode(&mut body);
        self.workers[worker].outbox.push_back(body);
        self.flush_outbox(worker)
    }

    /// Moves queued messages into the worker's mailbox, in order; one too
    /// large for it goes on the socket behind a marker. Wakes the worker if
    /// it was asleep.
    fn flush_outbox(&mut self, worker: usize) -> PyResult<()> {
        let link = &mut self.workers[worker];
        let Some(conn) = link.conn.as_mut() else {
            link.outbox.clear();
            return Ok(());
        };
        let mut pushed = false;
        while let Some(body) = link.outbox.front() {
            if body.len() > link.mailbox.max_message() {
                if !link.mailbox.push(Dir::Tasks, ON_SOCKET) {
                    break;
                }
                conn.queue_frame(body);
            } else if !link.mailbox.push(Dir::Tasks, body) {
                break;
            }
            link.outbox.pop_front();
            pushed = true;
        }
        if pushed && link.mailbox.consumer_was_sleeping(Dir::Tasks) {
            conn.queue_frame(&[]);
        }
        if conn.has_unflushed() {
            conn.flush().map_err(io_err)?;
        }
        Ok(())
    }

    /// `_try_put_index`: draw the next index and give it to a worker.
    fn try_put_index(&mut self, py: Python<'_>) -> PyResult<()> {
        if !self.sched.can_dispatch() {
            return Ok(());
        }
        let indices = match &self.source {
            Source::Iterable(n) => TaskIndices::Iterable(*n),
            Source::Indices(indices) => match indices.next(py)? {
                None => return Ok(()),
                Some(Item::Batch(v)) => TaskIndices::Ints(v),
                Some(Item::Index(i)) => TaskIndices::Int(i),
                Some(Item::Object(obj)) => TaskIndices::Pickled(pickle(py, &obj)?),
            },
        };
        let Some(d) = self.sched.dispatch() else {
            return Ok(());
        };
        self.send(
            d.worker,
            &ToWorker::Task {
                seq: d.seq,
                indices,
            },
        )
    }

    fn warn_if_past_len(&self, py: Python<'_>) -> PyResult<()> {
        if !self.iterable {
            return Ok(());
        }
        warn_past_reported_len(
            py,
            self.dataset.bind(py),
            self.len_called,
            self.num_yielded,
            true,
        )
    }

    /// Blocks until at least one result arrives (or a worker fails, or the
    /// timeout passes): mailboxes first, a short spin, then a sleep on every
    /// worker's socket and pidfd at once with the GIL released.
    fn wait(&mut self, py: Python<'_>) -> PyResult<()> {
        let started = Instant::now();
        loop {
            if self.pump(py, false)? > 0 || !self.early.is_empty() {
                return Ok(());
            }
            if spin_wait(SPIN, || self.any_result_waiting()) {
                continue;
            }
            let mut slice = SIGNAL_SLICE;
            if let Some((limit, text)) = &self.timeout {
                let spent = started.elapsed();
                if spent >= *limit {
                    return Err(PyRuntimeError::new_err(format!(
                        "DataLoader timed out after {text} seconds"
                    )));
                }
                slice = slice.min(*limit - spent);
            }
            self.sleep(py, slice)?;
            self.check_deaths(py)?;
            py.check_signals()?;
        }
    }

    fn any_result_waiting(&self) -> bool {
        self.workers
            .iter()
            .any(|w| w.conn.is_some() && w.mailbox.has_message(Dir::Results))
    }

    /// Sleeps on every worker's socket and pidfd (GIL released) unless a
    /// result arrives while announcing it; then reads what `poll` reported.
    fn sleep(&mut self, py: Python<'_>, slice: Duration) -> PyResult<()> {
        for (i, w) in self.workers.iter().enumerate() {
            if w.conn.is_some() && !w.mailbox.prepare_sleep(Dir::Results) {
                for v in &self.workers[..i] {
                    v.mailbox.end_sleep(Dir::Results);
                }
                return Ok(());
            }
        }
        let ready = self.poll_ready(py, slice);
        for w in &self.workers {
            w.mailbox.end_sleep(Dir::Results);
        }
        self.read_ready(py, &ready?)
    }

    /// Which workers' sockets or pidfds are ready within `slice`.
    fn poll_ready(&self, py: Python<'_>, slice: Duration) -> PyResult<Vec<usize>> {
        let workers = &self.workers;
        py.detach(|| -> std::io::Result<Vec<usize>> {
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(2 * workers.len());
            let mut owner = Vec::with_capacity(2 * workers.len());
            for (i, w) in workers.iter().enumerate() {
                if let Some(c) = &w.conn {
                    let mut ev = PollFlags::IN;
                    if c.has_unflushed() {
                        ev |= PollFlags::OUT;
                    }
                    fds.push(PollFd::from_borrowed_fd(c.as_fd(), ev));
                    owner.push(i);
                }
                if let (true, Some(p)) = (w.running, w.process.pidfd()) {
                    fds.push(PollFd::from_borrowed_fd(p, PollFlags::IN));
                    owner.push(i);
                }
            }
            poll_fds(&mut fds, Some(slice))?;
            let mut ready: Vec<usize> = fds
                .iter()
                .zip(&owner)
                .filter(|(f, _)| !f.revents().is_empty())
                .map(|(_, &i)| i)
                .collect();
            ready.dedup();
            Ok(ready)
        })
        .map_err(io_err)
    }

    /// Reads the sockets `poll` reported: wake-ups are dropped, frames kept
    /// for the markers that will ask for them, EOF noted.
    fn read_ready(&mut self, py: Python<'_>, ready: &[usize]) -> PyResult<()> {
        for &w in ready {
            let Some(conn) = self.workers[w].conn.as_mut() else {
                continue;
            };
            if conn.has_unflushed() {
                conn.flush().map_err(io_err)?;
            }
            if conn.read_some().map_err(io_err)? == ReadState::Closed {
                // Results still in the mailbox are handled before the loss.
                self.pump(py, false)?;
                self.workers[w].conn = None;
                if self.workers[w].running {
                    self.check_deaths(py)?;
                }
            } else {
                conn.skip_wakeups();
            }
        }
        Ok(())
    }

    /// Handles every message waiting in the mailboxes (and retries queued
    /// tasks). Returns how many task results (or, with `resuming`, Resume
    /// acks) came in.
    fn pump(&mut self, py: Python<'_>, resuming: bool) -> PyResult<usize> {
        let mut got = 0;
        let mut buf = Vec::new();
        for w in 0..self.workers.len() {
            if !self.workers[w].outbox.is_empty() {
                self.flush_outbox(w)?;
            }
            loop {
                let link = &mut self.workers[w];
                if link.conn.is_none() || !link.mailbox.pop(Dir::Results, &mut buf) {
                    break;
                }
                let frame = if buf == ON_SOCKET {
                    let conn = link.conn.as_mut().expect("checked above");
                    match py.detach(|| conn.recv_message_blocking()).map_err(io_err)? {
                        Some(f) => f,
                        None => {
                            link.conn = None;
                            break;
                        }
                    }
                } else {
                    std::mem::take(&mut buf)
                };
                let msg = FromWorker::decode(&frame)
                    .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
                got += self.handle(py, w, msg, resuming)?;
            }
        }
        Ok(got)
    }

    fn handle(
        &mut self,
        py: Python<'_>,
        w: usize,
        msg: FromWorker,
        resuming: bool,
    ) -> PyResult<usize> {
        let record = |r: crate::scheduler::protocol::RecordLoc| RecordRef {
            segment: r.segment,
            offset: r.offset,
            len: r.len,
        };
        match msg {
            FromWorker::Segment { id } => {
                let fd = self.workers[w]
                    .conn
                    .as_mut()
                    .and_then(Conn::take_fd)
                    .ok_or_else(|| {
                        PyRuntimeError::new_err("ferroloader: segment without its descriptor")
                    })?;
                let seg = Segment::from_fd(fd).map_err(io_err)?;
                self.workers[w].arena.add_segment(id, seg);
                Ok(0)
            }
            FromWorker::Resumed => Ok(usize::from(resuming)),
            _ if resuming => {
                // A result of the epoch being abandoned: release its record.
                if let FromWorker::Batch { record: r, .. } = msg {
                    self.workers[w].arena.discard(record(r));
                }
                Ok(0)
            }
            FromWorker::Batch { seq, record: r } => {
                if let Some(early) = self.sched.on_result(seq, Payload::Batch(record(r))) {
                    self.early.push_back(early);
                }
                Ok(1)
            }
            FromWorker::Error { seq, payload } => {
                if let Some(early) = self.sched.on_result(seq, Payload::Error(payload)) {
                    self.early.push_back(early);
                }
                Ok(1)
            }
            FromWorker::Exhausted { .. } => {
                self.sched.on_exhausted(w);
                if !self.persistent {
                    // `_mark_worker_as_unavailable`: this replica is done.
                    self.send(w, &ToWorker::Shutdown)?;
                    self.workers[w].running = false;
                }
                self.try_put_index(py)?;
                Ok(1)
            }
        }
    }

    /// Raises torch's error for a worker that ended while still expected.
    fn check_deaths(&mut self, py: Python<'_>) -> PyResult<()> {
        for w in 0..self.workers.len() {
            if !self.workers[w].running {
                continue;
            }
            let Some(exit) = self.workers[w].process.exit_status() else {
                continue;
            };
            let pid = self.workers[w].process.pid();
            self.workers[w].running = false;
            self.sched.mark_unavailable(w);
            let msg = match exit {
                Exit::Signal(sig) => {
                    let name: String = py
                        .import("signal")?
                        .call_method1("strsignal", (sig,))?
                        .extract()
                        .unwrap_or_else(|_| format!("signal {sig}"));
                    let mut m = format!("DataLoader worker (pid {pid}) is killed by signal: {name}. ");
                    if sig == rustix::process::Signal::BUS.as_raw() {
                        m.push_str("It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.");
                    }
                    m
                }
                Exit::Code(code) => format!(
                    "DataLoader worker (pid {pid}) exited unexpectedly with exit code {code}. Details are lost due to multiprocessing. Rerunning with num_workers=0 may give better error trace."
                ),
            };
            self.close();
            return Err(PyRuntimeError::new_err(msg));
        }
        Ok(())
    }
}

impl Drop for MultiProcessIter {
    fn drop(&mut self) {
        self.close();
    }
}

fn pickle(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let b = torch(py)?.dumps.bind(py).call1((obj,))?;
    Ok(b.cast_into::<PyBytes>()?.as_bytes().to_vec())
}
