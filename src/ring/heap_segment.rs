//! A [`Segment`] backed by ordinary heap memory, for the two checkers that
//! cannot run the real one (`segment.rs`: a memfd mapped `MAP_SHARED`):
//!
//! * **Miri** (`cfg(miri)`) supports neither `memfd_create` nor a shared
//!   mapping of a file. Here a segment is a zeroed, page-aligned heap block;
//!   the protocol code views its header words as `std` atomics exactly as in
//!   production (`AtomicU64::from_ptr` and header structs of atomics), so
//!   Miri checks the arena's and the mailbox's real `unsafe` code (alignment,
//!   bounds, aliasing of the payload slices, data races between threads).
//! * **loom** (`cfg(loom)`): loom's atomics are objects of the model, not
//!   views of raw bytes, so the header words live beside the bytes: one loom
//!   `AtomicU32` per 4-byte slot and one `AtomicU64` per 8-byte slot of the
//!   first 24 bytes of every 64-byte granule (where the record header, the
//!   segment header and the mailbox's control words lie), created with the
//!   segment, zero like a fresh memfd. [`Segment::atomic_u32`] and
//!   [`Segment::atomic_u64`] hand them out. Every byte also has a loom
//!   `UnsafeCell<()>` that the protocol's payload accesses touch under
//!   `cfg(loom)` ([`Segment::loom_read`], [`Segment::loom_write`]), so loom
//!   reports a payload read or write that is not ordered after the other
//!   side's by the protocol's atomics.
//!
//! Both keep the API of the real segment so the whole crate builds; what a
//! heap segment cannot do (have an fd, be mapped from one) panics or fails
//! with `Unsupported`. The "second mapping" the other side would make with
//! [`Segment::from_fd`] is [`Segment::share`]: the same memory.

use std::alloc::Layout;
use std::fmt;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

#[cfg(loom)]
use super::sync::{AtomicU32, AtomicU64};

/// The page size a heap segment pretends to have. Under loom it is one
/// 64-byte granule, so an arena can be a handful of records (a small state
/// space); under Miri it is the usual 4 KiB, as the tests expect.
#[cfg(loom)]
const PAGE: usize = 64;
#[cfg(not(loom))]
const PAGE: usize = 4096;

/// Alignment of the heap block: a page of the real machine, as an mmap is.
const ALIGN: usize = 4096;

#[cfg(loom)]
const GRANULE: usize = 64;
/// Atomic slots exist only in the first `ATOMIC_SPAN` bytes of a granule.
#[cfg(loom)]
const ATOMIC_SPAN: usize = 24;

/// The memory behind one or more [`Segment`]s.
struct HeapMem {
    ptr: NonNull<u8>,
    layout: Layout,
    #[cfg(loom)]
    u32s: Box<[[AtomicU32; ATOMIC_SPAN / 4]]>,
    #[cfg(loom)]
    u64s: Box<[[AtomicU64; ATOMIC_SPAN / 8]]>,
    #[cfg(loom)]
    cells: Box<[loom::cell::UnsafeCell<()>]>,
}

// SAFETY: `HeapMem` owns its block like a `Box<[u8]>` does; the raw pointer
// is not tied to a thread. Access to the bytes is governed by the arena and
// mailbox protocols, exactly as for the shared mapping it stands in for
// (see `crate::ring`). loom's atomics are `Send + Sync`; its `UnsafeCell`s
// hold `()` and are only used through `with`/`with_mut`, which loom checks
// (loom runs one thread at a time).
unsafe impl Send for HeapMem {}
// SAFETY: as for `Send`.
unsafe impl Sync for HeapMem {}

impl Drop for HeapMem {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc_zeroed(layout)` in
        // `Segment::create` and is freed only here, once, when the last
        // `Segment` sharing it is gone.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A heap-backed stand-in for the memfd segment (see the module docs).
///
/// Invariant: `ptr` is `mem`'s block, valid for reads and writes of `len >
/// 0` bytes and `ALIGN`-aligned for as long as `mem` is alive.
pub struct Segment {
    mem: Arc<HeapMem>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: as for the real segment: the handle owns (a share of) its memory,
// and concurrent access to the bytes is governed by the ring's protocol.
unsafe impl Send for Segment {}
// SAFETY: `&Segment` hands out the length, the raw pointer and (loom) the
// header atomics; it does not access the bytes itself.
unsafe impl Sync for Segment {}

impl fmt::Debug for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment")
            .field("heap", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl Segment {
    /// A zero-filled heap segment of `len` bytes.
    pub fn create(len: usize) -> io::Result<Segment> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ferroloader: a shared-memory segment cannot be empty",
            ));
        }
        let layout = Layout::from_size_align(len, ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout);
        };
        #[cfg(loom)]
        let granules = len.div_ceil(GRANULE);
        let mem = HeapMem {
            ptr,
            layout,
            #[cfg(loom)]
            u32s: (0..granules)
                .map(|_| std::array::from_fn(|_| AtomicU32::new(0)))
                .collect(),
            #[cfg(loom)]
            u64s: (0..granules)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            #[cfg(loom)]
            cells: (0..len).map(|_| loom::cell::UnsafeCell::new(())).collect(),
        };
        Ok(Segment {
            mem: Arc::new(mem),
            ptr: ptr.as_ptr(),
            len,
        })
    }

    /// Always `Unsupported`: a heap segment is shared with [`Segment::share`].
    pub fn from_fd(_fd: OwnedFd) -> io::Result<Segment> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "ferroloader: heap-backed segments (cfg(miri) / cfg(loom)) cannot be mapped from an fd",
        ))
    }

    /// A second handle on the same memory: what the other process's
    /// [`Segment::from_fd`] of this segment's fd gives in production.
    pub fn share(&self) -> Segment {
        Segment {
            mem: Arc::clone(&self.mem),
            ptr: self.ptr,
            len: self.len,
        }
    }

    /// Panics: a heap segment has no fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        panic!("ferroloader: a heap-backed segment (cfg(miri) / cfg(loom)) has no fd")
    }

    /// The segment's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a segment has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The first byte (4 KiB aligned). Valid for `len()` bytes for as long
    /// as `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Zeroes `[offset, offset + len)`, as reads after a real hole punch
    /// see. The caller must own those bytes.
    pub fn punch_hole(&self, offset: usize, len: usize) -> io::Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ferroloader: hole outside the segment",
            ));
        }
        // SAFETY: in bounds (checked) of the live block (invariant); the
        // caller owns the range (documented), so no one else accesses it.
        unsafe { std::ptr::write_bytes(self.ptr.add(offset), 0, len) };
        Ok(())
    }

    /// The loom atomic standing for the `u32` at byte `off`.
    #[cfg(loom)]
    pub(super) fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        let (g, at) = (off / GRANULE, off % GRANULE);
        assert!(
            at % 4 == 0 && at < ATOMIC_SPAN && off < self.len,
            "loom segment: no u32 atomic at {off}"
        );
        &self.mem.u32s[g][at / 4]
    }

    /// The loom atomic standing for the `u64` at byte `off`.
    #[cfg(loom)]
    pub(super) fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        let (g, at) = (off / GRANULE, off % GRANULE);
        assert!(
            at % 8 == 0 && at < ATOMIC_SPAN && off < self.len,
            "loom segment: no u64 atomic at {off}"
        );
        &self.mem.u64s[g][at / 8]
    }

    /// Tells loom that this thread reads the bytes `[off, off + len)` now:
    /// loom fails the model if a write to any of them is not ordered before
    /// this read (happens-before), or is concurrent with it.
    #[cfg(loom)]
    pub(super) fn loom_read(&self, off: usize, len: usize) {
        for c in &self.mem.cells[off..off + len] {
            c.with(|_| ());
        }
    }

    /// Tells loom that this thread writes the bytes `[off, off + len)` now:
    /// loom fails the model if any other access to them is not ordered
    /// before this write.
    #[cfg(loom)]
    pub(super) fn loom_write(&self, off: usize, len: usize) {
        for c in &self.mem.cells[off..off + len] {
            c.with_mut(|_| ());
        }
    }
}

/// The page size heap segments pretend to have (see `PAGE`).
pub fn page_size() -> usize {
    PAGE
}
