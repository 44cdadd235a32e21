//! Workers on other machines (Ray actors), as a third host for the same
//! worker loop.
//!
//! - In the actor, [`ActorHost`] runs the worker's host (the same fetch and
//!   Rust collate into the same record format) over an arena of its own,
//!   one call per message; a batch comes back as the record's bytes.
//! - In the training process, a relay thread runs the worker loop
//!   (`crate::worker::serve`: socket, arena, mailbox, as a worker thread
//!   has) with a [`RelayHost`], whose every call goes to the Python relay
//!   (`ferroloader.ray`), which calls the actor. A batch's record bytes are
//!   copied into the relay's arena and handed over as any worker's are:
//!   the scheduler, the window, the order, the state and the decoding are
//!   those of local workers.
//!
//! Tasks and replies cross as plain Python values: a task is `("ints",
//! [i, ...])`, `("int", i)`, `("pickled", bytes)`, `("iterable", n or
//! None)`, `("lane", l)` or `("addresses", [(shard, offset), ...])`; a reply
//! `(kind, payload, state, lane_pos)` with kind `"batch"` (the record's
//! bytes), `"failed"` (a pickled `ExceptionWrapper`), `"exhausted"`,
//! `"need_work"` (`(lane, given)`) or `"tail"` (`(lane, [works])`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::error::Class;
use super::ffi::{adopt_fd, DlView};
use super::worker::{ParkedHost, WorkerSpec};
use crate::ring::{ArenaReader, Segment};
use crate::stats::StageTimes;
use crate::wire::protocol::{LanePos, TaskIndices, Work};
use crate::worker::{serve, Blocking, Config, Host, Records, Reply};

/// A task's indices as Python values (see the module doc).
fn task_to_py<'py>(py: Python<'py>, indices: &TaskIndices) -> PyResult<Bound<'py, PyTuple>> {
    Ok(match indices {
        TaskIndices::Ints(v) => ("ints", v.clone()).into_pyobject(py)?,
        TaskIndices::Int(i) => ("int", *i).into_pyobject(py)?,
        TaskIndices::Pickled(b) => ("pickled", PyBytes::new(py, b)).into_pyobject(py)?,
        TaskIndices::Iterable(n) => ("iterable", *n).into_pyobject(py)?,
        TaskIndices::Lane(l) => ("lane", *l).into_pyobject(py)?,
        TaskIndices::Addresses(a) => ("addresses", a.clone()).into_pyobject(py)?,
    })
}

fn task_from_py(task: &Bound<'_, PyAny>) -> PyResult<TaskIndices> {
    let (kind, value): (String, Bound<'_, PyAny>) = task.extract()?;
    Ok(match kind.as_str() {
        "ints" => TaskIndices::Ints(value.extract()?),
        "int" => TaskIndices::Int(value.extract()?),
        "pickled" => TaskIndices::Pickled(value.extract()?),
        "iterable" => TaskIndices::Iterable(value.extract()?),
        "lane" => TaskIndices::Lane(value.extract()?),
        "addresses" => TaskIndices::Addresses(value.extract()?),
        other => return Err(PyValueError::new_err(format!("a task of kind {other:?}"))),
    })
}

fn work_of((shard, emitted, end): (u32, u64, u64)) -> Work {
    Work {
        shard,
        emitted,
        end,
    }
}

fn times_to_py(t: &StageTimes) -> (u64, u64, u64, u64) {
    (t.fetch, t.collate, t.transfer, t.batches)
}

/// A worker's host in a remote actor: the user's dataset, fetched and
/// collated by the same code as in a worker process, into an arena of its
/// own that it also reads (each batch's record copied out, then released).
#[pyclass(module = "ferroloader._core", unsendable)]
pub struct ActorHost {
    host: ParkedHost,
    records: Records,
    reader: ArenaReader,
}

#[pymethods]
impl ActorHost {
    #[new]
    fn new(py: Python<'_>, spec: WorkerSpec) -> PyResult<Self> {
        let host = ParkedHost::new(py, spec)?;
        let Config {
            shm_initial,
            shm_limit,
            prefetch_factor,
            ..
        } = host.config;
        let records = Records::new(shm_initial, shm_limit, prefetch_factor)?;
        Ok(ActorHost {
            host,
            records,
            reader: ArenaReader::new(),
        })
    }

    /// An epoch begins; what its set-up raised, if it did (a pickled
    /// `ExceptionWrapper`).
    fn start_epoch(&mut self, py: Python<'_>) -> Option<Py<PyBytes>> {
        self.host
            .with(py, |h| {
                h.start_epoch();
                h.setup_error()
            })
            .map(|e| PyBytes::new(py, &e).unbind())
    }

    fn lanes(&mut self, py: Python<'_>, lanes: Vec<u32>, shuffle: bool, block: u64, root: u64) {
        self.host.with(py, |h| h.lanes(lanes, shuffle, block, root))
    }

    fn assign(&mut self, py: Python<'_>, lane: u32, works: Vec<(u32, u64, u64)>, last: bool) {
        let works = works.into_iter().map(work_of).collect();
        self.host.with(py, |h| h.assign(lane, works, last))
    }

    fn hand_back(&mut self, py: Python<'_>, lane: u32) {
        self.host.with(py, |h| h.hand_back(lane))
    }

    /// One task: `(kind, payload, state, lane_pos)` (see the module doc),
    /// and the stage timings it took.
    #[allow(clippy::type_complexity)]
    fn run<'py>(
        &mut self,
        py: Python<'py>,
        task: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyTuple>, (u64, u64, u64, u64))> {
        let indices = task_from_py(task)?;
        let records = &mut self.records;
        let (reply, state, pos, times) = self.host.with(py, |h| -> PyResult<_> {
            let reply = h.run(indices, records)?;
            let (state, pos) = match reply {
                Reply::Batch(_) => (h.state_after_batch()?, h.lane_after_batch()),
                _ => (None, None),
            };
            Ok((reply, state, pos, h.take_times()))
        })?;
        let state = state.map(|s| PyBytes::new(py, &s));
        let pos = pos.map(|(lane, p)| (lane, p.started, p.shard, p.emitted));
        let out = match reply {
            Reply::Batch(r) => {
                let bytes = self.take_record(py, r)?;
                ("batch", bytes, state, pos).into_pyobject(py)?
            }
            Reply::Failed(payload) => {
                ("failed", PyBytes::new(py, &payload), state, pos).into_pyobject(py)?
            }
            Reply::Exhausted => ("exhausted", py.None(), state, pos).into_pyobject(py)?,
            Reply::NeedWork { lane, given } => {
                ("need_work", (lane, given), state, pos).into_pyobject(py)?
            }
            Reply::Tail { lane, works } => {
                let works: Vec<(u32, u64, u64)> =
                    works.iter().map(|w| (w.shard, w.emitted, w.end)).collect();
                ("tail", (lane, works), state, pos).into_pyobject(py)?
            }
        };
        Ok((out, times_to_py(&times)))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.host.traverse(&visit)
    }
}

impl ActorHost {
    /// The published record's bytes, and the record released (this
    /// process reads its own arena: no training process is on this node).
    fn take_record<'py>(
        &mut self,
        py: Python<'py>,
        r: crate::ring::RecordRef,
    ) -> PyResult<Bound<'py, PyBytes>> {
        for (id, fd) in self.records.take_new_segments()? {
            let seg = Segment::from_fd(fd).map_err(|e| {
                PyErr::from(crate::Error::SharedMemory {
                    what: "the actor's arena".into(),
                    source: e,
                })
            })?;
            self.reader.add_segment(id, seg);
        }
        let handle = self
            .reader
            .open(r)
            .ok_or_else(|| Class::Internal.err("the actor's record did not open"))?;
        // dropping the handle releases the record for the writer to reuse
        Ok(PyBytes::new(py, handle.bytes()))
    }
}

/// A reply as it comes from the relay: `(kind, payload, state, lane_pos)`.
type ReplyParts<'py> = (
    String,
    Bound<'py, PyAny>,
    Option<Vec<u8>>,
    Option<(u32, u32, u32, u64)>,
);

/// The training process's side of a remote worker: the worker loop's calls
/// go to `relay` (a Python object, `ferroloader.ray`), a batch's record
/// bytes into this thread's arena.
struct RelayHost<'py> {
    py: Python<'py>,
    relay: Bound<'py, PyAny>,
    state: Option<Vec<u8>>,
    pos: Option<(u32, LanePos)>,
    times: StageTimes,
    setup_error: Option<Vec<u8>>,
}

impl Blocking for RelayHost<'_> {
    fn blocking<R: Send>(&mut self, f: impl FnOnce() -> R + Send) -> R {
        self.py.detach(f)
    }
}

impl RelayHost<'_> {
    fn run_task(&mut self, indices: TaskIndices, records: &mut Records) -> PyResult<Reply> {
        let py = self.py;
        let task = task_to_py(py, &indices)?;
        let (reply, times): (Bound<'_, PyTuple>, (u64, u64, u64, u64)) =
            self.relay.call_method1("run", (task,))?.extract()?;
        self.times.add(&StageTimes {
            fetch: times.0,
            collate: times.1,
            transfer: times.2,
            batches: times.3,
        });
        let (kind, payload, state, pos): ReplyParts<'_> = reply.extract()?;
        self.state = state;
        self.pos = pos.map(|(lane, started, shard, emitted)| {
            (
                lane,
                LanePos {
                    started,
                    shard,
                    emitted,
                },
            )
        });
        Ok(match kind.as_str() {
            "batch" => {
                // bytes, or a uint8 array (Ray's zero-copy view of the
                // object store): copied once, into this relay's arena
                let view;
                let bytes: &[u8] = match payload.cast::<PyBytes>() {
                    Ok(b) => b.as_bytes(),
                    Err(_) => {
                        view = DlView::of_array(&payload).ok_or_else(|| {
                            PyValueError::new_err("a batch that is neither bytes nor an array")
                        })?;
                        view.contiguous_bytes().ok_or_else(|| {
                            PyValueError::new_err("a batch array that is not contiguous")
                        })?
                    }
                };
                let len = bytes.len();
                // (it may wait for records to be released: not with the GIL)
                let r = py.detach(|| records.alloc(len))?;
                records.payload_mut(r).copy_from_slice(bytes);
                records.publish(r);
                Reply::Batch(r)
            }
            "failed" => Reply::Failed(payload.extract()?),
            "exhausted" => Reply::Exhausted,
            "need_work" => {
                let (lane, given) = payload.extract()?;
                Reply::NeedWork { lane, given }
            }
            "tail" => {
                let (lane, works): (u32, Vec<(u32, u64, u64)>) = payload.extract()?;
                Reply::Tail {
                    lane,
                    works: works.into_iter().map(work_of).collect(),
                }
            }
            other => return Err(PyValueError::new_err(format!("a reply of kind {other:?}"))),
        })
    }
}

impl Host for RelayHost<'_> {
    type Error = PyErr;

    fn start_epoch(&mut self) {
        // (a relay that fails here fails the epoch's first task too)
        match self.relay.call_method0("start_epoch") {
            Ok(e) => self.setup_error = e.extract::<Option<Vec<u8>>>().unwrap_or(None),
            Err(e) => self.setup_error = relay_error(self.py, &self.relay, e),
        }
    }

    fn setup_error(&self) -> Option<Vec<u8>> {
        self.setup_error.clone()
    }

    fn run(&mut self, indices: TaskIndices, records: &mut Records) -> PyResult<Reply> {
        if let Some(payload) = self.setup_error.take() {
            return Ok(Reply::Failed(payload));
        }
        match self.run_task(indices, records) {
            Ok(reply) => Ok(reply),
            // the relay's own error (the actors are gone past their
            // restarts, the cluster is unreachable): the task's error
            Err(e) => match relay_error(self.py, &self.relay, e) {
                Some(payload) => Ok(Reply::Failed(payload)),
                None => Err(Class::Internal.err("a remote worker's error could not be wrapped")),
            },
        }
    }

    fn state_after_batch(&mut self) -> PyResult<Option<Vec<u8>>> {
        Ok(self.state.take())
    }

    fn lanes(&mut self, lanes: Vec<u32>, shuffle: bool, block: u64, root: u64) {
        let r = self
            .relay
            .call_method1("lanes", (lanes, shuffle, block, root));
        self.remember(r);
    }

    fn assign(&mut self, lane: u32, works: Vec<Work>, last: bool) {
        let works: Vec<(u32, u64, u64)> =
            works.iter().map(|w| (w.shard, w.emitted, w.end)).collect();
        let r = self.relay.call_method1("assign", (lane, works, last));
        self.remember(r);
    }

    fn hand_back(&mut self, lane: u32) {
        let r = self.relay.call_method1("hand_back", (lane,));
        self.remember(r);
    }

    fn lane_after_batch(&mut self) -> Option<(u32, LanePos)> {
        self.pos.take()
    }

    fn take_times(&mut self) -> StageTimes {
        std::mem::take(&mut self.times)
    }
}

impl RelayHost<'_> {
    /// A control message the relay could not pass on: the next task says
    /// so (the relay keeps what it could not send, and fails the task).
    fn remember(&mut self, r: PyResult<Bound<'_, PyAny>>) {
        if let Err(e) = r {
            self.setup_error = relay_error(self.py, &self.relay, e);
        }
    }
}

/// An error of the relay as a task's failure: the relay wraps it (naming
/// the worker and its node) as a worker's exception is wrapped.
fn relay_error(py: Python<'_>, relay: &Bound<'_, PyAny>, e: PyErr) -> Option<Vec<u8>> {
    relay
        .call_method1("wrap", (e.into_value(py),))
        .and_then(|b| b.extract::<Vec<u8>>())
        .ok()
}

/// A remote worker's relay, run on a thread of the training process: the
/// worker loop over `fd`, its calls sent to `relay`, until the main side
/// stops it. `shm`: `(initial, limit, prefetch_factor, trim)` of the
/// relay's arena.
#[pyfunction]
pub fn relay_loop(
    py: Python<'_>,
    fd: i32,
    relay: Bound<'_, PyAny>,
    shm: (usize, usize, usize, bool),
) -> PyResult<()> {
    let fd = adopt_fd(fd)?;
    let mut host = RelayHost {
        py,
        relay,
        state: None,
        pos: None,
        times: StageTimes::default(),
        setup_error: None,
    };
    let config = Config {
        main_pid: 0,
        shm_initial: shm.0,
        shm_limit: shm.1,
        prefetch_factor: shm.2,
        trim: shm.3,
    };
    serve(&mut host, fd, config)
}
