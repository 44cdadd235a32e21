//! Model checks of the ring's two shared-memory protocols under loom, which
//! runs each model once for every interleaving of its threads and every
//! value a load may return under the C11 memory model (within loom's
//! documented limits: `SeqCst` accesses are treated as `AcqRel`, and some
//! load-buffering outcomes are not explored).
//!
//! The code under test is the real one: with `--cfg loom`, `sync.rs` gives
//! the arena and the mailbox loom's atomics, and `heap_segment.rs` backs a
//! segment by heap memory whose header words are loom atomics and whose
//! bytes each have a loom `UnsafeCell`, touched by `payload_mut`,
//! `RecordHandle::bytes`, `RecordHandle`'s drop and the mailbox's
//! `write_at`/`read_at`. So besides the assertions below, loom fails a model
//! if any payload byte is read or written by one side without the
//! protocol's atomics ordering it after the other side's last access.
//!
//! Run (a separate target dir: `--cfg loom` rebuilds every crate):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --lib ring::loom_models
//! ```
//!
//! All six take about 30 s in all on one core of the dev machine (release
//! build). Every model but `arena_release_on_two_threads` is a full search;
//! `LOOM_MAX_PREEMPTIONS=N` bounds the others too, for a quicker pass.
//!
//! Each property was checked to fail when the protocol is broken on
//! purpose (publish, open's exchange, the release store or reclaim's load
//! made `Relaxed`; the release count bumped before the `RELEASED` store;
//! reclaim reading the counter after its sweep; the mailbox's `tail` or
//! `head` store made `Relaxed`; its room check off by one; `prepare_sleep`
//! without its re-check).

use super::{ArenaError, ArenaReader, ArenaWriter, Dir, Mailbox, RecordHandle, RecordRef};
use super::{RECORD_ALIGN, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// Payload length of the arena models' records (one granule).
const LEN: usize = 8;
/// A segment with room for exactly two such records: the third allocation
/// has to wait for a release and reuse its space.
const SEG: usize = SEGMENT_HEADER_LEN + 2 * (RECORD_HEADER_LEN + RECORD_ALIGN);
/// Records the writer publishes in each arena model.
const RECORDS: usize = 3;

/// A `RecordRef` of segment 0 as one non-zero word (0: not yet sent).
fn encode(r: RecordRef) -> u64 {
    assert_eq!(r.segment, 0, "the model's arena never grows");
    r.offset << 32 | r.len
}

fn decode(v: u64) -> RecordRef {
    RecordRef {
        segment: 0,
        offset: v >> 32,
        len: v & 0xffff_ffff,
    }
}

/// The byte record `k` is filled with (never 0, the fresh memory's value).
fn tag(k: usize) -> u8 {
    k as u8 + 1
}

/// How the reader of [`arena_model`] gives records 0 and 1 back.
#[derive(Clone, Copy)]
enum Release {
    /// Record 0, then record 1.
    InOrder,
    /// Record 1, then record 0.
    OutOfOrder,
    /// Record 1's handle is dropped by a thread of its own (as a tensor
    /// freed on any thread is) while the reader drops record 0.
    OnTwoThreads,
}

/// Writer (the model's main thread) and one reader thread over a two-record
/// arena; the reader holds records 0 and 1 at once and releases them as
/// `release` says, then takes record 2, which only fits in space released. Refs cross from writer to reader through `Relaxed` atomics, so
/// nothing but the record's own `state` word orders the two sides (the
/// production socket is a barrier the protocol does not rely on); the
/// reader retries `open` until the record is visibly LIVE.
///
/// Checks: every published record opens, exactly once; the reader sees the
/// bytes written before `publish`, and they stay intact until its drop (the
/// writer never reuses a record the reader holds); loom's cell tracking
/// finds no payload access unordered with the other side's; after both
/// sides are done, one `reclaim` returns every record (no release lost) and
/// the writer's block map is whole again.
fn arena_model(release: Release, builder: loom::model::Builder) {
    builder.check(move || {
        let mut w = ArenaWriter::new(SEG, SEG).expect("arena");
        let r = ArenaReader::new();
        r.add_segment(0, w.shared_segment(0).expect("segment 0"));
        let slots: Arc<[AtomicU64; RECORDS]> = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));

        let reader = {
            let slots = Arc::clone(&slots);
            thread::spawn(move || {
                let open = |k: usize| {
                    let rec = loop {
                        match slots[k].load(Ordering::Relaxed) {
                            0 => thread::yield_now(),
                            v => break decode(v),
                        }
                    };
                    let h = loop {
                        match r.open(rec) {
                            Some(h) => break h,
                            None => thread::yield_now(),
                        }
                    };
                    assert!(r.open(rec).is_none(), "record {k} opened twice");
                    assert!(h.bytes().iter().all(|&b| b == tag(k)), "record {k}");
                    h
                };
                // Each handle's bytes are checked again just before its drop:
                // the writer must not have reused the record meanwhile.
                let give_back = |k: usize, h: RecordHandle| {
                    assert!(h.bytes().iter().all(|&b| b == tag(k)), "record {k} reused");
                    drop(h);
                };
                let (h0, h1) = (open(0), open(1));
                match release {
                    Release::InOrder => {
                        give_back(0, h0);
                        give_back(1, h1);
                    }
                    Release::OutOfOrder => {
                        give_back(1, h1);
                        give_back(0, h0);
                    }
                    Release::OnTwoThreads => {
                        let other = thread::spawn(move || give_back(1, h1));
                        give_back(0, h0);
                        other.join().expect("releaser");
                    }
                }
                let h = open(2);
                assert!(h.bytes().iter().all(|&b| b == tag(2)), "record 2");
            })
        };

        for (k, slot) in slots.iter().enumerate() {
            let rec = loop {
                match w.alloc(LEN) {
                    Ok(rec) => break rec,
                    Err(ArenaError::LimitExceeded { .. }) => thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
            };
            w.payload_mut(rec).fill(tag(k));
            w.publish(rec);
            slot.store(encode(rec), Ordering::Relaxed);
        }
        reader.join().expect("reader");

        w.reclaim();
        assert_eq!(w.live_records(), 0, "a release was lost");
        assert_eq!(w.live_bytes(), 0);
        w.check_invariants();
        let whole = SEG - SEGMENT_HEADER_LEN - RECORD_HEADER_LEN;
        assert!(w.alloc(whole).is_ok(), "free space coalesced");
    });
}

/// The arena protocol with the held records released in allocation order
/// (full search).
#[test]
fn arena_release_in_order() {
    arena_model(Release::InOrder, loom::model::Builder::new());
}

/// The arena protocol with the held records released out of order (the
/// later record first), so reclaim frees a hole below a held record (full
/// search).
#[test]
fn arena_release_out_of_order() {
    arena_model(Release::OutOfOrder, loom::model::Builder::new());
}

/// The arena protocol with the two held records released concurrently by
/// two threads. Three threads make the full search too long (over 2.7
/// million executions in 5 minutes, unfinished), so this one explores every
/// execution with at most 4 preemptions (loom's advice: most bugs need 2 or
/// fewer); `LOOM_MAX_PREEMPTIONS` overrides the bound (5: ~1 minute).
#[test]
fn arena_release_on_two_threads() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(4);
    arena_model(Release::OnTwoThreads, builder);
}

/// The writer publishes two records and sweeps twice (`reclaim`) while the
/// reader opens them and releases them on two threads (the second record's
/// handle is dropped by another thread, as a tensor freed anywhere is), so
/// the sweeps race both releases' two steps (the `RELEASED` store, then the
/// counter bump) and the releases race each other. Refs cross through
/// `Relaxed` atomics as in [`arena_model`].
///
/// Checks: after the reader is done, one more `reclaim` returns every
/// record: no sweep ever consumed a count without also freeing the record
/// that made it (the counter is read before the sweep, and a release bumps
/// it only after its `RELEASED` store). Loom's cell tracking checks, as
/// above, that reclaimed space is reused only after the reader's accesses.
#[test]
fn arena_reclaim_racing_releases() {
    loom::model(|| {
        let mut w = ArenaWriter::new(SEG, SEG).expect("arena");
        let r = ArenaReader::new();
        r.add_segment(0, w.shared_segment(0).expect("segment 0"));
        let slots: Arc<[AtomicU64; 2]> = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
        let reader = {
            let slots = Arc::clone(&slots);
            thread::spawn(move || {
                let open = |k: usize| {
                    let rec = loop {
                        match slots[k].load(Ordering::Relaxed) {
                            0 => thread::yield_now(),
                            v => break decode(v),
                        }
                    };
                    loop {
                        match r.open(rec) {
                            Some(h) => break h,
                            None => thread::yield_now(),
                        }
                    }
                };
                let h0 = open(0);
                let h1 = open(1);
                // A tensor freed on another thread: the two releases race.
                let other = thread::spawn(move || drop(h1));
                drop(h0);
                other.join().expect("releaser");
            })
        };
        for (k, slot) in slots.iter().enumerate() {
            let rec = w.alloc(LEN).expect("two records fit");
            w.payload_mut(rec).fill(tag(k));
            w.publish(rec);
            slot.store(encode(rec), Ordering::Relaxed);
        }
        w.reclaim();
        w.reclaim();
        reader.join().expect("reader");
        w.reclaim();
        assert_eq!(w.live_records(), 0, "a release was lost");
        w.check_invariants();
        // The reclaimed space is reused (loom checks the reader's accesses
        // are ordered before these writes).
        let a = w.alloc(LEN).expect("reclaimed");
        w.payload_mut(a).fill(9);
        let b = w.alloc(LEN).expect("reclaimed");
        w.payload_mut(b).fill(9);
    });
}

/// Message `k` of the mailbox models.
fn message(k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (k * 64 + i) as u8).collect()
}

/// One producer, one consumer, a 64-byte ring. Lengths 28 and 25 fill 61
/// of its 64 bytes (4 + 28, 4 + 25), so the third message (empty: 4
/// bytes) is refused until the consumer pops the first, by one byte, and
/// then its length prefix wraps around the end of the ring.
///
/// Checks: the consumer gets every message, once, in order, with the bytes
/// the producer wrote (and loom's cell tracking finds no ring byte read
/// before its `tail` store published it, or overwritten before the
/// consumer's `head` store gave it back); nothing is left over.
#[test]
fn mailbox_fifo_no_loss_no_duplicate() {
    loom::model(|| {
        const LENS: [usize; 3] = [28, 25, 0];
        let producer = Mailbox::create(64).expect("mailbox");
        let consumer = producer.share();
        let t = thread::spawn(move || {
            for (k, len) in LENS.into_iter().enumerate() {
                while !producer.push(Dir::Results, &message(k, len)) {
                    thread::yield_now();
                }
            }
        });
        let mut out = Vec::new();
        for (k, len) in LENS.into_iter().enumerate() {
            while !consumer.pop(Dir::Results, &mut out).expect("well-formed") {
                thread::yield_now();
            }
            assert_eq!(out, message(k, len), "message {k}");
        }
        t.join().expect("producer");
        assert!(!consumer.pop(Dir::Results, &mut out).expect("well-formed"));
    });
}

/// The sleep/wake handshake. The consumer pops; on an empty ring it
/// announces sleep (`prepare_sleep`, which re-checks the ring) and, if that
/// commits, blocks until woken; then `end_sleep`. The producer pushes and,
/// if `consumer_was_sleeping`, wakes it. The wake-up is a loom condvar over
/// a flag (the socket byte of production: a wake sent before the consumer
/// blocks is not lost, a spurious one is harmless).
///
/// Checks: no lost wake-up: a consumer that committed to sleep with the
/// ring empty is always woken by a later push (otherwise both threads end
/// up blocked or finished and loom reports the deadlock), and every message
/// arrives once, in order.
///
/// It also passes with every ordering of the handshake weakened to
/// Acquire/Release/AcqRel (tried by hand), as the mailbox docs argue. With
/// the consumer's writes of the flag as plain stores it fails: under
/// acquire/release alone that lost wake-up is real; with SeqCst it is not
/// (the single total order forbids it), but loom, which treats SeqCst
/// accesses as AcqRel, cannot tell, which is one reason every write of the
/// flag is a swap.
#[test]
fn mailbox_sleep_and_wake_never_loses_a_wakeup() {
    loom::model(|| {
        const N: usize = 2;
        let producer = Mailbox::create(64).expect("mailbox");
        let consumer = producer.share();
        let wake = Arc::new((Mutex::new(false), Condvar::new()));
        let t = {
            let wake = Arc::clone(&wake);
            thread::spawn(move || {
                for k in 0..N {
                    assert!(producer.push(Dir::Tasks, &message(k, 4)));
                    if producer.consumer_was_sleeping(Dir::Tasks) {
                        *wake.0.lock().expect("lock") = true;
                        wake.1.notify_one();
                    }
                }
            })
        };
        let mut out = Vec::new();
        for k in 0..N {
            while !consumer.pop(Dir::Tasks, &mut out).expect("well-formed") {
                if consumer.prepare_sleep(Dir::Tasks) {
                    let mut woken = wake.0.lock().expect("lock");
                    while !*woken {
                        woken = wake.1.wait(woken).expect("wait");
                    }
                    *woken = false;
                    drop(woken);
                    consumer.end_sleep(Dir::Tasks);
                }
            }
            assert_eq!(out, message(k, 4), "message {k}");
        }
        t.join().expect("producer");
    });
}
