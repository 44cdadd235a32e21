//! [`HostRuntime`] over the CUDA runtime library torch has already loaded
//! (`libcudart.so.*`, found by the bindings in the process's mappings): no
//! CUDA dependency at build time, and the same runtime, contexts and
//! devices torch uses. An FFI edge, so `unsafe` is allowed here; every
//! block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use libloading::Library;

use super::{Fence, HostRuntime, StreamId};

type CudaError = c_int;
const SUCCESS: CudaError = 0;
/// `cudaHostRegisterPortable`: pinned for every context, so a copy to any
/// device sees the memory as page-locked.
const HOST_REGISTER_PORTABLE: c_uint = 0x01;
/// `cudaEventBlockingSync | cudaEventDisableTiming`: the reaper sleeps in
/// `cudaEventSynchronize` instead of spinning, and the event is cheap.
const EVENT_FLAGS: c_uint = 0x01 | 0x02;
/// `cudaStreamCaptureModeRelaxed`: this thread's calls do not invalidate a
/// CUDA graph another thread is capturing (as torch's own allocator does).
const CAPTURE_MODE_RELAXED: c_int = 2;

type HostRegisterFn = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CudaError;
type HostUnregisterFn = unsafe extern "C" fn(*mut c_void) -> CudaError;
type EventCreateFn = unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CudaError;
type EventRecordFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> CudaError;
type EventFn = unsafe extern "C" fn(*mut c_void) -> CudaError;
type GetDeviceFn = unsafe extern "C" fn(*mut c_int) -> CudaError;
type SetDeviceFn = unsafe extern "C" fn(c_int) -> CudaError;
type StreamIsCapturingFn = unsafe extern "C" fn(*mut c_void, *mut c_int) -> CudaError;
type GetLastErrorFn = unsafe extern "C" fn() -> CudaError;
type GetErrorStringFn = unsafe extern "C" fn(CudaError) -> *const c_char;
type ExchangeCaptureModeFn = unsafe extern "C" fn(*mut c_int) -> CudaError;
type DeviceSynchronizeFn = unsafe extern "C" fn() -> CudaError;

/// The CUDA runtime's entry points, resolved once.
pub struct CudaRuntime {
    host_register: HostRegisterFn,
    host_unregister: HostUnregisterFn,
    event_create: EventCreateFn,
    event_record: EventRecordFn,
    event_synchronize: EventFn,
    event_destroy: EventFn,
    get_device: GetDeviceFn,
    set_device: SetDeviceFn,
    stream_is_capturing: StreamIsCapturingFn,
    get_last_error: GetLastErrorFn,
    get_error_string: GetErrorStringFn,
    exchange_capture_mode: ExchangeCaptureModeFn,
    device_synchronize: DeviceSynchronizeFn,
    // Keeps the library loaded while the function pointers above are used
    // (declared last: dropped after them, though they are plain pointers).
    _lib: Library,
}

/// A symbol of `lib` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the symbol's true C signature.
// SAFETY: unsafe to call: nothing checks `T` against the library's symbol;
// each caller names the CUDA runtime's documented signature.
unsafe fn symbol<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    let bytes: Vec<u8> = name.bytes().chain(std::iter::once(0)).collect();
    // SAFETY: the caller guarantees `T` is the symbol's signature; the
    // pointer is used only while `lib` stays loaded (it is kept with it).
    unsafe { lib.get::<T>(&bytes) }
        .map(|s| *s)
        .map_err(|e| format!("{name}: {e}"))
}

impl CudaRuntime {
    /// Opens the CUDA runtime at `path` (already loaded by torch: opening it
    /// again returns the same library) and resolves what pinning needs.
    pub fn open(path: &str) -> Result<CudaRuntime, String> {
        // SAFETY: loading a shared library runs its initialisers; this one
        // is the CUDA runtime torch has loaded already, so they have run.
        let lib = unsafe { Library::new(path) }.map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: each type alias above is the documented C signature of the
        // CUDA runtime function of that name (cuda_runtime_api.h).
        unsafe {
            Ok(CudaRuntime {
                host_register: symbol(&lib, "cudaHostRegister")?,
                host_unregister: symbol(&lib, "cudaHostUnregister")?,
                event_create: symbol(&lib, "cudaEventCreateWithFlags")?,
                event_record: symbol(&lib, "cudaEventRecord")?,
                event_synchronize: symbol(&lib, "cudaEventSynchronize")?,
                event_destroy: symbol(&lib, "cudaEventDestroy")?,
                get_device: symbol(&lib, "cudaGetDevice")?,
                set_device: symbol(&lib, "cudaSetDevice")?,
                stream_is_capturing: symbol(&lib, "cudaStreamIsCapturing")?,
                get_last_error: symbol(&lib, "cudaGetLastError")?,
                get_error_string: symbol(&lib, "cudaGetErrorString")?,
                exchange_capture_mode: symbol(&lib, "cudaThreadExchangeStreamCaptureMode")?,
                device_synchronize: symbol(&lib, "cudaDeviceSynchronize")?,
                _lib: lib,
            })
        }
    }

    /// `Err` with the runtime's text for a failed call, after clearing the
    /// thread's last error: torch checks `cudaGetLastError()` after its own
    /// kernel launches and must not see ours.
    fn check(&self, what: &str, code: CudaError) -> Result<(), String> {
        if code == SUCCESS {
            return Ok(());
        }
        // SAFETY: cudaGetLastError takes nothing and only resets the
        // calling thread's error state.
        unsafe { (self.get_last_error)() };
        // SAFETY: cudaGetErrorString returns a static NUL-terminated string
        // for any code (an "unrecognized error code" text for unknown ones).
        let text = unsafe { (self.get_error_string)(code) };
        let text = if text.is_null() {
            format!("error {code}")
        } else {
            // SAFETY: non-null, NUL-terminated and static (see above).
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(format!("{what} failed: {text} ({code})"))
    }

    fn current_device(&self) -> Result<c_int, String> {
        let mut dev: c_int = 0;
        // SAFETY: `dev` is a valid out-pointer for one int.
        let code = unsafe { (self.get_device)(&mut dev) };
        self.check("cudaGetDevice", code).map(|()| dev)
    }

    /// Makes `device` current on this thread if it is not.
    fn use_device(&self, device: c_int) -> Result<(), String> {
        if self.current_device()? != device {
            // SAFETY: `device` is an index torch reported; the call only
            // sets this thread's current device.
            self.check("cudaSetDevice", unsafe { (self.set_device)(device) })?;
        }
        Ok(())
    }

    /// Runs `f` in the relaxed stream-capture mode, then restores the
    /// thread's mode.
    fn relaxed<R>(&self, f: impl FnOnce() -> R) -> R {
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a valid in/out pointer to a capture mode.
        let swapped = unsafe { (self.exchange_capture_mode)(&mut mode) } == SUCCESS;
        let out = f();
        if swapped {
            // SAFETY: as above; puts back the mode the thread had.
            unsafe { (self.exchange_capture_mode)(&mut mode) };
        }
        out
    }

    /// One event recorded on `s` (its device made current); `None` for a
    /// stream under graph capture, where a recorded event would become a
    /// graph node instead of marking the stream (a captured copy reads its
    /// source when the graph is replayed, which no fence can cover).
    fn record_on(&self, s: StreamId) -> Result<Option<(i32, u64)>, String> {
        self.use_device(s.device)?;
        let stream = s.stream as usize as *mut c_void;
        let mut capturing: c_int = 0;
        // SAFETY: `stream` is a raw cudaStream_t torch reported for this
        // device (or 0, the legacy default stream), alive while torch uses
        // it; `capturing` is a valid out-pointer.
        let code = unsafe { (self.stream_is_capturing)(stream, &mut capturing) };
        self.check("cudaStreamIsCapturing", code)?;
        if capturing != 0 {
            return Ok(None);
        }
        let mut event: *mut c_void = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-pointer; the flags are documented.
        let code = unsafe { (self.event_create)(&mut event, EVENT_FLAGS) };
        self.check("cudaEventCreateWithFlags", code)?;
        // SAFETY: `event` was just created on this device and `stream`
        // belongs to it (see above).
        let code = unsafe { (self.event_record)(event, stream) };
        if let Err(e) = self.check("cudaEventRecord", code) {
            // SAFETY: `event` is ours and recorded nowhere.
            unsafe { (self.event_destroy)(event) };
            return Err(e);
        }
        Ok(Some((s.device, event as usize as u64)))
    }
}

impl HostRuntime for CudaRuntime {
    fn register(&self, ptr: *mut u8, len: usize) -> Result<i32, String> {
        self.relaxed(|| {
            let device = self.current_device()?;
            // SAFETY: `ptr..ptr+len` is a live shared mapping of the
            // caller's (an arena segment) that stays mapped until
            // `unregister`.
            let code = unsafe { (self.host_register)(ptr.cast(), len, HOST_REGISTER_PORTABLE) };
            self.check("cudaHostRegister", code).map(|()| device)
        })
    }

    fn unregister(&self, ptr: *mut u8, device: i32) {
        self.relaxed(|| {
            let _ = self.use_device(device);
            // SAFETY: `ptr` was registered by `register` and is still mapped.
            let code = unsafe { (self.host_unregister)(ptr.cast()) };
            // Nothing to do about a failure (the process is likely ending).
            let _ = self.check("cudaHostUnregister", code);
        })
    }

    fn fence(&self, streams: &[StreamId]) -> Result<Fence, String> {
        self.relaxed(|| {
            let mut events = Vec::with_capacity(streams.len());
            for &s in streams {
                match self.record_on(s) {
                    Ok(Some(e)) => events.push(e),
                    Ok(None) => {}
                    Err(e) => {
                        let _ = self.wait(Fence(events));
                        return Err(e);
                    }
                }
            }
            Ok(Fence(events))
        })
    }

    fn wait(&self, fence: Fence) -> Result<(), String> {
        self.relaxed(|| {
            let mut result = Ok(());
            for (device, e) in fence.0 {
                let event = e as usize as *mut c_void;
                let _ = self.use_device(device);
                // SAFETY: `event` was created and recorded by `fence` and is
                // destroyed only here, once.
                let code = unsafe { (self.event_synchronize)(event) };
                if let Err(err) = self.check("cudaEventSynchronize", code) {
                    result = result.and(Err(err));
                }
                // SAFETY: as above; nothing uses `event` after this.
                let code = unsafe { (self.event_destroy)(event) };
                let _ = self.check("cudaEventDestroy", code);
            }
            result
        })
    }

    fn synchronize(&self, devices: &[i32]) -> Result<(), String> {
        self.relaxed(|| {
            for &d in devices {
                self.use_device(d)?;
                // SAFETY: takes nothing; waits for the current device.
                let code = unsafe { (self.device_synchronize)() };
                self.check("cudaDeviceSynchronize", code)?;
            }
            Ok(())
        })
    }

    fn reaper_started(&self) {
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a valid in/out pointer; the reaper thread keeps
        // the relaxed mode for its life.
        unsafe { (self.exchange_capture_mode)(&mut mode) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let err = CudaRuntime::open("/nonexistent/libcudart.so.12")
            .err()
            .expect("no such library");
        assert!(err.contains("/nonexistent/libcudart.so.12"), "{err}");
    }

    #[test]
    fn a_library_without_the_runtime_names_the_missing_symbol() {
        // libc is loaded in every process and has no CUDA symbols.
        let err = CudaRuntime::open("libc.so.6")
            .err()
            .expect("not the CUDA runtime");
        assert!(err.contains("cudaHostRegister"), "{err}");
    }
}
