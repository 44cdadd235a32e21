//! A model of the CUDA runtime's part in pinned arenas, for tests on
//! machines without a GPU: registered ranges, streams as queues of
//! asynchronous host-to-device copies that run when the test says so, and
//! events that pass when their stream has run that far. Its copies read
//! host memory by raw address, as the GPU's copy engine does, which makes
//! this an FFI edge: `unsafe` is allowed here, each block says why it is
//! sound.
//!
//! A copy from memory that is not registered runs at once, as CUDA stages
//! a copy from pageable memory before the call returns; a copy from
//! registered memory reads it only when its stream runs, so a record reused
//! too early shows up as a torn batch.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::pin::{Fence, HostRuntime, StreamId};

struct HostCopy {
    src: usize,
    len: usize,
    out: Option<Vec<u8>>,
}

enum Op {
    /// A copy: an index into `State::copies`.
    Copy(usize),
    /// `wait_stream`: the queue goes on only once that stream has run that
    /// many operations.
    Wait(StreamId, usize),
}

#[derive(Default)]
struct StreamQueue {
    ops: Vec<Op>,
    ran: usize,
}

#[derive(Default)]
struct State {
    registered: Vec<(usize, usize)>,
    register_calls: Vec<(usize, usize)>,
    unregister_calls: Vec<usize>,
    fail_register: bool,
    copies: Vec<HostCopy>,
    streams: HashMap<StreamId, StreamQueue>,
    /// Fences: per stream, the queue length when taken.
    fences: Vec<Vec<(StreamId, usize)>>,
}

impl State {
    fn is_registered(&self, ptr: usize, len: usize) -> bool {
        self.registered
            .iter()
            .any(|&(p, l)| ptr >= p && ptr.saturating_add(len) <= p + l)
    }

    /// Reads `len` bytes at `ptr` if they lie in a registered range.
    /// Called with the state locked, so no registration can be undone (and
    /// its memory unmapped) meanwhile.
    fn read_registered(&self, ptr: usize, len: usize) -> Option<Vec<u8>> {
        // SAFETY: the range is registered (checked first), and a registered
        // arena segment stays mapped until `unregister`, which needs this
        // state's lock, held here. A concurrent write by a worker (the torn
        // batch this model exists to show) can only change the values read.
        self.is_registered(ptr, len)
            .then(|| unsafe { copy_host(ptr, len) })
    }
}

#[derive(Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
    ran: Condvar,
}

impl FakeRuntime {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until each stream in `marks` has run that many operations.
    fn wait_until<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        marks: &[(StreamId, usize)],
    ) -> MutexGuard<'a, State> {
        while !marks
            .iter()
            .all(|(s, n)| st.streams.get(s).map_or(0, |q| q.ran) >= *n)
        {
            st = self.ran.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st
    }
}

impl HostRuntime for FakeRuntime {
    fn register(&self, ptr: *mut u8, len: usize) -> Result<i32, String> {
        let mut st = self.lock();
        if st.fail_register {
            return Err("cudaHostRegister failed: operation not supported (fake runtime)".into());
        }
        st.registered.push((ptr as usize, len));
        st.register_calls.push((ptr as usize, len));
        Ok(0)
    }

    fn unregister(&self, ptr: *mut u8, _device: i32) {
        let mut st = self.lock();
        st.registered.retain(|&(p, _)| p != ptr as usize);
        st.unregister_calls.push(ptr as usize);
    }

    fn fence(&self, streams: &[StreamId]) -> Result<Fence, String> {
        let mut st = self.lock();
        let marks = streams
            .iter()
            .map(|s| (*s, st.streams.get(s).map_or(0, |q| q.ops.len())))
            .collect();
        st.fences.push(marks);
        Ok(Fence(vec![(0, (st.fences.len() - 1) as u64)]))
    }

    fn wait(&self, fence: Fence) -> Result<(), String> {
        let mut st = self.lock();
        for (_, id) in fence.0 {
            let marks = st.fences[id as usize].clone();
            st = self.wait_until(st, &marks);
        }
        Ok(())
    }

    fn synchronize(&self, devices: &[i32]) -> Result<(), String> {
        let st = self.lock();
        let marks: Vec<_> = st
            .streams
            .iter()
            .filter(|(s, _)| devices.contains(&s.device))
            .map(|(s, q)| (*s, q.ops.len()))
            .collect();
        drop(self.wait_until(st, &marks));
        Ok(())
    }
}

/// `ferroloader._core._FakeCudaRuntime`: see the module doc.
#[pyclass(frozen, module = "ferroloader._core", name = "_FakeCudaRuntime")]
pub struct FakeCudaRuntime {
    pub runtime: Arc<FakeRuntime>,
    /// `(device, stream)`: what the test says is torch's current stream.
    current: Mutex<Option<(i32, u64)>>,
}

#[pymethods]
impl FakeCudaRuntime {
    #[new]
    fn new() -> Self {
        FakeCudaRuntime {
            runtime: Arc::new(FakeRuntime::default()),
            current: Mutex::new(Some((0, 0))),
        }
    }

    /// The current stream as the loader sees it (`None`: cannot tell).
    #[getter]
    fn get_current(&self) -> Option<(i32, u64)> {
        *self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[setter]
    fn set_current(&self, value: Option<(i32, u64)>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = value;
    }

    /// Registration fails from now on (`True`), as on a system that
    /// refuses to page-lock shared memory.
    fn fail_registration(&self, fail: bool) {
        self.runtime.lock().fail_register = fail;
    }

    /// Queues a copy of `nbytes` at `ptr` (a tensor's `data_ptr()`) on
    /// `stream`; from unregistered memory it runs at once. Returns its id.
    #[pyo3(signature = (ptr, nbytes, stream, device=0))]
    fn copy_async(&self, ptr: usize, nbytes: usize, stream: u64, device: i32) -> usize {
        let mut st = self.runtime.lock();
        let out = (!st.is_registered(ptr, nbytes)).then(|| {
            // SAFETY: memory the fake did not register is the caller's
            // tensor (its `data_ptr()`, `nbytes` long), kept alive by the
            // caller for this call, as a real copy from pageable memory
            // needs; it is read at once.
            unsafe { copy_host(ptr, nbytes) }
        });
        let id = st.copies.len();
        st.copies.push(HostCopy {
            src: ptr,
            len: nbytes,
            out,
        });
        if st.copies[id].out.is_none() {
            st.streams
                .entry(StreamId { device, stream })
                .or_default()
                .ops
                .push(Op::Copy(id));
        }
        id
    }

    /// `stream.wait_stream(other)`: work queued on `stream` from now on
    /// runs only after what is queued on `other` now.
    #[pyo3(signature = (stream, other, device=0))]
    fn wait_stream(&self, stream: u64, other: u64, device: i32) {
        let mut st = self.runtime.lock();
        let other = StreamId {
            device,
            stream: other,
        };
        let n = st.streams.get(&other).map_or(0, |q| q.ops.len());
        st.streams
            .entry(StreamId { device, stream })
            .or_default()
            .ops
            .push(Op::Wait(other, n));
    }

    /// Runs what is queued on `stream`, up to a `wait_stream` whose other
    /// stream has not run far enough (its events pass as it goes).
    #[pyo3(signature = (stream, device=0))]
    fn run(&self, py: Python<'_>, stream: u64, device: i32) {
        py.detach(|| {
            let mut st = self.runtime.lock();
            let key = StreamId { device, stream };
            while let Some(q) = st.streams.get(&key) {
                let Some(op) = q.ops.get(q.ran) else {
                    break;
                };
                match *op {
                    Op::Wait(other, n) => {
                        if st.streams.get(&other).map_or(0, |q| q.ran) < n {
                            break;
                        }
                    }
                    Op::Copy(c) => {
                        let (src, len) = (st.copies[c].src, st.copies[c].len);
                        // empty if unregistered meanwhile (nothing kept it)
                        let bytes = st.read_registered(src, len).unwrap_or_default();
                        st.copies[c].out = Some(bytes);
                    }
                }
                if let Some(q) = st.streams.get_mut(&key) {
                    q.ran += 1;
                }
            }
            self.runtime.ran.notify_all();
        });
    }

    /// The bytes a copy read (`None` while its stream has not run it).
    fn result<'py>(&self, py: Python<'py>, op: usize) -> Option<Bound<'py, PyBytes>> {
        let st = self.runtime.lock();
        st.copies
            .get(op)
            .and_then(|c| c.out.as_ref())
            .map(|b| PyBytes::new(py, b))
    }

    /// Ranges registered now, as `(address, length)`.
    #[getter]
    fn registered(&self) -> Vec<(usize, usize)> {
        self.runtime.lock().registered.clone()
    }

    /// Every `register` call so far, as `(address, length)`.
    #[getter]
    fn register_calls(&self) -> Vec<(usize, usize)> {
        self.runtime.lock().register_calls.clone()
    }

    /// Every `unregister` call so far (addresses).
    #[getter]
    fn unregister_calls(&self) -> Vec<usize> {
        self.runtime.lock().unregister_calls.clone()
    }

    /// Fences taken so far.
    #[getter]
    fn fences(&self) -> usize {
        self.runtime.lock().fences.len()
    }
}

/// The `len` bytes at `ptr`, copied out.
///
/// # Safety
/// `ptr..ptr+len` must be readable memory that stays mapped for the call.
// SAFETY: unsafe to call: `ptr` is an address from Python, unchecked; its
// callers pass a registered range or the calling tensor's own bytes.
unsafe fn copy_host(ptr: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    if len > 0 {
        // SAFETY: the caller's promise: `len` readable bytes at `ptr`.
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr(), len) };
    }
    out
}
