//! `PinArena`: one multi-process iterator's pinned arenas ([`Pinning`])
//! over the CUDA runtime torch loaded (or, in test builds, the fake runtime of `crate::doubles`), and
//! the host's part of the reuse guard: at each `next()` of the training
//! loop, asking torch for its current stream and fencing what was freed
//! since ([`Pinning::tick`]).

use std::sync::Arc;

use pyo3::prelude::*;

use super::error::Class;
use crate::pin::cuda::CudaRuntime;
use crate::pin::{HostRuntime, Pinning, StreamId};
use crate::ring::{page_size, Segment};

/// See [`PinArena::counts`].
pub type PinCountsTuple = (u64, u64, u64, u64, u64, u64);

pub fn counts_tuple(p: &Pinning) -> PinCountsTuple {
    let c = p.counts();
    (
        c.segments,
        c.bytes,
        c.failed,
        c.fenced,
        c.synchronized,
        c.unfenced,
    )
}

#[pyclass(frozen, module = "ferroloader._core")]
pub struct PinArena {
    pub pinning: Arc<Pinning>,
    runtime: Arc<dyn HostRuntime>,
    /// `() -> [(device, raw stream), ...]`: torch's current stream on each
    /// device in use.
    stream_fn: Py<PyAny>,
}

/// `stream_fn()` as [`StreamId`]s (none if it fails).
fn current_streams(py: Python<'_>, stream_fn: &Py<PyAny>) -> Vec<StreamId> {
    let got: Option<Vec<(i32, u64)>> = stream_fn
        .bind(py)
        .call0()
        .ok()
        .and_then(|v| v.extract().ok());
    got.unwrap_or_default()
        .into_iter()
        .map(|(device, stream)| StreamId { device, stream })
        .collect()
}

impl PinArena {
    pub(crate) fn with_runtime(
        runtime: Arc<dyn HostRuntime>,
        stream_fn: Py<PyAny>,
        guard: bool,
    ) -> Self {
        let pinning = Pinning::new(Arc::clone(&runtime), guard);
        PinArena {
            pinning,
            runtime,
            stream_fn,
        }
    }
}

#[pymethods]
impl PinArena {
    /// Pinned arenas over the CUDA runtime library at `library` (the one
    /// torch loaded). `stream_fn() -> [(device, raw stream), ...]` reports
    /// torch's current stream on each device in use.
    #[staticmethod]
    #[pyo3(signature = (library, stream_fn, guard=true))]
    fn cuda(library: &str, stream_fn: Py<PyAny>, guard: bool) -> PyResult<Self> {
        let rt = CudaRuntime::open(library).map_err(|e| Class::Config.err(e))?;
        Ok(Self::with_runtime(Arc::new(rt), stream_fn, guard))
    }

    /// Registers and unregisters one page of shared memory, as the arenas
    /// will be: `None` if that works, else why not (the loader then pins
    /// on a background thread instead).
    fn check(&self, py: Python<'_>) -> Option<String> {
        let runtime = Arc::clone(&self.runtime);
        py.detach(move || {
            let seg = match Segment::create(page_size()) {
                Ok(s) => s,
                Err(e) => return Some(format!("shared memory: {e}")),
            };
            match runtime.register(seg.as_ptr(), seg.len()) {
                Ok(device) => {
                    runtime.unregister(seg.as_ptr(), device);
                    None
                }
                Err(e) => Some(e),
            }
        })
    }

    /// `(segments, bytes, failed, fenced, synchronized, unfenced)`:
    /// segments registered and their bytes, registrations that failed,
    /// records released after a fence, after a device synchronization, and
    /// without either (a failed device).
    #[getter]
    fn counts(&self) -> PinCountsTuple {
        counts_tuple(&self.pinning)
    }

    /// The training loop's `next()` (called by the iterator; when a pin
    /// thread takes the batches from the engine, by the loop's own
    /// `next()`): the current streams join those fences cover, and the
    /// records freed since the last tick go to the reaper.
    pub fn tick(&self, py: Python<'_>) {
        let current = current_streams(py, &self.stream_fn);
        self.pinning.tick(&current);
    }

    /// The iterator is closing: records freed from now on are fenced as
    /// they are freed (there will be no next `next()`).
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.pinning.close());
    }

    /// The first registration error, if one failed.
    #[getter]
    fn first_error(&self) -> Option<String> {
        self.pinning.first_error()
    }

    /// The `(device, stream)` pairs every fence covers.
    #[getter]
    fn streams(&self) -> Vec<(i32, u64)> {
        self.pinning
            .streams()
            .into_iter()
            .map(|s| (s.device, s.stream))
            .collect()
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.stream_fn)
    }
}
