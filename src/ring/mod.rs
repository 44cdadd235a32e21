//! The shared-memory arena ("ring") that carries batches from a worker
//! process to the main process without copying them a second time.
//!
//! Each worker owns one arena. The worker ([`ArenaWriter`], the only writer
//! and the only allocator) writes each collated batch into a *record*,
//! publishes it and tells the main process its [`RecordRef`] (a message
//! outside this module). The main process ([`ArenaReader`]) maps the same
//! memory, [opens](ArenaReader::open) the record and hands out tensors over
//! the [`RecordHandle`]'s bytes; when the handle is dropped (the last tensor
//! is freed, on any thread, in any order) the record is marked released with
//! one atomic store in shared memory, and the worker reuses its space on a
//! later allocation. It is an arena with out-of-order release, not a FIFO.
//!
//! This is the one engine module that uses `unsafe` (mapping memory, viewing
//! shared words as atomics, handing out payload slices). Every block carries
//! a `// SAFETY:` comment that refers back to the invariants below and to
//! [`Segment`]'s.
//!
//! # Protocol
//!
//! ## Segments
//!
//! An arena is a list of [`Segment`]s numbered 0, 1, 2, ... in creation
//! order: anonymous memfds (`memfd_create`, never a `/dev/shm` file), sized
//! once and sealed against shrinking and growing, mapped `MAP_SHARED` by both
//! processes (at different addresses; everything in shared memory is an
//! offset). The writer creates them; their fds reach the reader through
//! [`ArenaWriter::take_new_segments`] and the worker's Unix socket, and the
//! reader maps them with [`Segment::from_fd`] and [`ArenaReader::add_segment`].
//! A new segment id is sent before any record in it is published.
//!
//! Each segment starts with a 64-byte segment header:
//!
//! | offset | type        | field      | written by                                      |
//! |--------|-------------|------------|-------------------------------------------------|
//! | 0      | `AtomicU32` | magic      | writer, at creation (`b"FLSG"`)                 |
//! | 4      | `AtomicU32` | version    | writer, at creation (1)                         |
//! | 8      | `AtomicU64` | `released` | reader: `fetch_add(1, Release)` after each release |
//! | 16     | `AtomicU32` | segment id | writer, at creation                             |
//! | 20..64 | reserved    |            |                                                 |
//!
//! The rest of the segment, `[64, len)`, is tiled by records and free space,
//! in 64-byte granules.
//!
//! ## Records
//!
//! A record is a 64-byte header followed by the payload, rounded up to a
//! multiple of 64 bytes, so every payload is 64-byte aligned (segments are
//! page aligned). A [`RecordRef`] names the *payload*: `offset` is its start
//! in the segment, `len` the exact length asked for; the header lies at
//! `offset - 64`.
//!
//! | offset | type        | field   | written by                                 |
//! |--------|-------------|---------|--------------------------------------------|
//! | 0      | `AtomicU32` | `state` | both, see the state machine                |
//! | 4      | `AtomicU32` | magic   | writer, at allocation (`b"FLRC"`)          |
//! | 8      | `AtomicU64` | `len`   | writer, at allocation (payload length)     |
//! | 16     | `AtomicU64` | `seq`   | writer, at allocation (its allocation count; diagnostics) |
//! | 24..64 | reserved    |         |                                            |
//!
//! **Sizes belong to the writer alone.** The writer keeps the true block map
//! (which ranges are records, which are free, and how large each is) in its
//! own private memory; the header's `len` is only a copy the reader checks a
//! `RecordRef` against. Nothing the reader writes can change the writer's
//! allocator except the one `state` transition it is allowed to make.
//!
//! ## State machine of `state`
//!
//! ```text
//!  FREE(0) --alloc--> WRITING(1) --publish--> LIVE(2) --open--> HELD(3) --drop--> RELEASED(4)
//!     ^                  |  abandon                                                   |
//!     +------------------+----------------------- reclaim (writer) -------------------+
//! ```
//!
//! * `alloc` (writer): writes magic, `len`, `seq`, then `state = WRITING`,
//!   all `Relaxed` (no one else looks at the record yet). The writer then
//!   fills the payload with plain stores.
//! * `publish` (writer): `state.store(LIVE, Release)`: every payload byte
//!   written before happens-before a reader's `Acquire` that sees `LIVE`.
//!   From here on the writer neither writes nor reads the payload.
//! * `open` (reader): checks the ref (segment known, aligned, in range,
//!   magic), then `state.compare_exchange(LIVE, HELD, Acquire, Relaxed)`,
//!   then checks `len`. A ref can be opened once: a second `open` (or one of
//!   a stale ref) fails instead of producing a second handle whose drop would
//!   release the record early. While `HELD` the payload belongs to the reader
//!   (tensors may even be written in place).
//! * drop of the [`RecordHandle`] (reader, any thread):
//!   `state.store(RELEASED, Release)`, then the segment's
//!   `released.fetch_add(1, Release)`. The `Release` orders every access the
//!   reader made to the payload before the writer's reuse of the space.
//! * reclaim (writer, inside `alloc`/[`reclaim`](ArenaWriter::reclaim)): for
//!   each segment, `released.load(Acquire)`; only if it moved since the last
//!   sweep, the writer sweeps its published records with
//!   `state.load(Acquire)` and returns each `RELEASED` one to its free map
//!   (writing `state = FREE`, `Relaxed`). The counter is read *before* the
//!   sweep, so a release racing the sweep is seen by the next one; none is
//!   lost. The `Acquire` pairs with the reader's `Release` store.
//! * `abandon` (writer): an unpublished record goes straight back to FREE.
//!
//! The header words are only ever accessed as atomics by both sides; lock-free
//! 32- and 64-bit atomics are address-free on Linux x86_64 and aarch64, so
//! they work between two mappings of the same page in different processes.
//! (In practice the `RecordRef` message crosses a socket, itself a full
//! barrier, but the protocol does not rely on it.)
//!
//! ## Allocation and reclamation
//!
//! First-fit from the lowest address: segments in id order, free blocks in
//! offset order, the first block large enough is split and its low end used.
//! Free neighbours are coalesced as soon as a block becomes free (abandon or
//! reclaim). Steady state therefore keeps reusing the same low, already
//! touched pages: a fresh page of shared memory costs a page fault on first
//! touch (about 10x a `memcpy`), a reused one does not. Out-of-order release
//! only leaves holes that the next fitting allocation fills.
//!
//! ## Growth and the limit
//!
//! If no free block fits, the writer creates a new segment of
//! `max(needed, total arena size so far)` bytes (page rounded), so the arena
//! doubles and a batch larger than any record (or than the initial segment)
//! still gets one, only slower. Segments are never unmapped while the writer
//! lives (their ids stay valid for the reader), so in steady state no segment
//! is created and no fd is sent. [`ArenaWriter::trim`] can give the pages of
//! free space back to the kernel (hole punching) after a burst.
//!
//! The arena's total size never exceeds the limit given to
//! [`ArenaWriter::new`] (a growth segment is capped to fit). When a record
//! cannot fit even so, `alloc` returns [`ArenaError::LimitExceeded`], whose
//! message tells the user to release held batches sooner or raise
//! `FERROLOADER_SHM_LIMIT`. The error may be transient (batches in flight to
//! the main process may still be released); the caller decides whether to
//! wait and retry.
//!
//! ## Lifetimes
//!
//! A [`RecordHandle`] holds an `Arc<Segment>`: its mapping outlives the
//! [`ArenaReader`], the [`ArenaWriter`] and the worker process itself. A
//! release after the worker is gone is a harmless store into memory no one
//! reuses. The memfd's pages are freed by the kernel when the last mapping
//! and fd are gone, in every way a process can exit.

#![allow(unsafe_code)]

mod arena;
mod budget;
mod mailbox;
// The real segment is a memfd mapped `MAP_SHARED`. Miri cannot run that
// and loom's atomics cannot live in raw mapped bytes, so under either the
// same API is backed by heap memory (see `heap_segment.rs`); the arena and
// mailbox code above it is the same in all builds.
#[cfg(not(any(miri, loom)))]
mod segment;
#[cfg(any(miri, loom))]
#[path = "heap_segment.rs"]
mod segment;
mod sync;

pub use arena::{
    ArenaError, ArenaReader, ArenaWriter, RecordHandle, RecordRef, RECORD_ALIGN, RECORD_HEADER_LEN,
    SEGMENT_HEADER_LEN,
};
pub use budget::RecordBudget;
pub use mailbox::{Dir, Mailbox};
pub use segment::{page_size, Segment};

#[cfg(all(test, not(loom)))]
mod tests;

// Model checks of the arena and mailbox protocols under loom; see that file
// for how to run them.
#[cfg(all(test, loom))]
mod loom_models;
