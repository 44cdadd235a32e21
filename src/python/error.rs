//! Engine errors to Python exceptions, variant by variant, onto the classes
//! of `ferroloader.errors` (each a subclass of what torch raises there).
//! Errors from the user's code are `PyErr`s already and pass untouched.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::wire::transport::Exit;
use crate::Error;

/// ferroloader's exception classes (`python/ferroloader/errors.py`).
#[derive(Clone, Copy, Debug)]
pub enum Class {
    SharedMemory,
    SharedMemoryLimit,
    WorkerDied,
    WorkerTimeout,
    Protocol,
    Config,
    Internal,
    ShardQueue,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::SharedMemory => "SharedMemoryError",
            Class::SharedMemoryLimit => "SharedMemoryLimitError",
            Class::WorkerDied => "WorkerDiedError",
            Class::WorkerTimeout => "WorkerTimeoutError",
            Class::Protocol => "ProtocolError",
            Class::Config => "ConfigError",
            Class::Internal => "InternalError",
            Class::ShardQueue => "ShardQueueError",
        }
    }

    /// An exception of this class with `msg`.
    pub fn err(self, msg: impl Into<String>) -> PyErr {
        let msg = msg.into();
        Python::attach(|py| match self.class(py) {
            Ok(cls) => PyErr::from_type(cls, msg),
            Err(e) => e,
        })
    }

    fn class<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyType>> {
        static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
        let module =
            MODULE.get_or_try_init(py, || py.import("ferroloader.errors").map(Bound::unbind))?;
        Ok(module.bind(py).getattr(self.name())?.cast_into()?)
    }
}

/// Runs `f`; a Rust panic inside it becomes `InternalError` naming `place`
/// (PyO3 would raise `PanicException`, a `BaseException` that `except
/// Exception` does not catch). Every defect should be an error, not a panic:
/// this is the boundary's last line.
pub fn guard<T>(place: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    guard_panic(place, f).0
}

/// [`guard`], also saying whether `f` panicked.
pub fn guard_panic<T>(place: &str, f: impl FnOnce() -> PyResult<T>) -> (PyResult<T>, bool) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => (result, false),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            let msg = format!(
                "ferroloader: {place} failed ({what}); this is a bug in ferroloader: please \
                 report it with this message and the output of `python -m ferroloader`"
            );
            (Err(Class::Internal.err(msg)), true)
        }
    }
}

impl From<crate::scheduler::shards::QueueError> for PyErr {
    fn from(e: crate::scheduler::shards::QueueError) -> PyErr {
        Class::ShardQueue.err(e.0)
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let class = match &e {
            Error::SharedMemory { .. } => Class::SharedMemory,
            Error::ShmLimit(_) => Class::SharedMemoryLimit,
            Error::WorkerDied { exit, pid, worker } => {
                let exit = match exit {
                    Exit::Unknown => exit_from_python(*pid).unwrap_or(Exit::Unknown),
                    known => *known,
                };
                return Class::WorkerDied.err(died_message(*worker, *pid, exit));
            }
            Error::Timeout { .. } => Class::WorkerTimeout,
            Error::Protocol(_) | Error::Corrupt { .. } | Error::Disconnected(_) => Class::Protocol,
            Error::Queue(_) => Class::ShardQueue,
        };
        class.err(e.to_string())
    }
}

/// How a worker the engine could not read the end of ended, as its
/// `multiprocessing.Process` says (`ferroloader.hosts.local.exit_code`).
fn exit_from_python(pid: i32) -> Option<Exit> {
    Python::attach(|py| -> PyResult<Option<i32>> {
        py.import("ferroloader.hosts.local")?
            .call_method1("exit_code", (pid,))?
            .extract()
    })
    .ok()
    .flatten()
    .map(|code| {
        if code < 0 {
            Exit::Signal(-code)
        } else {
            Exit::Code(code)
        }
    })
}

/// torch's message for a dead worker, the signal named as Python names it.
fn died_message(worker: usize, pid: i32, exit: Exit) -> String {
    let Exit::Signal(sig) = exit else {
        return Error::WorkerDied { worker, pid, exit }.to_string();
    };
    let name = Python::attach(|py| -> PyResult<String> {
        py.import("signal")?
            .call_method1("strsignal", (sig,))?
            .extract()
    })
    .unwrap_or_else(|_| format!("signal {sig}"));
    let mut m = format!("DataLoader worker (pid {pid}) is killed by signal: {name}. ");
    if sig == rustix::process::Signal::BUS.as_raw() {
        m.push_str(
            "It is possible that dataloader's workers are out of shared memory. \
             Please try to raise your shared memory limit.",
        );
    }
    m
}
