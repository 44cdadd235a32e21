//! The worker loop: runs in each worker process once the Python entry point
//! (`ferroloader._worker`) has seeded it and set its worker info.
//!
//! ```text
//!  wait for a frame (GIL released) ──Task──▶ fetch + collate (Python code)
//!        ▲                                    │ encode into a new arena record
//!        │                                    ▼
//!        └──────────── Batch / Error / Exhausted frame to the main process
//!  Resume: ack, then a new replica iterator.  Shutdown or EOF: return.
//! ```
//! A watchdog thread kills the worker as soon as the main process is gone,
//! whatever the worker is doing (even inside user code).

use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rustix::event::PollFlags;
use rustix::process::{Pid, PidfdFlags, Signal};

use super::codec::{encode_batch, RecordBudget};
use super::collate::Sink;
use super::fetch::Fetcher;
use super::ffi::adopt_fd;
use super::torch::torch;
use crate::ring::{ArenaWriter, Dir, Mailbox};
use crate::scheduler::protocol::{FromWorker, TaskIndices, ToWorker, ON_SOCKET};
use crate::scheduler::transport::{spin_wait, wait_fd, Conn, ReadState};

/// How long an idle worker keeps checking its mailbox before it sleeps on
/// its socket (a wake-up costs far more than this on a busy machine).
const SPIN: Duration = Duration::from_micros(100);

fn io_err(e: std::io::Error) -> PyErr {
    PyRuntimeError::new_err(format!("ferroloader worker: {e}"))
}

/// The main process closed its end (it stopped this iterator): not an
/// error, the worker just leaves.
fn main_gone(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
    )
}

/// Kills this process when `main_pid` exits.
fn start_watchdog(main_pid: i32) {
    let me = rustix::process::getpid();
    let kill_self = move || {
        let _ = rustix::process::kill_process(me, Signal::KILL);
    };
    let Some(pid) = Pid::from_raw(main_pid) else {
        return;
    };
    match rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => {
            std::thread::Builder::new()
                .name("ferroloader-watchdog".into())
                .spawn(move || {
                    use std::os::fd::AsFd;
                    while wait_fd(fd.as_fd(), PollFlags::IN, None).is_err() {}
                    kill_self();
                })
                .ok();
        }
        Err(rustix::io::Errno::SRCH) => kill_self(),
        Err(_) => {
            // No pidfds (Linux < 5.3): poll the parent's existence instead.
            std::thread::Builder::new()
                .name("ferroloader-watchdog".into())
                .spawn(move || loop {
                    std::thread::sleep(Duration::from_millis(200));
                    if rustix::process::test_kill_process(pid).is_err() {
                        kill_self();
                    }
                })
                .ok();
        }
    }
}

struct Worker {
    budget: RecordBudget,
    conn: Conn,
    mailbox: Mailbox,
    buf: Vec<u8>,
    arena: ArenaWriter,
    fetcher: Fetcher,
    iterable: bool,
    auto_collation: bool,
    drop_last: bool,
    make_iter: Py<PyAny>,
    wrap_exception: Py<PyAny>,
    iterator: Option<Py<PyAny>>,
    init_exception: Option<Vec<u8>>,
    ended: bool,
    iteration_end: bool,
}

impl Worker {
    fn gone_or(e: std::io::Error) -> PyErr {
        if main_gone(&e) {
            PyErr::new::<pyo3::exceptions::PyConnectionAbortedError, _>("main process gone")
        } else {
            io_err(e)
        }
    }

    /// A message to the main process, in order: through the mailbox, or on
    /// the socket behind a marker when it carries an fd or is too large.
    fn send(&mut self, msg: &FromWorker) -> PyResult<()> {
        // New arena segments go first, so the main process can map a record
        // before it reads the message naming it.
        let new: Vec<u32> = self
            .arena
            .take_new_segments()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        for id in new {
            let mut body = Vec::new();
            FromWorker::Segment { id }.encode(&mut body);
            let fd = self.arena.segment_fd(id).expect("segment just created");
            self.conn
                .send_frame_blocking(&body, Some(fd))
                .map_err(Self::gone_or)?;
            self.push(ON_SOCKET)?;
        }
        let mut body = Vec::new();
        msg.encode(&mut body);
        if body.len() > self.mailbox.max_message() {
            self.conn
                .send_frame_blocking(&body, None)
                .map_err(Self::gone_or)?;
            return self.push(ON_SOCKET);
        }
        self.push(&body)
    }

    fn push(&mut self, body: &[u8]) -> PyResult<()> {
        while !self.mailbox.push(Dir::Results, body) {
            // The main process is behind (or gone): wait for room.
            let state = wait_fd(
                self.conn.as_fd_ref(),
                PollFlags::IN,
                Some(Duration::from_millis(1)),
            )
            .and_then(|ready| {
                if ready {
                    self.conn.read_some()
                } else {
                    Ok(ReadState::Open)
                }
            })
            .map_err(Self::gone_or)?;
            if state == ReadState::Closed {
                return Err(Self::gone_or(std::io::ErrorKind::BrokenPipe.into()));
            }
        }
        if self.mailbox.consumer_was_sleeping(Dir::Results) {
            self.conn
                .send_frame_blocking(&[], None)
                .map_err(Self::gone_or)?;
        }
        Ok(())
    }

    /// The next message from the main process; `None` once it has closed
    /// the connection. Spins briefly on the mailbox before sleeping.
    fn next_message(&mut self, py: Python<'_>) -> PyResult<Option<ToWorker>> {
        loop {
            if self.mailbox.pop(Dir::Tasks, &mut self.buf) {
                let frame = if self.buf == ON_SOCKET {
                    match self.conn.recv_message_blocking() {
                        Ok(Some(f)) => f,
                        Ok(None) => return Ok(None),
                        Err(e) if main_gone(&e) => return Ok(None),
                        Err(e) => return Err(io_err(e)),
                    }
                } else {
                    std::mem::take(&mut self.buf)
                };
                return ToWorker::decode(&frame)
                    .map(Some)
                    .map_err(|e| PyRuntimeError::new_err(e.to_string()));
            }
            let mailbox = &self.mailbox;
            if spin_wait(SPIN, || mailbox.has_message(Dir::Tasks))
                || !self.mailbox.prepare_sleep(Dir::Tasks)
            {
                continue;
            }
            let conn = &mut self.conn;
            let state = py.detach(|| {
                wait_fd(conn.as_fd_ref(), PollFlags::IN, None)?;
                conn.read_some()
            });
            self.mailbox.end_sleep(Dir::Tasks);
            match state {
                Ok(ReadState::Closed) => return Ok(None),
                Ok(ReadState::Open) => self.conn.skip_wakeups(),
                Err(e) if main_gone(&e) => return Ok(None),
                Err(e) => return Err(io_err(e)),
            }
        }
    }

    fn new_iterator(&mut self, py: Python<'_>) {
        self.ended = false;
        match self.make_iter.bind(py).call0() {
            Ok(it) => self.iterator = Some(it.unbind()),
            Err(e) => self.init_exception = self.wrap(py, e).ok(),
        }
    }

    fn wrap(&self, py: Python<'_>, e: PyErr) -> PyResult<Vec<u8>> {
        let wrapped = self.wrap_exception.bind(py).call1((e.into_value(py),))?;
        wrapped
            .cast_into::<PyBytes>()
            .map(|b| b.as_bytes().to_vec())
            .map_err(Into::into)
    }

    /// Fetch and collate one task. `Ok(None)`: the replica is exhausted.
    fn run<'py>(
        &mut self,
        py: Python<'py>,
        indices: TaskIndices,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
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
                    .ok_or_else(|| PyRuntimeError::new_err("no dataset iterator"))?
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

    fn task(&mut self, py: Python<'_>, seq: u64, indices: TaskIndices) -> PyResult<()> {
        if self.iteration_end {
            return Ok(());
        }
        if let Some(payload) = self.init_exception.take() {
            return self.send(&FromWorker::Error { seq, payload });
        }
        let outcome = self.run(py, indices).and_then(|b| {
            b.map(|b| encode_batch(py, &b, &mut self.arena, &mut self.budget))
                .transpose()
        });
        match outcome {
            Ok(Some(record)) => self.send(&FromWorker::Batch {
                seq,
                record: crate::scheduler::protocol::RecordLoc {
                    segment: record.segment,
                    offset: record.offset,
                    len: record.len,
                },
            }),
            Ok(None) if self.iterable => {
                self.iteration_end = true;
                self.send(&FromWorker::Exhausted { seq })
            }
            Ok(None) => Err(PyRuntimeError::new_err("map-style fetch ended")),
            Err(e)
                if self.iterable && e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) =>
            {
                self.iteration_end = true;
                self.send(&FromWorker::Exhausted { seq })
            }
            Err(e) => {
                let payload = self.wrap(py, e)?;
                self.send(&FromWorker::Error { seq, payload })
            }
        }
    }
}

/// Serves tasks until the main process says stop or goes away.
#[pyfunction]
#[pyo3(signature = (fd, *, dataset, iterable, auto_collation, drop_last, collate_fn, getitems, tensors, main_pid, shm_initial, shm_limit, prefetch_factor, make_iter, wrap_exception, init_exception))]
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
) -> PyResult<()> {
    start_watchdog(main_pid);
    let mut conn = Conn::new(adopt_fd(fd)?);
    let mailbox = match py.detach(|| conn.recv_message_blocking()).map_err(io_err)? {
        None => return Ok(()),
        Some(frame) => match ToWorker::decode(&frame) {
            Ok(ToWorker::Mailbox) => {
                let fd = conn
                    .take_fd()
                    .ok_or_else(|| PyRuntimeError::new_err("mailbox frame without its fd"))?;
                Mailbox::from_fd(fd).map_err(io_err)?
            }
            _ => {
                return Err(PyRuntimeError::new_err(
                    "ferroloader worker: expected the mailbox first",
                ))
            }
        },
    };
    let arena = ArenaWriter::new(shm_initial, shm_limit).map_err(io_err)?;
    let fetcher = Fetcher::new(py, dataset, getitems, tensors, collate_fn, Sink::Deferred)?;
    let mut w = Worker {
        budget: RecordBudget::new(prefetch_factor),
        conn,
        mailbox,
        buf: Vec::new(),
        arena,
        fetcher,
        iterable,
        auto_collation,
        drop_last,
        make_iter,
        wrap_exception,
        iterator: None,
        init_exception,
        ended: false,
        iteration_end: false,
    };
    if iterable && w.init_exception.is_none() {
        w.new_iterator(py);
    }
    loop {
        let Some(msg) = w.next_message(py)? else {
            return Ok(());
        };
        let handled = match msg {
            ToWorker::Task { seq, indices } => w.task(py, seq, indices),
            ToWorker::Resume => w.send(&FromWorker::Resumed).map(|()| {
                w.iteration_end = false;
                if w.iterable {
                    w.new_iterator(py);
                }
            }),
            ToWorker::Shutdown => return Ok(()),
            ToWorker::Mailbox => Err(PyRuntimeError::new_err("a second mailbox")),
        };
        match handled {
            Ok(()) => {}
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyConnectionAbortedError>(py) => {
                return Ok(())
            }
            Err(e) => return Err(e),
        }
    }
}
