//! The DLPack C ABI (v0.8, unversioned `DLManagedTensor`): how tensors cross
//! between torch or numpy and the engine without a copy. An FFI edge, so
//! `unsafe` is allowed here; every block says why it is sound.
//!
//! - [`export`]: a `DLManagedTensor` over memory the engine owns, with an
//!   `owner` that keeps that memory alive until the consumer calls the
//!   deleter (torch does when the tensor's storage dies).
//! - [`TensorView`]: a read-only look at a `DLManagedTensor` someone else
//!   produced, for as long as its producer keeps it alive.
//!
//! Wrapping these in a `PyCapsule` is the bindings' (`python::ffi`).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr::NonNull;

pub use crate::record::DlDtype;

/// `kDLCPU`.
pub const DL_CPU: i32 = 1;

#[repr(C)]
pub struct DlDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
pub struct DlTensor {
    pub data: *mut c_void,
    pub device: DlDevice,
    pub ndim: i32,
    pub dtype: DlDtype,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
pub struct DlManagedTensor {
    pub dl_tensor: DlTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
pub struct DlPackVersion {
    pub major: u32,
    pub minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack 1.x): what `__dlpack__(max_version=
/// (1, 0))` hands over, the only form in which numpy exports a read-only
/// array (memory maps, `np.asarray(PIL.Image)`).
#[repr(C)]
pub struct DlManagedTensorVersioned {
    pub version: DlPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DlTensor,
}

/// What an exported tensor owns: its shape and whatever keeps the memory
/// alive (`owner`), dropped by the deleter.
///
/// Invariant: `managed` is the first field, so a `*mut DlManagedTensor`
/// handed to a consumer is also a `*mut Exported`; `managed.dl_tensor.shape`
/// points into `shape`, whose heap buffer never moves.
#[repr(C)]
struct Exported {
    managed: DlManagedTensor,
    shape: Vec<i64>,
    owner: Box<dyn Send>,
}

/// The deleter of tensors made by [`export`].
///
/// # Safety
/// `managed` is null or a pointer [`export`] returned that nothing has
/// freed yet (the DLPack contract: the consumer calls it once).
unsafe extern "C" fn exported_deleter(managed: *mut DlManagedTensor) {
    if !managed.is_null() {
        // SAFETY: only tensors made by `export` use this deleter, and their
        // DLManagedTensor is the first field of a leaked Box<Exported>
        // (struct invariant); the consumer calls it once.
        drop(unsafe { Box::from_raw(managed as *mut Exported) });
    }
}

/// A CPU tensor of `shape` and `dtype`, contiguous, over the bytes at
/// `data`. Making one is safe; using it is the consumer's side of the
/// contract: the memory must hold `shape` of `dtype` for as long as the
/// tensor lives, which `owner` (dropped by the deleter) is there to ensure.
/// Whoever holds the pointer must call its deleter exactly once.
pub fn export(
    data: *mut u8,
    shape: &[i64],
    dtype: DlDtype,
    owner: Box<dyn Send>,
) -> NonNull<DlManagedTensor> {
    let mut exported = Box::new(Exported {
        managed: DlManagedTensor {
            dl_tensor: DlTensor {
                data: data.cast(),
                device: DlDevice {
                    device_type: DL_CPU,
                    device_id: 0,
                },
                ndim: shape.len() as i32,
                dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(exported_deleter),
        },
        shape: shape.to_vec(),
        owner,
    });
    exported.managed.dl_tensor.shape = exported.shape.as_mut_ptr();
    NonNull::from(Box::leak(exported)).cast()
}

/// Calls a managed tensor's deleter (the producer frees what it owns).
///
/// # Safety
/// `managed` points at a live `DLManagedTensor` whose deleter has not been
/// called, and nothing uses it afterwards.
// SAFETY: unsafe to call: a deleter run twice, or on a tensor still in use,
// frees memory twice or under its reader. Callers: the capsule destructor
// and `export_capsule`'s failure path, each on a tensor it holds alone.
pub unsafe fn release(managed: NonNull<DlManagedTensor>) {
    // SAFETY: the caller guarantees a live, not yet released tensor.
    unsafe {
        if let Some(deleter) = (*managed.as_ptr()).deleter {
            deleter(managed.as_ptr());
        }
    }
}

/// A read-only view of a DLPack tensor.
///
/// Invariant: `t` is a valid `DLTensor` whose shape, strides and data stay
/// alive and unmoved for `'a` (the creator's promise in [`TensorView::new`]).
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    t: &'a DlTensor,
}

impl<'a> TensorView<'a> {
    /// # Safety
    /// `managed` points at a `DLManagedTensor` that its producer keeps alive,
    /// with its memory unchanged, for all of `'a`.
    // SAFETY: unsafe to call: the view borrows the producer's memory for
    // 'a with no owner to hold it; callers keep the capsule or tensor alive.
    pub unsafe fn new(managed: NonNull<DlManagedTensor>) -> TensorView<'a> {
        // SAFETY: the caller's promise: `managed` is live and unchanged for 'a.
        let t = unsafe { &(*managed.as_ptr()).dl_tensor };
        TensorView { t }
    }

    /// A view of a versioned tensor; `None` for a major version other than
    /// 1 (its layout past `version` is not known).
    ///
    /// # Safety
    /// As for [`TensorView::new`].
    // SAFETY: unsafe to call, as `new`.
    pub unsafe fn new_versioned(
        managed: NonNull<DlManagedTensorVersioned>,
    ) -> Option<TensorView<'a>> {
        // SAFETY: the caller's promise: `managed` is live and unchanged for
        // 'a; `version` is the first field of every DLPack 1.x layout.
        let m = unsafe { &*managed.as_ptr() };
        (m.version.major == 1).then_some(TensorView { t: &m.dl_tensor })
    }

    pub fn dtype(&self) -> DlDtype {
        self.t.dtype
    }

    pub fn device_type(&self) -> i32 {
        self.t.device.device_type
    }

    pub fn shape(&self) -> &'a [i64] {
        if self.t.ndim <= 0 || self.t.shape.is_null() {
            return &[];
        }
        // SAFETY: DLPack guarantees `shape` holds `ndim` int64s that live as
        // long as the managed tensor (struct invariant).
        unsafe { std::slice::from_raw_parts(self.t.shape, self.t.ndim as usize) }
    }

    fn strides(&self) -> Option<&'a [i64]> {
        if self.t.ndim <= 0 || self.t.strides.is_null() {
            return None;
        }
        // SAFETY: as for `shape`; a null pointer (compact layout) is handled above.
        Some(unsafe { std::slice::from_raw_parts(self.t.strides, self.t.ndim as usize) })
    }

    pub fn numel(&self) -> usize {
        self.shape().iter().map(|&d| d.max(0) as usize).product()
    }

    /// Row-major with no gaps (size-1 dimensions may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let Some(strides) = self.strides() else {
            return true;
        };
        let mut expected = 1i64;
        for (&d, &s) in self.shape().iter().zip(strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// The element bytes, if the tensor is contiguous CPU memory.
    pub fn contiguous_bytes(&self) -> Option<&'a [u8]> {
        if self.device_type() != DL_CPU || !self.is_contiguous() {
            return None;
        }
        let len = self.numel().checked_mul(self.dtype().itemsize())?;
        if len == 0 {
            return Some(&[]);
        }
        if self.t.data.is_null() {
            return None;
        }
        // SAFETY: a contiguous CPU tensor of `numel` elements of `itemsize`
        // bytes starts at data + byte_offset (DLPack); the memory is alive
        // and unchanged for 'a (struct invariant) and only read here.
        Some(unsafe {
            std::slice::from_raw_parts(
                (self.t.data as *const u8).add(self.t.byte_offset as usize),
                len,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const F32: DlDtype = DlDtype {
        code: 2,
        bits: 32,
        lanes: 1,
    };

    #[test]
    fn an_export_reads_back_and_its_deleter_drops_the_owner() {
        let mut data: Vec<u8> = (0..24).collect();
        let alive = Arc::new(());
        let t = export(
            data.as_mut_ptr(),
            &[2, 3],
            F32,
            Box::new(Arc::clone(&alive)),
        );
        // SAFETY: `t` is alive until `release` below and `data` outlives it.
        let view = unsafe { TensorView::new(t) };
        assert_eq!(view.shape(), &[2, 3]);
        assert_eq!(view.dtype(), F32);
        assert!(view.is_contiguous());
        assert_eq!(view.contiguous_bytes().unwrap(), &data[..]);
        assert_eq!(Arc::strong_count(&alive), 2);
        // SAFETY: released once, not used afterwards.
        unsafe { release(t) };
        assert_eq!(Arc::strong_count(&alive), 1);
    }

    #[test]
    fn a_strided_tensor_is_not_contiguous() {
        let mut data = vec![0u8; 64];
        let t = export(data.as_mut_ptr(), &[2, 2], F32, Box::new(()));
        let mut strides = [1i64, 2];
        // SAFETY: `t` is ours and alive; we point its strides at a local that
        // outlives every use below, before anything reads them.
        unsafe { (*t.as_ptr()).dl_tensor.strides = strides.as_mut_ptr() };
        // SAFETY: `t` is alive until `release` below.
        let view = unsafe { TensorView::new(t) };
        assert!(!view.is_contiguous());
        assert!(view.contiguous_bytes().is_none());
        // SAFETY: released once, not used afterwards.
        unsafe { release(t) };
    }
}
