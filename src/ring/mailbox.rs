//! The message mailbox between the main process and one worker: two
//! single-producer single-consumer byte rings in one sealed memfd, so that
//! in steady state a task or a result costs a few stores and loads, not a
//! system call.
//!
//! # Layout
//!
//! | offset          | what                                             |
//! |-----------------|--------------------------------------------------|
//! | 0               | task ring control (main produces, worker consumes) |
//! | 128             | result ring control (worker produces, main consumes) |
//! | 256             | task ring data, `cap` bytes                      |
//! | 256 + cap       | result ring data, `cap` bytes                    |
//!
//! A ring control block is `tail: u64`, `closed: u64` (producer's cache
//! line, offsets 0 and 8) and `head: u64`, `sleeping: u32` (consumer's
//! cache line, offset 64). `head` and `tail` are byte counts that only
//! grow; data lives at `pos % cap`.
//! A message is `u32` length (little-endian) then its bytes, wrapping
//! around the end of the data area; `cap` is a power of two.
//!
//! # Protocol
//!
//! - The producer writes a message into `[tail, head + cap)`, then stores
//!   `tail += 4 + len`. The consumer reads `[head, tail)`, then stores
//!   `head += 4 + len`. Neither touches the other's range, so the bytes need
//!   no atomics; the two counters carry the ordering (the producer's store of
//!   `tail` publishes the bytes it wrote, the consumer's store of `head`
//!   hands the space back).
//! - Waking: a consumer about to block swaps `sleeping` to 1, then checks
//!   the ring once more, and blocks only if it is still empty. A producer,
//!   after storing `tail`, swaps `sleeping` to 0 and, if it was 1, sends a
//!   wake-up on the side channel (the worker's socket). No lost wake-up:
//!   every write of `sleeping` (the consumer's withdrawal and `end_sleep`
//!   too) is a swap, so its modification order is a chain of
//!   read-modify-writes, each reading the one before. If the producer's swap
//!   comes after the consumer's swap to 1, it reads that 1 and wakes the
//!   consumer. If it comes before, the consumer's swap to 1 is in the
//!   producer's release sequence, so it acquires everything before the
//!   producer's swap, `tail` included, and its re-check sees the message.
//!   This needs only acquire/release (the operations are SeqCst anyway).
//!   With plain stores for the consumer's writes it would hold only through
//!   the single total order of SeqCst operations, a subtler argument that
//!   loom (`loom_models.rs`) cannot check: it treats SeqCst accesses as
//!   AcqRel. On x86 a SeqCst store and a swap are the same `xchg`.
//! - Closing: the producer sets `closed` when it wants nothing more of the
//!   consumer (the main process stopped the worker); the consumer checks it
//!   before it acts on a message, so what was queued before is dropped.
//! - A message too large for the ring (or one that carries a file
//!   descriptor) goes on the socket, and a one-byte marker takes its place in
//!   the ring, so the consumer still takes messages in the order they were
//!   sent.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use super::sync::{AtomicU32, AtomicU64, Ordering};
use super::Segment;
use crate::record::DecodeError;

const CTL_LEN: usize = 128;
const DATA_OFFSET: usize = 2 * CTL_LEN;
const TAIL: usize = 0;
const CLOSED: usize = 8;
const HEAD: usize = 64;
const SLEEPING: usize = 72;

/// Two rings over one shared segment.
///
/// Invariant: `seg` is at least `DATA_OFFSET + 2 * cap` bytes, `cap` is a
/// power of two, and at most one process produces into and one consumes from
/// each ring (the main process and its worker, with fixed roles).
pub struct Mailbox {
    seg: Segment,
    cap: usize,
}

/// Which ring of a mailbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Main process to worker.
    Tasks = 0,
    /// Worker to main process.
    Results = 1,
}

impl Mailbox {
    /// A new mailbox whose rings hold `cap` bytes each (rounded up to a
    /// power of two).
    pub fn create(cap: usize) -> io::Result<Mailbox> {
        let cap = cap.max(64).next_power_of_two();
        let seg = Segment::create(DATA_OFFSET + 2 * cap)?;
        Ok(Mailbox { seg, cap })
    }

    /// Maps a mailbox created by the other process.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Mailbox> {
        let seg = Segment::from_fd(fd)?;
        let data = seg.len().saturating_sub(DATA_OFFSET) / 2;
        let cap = if data.is_power_of_two() { data } else { 0 };
        if cap < 64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a ferroloader mailbox",
            ));
        }
        Ok(Mailbox { seg, cap })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.seg.fd()
    }

    /// The other side's view of this mailbox: the same memory. Heap-backed
    /// builds only (Miri, loom), where there is no fd to map
    /// ([`Mailbox::from_fd`] in production).
    #[cfg(any(miri, loom))]
    pub fn share(&self) -> Mailbox {
        Mailbox {
            seg: self.seg.share(),
            cap: self.cap,
        }
    }

    /// The largest message that fits the ring.
    pub fn max_message(&self) -> usize {
        self.cap / 2 - 4
    }

    #[cfg(not(loom))]
    fn ctl(&self, dir: Dir, field: usize) -> *mut u8 {
        // In bounds: the control blocks lie in the first CTL_LEN * 2 bytes.
        self.seg
            .as_ptr()
            .wrapping_add(dir as usize * CTL_LEN + field)
    }

    #[cfg(not(loom))]
    fn counter(&self, dir: Dir, field: usize) -> &AtomicU64 {
        // SAFETY: the field is 8-aligned inside the mapped segment (struct
        // invariant; the mapping is page aligned), lives as long as `self`,
        // and is only ever accessed atomically by both processes.
        unsafe { AtomicU64::from_ptr(self.ctl(dir, field) as *mut u64) }
    }

    #[cfg(not(loom))]
    fn sleeping(&self, dir: Dir) -> &AtomicU32 {
        // SAFETY: as for `counter`: 4-aligned, in bounds, only atomic access.
        unsafe { AtomicU32::from_ptr(self.ctl(dir, SLEEPING) as *mut u32) }
    }

    /// Under loom: the loom atomic the heap segment keeps for that word.
    #[cfg(loom)]
    fn counter(&self, dir: Dir, field: usize) -> &AtomicU64 {
        self.seg.atomic_u64(dir as usize * CTL_LEN + field)
    }

    #[cfg(loom)]
    fn sleeping(&self, dir: Dir) -> &AtomicU32 {
        self.seg.atomic_u32(dir as usize * CTL_LEN + SLEEPING)
    }

    /// Under loom: tells the model checker which data bytes
    /// `[pos, pos + len)` (wrapping) this thread reads or writes now.
    #[cfg(loom)]
    fn loom_access(&self, dir: Dir, pos: u64, len: usize, write: bool) {
        let base = DATA_OFFSET + dir as usize * self.cap;
        let at = pos as usize & (self.cap - 1);
        let first = len.min(self.cap - at);
        for (off, n) in [(base + at, first), (base, len - first)] {
            if write {
                self.seg.loom_write(off, n);
            } else {
                self.seg.loom_read(off, n);
            }
        }
    }

    fn data(&self, dir: Dir) -> *mut u8 {
        self.seg
            .as_ptr()
            .wrapping_add(DATA_OFFSET + dir as usize * self.cap)
    }

    /// Copies `src` into the ring's data at byte position `pos` (wrapping).
    ///
    /// Caller: the producer, with `[pos, pos + src.len())` inside its free
    /// range `[tail, head + cap)`.
    fn write_at(&self, dir: Dir, pos: u64, src: &[u8]) {
        let at = pos as usize & (self.cap - 1);
        let first = src.len().min(self.cap - at);
        #[cfg(loom)]
        self.loom_access(dir, pos, src.len(), true);
        // SAFETY: both copies stay inside this ring's data area (`at < cap`,
        // `first <= cap - at`, the rest wraps to the start and is shorter
        // than `cap`); the range is the producer's free space, which the
        // consumer does not read until `tail` is published (protocol), and
        // `src` cannot overlap shared memory we are about to write.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data(dir).add(at), first);
            std::ptr::copy_nonoverlapping(
                src.as_ptr().add(first),
                self.data(dir),
                src.len() - first,
            );
        }
    }

    /// Copies ring bytes at `pos` (wrapping) into `dst`.
    ///
    /// Caller: the consumer, with the range inside `[head, tail)` and
    /// `dst.len() <= cap` (checked in `pop`: the counters live in memory the
    /// other process can write).
    fn read_at(&self, dir: Dir, pos: u64, dst: &mut [u8]) {
        assert!(dst.len() <= self.cap, "mailbox read longer than the ring");
        let at = pos as usize & (self.cap - 1);
        let first = dst.len().min(self.cap - at);
        #[cfg(loom)]
        self.loom_access(dir, pos, dst.len(), false);
        // SAFETY: in bounds as in `write_at`; the range was published by
        // the producer (its `tail` store, acquired by our load) and it will
        // not be rewritten until we store `head` past it.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data(dir).add(at), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(
                self.data(dir),
                dst.as_mut_ptr().add(first),
                dst.len() - first,
            );
        }
    }

    /// Producer: appends one message; `false` if it does not fit now.
    pub fn push(&self, dir: Dir, body: &[u8]) -> bool {
        let need = 4 + body.len() as u64;
        let tail = self.counter(dir, TAIL).load(Ordering::Relaxed);
        let head = self.counter(dir, HEAD).load(Ordering::Acquire);
        if need > self.cap as u64 - (tail - head) {
            return false;
        }
        self.write_at(dir, tail, &(body.len() as u32).to_le_bytes());
        self.write_at(dir, tail + 4, body);
        self.counter(dir, TAIL).store(tail + need, Ordering::SeqCst);
        true
    }

    /// Producer, after pushing: whether the consumer was asleep (and so
    /// must be woken on the side channel). Clears the flag.
    pub fn consumer_was_sleeping(&self, dir: Dir) -> bool {
        self.sleeping(dir).swap(0, Ordering::SeqCst) == 1
    }

    /// Consumer: takes the oldest message into `out` (cleared first);
    /// `Ok(false)` when there is none. The counters and the length prefix
    /// are in memory the other process writes, so they are checked before
    /// anything is read: a ring whose counters are more than `cap` apart,
    /// or a message longer than the bytes published, is an error, never a
    /// read outside the ring.
    pub fn pop(&self, dir: Dir, out: &mut Vec<u8>) -> Result<bool, DecodeError> {
        let head = self.counter(dir, HEAD).load(Ordering::Relaxed);
        let tail = self.counter(dir, TAIL).load(Ordering::Acquire);
        if head == tail {
            return Ok(false);
        }
        let published = tail.wrapping_sub(head);
        if published > self.cap as u64 || published < 4 {
            return Err(DecodeError("mailbox counters corrupted"));
        }
        let mut len = [0u8; 4];
        self.read_at(dir, head, &mut len);
        let len = u32::from_le_bytes(len) as u64;
        if 4 + len > published {
            return Err(DecodeError("mailbox message past the published bytes"));
        }
        out.clear();
        out.resize(len as usize, 0);
        self.read_at(dir, head.wrapping_add(4), out);
        self.counter(dir, HEAD)
            .store(head.wrapping_add(4 + len), Ordering::Release);
        Ok(true)
    }

    /// Overwrites the mailbox's bytes (control blocks, then rings) with
    /// `data`, as a buggy or hostile peer could: for the fuzz targets and
    /// tests of `pop`'s checks. Not for use while another side is attached.
    #[doc(hidden)]
    pub fn scribble(&self, data: &[u8]) {
        let n = data.len().min(self.seg.len());
        // SAFETY: `n <= seg.len()`, so the copy stays inside the live mapping
        // (the `Segment` invariant); `data` is a separate Rust slice, so the
        // ranges do not overlap. Only the caller's process has this mailbox
        // (documented above), so no one reads the bytes while they change.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.seg.as_ptr(), n) };
    }

    /// Consumer: whether a message is waiting.
    pub fn has_message(&self, dir: Dir) -> bool {
        self.counter(dir, HEAD).load(Ordering::Relaxed)
            != self.counter(dir, TAIL).load(Ordering::SeqCst)
    }

    /// Consumer, before blocking: announces it sleeps; returns `false` (and
    /// withdraws) if a message arrived meanwhile, in which case it must not
    /// block. Every write of the flag is a swap, not a store: see the module
    /// docs.
    pub fn prepare_sleep(&self, dir: Dir) -> bool {
        self.sleeping(dir).swap(1, Ordering::SeqCst);
        if self.has_message(dir) {
            self.sleeping(dir).swap(0, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Consumer, after waking.
    pub fn end_sleep(&self, dir: Dir) {
        self.sleeping(dir).swap(0, Ordering::SeqCst);
    }

    /// Producer: nothing more is wanted of the consumer; what is queued
    /// may be dropped.
    pub fn close(&self, dir: Dir) {
        self.counter(dir, CLOSED).store(1, Ordering::Release);
    }

    /// Consumer: whether the producer closed the ring (one load).
    pub fn is_closed(&self, dir: Dir) -> bool {
        self.counter(dir, CLOSED).load(Ordering::Acquire) != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The other process's view: a second mapping through a dup'ed fd
    /// (under Miri, which has no memfds, the same heap memory).
    fn dup(m: &Mailbox) -> Mailbox {
        #[cfg(miri)]
        return m.share();
        #[cfg(not(miri))]
        Mailbox::from_fd(m.fd().try_clone_to_owned().unwrap()).unwrap()
    }

    #[test]
    fn messages_cross_mappings_in_order() {
        let a = Mailbox::create(256).unwrap();
        let b = dup(&a);
        assert!(a.push(Dir::Tasks, b"one"));
        assert!(a.push(Dir::Tasks, b""));
        assert!(a.push(Dir::Tasks, b"three"));
        let mut out = Vec::new();
        for want in [&b"one"[..], b"", b"three"] {
            assert!(b.pop(Dir::Tasks, &mut out).unwrap());
            assert_eq!(out, want);
        }
        assert!(!b.pop(Dir::Tasks, &mut out).unwrap());
        assert!(!b.has_message(Dir::Results));
    }

    #[test]
    fn a_ring_closed_by_its_producer_is_seen_closed_across_mappings() {
        let a = Mailbox::create(256).unwrap();
        let b = dup(&a);
        assert!(a.push(Dir::Tasks, b"queued"));
        assert!(!b.is_closed(Dir::Tasks));
        a.close(Dir::Tasks);
        assert!(b.is_closed(Dir::Tasks));
        // the other ring, and the queued message, are untouched
        assert!(!b.is_closed(Dir::Results));
        let mut out = Vec::new();
        assert!(b.pop(Dir::Tasks, &mut out).unwrap());
        assert_eq!(out, b"queued");
    }

    #[test]
    fn scribbled_counters_or_lengths_are_errors_not_reads_outside_the_ring() {
        let a = Mailbox::create(64).unwrap();
        let mut out = Vec::new();
        // the producer's tail claims more than the ring holds
        a.counter(Dir::Results, TAIL)
            .store(1 << 40, Ordering::Release);
        assert!(a.pop(Dir::Results, &mut out).is_err());
        // tail behind head (wrapped)
        a.counter(Dir::Results, TAIL).store(0, Ordering::Release);
        a.counter(Dir::Results, HEAD).store(8, Ordering::Release);
        assert!(a.pop(Dir::Results, &mut out).is_err());
        // a length prefix past the bytes published
        let b = Mailbox::create(64).unwrap();
        assert!(b.push(Dir::Results, b"abc"));
        b.write_at(Dir::Results, 0, &u32::MAX.to_le_bytes());
        assert!(b.pop(Dir::Results, &mut out).is_err());
        // a consistent message still reads
        let c = Mailbox::create(64).unwrap();
        assert!(c.push(Dir::Results, b"abc"));
        assert!(c.pop(Dir::Results, &mut out).unwrap());
        assert_eq!(out, b"abc");
    }

    #[test]
    fn full_ring_refuses_then_accepts_after_pop() {
        let a = Mailbox::create(64).unwrap();
        let b = dup(&a);
        let body = [7u8; 28];
        assert!(a.push(Dir::Results, &body));
        assert!(a.push(Dir::Results, &body));
        assert!(!a.push(Dir::Results, &body));
        let mut out = Vec::new();
        assert!(b.pop(Dir::Results, &mut out).unwrap());
        assert!(a.push(Dir::Results, &body));
    }

    #[test]
    fn sleep_flag_is_seen_by_the_producer_once() {
        let a = Mailbox::create(64).unwrap();
        let b = dup(&a);
        assert!(b.prepare_sleep(Dir::Tasks));
        assert!(a.push(Dir::Tasks, b"x"));
        assert!(a.consumer_was_sleeping(Dir::Tasks));
        assert!(!a.consumer_was_sleeping(Dir::Tasks));
        // A message already there: the consumer must not sleep.
        assert!(!b.prepare_sleep(Dir::Tasks));
    }

    #[test]
    fn threads_exchange_every_message_without_loss() {
        let a = Mailbox::create(128).unwrap();
        let b = dup(&a);
        // Under Miri, which interprets each step, a shorter run.
        let n: u32 = if cfg!(miri) { 1_000 } else { 20_000 };
        let producer = std::thread::spawn(move || {
            for i in 0..n {
                let body = i.to_le_bytes().repeat((i % 7) as usize);
                while !a.push(Dir::Results, &body) {
                    std::thread::yield_now();
                }
            }
        });
        let mut out = Vec::new();
        for i in 0..n {
            while !b.pop(Dir::Results, &mut out).unwrap() {
                std::thread::yield_now();
            }
            assert_eq!(out, i.to_le_bytes().repeat((i % 7) as usize));
        }
        producer.join().unwrap();
    }

    proptest! {
        #![proptest_config(crate::testing::miri_friendly(ProptestConfig::default()))]

        #[test]
        fn any_interleaving_of_push_and_pop_is_fifo(ops in proptest::collection::vec((any::<bool>(), 0usize..40), 0..300)) {
            let a = Mailbox::create(128).unwrap();
            let b = dup(&a);
            let mut model = std::collections::VecDeque::new();
            let mut k = 0u8;
            let mut out = Vec::new();
            for (push, len) in ops {
                if push {
                    let body: Vec<u8> = (0..len).map(|i| k.wrapping_add(i as u8)).collect();
                    k = k.wrapping_add(1);
                    if a.push(Dir::Tasks, &body) {
                        model.push_back(body);
                    }
                } else {
                    let got = b.pop(Dir::Tasks, &mut out).unwrap().then(|| out.clone());
                    prop_assert_eq!(got, model.pop_front());
                }
            }
        }
    }
}
