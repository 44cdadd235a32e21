//! One shared-memory segment: an anonymous memfd mapped `MAP_SHARED`.
//!
//! A segment never has a name in any file system (no `/dev/shm` entry), so
//! nothing survives the processes that map it, whatever way they exit. The
//! memfd is sealed against shrinking and growing right after it is sized, so
//! no process holding the fd can truncate it under a live mapping (which would
//! turn reads of the cut-off pages into `SIGBUS`); [`Segment::from_fd`] only
//! maps fds that carry those seals.

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// The memfd's name as it appears in `/proc/<pid>/fd` and `/proc/<pid>/maps`
/// (`/memfd:ferroloader (deleted)`); it is not a path anywhere.
const MEMFD_NAME: &str = "ferroloader";

/// The seals every ring segment carries: its size is fixed for good.
const SIZE_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

/// A memfd-backed `MAP_SHARED` read-write mapping of the whole file.
///
/// # Invariant
///
/// `ptr` is the start of a live `MAP_SHARED`, `PROT_READ | PROT_WRITE`
/// mapping of exactly `len > 0` bytes of `fd`, created by this value and
/// unmapped only in its `Drop`; `ptr` is page aligned; the file's size is
/// sealed (`F_SEAL_SHRINK | F_SEAL_GROW`) at `len` or more, so every byte of
/// the mapping stays backed for as long as the mapping exists.
///
/// The segment itself never reads or writes the memory: who may touch which
/// bytes, and how, is the arena protocol's business (see [`crate::ring`]).
#[derive(Debug)]
pub struct Segment {
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `Segment` is an owning handle to a mapping (see the invariant); the
// raw pointer is not tied to the creating thread, and mapping and unmapping
// are process-wide operations, so moving the handle to another thread is
// sound.
unsafe impl Send for Segment {}
// SAFETY: `&Segment` only hands out the fd, the length and the raw pointer;
// it performs no access to the memory itself. Concurrent access to the bytes
// is governed by the arena protocol, which uses atomics for every word two
// parties may touch at once (`crate::ring` module docs).
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates an anonymous shared segment of `len` bytes (zero-filled):
    /// `memfd_create("ferroloader", MFD_CLOEXEC | MFD_ALLOW_SEALING)`,
    /// `ftruncate`, size seals, `mmap(MAP_SHARED)`. Nothing ever appears in
    /// `/dev/shm`. Pages are not touched here: each one costs a page fault on
    /// its first write.
    pub fn create(len: usize) -> io::Result<Segment> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ferroloader: a shared-memory segment cannot be empty",
            ));
        }
        if crate::facilities::disabled(crate::facilities::Facility::Memfd) {
            return Err(rustix::io::Errno::NOSYS.into());
        }
        let fd =
            rustix::fs::memfd_create(MEMFD_NAME, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        // memfds are born 0777; torch's shared-memory files are 0600
        rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o600))?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SIZE_SEALS | SealFlags::SEAL)?;
        Self::map(fd, len)
    }

    /// Maps a segment's fd received from the other process (its length from
    /// `fstat`). The fd must be a ferroloader memfd: sealed against shrinking
    /// and growing, non-empty; anything else is `InvalidInput`.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Segment> {
        let sealed = rustix::fs::fcntl_get_seals(&fd)
            .map(|s| s.contains(SIZE_SEALS))
            .unwrap_or(false);
        if !sealed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ferroloader: the fd is not a size-sealed memfd segment",
            ));
        }
        let size = rustix::fs::fstat(&fd)?.st_size;
        let len = usize::try_from(size)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "ferroloader: the segment fd has no usable size",
                )
            })?;
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        // SAFETY: a fresh mapping at an address the kernel picks (null hint,
        // no MAP_FIXED), so no existing memory is replaced; `fd` is a valid
        // open memfd whose size is sealed at `len` bytes or more (checked by
        // both callers), so the whole mapping is backed. The result becomes
        // the `Segment` invariant, and only `Drop` unmaps it.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        Ok(Segment {
            fd,
            ptr: ptr.cast::<u8>(),
            len,
        })
    }

    /// The memfd, to send to the other process (e.g. `SCM_RIGHTS`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The mapping's length in bytes (the file's size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a segment has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The first byte of the mapping (page aligned). Valid for `len()` bytes
    /// for as long as `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Gives the pages of `[offset, offset + len)` back to the kernel
    /// (`fallocate(PUNCH_HOLE | KEEP_SIZE)`): they read as zeros afterwards
    /// and cost a page fault again on their next touch, in every process
    /// mapping the segment. Partial pages at either end are zeroed, not
    /// freed. The caller must own those bytes (no one else may be using
    /// them); the mapping itself stays valid.
    pub fn punch_hole(&self, offset: usize, len: usize) -> io::Result<()> {
        let end = offset.checked_add(len).filter(|&e| e <= self.len);
        if end.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ferroloader: hole outside the segment",
            ));
        }
        if len == 0 {
            return Ok(());
        }
        rustix::fs::fallocate(
            &self.fd,
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            offset as u64,
            len as u64,
        )?;
        Ok(())
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping this value created
        // (invariant) and nothing else unmaps it. Every reference into it
        // that the ring hands out borrows either this `Segment` or an `Arc`
        // holding it, so none outlives this call.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}

/// The system page size, the granularity of faults and of `punch_hole`.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_is_private_to_its_user() {
        let a = Segment::create(4096).unwrap();
        let mode = rustix::fs::fstat(a.fd()).unwrap().st_mode & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn create_is_zeroed_and_shared_through_a_second_mapping() {
        let a = Segment::create(10_000).unwrap();
        assert_eq!(a.len(), 10_000);
        assert_eq!(a.as_ptr() as usize % page_size(), 0);
        let b = Segment::from_fd(a.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(b.len(), 10_000);
        assert_ne!(a.as_ptr(), b.as_ptr());
        // SAFETY: test-only; both mappings are live for the whole block, the
        // offsets are in range, and this single thread is the only user.
        unsafe {
            assert_eq!(*b.as_ptr().add(9_999), 0);
            *a.as_ptr().add(9_999) = 7;
            assert_eq!(*b.as_ptr().add(9_999), 7);
        }
    }

    #[test]
    fn from_fd_rejects_unsealed_and_empty() {
        let fd = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        let err = Segment::from_fd(fd).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(Segment::create(0).is_err());
    }

    #[test]
    fn the_size_is_sealed() {
        let a = Segment::create(8192).unwrap();
        assert!(rustix::fs::ftruncate(a.fd(), 0).is_err());
        assert!(rustix::fs::ftruncate(a.fd(), 1 << 20).is_err());
    }

    #[test]
    fn nothing_in_dev_shm() {
        let seg = Segment::create(4096).unwrap();
        let ours = std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().contains(MEMFD_NAME))
            })
            .unwrap_or(false);
        assert!(!ours);
        let link = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&seg.fd())
        ))
        .unwrap();
        assert!(link.to_string_lossy().starts_with("/memfd:ferroloader"));
    }

    #[test]
    fn punch_hole_zeroes_and_stays_mapped() {
        let p = page_size();
        let a = Segment::create(4 * p).unwrap();
        // SAFETY: test-only; the mapping is live and `p + 1 < 4p`; one thread.
        unsafe { *a.as_ptr().add(p + 1) = 9 };
        a.punch_hole(p, p).unwrap();
        // SAFETY: as above. Volatile: the write above is not one the
        // optimiser may forward past the syscall (an asm block to it).
        assert_eq!(unsafe { a.as_ptr().add(p + 1).read_volatile() }, 0);
        assert!(a.punch_hole(3 * p, 2 * p).is_err());
    }
}
