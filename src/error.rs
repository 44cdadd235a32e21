//! The engine's errors: one enum for everything the engine itself can go
//! wrong with. The bindings map it variant by variant onto ferroloader's
//! exception classes (`ferroloader.errors`), each a subclass of what torch
//! raises in that place; errors in the user's own code never pass through
//! here, they travel as the user's exception.

use std::fmt;
use std::io;

use crate::record::DecodeError;
use crate::ring::ArenaError;
use crate::wire::transport::Exit;

#[derive(Debug)]
pub enum Error {
    /// Shared memory (a mailbox or an arena segment) could not be created
    /// or mapped.
    SharedMemory { what: String, source: io::Error },
    /// A worker's arena reached its share of `FERROLOADER_SHM_LIMIT`.
    ShmLimit(ArenaError),
    /// A worker process ended while the loader still expected it to answer.
    WorkerDied { worker: usize, pid: i32, exit: Exit },
    /// No batch arrived within the loader's `timeout`, as the user wrote it.
    Timeout { after: String },
    /// A message or record from the other side does not parse.
    Protocol(DecodeError),
    /// What worker `worker` put in shared memory (its mailbox or a record)
    /// is inconsistent: the batch is lost, nothing outside the memory is read.
    Corrupt { worker: usize, what: DecodeError },
    /// The connection to the other process failed (not a clean close).
    Disconnected(io::Error),
    /// The job's shared shard queue failed (its store is gone), as it says.
    Queue(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::SharedMemory { what, source } => {
                write!(
                    f,
                    "ferroloader: cannot create shared memory for {what} ({source})"
                )?;
                if source.raw_os_error() == Some(rustix::io::Errno::NOSYS.raw_os_error()) {
                    write!(
                        f,
                        "; loading with workers (worker processes or worker threads: their \
                         batches travel through memfd shared memory) needs Linux 3.17 or later \
                         (memfd_create); use num_workers=0"
                    )?;
                }
                Ok(())
            }
            Error::ShmLimit(e) => write!(
                f,
                "{e} (FERROLOADER_SHM_LIMIT is the loader's total, split evenly across its workers)"
            ),
            // Torch's wording for a dead worker; the signal's name is the
            // bindings' to add (they ask Python's `signal.strsignal`).
            Error::WorkerDied { worker, pid, exit } => match exit {
                Exit::Thread => write!(
                    f,
                    "DataLoader worker thread {worker} exited unexpectedly (its exception, \
                     if any, was printed by threading.excepthook)"
                ),
                // (torch's words where it cannot tell how: a worker of a
                // fork server, reaped by that server)
                Exit::Unknown => write!(f, "DataLoader worker (pid(s) {pid}) exited unexpectedly"),
                Exit::Signal(sig) => {
                    write!(
                        f,
                        "DataLoader worker (pid {pid}) is killed by signal {sig}."
                    )
                }
                Exit::Code(code) => write!(
                    f,
                    "DataLoader worker (pid {pid}) exited unexpectedly with exit code {code}. \
                     Details are lost due to multiprocessing. Rerunning with num_workers=0 may \
                     give better error trace."
                ),
            },
            Error::Timeout { after } => write!(f, "DataLoader timed out after {after} seconds"),
            Error::Protocol(e) => write!(f, "{e}"),
            Error::Corrupt { worker, what } => write!(
                f,
                "ferroloader: DataLoader worker {worker} wrote inconsistent shared memory \
                 ({what}); its batch is lost and the iterator stops"
            ),
            Error::Disconnected(e) => write!(f, "ferroloader: lost contact with a worker: {e}"),
            Error::Queue(what) => f.write_str(what),
        }
    }
}

impl From<crate::scheduler::shards::QueueError> for Error {
    fn from(e: crate::scheduler::shards::QueueError) -> Error {
        Error::Queue(e.0)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::SharedMemory { source, .. } => Some(source),
            Error::ShmLimit(e) => Some(e),
            Error::Protocol(e) | Error::Corrupt { what: e, .. } => Some(e),
            Error::Disconnected(e) => Some(e),
            Error::WorkerDied { .. } | Error::Timeout { .. } | Error::Queue(_) => None,
        }
    }
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        Error::Protocol(e)
    }
}

impl From<ArenaError> for Error {
    fn from(e: ArenaError) -> Self {
        match e {
            ArenaError::Io(source) => Error::SharedMemory {
                what: "a worker's arena".into(),
                source,
            },
            limit => Error::ShmLimit(limit),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enosys_names_the_kernel_and_other_errnos_do_not() {
        let nosys = Error::SharedMemory {
            what: "worker 0".into(),
            source: io::Error::from_raw_os_error(rustix::io::Errno::NOSYS.raw_os_error()),
        };
        assert!(nosys.to_string().contains("Linux 3.17"));
        // thread workers need it too: the text is not of processes alone
        assert!(nosys.to_string().contains("loading with workers"));
        assert!(!nosys.to_string().contains("multi-process"));
        let mfile = Error::SharedMemory {
            what: "worker 0".into(),
            source: io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error()),
        };
        assert!(!mfile.to_string().contains("Linux 3.17"));
    }

    #[test]
    fn a_dead_worker_is_named_with_torch_wording() {
        let e = Error::WorkerDied {
            worker: 1,
            pid: 42,
            exit: Exit::Code(3),
        };
        assert!(e
            .to_string()
            .starts_with("DataLoader worker (pid 42) exited unexpectedly with exit code 3."));
    }
}
