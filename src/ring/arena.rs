//! The arena's two sides: [`ArenaWriter`] (worker: sole allocator and writer)
//! and [`ArenaReader`] (main process: opens records, releases them on drop).
//! The shared layout and the state machine are described in [`crate::ring`].
//!
//! # Invariants the `unsafe` blocks rely on
//!
//! * (I1) **Headers.** Every header view is taken at an offset that is a
//!   multiple of 64 with 64 bytes inside the segment (checked by
//!   [`record_header`] / [`segment_header`]); the segment base is page
//!   aligned, so the atomics are aligned. Both processes access header words
//!   only as atomics.
//! * (I2) **Blocks.** The writer's block map tiles `[SEGMENT_HEADER_LEN,
//!   len)` of each segment with disjoint blocks (free or used), so two records
//!   never overlap.
//! * (I3) **Payload ownership.** A record's payload bytes are accessed by the
//!   writer only while it is `WRITING` (through `payload_mut(&mut self)`, so
//!   one slice at a time), and by the reader only while it holds the
//!   `RecordHandle` created by the one successful `LIVE -> HELD` exchange.
//!   The `Release`/`Acquire` pairs of the protocol order the two owners'
//!   accesses. This assumes the reader opens only refs the writer published
//!   (the lead's messages); `open` rejects refs that are out of range,
//!   misaligned, not `LIVE`, of another length or already open.

use super::segment::{page_size, Segment};
use super::sync::{AtomicU32, AtomicU64, Ordering};
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, RwLock};

/// Alignment of every payload and granule of every block.
pub const RECORD_ALIGN: usize = 64;
/// Bytes of the header in front of every payload.
pub const RECORD_HEADER_LEN: usize = 64;
/// Bytes of the header at the start of every segment.
pub const SEGMENT_HEADER_LEN: usize = 64;

const SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"FLSG");
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"FLRC");
const LAYOUT_VERSION: u32 = 1;

/// Values of a record header's `state` word.
mod state {
    pub const FREE: u32 = 0;
    pub const WRITING: u32 = 1;
    pub const LIVE: u32 = 2;
    pub const HELD: u32 = 3;
    pub const RELEASED: u32 = 4;
}

/// A record header as it lies in shared memory (first 24 of its 64 bytes).
#[cfg(not(loom))]
#[repr(C)]
struct RecordHeader {
    state: AtomicU32,
    magic: AtomicU32,
    len: AtomicU64,
    seq: AtomicU64,
}

/// A segment header as it lies in shared memory (first 24 of its 64 bytes).
#[cfg(not(loom))]
#[repr(C)]
struct SegmentHeader {
    magic: AtomicU32,
    version: AtomicU32,
    released: AtomicU64,
    id: AtomicU32,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<RecordHeader>() <= RECORD_HEADER_LEN);
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<SegmentHeader>() <= SEGMENT_HEADER_LEN);
const _: () = assert!(RECORD_HEADER_LEN % RECORD_ALIGN == 0);
const _: () = assert!(SEGMENT_HEADER_LEN % RECORD_ALIGN == 0);

/// The record header at `header_off` (the payload's offset minus 64).
#[cfg(not(loom))]
fn record_header(seg: &Segment, header_off: usize) -> &RecordHeader {
    assert!(
        header_off % RECORD_ALIGN == 0
            && header_off >= SEGMENT_HEADER_LEN
            && header_off + RECORD_HEADER_LEN <= seg.len(),
        "ferroloader ring: record header {header_off} outside its segment"
    );
    // SAFETY: (I1) the 64 bytes at `header_off` lie inside the live mapping
    // (asserted above; `Segment` invariant) for as long as `seg` is borrowed;
    // the address is 64-byte aligned (page-aligned base + multiple of 64),
    // enough for `AtomicU64`; `RecordHeader` is all atomics, valid for any
    // bit pattern, and both processes access these words only atomically.
    unsafe { &*seg.as_ptr().add(header_off).cast::<RecordHeader>() }
}

/// The segment header at offset 0.
#[cfg(not(loom))]
fn segment_header(seg: &Segment) -> &SegmentHeader {
    assert!(
        seg.len() >= SEGMENT_HEADER_LEN,
        "ferroloader ring: segment too small"
    );
    // SAFETY: (I1) offset 0 of a live, page-aligned mapping of at least 64
    // bytes (asserted); `SegmentHeader` is all atomics, valid for any bit
    // pattern, and its words are only ever accessed atomically.
    unsafe { &*seg.as_ptr().cast::<SegmentHeader>() }
}

/// Under loom: a record header's words, as the loom atomics a heap segment
/// keeps beside its bytes at the same offsets (`heap_segment.rs`). The
/// protocol code uses it exactly as the `&RecordHeader` of other builds.
#[cfg(loom)]
struct RecordHeader<'a> {
    state: &'a AtomicU32,
    magic: &'a AtomicU32,
    len: &'a AtomicU64,
    seq: &'a AtomicU64,
}

/// Under loom: a segment header's words (see [`RecordHeader`]).
#[cfg(loom)]
struct SegmentHeader<'a> {
    magic: &'a AtomicU32,
    version: &'a AtomicU32,
    released: &'a AtomicU64,
    id: &'a AtomicU32,
}

#[cfg(loom)]
fn record_header(seg: &Segment, header_off: usize) -> RecordHeader<'_> {
    assert!(
        header_off % RECORD_ALIGN == 0
            && header_off >= SEGMENT_HEADER_LEN
            && header_off + RECORD_HEADER_LEN <= seg.len(),
        "ferroloader ring: record header {header_off} outside its segment"
    );
    RecordHeader {
        state: seg.atomic_u32(header_off),
        magic: seg.atomic_u32(header_off + 4),
        len: seg.atomic_u64(header_off + 8),
        seq: seg.atomic_u64(header_off + 16),
    }
}

#[cfg(loom)]
fn segment_header(seg: &Segment) -> SegmentHeader<'_> {
    SegmentHeader {
        magic: seg.atomic_u32(0),
        version: seg.atomic_u32(4),
        released: seg.atomic_u64(8),
        id: seg.atomic_u32(16),
    }
}

/// Bytes a record of payload `len` occupies (header + payload rounded up),
/// or `None` on overflow.
fn record_size(len: usize) -> Option<usize> {
    len.checked_next_multiple_of(RECORD_ALIGN)?
        .checked_add(RECORD_HEADER_LEN)
}

/// Where a record's payload lies: segment id, payload offset, payload length.
///
/// The offset is that of the payload (64-byte aligned); the header lies just
/// before it. This is what the worker sends to the main process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordRef {
    pub segment: u32,
    pub offset: u64,
    pub len: u64,
}

/// Why [`ArenaWriter::alloc`] failed.
#[derive(Debug)]
pub enum ArenaError {
    /// The record does not fit without growing the arena past `limit`.
    LimitExceeded {
        /// The arena's size limit in bytes.
        limit: usize,
        /// The payload length asked for.
        requested: usize,
        /// Bytes in records not yet released by the main process.
        live_bytes: usize,
    },
    /// Creating or mapping a segment failed.
    Io(io::Error),
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArenaError::LimitExceeded {
                limit,
                requested,
                live_bytes,
            } => write!(
                f,
                "ferroloader: a worker's shared-memory arena reached its limit of {limit} bytes: \
                 a batch of {requested} bytes does not fit while {live_bytes} bytes are still \
                 held by batches the main process has not released. Release held batches sooner \
                 (drop references to old batches and their tensors), or raise the limit with \
                 the FERROLOADER_SHM_LIMIT environment variable."
            ),
            ArenaError::Io(e) => write!(f, "ferroloader: shared-memory arena: {e}"),
        }
    }
}

impl std::error::Error for ArenaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ArenaError::Io(e) => Some(e),
            ArenaError::LimitExceeded { .. } => None,
        }
    }
}

impl From<io::Error> for ArenaError {
    fn from(e: io::Error) -> Self {
        ArenaError::Io(e)
    }
}

/// Returns a block to a free map, merging it with free neighbours.
fn give_back(free: &mut BTreeMap<usize, usize>, mut start: usize, mut size: usize) {
    if let Some((&p, &psize)) = free.range(..start).next_back() {
        if p + psize == start {
            free.remove(&p);
            start = p;
            size += psize;
        }
    }
    if let Some(nsize) = free.remove(&(start + size)) {
        size += nsize;
    }
    free.insert(start, size);
}

/// A used block in the writer's private map.
#[derive(Clone, Copy, Debug)]
struct Used {
    /// Whole block: header + rounded payload.
    size: usize,
    /// Payload length as asked for.
    len: usize,
    /// `false`: WRITING (the writer's); `true`: handed to the reader.
    published: bool,
}

/// One segment and the writer's private block map over it (I2).
#[derive(Debug)]
struct SegAlloc {
    seg: Segment,
    /// Free blocks: start -> size, coalesced (no two adjacent).
    free: BTreeMap<usize, usize>,
    /// Used blocks: start (header offset) -> block.
    used: BTreeMap<usize, Used>,
    /// The segment's `released` counter as of the last sweep.
    released_seen: u64,
    /// Number of published blocks in `used`.
    published: usize,
}

impl SegAlloc {
    fn new(seg: Segment, id: u32) -> SegAlloc {
        let h = segment_header(&seg);
        h.magic.store(SEGMENT_MAGIC, Ordering::Relaxed);
        h.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        h.id.store(id, Ordering::Relaxed);
        let released_seen = h.released.load(Ordering::Relaxed);
        let mut free = BTreeMap::new();
        let usable = (seg.len() - SEGMENT_HEADER_LEN) / RECORD_ALIGN * RECORD_ALIGN;
        if usable > 0 {
            free.insert(SEGMENT_HEADER_LEN, usable);
        }
        SegAlloc {
            seg,
            free,
            used: BTreeMap::new(),
            released_seen,
            published: 0,
        }
    }

    /// First fit: the lowest free block of at least `size` bytes; its low end
    /// is taken, the rest stays free. Returns the block's start.
    fn take_first_fit(&mut self, size: usize) -> Option<usize> {
        let (&start, &have) = self.free.iter().find(|&(_, &have)| have >= size)?;
        self.free.remove(&start);
        if have > size {
            self.free.insert(start + size, have - size);
        }
        Some(start)
    }

    /// Returns a block to the free map, merging it with free neighbours.
    fn give_back(&mut self, start: usize, size: usize) {
        give_back(&mut self.free, start, size);
    }

    /// Sweeps published records if the reader released any since the last
    /// sweep. Returns (records, bytes) reclaimed.
    fn reclaim(&mut self) -> (usize, usize) {
        let released = segment_header(&self.seg).released.load(Ordering::Acquire);
        if released == self.released_seen || self.published == 0 {
            self.released_seen = released;
            return (0, 0);
        }
        // Read before the sweep: a release racing it bumps the counter again
        // and is picked up by the next sweep.
        self.released_seen = released;
        let SegAlloc {
            seg,
            free,
            used,
            published,
            ..
        } = self;
        let (mut records, mut bytes) = (0, 0);
        used.retain(|&start, u| {
            if !u.published {
                return true;
            }
            let h = record_header(seg, start);
            if h.state.load(Ordering::Acquire) != state::RELEASED {
                return true;
            }
            h.state.store(state::FREE, Ordering::Relaxed);
            give_back(free, start, u.size);
            records += 1;
            bytes += u.size;
            false
        });
        *published -= records;
        (records, bytes)
    }
}

/// The worker's side of an arena: the only allocator and writer.
///
/// Not `Sync` by design of its API (`&mut self` everywhere it changes
/// state); it is `Send`.
#[derive(Debug)]
pub struct ArenaWriter {
    segs: Vec<SegAlloc>,
    limit: usize,
    total: usize,
    live: usize,
    /// Segments `0..sent` were returned by `take_new_segments`.
    sent: usize,
    seq: u64,
}

impl ArenaWriter {
    /// Creates the arena with segment 0 of `initial_len` bytes (rounded up
    /// to the page size, clamped to `limit`). `limit` bounds the arena's
    /// total size for good. Fails if `limit` cannot hold even one page.
    pub fn new(initial_len: usize, limit: usize) -> io::Result<ArenaWriter> {
        let page = page_size();
        let room = limit / page * page;
        let len = initial_len.max(1).next_multiple_of(page).min(room);
        if len < SEGMENT_HEADER_LEN + RECORD_HEADER_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "ferroloader: shared-memory limit of {limit} bytes is below one page; \
                     raise FERROLOADER_SHM_LIMIT"
                ),
            ));
        }
        let seg = Segment::create(len)?;
        Ok(ArenaWriter {
            segs: vec![SegAlloc::new(seg, 0)],
            limit,
            total: len,
            live: 0,
            sent: 0,
            seq: 0,
        })
    }

    /// Allocates a record with a `len`-byte payload, in state WRITING.
    ///
    /// First-fit over all segments from the lowest address, after reclaiming
    /// the records the reader released (coalescing free neighbours). If
    /// nothing fits, a new segment of `max(needed, total so far)` bytes is
    /// created (capped so the arena stays within its limit). Past the limit:
    /// [`ArenaError::LimitExceeded`].
    pub fn alloc(&mut self, len: usize) -> Result<RecordRef, ArenaError> {
        let limit = self.limit;
        let limit_err = |live_bytes| ArenaError::LimitExceeded {
            limit,
            requested: len,
            live_bytes,
        };
        let Some(size) = record_size(len) else {
            return Err(limit_err(self.live));
        };
        self.reclaim();
        let found = self
            .segs
            .iter_mut()
            .enumerate()
            .find_map(|(i, s)| s.take_first_fit(size).map(|start| (i, start)));
        let (i, start) = match found {
            Some(f) => f,
            None => {
                let i = self.grow(size).ok_or_else(|| limit_err(self.live))??;
                let start = self.segs[i]
                    .take_first_fit(size)
                    .expect("a new segment fits its record");
                (i, start)
            }
        };
        self.seq += 1;
        let s = &mut self.segs[i];
        let h = record_header(&s.seg, start);
        h.magic.store(RECORD_MAGIC, Ordering::Relaxed);
        h.len.store(len as u64, Ordering::Relaxed);
        h.seq.store(self.seq, Ordering::Relaxed);
        h.state.store(state::WRITING, Ordering::Relaxed);
        s.used.insert(
            start,
            Used {
                size,
                len,
                published: false,
            },
        );
        self.live += size;
        Ok(RecordRef {
            segment: i as u32,
            offset: (start + RECORD_HEADER_LEN) as u64,
            len: len as u64,
        })
    }

    /// Adds a segment for a block of `size` bytes. `None`: over the limit.
    fn grow(&mut self, size: usize) -> Option<io::Result<usize>> {
        let page = page_size();
        let min_len = size.checked_add(SEGMENT_HEADER_LEN)?;
        let want = min_len.max(self.total).checked_next_multiple_of(page)?;
        let room = (self.limit.saturating_sub(self.total)) / page * page;
        let len = want.min(room);
        if len < min_len {
            return None;
        }
        let id = u32::try_from(self.segs.len()).ok()?;
        Some(Segment::create(len).map(|seg| {
            self.segs.push(SegAlloc::new(seg, id));
            self.total += len;
            id as usize
        }))
    }

    /// The writer's own used block for `r`, which must be WRITING.
    fn writing(&self, r: RecordRef) -> (usize, usize) {
        let start = (r.offset as usize).wrapping_sub(RECORD_HEADER_LEN);
        let u = self
            .segs
            .get(r.segment as usize)
            .and_then(|s| s.used.get(&start));
        match u {
            Some(u) if !u.published && u.len as u64 == r.len => (r.segment as usize, start),
            _ => panic!("ferroloader ring: {r:?} is not a record being written by this arena"),
        }
    }

    /// The payload of a record being written. Panics if `r` is not a
    /// WRITING record of this arena (published, abandoned or foreign).
    pub fn payload_mut(&mut self, r: RecordRef) -> &mut [u8] {
        let (i, start) = self.writing(r);
        let seg = &self.segs[i].seg;
        let off = start + RECORD_HEADER_LEN;
        debug_assert!(off + r.len as usize <= seg.len());
        // Under loom: the writer writes the payload from here to `publish`.
        #[cfg(loom)]
        seg.loom_write(off, r.len as usize);
        // SAFETY: (I2) the block [start, start + size) lies inside the live
        // mapping and overlaps no other record; `off + len` is within it.
        // (I3) the record is WRITING (checked), so the reader does not touch
        // its payload (its `open` needs LIVE), and the `&mut self` borrow
        // makes this the only slice the writer has into shared memory until
        // it ends. The bytes are initialised (zero-filled memfd pages or
        // earlier contents).
        unsafe { std::slice::from_raw_parts_mut(seg.as_ptr().add(off), r.len as usize) }
    }

    /// Hands a WRITING record to the reader (state LIVE, `Release`). The
    /// writer will not touch it again until the reader releases it.
    pub fn publish(&mut self, r: RecordRef) {
        let (i, start) = self.writing(r);
        let s = &mut self.segs[i];
        if let Some(u) = s.used.get_mut(&start) {
            u.published = true;
        }
        s.published += 1;
        record_header(&s.seg, start)
            .state
            .store(state::LIVE, Ordering::Release);
    }

    /// Gives a WRITING record back without publishing it (e.g. collate
    /// raised). Its space is free again at once.
    pub fn abandon(&mut self, r: RecordRef) {
        let (i, start) = self.writing(r);
        let s = &mut self.segs[i];
        let Some(u) = s.used.remove(&start) else {
            return;
        };
        record_header(&s.seg, start)
            .state
            .store(state::FREE, Ordering::Relaxed);
        s.give_back(start, u.size);
        self.live -= u.size;
    }

    /// Reclaims every record the reader released; `alloc` does this itself.
    /// Returns how many records were reclaimed.
    pub fn reclaim(&mut self) -> usize {
        let mut n = 0;
        for s in &mut self.segs {
            let (records, bytes) = s.reclaim();
            n += records;
            self.live -= bytes;
        }
        n
    }

    /// Segments created since the last call (segment 0 on the first), with
    /// their fds, to send to the reader before any record in them.
    pub fn take_new_segments(&mut self) -> Vec<(u32, BorrowedFd<'_>)> {
        let from = self.sent;
        self.sent = self.segs.len();
        self.segs[from..]
            .iter()
            .enumerate()
            .map(|(k, s)| ((from + k) as u32, s.seg.fd()))
            .collect()
    }

    /// Segment `id` as the reader would map it: the same heap memory
    /// (`Segment::share`). Heap-backed builds only (Miri, loom), which have
    /// no fds to send.
    #[cfg(any(miri, loom))]
    pub fn shared_segment(&self, id: u32) -> Option<Segment> {
        self.segs.get(id as usize).map(|s| s.seg.share())
    }

    /// Segment `id`'s fd, if it exists.
    pub fn segment_fd(&self, id: u32) -> Option<BorrowedFd<'_>> {
        self.segs.get(id as usize).map(|s| s.seg.fd())
    }

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.segs.len()
    }

    /// Segment `id`'s length in bytes, if it exists.
    pub fn segment_len(&self, id: u32) -> Option<usize> {
        self.segs.get(id as usize).map(|s| s.seg.len())
    }

    /// Total bytes of all segments (headers and free space included).
    pub fn total_len(&self) -> usize {
        self.total
    }

    /// The limit given to [`ArenaWriter::new`].
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes in records (headers and padding included) that are being
    /// written or were published and not yet reclaimed (as of the last
    /// `alloc` or `reclaim`).
    pub fn live_bytes(&self) -> usize {
        self.live
    }

    /// Records published and not yet reclaimed (as of the last `alloc` or
    /// `reclaim`).
    pub fn live_records(&self) -> usize {
        self.segs.iter().map(|s| s.published).sum()
    }

    /// Gives the pages of free space back to the kernel, keeping the lowest
    /// `keep_bytes` of the arena (in allocation order: segment 0 first)
    /// resident, so steady state stays fault-free. Use after a burst of held
    /// batches, at a quiet moment (e.g. between epochs). Returns the bytes
    /// punched out. The segments stay mapped and their ids valid.
    pub fn trim(&mut self, keep_bytes: usize) -> io::Result<usize> {
        self.reclaim();
        let page = page_size();
        let mut base = 0usize;
        let mut punched = 0usize;
        for s in &self.segs {
            for (&start, &size) in &s.free {
                let keep_end = keep_bytes.saturating_sub(base);
                let lo = start.max(keep_end).next_multiple_of(page);
                let hi = (start + size) / page * page;
                if hi > lo {
                    s.seg.punch_hole(lo, hi - lo)?;
                    punched += hi - lo;
                }
            }
            base += s.seg.len();
        }
        Ok(punched)
    }

    /// Checks the private block map against invariant I2 and the counters.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut live = 0;
        let mut total = 0;
        for s in &self.segs {
            total += s.seg.len();
            let mut blocks: Vec<(usize, usize, bool)> = s
                .free
                .iter()
                .map(|(&a, &n)| (a, n, true))
                .chain(s.used.iter().map(|(&a, u)| (a, u.size, false)))
                .collect();
            blocks.sort_unstable();
            let mut at = SEGMENT_HEADER_LEN;
            let mut prev_free = false;
            for &(a, n, is_free) in &blocks {
                assert_eq!(a, at, "blocks tile the segment");
                assert!(n > 0 && n % RECORD_ALIGN == 0);
                assert!(!(prev_free && is_free), "free neighbours are coalesced");
                prev_free = is_free;
                at += n;
            }
            assert!(at <= s.seg.len() && s.seg.len() - at < RECORD_ALIGN);
            live += s.used.values().map(|u| u.size).sum::<usize>();
            assert_eq!(s.published, s.used.values().filter(|u| u.published).count());
        }
        assert_eq!(live, self.live);
        assert_eq!(total, self.total);
        assert!(self.total <= self.limit);
    }
}

/// The main process's side of an arena: maps the worker's segments, opens
/// published records. `Send + Sync`: segments are added by one thread while
/// handles are opened and dropped on others.
#[derive(Debug, Default)]
pub struct ArenaReader {
    segs: RwLock<Vec<Option<Arc<Segment>>>>,
}

impl ArenaReader {
    /// An empty reader; add segments as the writer announces them.
    pub fn new() -> ArenaReader {
        ArenaReader::default()
    }

    /// Registers segment `id` (mapped with [`Segment::from_fd`]). Adding an
    /// id again replaces the mapping for later opens; handles keep theirs.
    pub fn add_segment(&self, id: u32, seg: Segment) {
        let mut segs = self.segs.write().unwrap_or_else(|e| e.into_inner());
        let i = id as usize;
        if segs.len() <= i {
            segs.resize(i + 1, None);
        }
        segs[i] = Some(Arc::new(seg));
    }

    /// Opens a published record: `None` if the segment is unknown, the ref
    /// is out of range or misaligned, or the record is not LIVE with that
    /// length (e.g. opened already). On success the record is HELD until
    /// the handle is dropped.
    pub fn open(&self, r: RecordRef) -> Option<RecordHandle> {
        let seg = {
            let segs = self.segs.read().unwrap_or_else(|e| e.into_inner());
            segs.get(r.segment as usize)?.clone()?
        };
        let offset = usize::try_from(r.offset).ok()?;
        let len = usize::try_from(r.len).ok()?;
        if offset % RECORD_ALIGN != 0
            || offset < SEGMENT_HEADER_LEN + RECORD_HEADER_LEN
            || offset.checked_add(len)? > seg.len()
        {
            return None;
        }
        let h = record_header(&seg, offset - RECORD_HEADER_LEN);
        if h.magic.load(Ordering::Relaxed) != RECORD_MAGIC {
            return None;
        }
        h.state
            .compare_exchange(
                state::LIVE,
                state::HELD,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .ok()?;
        if h.len.load(Ordering::Relaxed) != r.len {
            h.state.store(state::LIVE, Ordering::Release);
            return None;
        }
        Some(RecordHandle {
            seg,
            segment: r.segment,
            offset,
            len,
        })
    }

    /// Opens and at once releases a record the main process will not use
    /// (e.g. a batch of an abandoned epoch). Returns whether it was open-able.
    pub fn discard(&self, r: RecordRef) -> bool {
        self.open(r).is_some()
    }
}

/// A HELD record: the reader's access to one payload. Keeps its segment
/// mapped (`Arc<Segment>`) after the reader, the writer and the worker
/// process are gone. Dropping it releases the record (one atomic `Release`
/// store in its header, then a bump of the segment's release counter).
pub struct RecordHandle {
    seg: Arc<Segment>,
    segment: u32,
    offset: usize,
    len: usize,
}

impl RecordHandle {
    /// The payload's first byte (64-byte aligned).
    pub fn as_ptr(&self) -> *const u8 {
        self.as_mut_ptr()
    }

    /// The payload's first byte, writable: while the handle lives the
    /// payload belongs to the reader, so tensors over it may be modified in
    /// place. Do not write through it while a [`bytes`](Self::bytes) slice
    /// is alive.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.seg.as_ptr().wrapping_add(self.offset)
    }

    /// Payload length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The payload as bytes.
    pub fn bytes(&self) -> &[u8] {
        #[cfg(loom)]
        self.seg.loom_read(self.offset, self.len);
        // SAFETY: `open` checked `offset + len <= seg.len()` and the mapping
        // lives as long as `self.seg` (`Segment` invariant). (I3) the record
        // is HELD by this handle, so the writer neither writes nor reuses
        // those bytes until `Drop` stores RELEASED; its last writes were
        // ordered before our `Acquire` in `open`.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    /// The segment the record lies in (its mapping stays alive as long as
    /// this share of it).
    pub fn segment(&self) -> &Arc<Segment> {
        &self.seg
    }

    /// The record this handle holds.
    pub fn record(&self) -> RecordRef {
        RecordRef {
            segment: self.segment,
            offset: self.offset as u64,
            len: self.len as u64,
        }
    }
}

impl fmt::Debug for RecordHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordHandle")
            .field("record", &self.record())
            .finish()
    }
}

impl Drop for RecordHandle {
    fn drop(&mut self) {
        // Under loom: the holder may have written the payload in place up
        // to here; the writer's reuse must be ordered after this.
        #[cfg(loom)]
        self.seg.loom_write(self.offset, self.len);
        let h = record_header(&self.seg, self.offset - RECORD_HEADER_LEN);
        h.state.store(state::RELEASED, Ordering::Release);
        segment_header(&self.seg)
            .released
            .fetch_add(1, Ordering::Release);
    }
}
