//! The FFI edge: raw memory that crosses between torch/numpy and Rust.
//!
//! What lives here and nowhere else:
//! - [`DlView`]: a read-only view of a tensor or array exported through a
//!   DLPack capsule (`torch._C._to_dlpack(t)`, `ndarray.__dlpack__()`); the
//!   capsule is held for as long as the view, so the producer's memory stays
//!   alive and unmoved.
//! - [`FreshTensor`]: the bytes of a tensor that this crate asked torch to
//!   allocate a moment ago (`torch.empty`, `Generator.get_state()`), written
//!   before any other code can see the tensor.
//! - Tensors exported over memory this crate owns: [`record_leaf_capsule`]
//!   (a batch leaf in the main process) and [`with_tensor_over`] (a scratch
//!   tensor over a record being written in a worker).
//! - [`adopt_fd`]: a descriptor number handed over from Python.
//! - [`import_arrow_stream`], [`import_arrow_array`]: Arrow data handed over
//!   through the Arrow PyCapsule interface (`__arrow_c_stream__`,
//!   `__arrow_c_array__`), moved out of its capsule into arrow-rs.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;
use std::sync::Arc;

use pyo3::ffi as pyffi;
use pyo3::prelude::*;

use super::error::Class;
use crate::pin::Held;
use crate::record::{DecodeError, Leaf};

use crate::dlpack::{self, DlManagedTensor, DlManagedTensorVersioned, TensorView};
pub use crate::dlpack::{DlDtype, DL_CPU};

const DLTENSOR: &CStr = c"dltensor";
const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";

/// A DLPack tensor held open for reading: a capsule and a view of the
/// tensor it holds, which lives as long as the capsule is unconsumed.
pub struct DlView<'py> {
    _capsule: Bound<'py, PyAny>,
    view: TensorView<'py>,
}

impl<'py> DlView<'py> {
    /// The array's own export: `__dlpack__()`, or where that refuses (numpy
    /// exports a read-only array only as a versioned tensor, which carries
    /// the read-only flag) `__dlpack__(max_version=(1, 0))`. `None` where
    /// neither works (numpy before 2.1 for a read-only array).
    pub fn of_array(array: &Bound<'py, PyAny>) -> Option<Self> {
        let py = array.py();
        let name = pyo3::intern!(py, "__dlpack__");
        if let Ok(capsule) = array.call_method0(name) {
            return Self::open(capsule);
        }
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs
            .set_item(pyo3::intern!(py, "max_version"), (1, 0))
            .ok()?;
        let capsule = array.call_method(name, (), Some(&kwargs)).ok()?;
        Self::open(capsule)
    }

    /// Opens a `"dltensor"` or `"dltensor_versioned"` (1.x) capsule; `None`
    /// for anything else (a consumed capsule, any other object).
    pub fn open(capsule: Bound<'py, PyAny>) -> Option<Self> {
        // SAFETY: the GIL is held (we have a Bound) and the pointer is a live
        // object; PyCapsule_IsValid accepts any object and sets no error.
        let valid = unsafe { pyffi::PyCapsule_IsValid(capsule.as_ptr(), DLTENSOR.as_ptr()) };
        if valid == 0 {
            return Self::open_versioned(capsule);
        }
        // SAFETY: validated above as a capsule named "dltensor", so the
        // pointer is, by the DLPack protocol, a DLManagedTensor.
        let managed = unsafe { pyffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr()) };
        let managed = NonNull::new(managed.cast::<DlManagedTensor>())?;
        // SAFETY: the producer frees the tensor only from the capsule's
        // destructor (or a consumer's, after renaming it), which cannot run
        // while we hold `_capsule`, for as long as this view ('py) lives.
        let view = unsafe { TensorView::new(managed) };
        Some(DlView {
            _capsule: capsule,
            view,
        })
    }

    fn open_versioned(capsule: Bound<'py, PyAny>) -> Option<Self> {
        let name = DLTENSOR_VERSIONED.as_ptr();
        // SAFETY: as in `open`.
        if unsafe { pyffi::PyCapsule_IsValid(capsule.as_ptr(), name) } == 0 {
            return None;
        }
        // SAFETY: validated above as a capsule named "dltensor_versioned",
        // so the pointer is, by the DLPack protocol, a
        // DLManagedTensorVersioned.
        let managed = unsafe { pyffi::PyCapsule_GetPointer(capsule.as_ptr(), name) };
        let managed = NonNull::new(managed.cast::<DlManagedTensorVersioned>())?;
        // SAFETY: as in `open`: the producer frees it only from the
        // capsule's destructor, which cannot run while we hold `_capsule`.
        let view = unsafe { TensorView::new_versioned(managed) }?;
        Some(DlView {
            _capsule: capsule,
            view,
        })
    }
}

/// Borrows end with the view: the capsule keeps the memory alive, not 'py.
impl DlView<'_> {
    pub fn dtype(&self) -> DlDtype {
        self.view.dtype()
    }

    pub fn device_type(&self) -> i32 {
        self.view.device_type()
    }

    pub fn shape(&self) -> &[i64] {
        self.view.shape()
    }

    /// The element bytes, if the tensor is contiguous CPU memory.
    pub fn contiguous_bytes(&self) -> Option<&[u8]> {
        self.view.contiguous_bytes()
    }
}

/// A contiguous tensor torch allocated for us a moment ago, whose bytes we
/// fill before handing it on.
///
/// Invariant: `ptr..ptr+len` is the tensor's whole storage, nobody else holds
/// a reference to the tensor, and the tensor (kept in `tensor`) outlives
/// every borrow of the bytes.
pub struct FreshTensor<'py> {
    tensor: Bound<'py, PyAny>,
    ptr: *mut u8,
    len: usize,
}

impl<'py> FreshTensor<'py> {
    /// `torch.empty(shape, dtype=dtype, device="cpu")`, `len` bytes long.
    pub fn empty(
        empty: &Bound<'py, PyAny>,
        shape: &[i64],
        dtype: &Bound<'py, PyAny>,
        itemsize: usize,
    ) -> PyResult<Self> {
        let py = empty.py();
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item(pyo3::intern!(py, "dtype"), dtype)?;
        kwargs.set_item(pyo3::intern!(py, "device"), pyo3::intern!(py, "cpu"))?;
        let size = pyo3::types::PyTuple::new(py, shape)?;
        let tensor = empty.call((size,), Some(&kwargs))?;
        let numel: usize = shape.iter().map(|&d| d as usize).product();
        Self::adopt(tensor, numel * itemsize)
    }

    fn adopt(tensor: Bound<'py, PyAny>, len: usize) -> PyResult<Self> {
        let py = tensor.py();
        let ptr: usize = tensor
            .call_method0(pyo3::intern!(py, "data_ptr"))?
            .extract()?;
        if ptr == 0 && len > 0 {
            return Err(Class::Internal.err("torch returned a null data pointer"));
        }
        Ok(FreshTensor {
            tensor,
            ptr: ptr as *mut u8,
            len,
        })
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: struct invariant: the storage is `len` bytes at `ptr`,
        // exclusively ours, alive while `self.tensor` is; `&mut self` makes
        // this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn into_tensor(self) -> Bound<'py, PyAny> {
        self.tensor
    }
}

/// The destructor of the capsules made by [`export_capsule`].
///
/// # Safety
/// Called by CPython only, with the GIL held and a capsule being destroyed.
unsafe extern "C" fn capsule_destructor(capsule: *mut pyffi::PyObject) {
    // SAFETY: called by CPython with the capsule being destroyed (GIL held).
    // A consumer that took the tensor renamed it "used_dltensor", so only an
    // unconsumed capsule still named "dltensor" owns its tensor here.
    unsafe {
        if pyffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let managed = pyffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            if let Some(managed) = NonNull::new(managed.cast::<DlManagedTensor>()) {
                dlpack::release(managed);
            }
        }
    }
}

/// A `"dltensor"` capsule over the bytes at `data`, a contiguous array of
/// `shape` and `dtype` on the CPU. `owner` is dropped when the consumer
/// (or, unconsumed, the capsule) is done with it.
///
/// # Safety
/// `data` must point at `shape`'s elements of `dtype` (their product times
/// the item size, in bytes), valid for reads and writes and written by no
/// one else for as long as the tensor made from the capsule may be used:
/// either `owner` keeps that memory alive and reserved, or the caller drops
/// the tensor before the memory is reused.
// SAFETY: unsafe to call: the capsule hands `data` to any consumer with no
// borrow to tie it; callers pass memory `owner` keeps reserved.
unsafe fn export_capsule<'py>(
    py: Python<'py>,
    data: *mut u8,
    shape: &[i64],
    dtype: DlDtype,
    owner: Box<dyn Send>,
) -> PyResult<Bound<'py, PyAny>> {
    let managed = dlpack::export(data, shape, dtype, owner);
    // SAFETY: `managed` is a fresh DLManagedTensor; from here the capsule's
    // destructor or the consumer releases it exactly once.
    let capsule = unsafe {
        pyffi::PyCapsule_New(
            managed.as_ptr().cast::<c_void>(),
            DLTENSOR.as_ptr(),
            Some(capsule_destructor),
        )
    };
    if capsule.is_null() {
        // SAFETY: the capsule was not created, so `managed` is still ours
        // and released only here.
        unsafe { dlpack::release(managed) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// A capsule over leaf `leaf` of an opened record, holding a share of the
/// record: the record stays HELD (the worker does not reuse it) and its
/// segment mapped until the last tensor over it is freed.
pub fn record_leaf_capsule<'py>(
    py: Python<'py>,
    record: &Arc<Held>,
    leaf: &Leaf,
) -> PyResult<Bound<'py, PyAny>> {
    let range = leaf.offset as usize..(leaf.offset as usize).saturating_add(leaf.nbytes());
    if range.end > record.len() {
        return Err(crate::Error::from(DecodeError("leaf bounds")).into());
    }
    let ptr = record.as_mut_ptr().wrapping_add(range.start);
    let owner: Box<dyn Send> = Box::new(Arc::clone(record));
    // SAFETY: `ptr..ptr+nbytes` lies inside the record (checked above) and
    // holds the leaf's `shape` of `dtype` (`nbytes` is computed from them);
    // `owner` keeps the record HELD, so the worker writes none of it, and
    // its segment mapped, for as long as the tensor lives.
    unsafe { export_capsule(py, ptr, &leaf.shape, leaf.dtype, owner) }
}

/// Runs `f` with a CPU tensor of `shape` and `dtype` over `dst` (part of a
/// record being written), for torch to write into (`copy_`, `stack(out=)`);
/// `from_dlpack` is torch's.
///
/// The tensor must not outlive `f`: once `f` returns and the tensor is
/// dropped, its storage must be gone. If torch kept it (nothing in this
/// crate's callers does), the process aborts rather than leave a tensor
/// over memory the arena will hand to the main process and reuse.
pub fn with_tensor_over<'py, R>(
    from_dlpack: &Bound<'py, PyAny>,
    dst: &mut [u8],
    shape: &[i64],
    dtype: DlDtype,
    f: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<R>,
) -> PyResult<R> {
    let elems = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?));
    if elems.and_then(|n| n.checked_mul(dtype.itemsize())) != Some(dst.len()) {
        return Err(Class::Internal.err("tensor shape does not match its bytes"));
    }
    let alive = Arc::new(());
    let owner: Box<dyn Send> = Box::new(Arc::clone(&alive));
    let py = from_dlpack.py();
    let out = {
        // SAFETY: `dst` holds exactly `shape` of `dtype` (checked above) and
        // is exclusively borrowed for this call; the storage's life is
        // checked through `alive` below before the borrow ends.
        let capsule = unsafe { export_capsule(py, dst.as_mut_ptr(), shape, dtype, owner) }?;
        let tensor = from_dlpack.call1((&capsule,))?;
        f(&tensor)
    };
    if Arc::strong_count(&alive) != 1 {
        eprintln!("ferroloader: a tensor over a batch being written outlived its use");
        std::process::abort();
    }
    out
}

/// Takes ownership of a file descriptor Python handed over with
/// `socket.detach()` (so nothing in Python will close it again).
pub fn adopt_fd(fd: i32) -> PyResult<std::os::fd::OwnedFd> {
    use std::os::fd::{FromRawFd, OwnedFd};
    if fd < 0 {
        return Err(Class::Internal.err(format!("invalid file descriptor {fd}")));
    }
    // Refuse a number that is not an open descriptor before claiming it.
    // SAFETY: borrowing for the duration of one fcntl call; `fd` is only
    // inspected, not closed.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::io::fcntl_getfd(borrowed)
        .map_err(|e| Class::Internal.err(format!("file descriptor {fd}: {e}")))?;
    // SAFETY: the descriptor is open (checked above) and the caller detached
    // it from its Python owner, so this OwnedFd is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

const ARROW_STREAM: &CStr = c"arrow_array_stream";
const ARROW_SCHEMA: &CStr = c"arrow_schema";
const ARROW_ARRAY: &CStr = c"arrow_array";

/// Moves the C stream out of an `arrow_array_stream` capsule (the
/// PyCapsule interface's `__arrow_c_stream__()`), leaving the capsule's
/// struct released-empty as the interface prescribes.
pub fn import_arrow_stream(
    capsule: &Bound<'_, pyo3::types::PyCapsule>,
) -> PyResult<arrow_array::ffi_stream::ArrowArrayStreamReader> {
    use arrow_array::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
    use pyo3::types::PyCapsuleMethods;
    let ptr = capsule.pointer_checked(Some(ARROW_STREAM))?;
    // SAFETY: a capsule named "arrow_array_stream" holds a valid, aligned,
    // initialised FFI_ArrowArrayStream (the PyCapsule interface's contract,
    // and the name was checked); `from_raw` moves it out and leaves an empty
    // struct whose release is NULL, so the capsule's destructor does nothing.
    let stream = unsafe { FFI_ArrowArrayStream::from_raw(ptr.as_ptr().cast()) };
    ArrowArrayStreamReader::try_new(stream)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("Arrow stream: {e}")))
}

/// Moves an array and reads its schema out of the two capsules of
/// `__arrow_c_array__()`.
pub fn import_arrow_array(
    schema: &Bound<'_, pyo3::types::PyCapsule>,
    array: &Bound<'_, pyo3::types::PyCapsule>,
) -> PyResult<arrow_array::ArrayRef> {
    use arrow_array::ffi::{from_ffi, FFI_ArrowArray, FFI_ArrowSchema};
    use pyo3::types::PyCapsuleMethods;
    let schema_ptr = schema.pointer_checked(Some(ARROW_SCHEMA))?;
    let array_ptr = array.pointer_checked(Some(ARROW_ARRAY))?;
    // SAFETY: the capsules are named "arrow_schema" and "arrow_array", so
    // they hold valid, aligned, initialised C structs (the interface's
    // contract). The schema is only borrowed (it stays the capsule's); the
    // array is moved out, leaving an empty struct with a NULL release.
    let data = unsafe {
        let schema = &*schema_ptr.as_ptr().cast::<FFI_ArrowSchema>();
        let array = FFI_ArrowArray::from_raw(array_ptr.as_ptr().cast());
        from_ffi(array, schema)
    }
    .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("Arrow array: {e}")))?;
    Ok(arrow_array::make_array(data))
}
