//! Tests of the arena protocol. Every test maps the writer's segments a
//! second time through a dup'ed fd (`Segment::from_fd`), as the main process
//! does, so reads go through a different mapping than the writes.
//!
//! Under Miri (`cargo +nightly miri test --lib ring`), which has neither
//! memfds nor shared mappings, segments are heap memory
//! (`heap_segment.rs`) and the reader shares the writer's instead: the
//! arena's own code is the same, and Miri checks its `unsafe` blocks and
//! the ordering of the two sides' accesses. Tests of the fd handover are
//! ignored there, and the long ones run shorter.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// Payload offset of the lowest record of a segment.
const FIRST: u64 = (SEGMENT_HEADER_LEN + RECORD_HEADER_LEN) as u64;

/// Hands the writer's new segments to the reader through dup'ed fds.
#[cfg(not(miri))]
fn connect(w: &mut ArenaWriter, r: &ArenaReader) {
    for (id, fd) in w.take_new_segments() {
        let seg = Segment::from_fd(fd.try_clone_to_owned().unwrap()).unwrap();
        r.add_segment(id, seg);
    }
}

/// Under Miri: hands every segment of the writer to the reader again (the
/// same heap memory; re-adding one is harmless).
#[cfg(miri)]
fn connect(w: &mut ArenaWriter, r: &ArenaReader) {
    for id in 0..w.segment_count() as u32 {
        r.add_segment(id, w.shared_segment(id).unwrap());
    }
}

/// `native` natively, `miri` under Miri: the iteration counts of the long
/// tests.
const fn scaled(native: u64, miri: u64) -> u64 {
    if cfg!(miri) {
        miri
    } else {
        native
    }
}

fn size_of_record(len: usize) -> usize {
    RECORD_HEADER_LEN + len.next_multiple_of(RECORD_ALIGN)
}

/// A payload byte pattern that differs per record and per position.
fn pattern(tag: u64, i: usize) -> u8 {
    (tag.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8
}

/// One period of `pattern(tag, _)` (it repeats every 251 bytes), so that
/// filling and checking run at memcpy/memcmp speed even in debug builds.
fn period(tag: u64) -> Vec<u8> {
    (0..251).map(|i| pattern(tag, i)).collect()
}

fn fill(w: &mut ArenaWriter, rec: RecordRef, tag: u64) {
    let p = period(tag);
    for c in w.payload_mut(rec).chunks_mut(251) {
        c.copy_from_slice(&p[..c.len()]);
    }
}

fn intact(h: &RecordHandle, tag: u64) -> bool {
    let p = period(tag);
    h.bytes().chunks(251).all(|c| c == &p[..c.len()])
}

/// A cheaper check for the per-step sweep of the property test: both ends
/// of the payload (where a neighbour's header or tail would land) and a
/// stride through the middle.
fn intact_sampled(h: &RecordHandle, tag: u64) -> bool {
    let b = h.bytes();
    let n = b.len();
    let edges = (0..n.min(128)).chain(n.saturating_sub(128)..n);
    edges
        .chain((0..n).step_by(509))
        .all(|i| b[i] == pattern(tag, i))
}

/// Alloc, fill, publish, connect, open.
fn put(w: &mut ArenaWriter, r: &ArenaReader, len: usize, tag: u64) -> RecordHandle {
    let rec = w.alloc(len).unwrap();
    fill(w, rec, tag);
    w.publish(rec);
    connect(w, r);
    r.open(rec).unwrap()
}

#[test]
fn send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Segment>();
    send_sync::<ArenaReader>();
    send_sync::<RecordHandle>();
    send::<ArenaWriter>();
}

#[test]
fn reader_sees_writer_bytes_through_its_own_mapping() {
    let mut w = ArenaWriter::new(64 * KIB, 16 * MIB).unwrap();
    let r = ArenaReader::new();
    let rec = w.alloc(1000).unwrap();
    assert_eq!(
        rec,
        RecordRef {
            segment: 0,
            offset: FIRST,
            len: 1000
        }
    );
    fill(&mut w, rec, 5);
    w.publish(rec);
    connect(&mut w, &r);
    let h = r.open(rec).unwrap();
    assert_eq!(h.len(), 1000);
    assert_eq!(h.as_ptr() as usize % RECORD_ALIGN, 0);
    assert!(intact(&h, 5));
    assert_eq!(h.record(), rec);
    assert_eq!(w.live_bytes(), size_of_record(1000));
    drop(h);
    assert_eq!(w.reclaim(), 1);
    assert_eq!(w.live_bytes(), 0);
    w.check_invariants();
}

#[test]
fn open_rejects_bad_refs_and_a_second_open() {
    let mut w = ArenaWriter::new(64 * KIB, MIB).unwrap();
    let r = ArenaReader::new();
    let rec = w.alloc(100).unwrap();
    connect(&mut w, &r);
    assert!(r.open(rec).is_none(), "WRITING is not open-able");
    w.publish(rec);
    for bad in [
        RecordRef { segment: 1, ..rec },
        RecordRef {
            offset: rec.offset + 1,
            ..rec
        },
        RecordRef {
            offset: rec.offset + 64,
            ..rec
        },
        RecordRef { offset: 0, ..rec },
        RecordRef { len: 101, ..rec },
        RecordRef {
            len: u64::MAX,
            ..rec
        },
        RecordRef {
            offset: u64::MAX - 63,
            ..rec
        },
    ] {
        assert!(r.open(bad).is_none(), "{bad:?}");
    }
    let h = r.open(rec).unwrap();
    assert!(r.open(rec).is_none(), "a record is opened once");
    drop(h);
    assert!(r.open(rec).is_none(), "released is not open-able");
}

#[test]
fn discard_releases_without_reading() {
    let mut w = ArenaWriter::new(64 * KIB, MIB).unwrap();
    let r = ArenaReader::new();
    let rec = w.alloc(100).unwrap();
    w.publish(rec);
    connect(&mut w, &r);
    assert!(r.discard(rec));
    assert!(!r.discard(rec));
    assert_eq!(w.reclaim(), 1);
    assert_eq!(w.live_bytes(), 0);
}

#[test]
fn zero_length_record() {
    let mut w = ArenaWriter::new(64 * KIB, MIB).unwrap();
    let r = ArenaReader::new();
    let h = put(&mut w, &r, 0, 0);
    assert!(h.is_empty() && h.bytes().is_empty());
    assert_eq!(w.live_bytes(), RECORD_HEADER_LEN);
    drop(h);
    assert_eq!(w.alloc(0).unwrap().offset, FIRST);
}

#[test]
fn abandon_gives_the_space_back() {
    let mut w = ArenaWriter::new(64 * KIB, MIB).unwrap();
    let a = w.alloc(5000).unwrap();
    w.payload_mut(a)[0] = 1;
    w.abandon(a);
    assert_eq!(w.live_bytes(), 0);
    assert_eq!(w.alloc(10).unwrap().offset, FIRST);
    w.check_invariants();
}

#[test]
#[should_panic(expected = "not a record being written")]
fn payload_mut_of_a_published_record_panics() {
    let mut w = ArenaWriter::new(64 * KIB, MIB).unwrap();
    let a = w.alloc(10).unwrap();
    w.publish(a);
    w.payload_mut(a);
}

#[test]
#[should_panic(expected = "not a record being written")]
fn double_publish_panics() {
    let mut w = ArenaWriter::new(64 * KIB, MIB).unwrap();
    let a = w.alloc(10).unwrap();
    w.publish(a);
    w.publish(a);
}

#[test]
fn first_fit_reuses_the_lowest_released_space() {
    let mut w = ArenaWriter::new(MIB, 16 * MIB).unwrap();
    let r = ArenaReader::new();
    let hs: Vec<_> = (0..6).map(|t| put(&mut w, &r, 4 * KIB, t)).collect();
    let offs: Vec<u64> = hs.iter().map(|h| h.record().offset).collect();
    let step = size_of_record(4 * KIB) as u64;
    assert!(offs.windows(2).all(|p| p[1] - p[0] == step));
    // Release out of order: 4, then 1, then 3.
    let mut hs: Vec<Option<RecordHandle>> = hs.into_iter().map(Some).collect();
    for i in [4, 1, 3] {
        hs[i] = None;
    }
    // The lowest hole (record 1's) is reused first, not the space after 5.
    let a = w.alloc(4 * KIB).unwrap();
    assert_eq!(a.offset, offs[1]);
    // 3 and 4 were coalesced: a record of twice the size fits at 3.
    let b = w.alloc(2 * 4 * KIB + 32).unwrap();
    assert_eq!(b.offset, offs[3]);
    // Everything else continues after record 5.
    let c = w.alloc(10).unwrap();
    assert_eq!(c.offset, offs[5] + step);
    for h in hs.iter().flatten() {
        let tag = offs.iter().position(|&o| o == h.record().offset).unwrap() as u64;
        assert!(intact(h, tag));
    }
    w.check_invariants();
}

#[test]
fn coalescing_both_sides() {
    let mut w = ArenaWriter::new(MIB, 16 * MIB).unwrap();
    let r = ArenaReader::new();
    let mut hs: Vec<Option<RecordHandle>> =
        (0..4).map(|t| Some(put(&mut w, &r, 1000, t))).collect();
    let first = hs[0].as_ref().unwrap().record().offset;
    // Middle, then the left neighbour, then the right one: one block of 3.
    for i in [1, 0, 2] {
        hs[i] = None;
        w.reclaim();
        w.check_invariants();
    }
    let big = w
        .alloc(3 * size_of_record(1000) - RECORD_HEADER_LEN)
        .unwrap();
    assert_eq!(big.offset, first);
    w.check_invariants();
}

#[test]
// Checks the fd handover (`take_new_segments`, `segment_fd`, `from_fd`):
// heap segments under Miri have no fds.
#[cfg_attr(miri, ignore)]
fn grows_into_new_segments_for_held_and_oversized_records() {
    let mut w = ArenaWriter::new(64 * KIB, 64 * MIB).unwrap();
    let r = ArenaReader::new();
    assert_eq!(w.take_new_segments().len(), 1);
    // A record larger than the whole initial segment.
    let big = w.alloc(MIB).unwrap();
    assert_eq!(big.segment, 1);
    assert_eq!(big.offset, FIRST);
    let new: Vec<u32> = w
        .take_new_segments()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(new, vec![1]);
    assert!(w.take_new_segments().is_empty());
    fill(&mut w, big, 9);
    w.publish(big);
    let seg0 = Segment::from_fd(w.segment_fd(0).unwrap().try_clone_to_owned().unwrap()).unwrap();
    let seg1 = Segment::from_fd(w.segment_fd(1).unwrap().try_clone_to_owned().unwrap()).unwrap();
    r.add_segment(0, seg0);
    r.add_segment(1, seg1);
    let h = r.open(big).unwrap();
    assert!(intact(&h, 9));
    // Held small records fill segment 0, then later segments: sizes double.
    let mut held = vec![h];
    for t in 0..200 {
        held.push(put(&mut w, &r, 16 * KIB, t + 100));
    }
    let lens: Vec<usize> = (0..w.segment_count() as u32)
        .map(|i| w.segment_len(i).unwrap())
        .collect();
    assert!(lens.len() >= 3, "{lens:?}");
    for i in 2..lens.len() {
        let before: usize = lens[..i].iter().sum();
        assert!(lens[i] >= before.min(64 * MIB - before), "{lens:?}");
    }
    assert_eq!(w.total_len(), lens.iter().sum::<usize>());
    for (k, h) in held.iter().enumerate().skip(1) {
        assert!(intact(h, k as u64 + 99));
    }
    drop(held);
    w.reclaim();
    assert_eq!(w.live_bytes(), 0);
    // All released: back to the lowest address, no new segment.
    let n = w.segment_count();
    assert_eq!(w.alloc(16 * KIB).unwrap().offset, FIRST);
    assert_eq!(w.segment_count(), n);
    w.check_invariants();
}

#[test]
fn limit_error_then_recovery() {
    let limit = 512 * KIB;
    let mut w = ArenaWriter::new(64 * KIB, limit).unwrap();
    let r = ArenaReader::new();
    let mut held = Vec::new();
    let err = loop {
        match w.alloc(50 * KIB) {
            Ok(rec) => {
                w.publish(rec);
                connect(&mut w, &r);
                held.push(r.open(rec).unwrap());
            }
            Err(e) => break e,
        }
        assert!(held.len() < 100);
    };
    assert!(w.total_len() <= limit);
    match &err {
        ArenaError::LimitExceeded {
            limit: l,
            requested,
            live_bytes,
        } => {
            assert_eq!((*l, *requested), (limit, 50 * KIB));
            assert_eq!(*live_bytes, held.len() * size_of_record(50 * KIB));
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("FERROLOADER_SHM_LIMIT"), "{msg}");
    assert!(msg.contains("Release held batches sooner"), "{msg}");
    assert!(msg.contains(&limit.to_string()), "{msg}");
    // A single record over the limit fails at once, even with room.
    drop(held);
    assert!(matches!(
        w.alloc(limit),
        Err(ArenaError::LimitExceeded { .. })
    ));
    assert!(matches!(
        w.alloc(usize::MAX),
        Err(ArenaError::LimitExceeded { .. })
    ));
    // Released batches make room again, without growing.
    let total = w.total_len();
    for _ in 0..10 {
        let rec = w.alloc(50 * KIB).unwrap();
        w.publish(rec);
        assert!(r.discard(rec));
    }
    assert_eq!(w.total_len(), total);
    w.check_invariants();
}

#[test]
fn initial_len_is_clamped_to_the_limit() {
    let p = page_size();
    let w = ArenaWriter::new(MIB, 3 * p + 5).unwrap();
    assert_eq!(w.total_len(), 3 * p);
    assert!(ArenaWriter::new(MIB, 10).is_err());
}

#[test]
fn handle_outlives_reader_writer_and_fds() {
    let mut w = ArenaWriter::new(64 * KIB, MIB).unwrap();
    let r = ArenaReader::new();
    let h = put(&mut w, &r, 40 * KIB, 3);
    let h = std::sync::Arc::new(h);
    let h2 = h.clone();
    drop(r);
    drop(w);
    assert!(intact(&h, 3));
    let t = std::thread::spawn(move || intact(&h2, 3));
    assert!(t.join().unwrap());
    drop(h); // the release store lands in memory only this mapping keeps.
}

#[test]
fn release_from_other_threads() {
    let mut w = ArenaWriter::new(256 * KIB, 64 * MIB).unwrap();
    let r = ArenaReader::new();
    let hs: Vec<_> = (0..64)
        .map(|t| (t, put(&mut w, &r, 1 + t as usize * 333, t)))
        .collect();
    let total = w.total_len();
    let mut per_thread: Vec<Vec<(u64, RecordHandle)>> = (0..4).map(|_| Vec::new()).collect();
    for (k, h) in hs.into_iter().enumerate() {
        per_thread[(k * 7) % 4].push(h);
    }
    std::thread::scope(|s| {
        for mut v in per_thread {
            s.spawn(move || {
                v.reverse();
                for (t, h) in v {
                    assert!(intact(&h, t));
                }
            });
        }
    });
    assert_eq!(w.reclaim(), 64);
    assert_eq!(w.live_bytes(), 0);
    assert_eq!(w.alloc(1).unwrap().offset, FIRST);
    assert_eq!(w.total_len(), total);
    w.check_invariants();
}

/// Releases on another thread while the writer keeps allocating.
#[test]
fn concurrent_release_while_allocating() {
    let mut w = ArenaWriter::new(2 * MIB, 64 * MIB).unwrap();
    let r = ArenaReader::new();
    let (tx, rx) = std::sync::mpsc::sync_channel::<(u64, RecordHandle)>(16);
    let releaser = std::thread::spawn(move || {
        for (t, h) in rx {
            assert!(intact(&h, t));
        }
    });
    for t in 0..scaled(5_000, 100) {
        let h = put(&mut w, &r, 1 + (t as usize * 977) % (20 * KIB), t);
        tx.send((t, h)).unwrap();
    }
    drop(tx);
    releaser.join().unwrap();
    w.reclaim();
    assert_eq!(w.live_bytes(), 0);
    assert_eq!(
        w.segment_count(),
        1,
        "16 in flight of <= 20 KiB fit in 2 MiB"
    );
    w.check_invariants();
}

/// Tiny deterministic generator for the steady-state test.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
// 11,000 cycles, too long for Miri, and the fd handover at the end; the
// shorter tests run the same code under it.
#[cfg_attr(miri, ignore)]
fn steady_state_does_not_grow() {
    // Up to 8 records of up to 64 KiB held at once, released in random
    // order: after warm-up the arena never grows over 10,000 cycles.
    let mut w = ArenaWriter::new(64 * KIB, 256 * MIB).unwrap();
    let r = ArenaReader::new();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut held: Vec<(u64, RecordHandle)> = Vec::new();
    let mut cycle = |w: &mut ArenaWriter, t: u64| {
        if held.len() == 8 {
            let k = rng.below(held.len());
            let (tag, h) = held.swap_remove(k);
            assert!(intact(&h, tag));
        }
        let len = 1 + rng.below(64 * KIB);
        held.push((t, put(w, &r, len, t)));
    };
    for t in 0..1_000 {
        cycle(&mut w, t);
    }
    let (total, segments) = (w.total_len(), w.segment_count());
    for t in 1_000..11_000 {
        cycle(&mut w, t);
        assert_eq!(w.total_len(), total, "grew at cycle {t}");
    }
    assert_eq!(w.segment_count(), segments);
    assert!(w.take_new_segments().is_empty());
    w.check_invariants();
}

#[test]
fn steady_state_in_a_roomy_arena_stays_at_the_start() {
    // One record at a time: always the same low offset, never new pages.
    let mut w = ArenaWriter::new(64 * MIB, 256 * MIB).unwrap();
    let r = ArenaReader::new();
    for t in 0..scaled(10_000, 200) {
        let rec = w.alloc(1 + (t as usize * 4099) % MIB).unwrap();
        assert_eq!(rec.offset, FIRST);
        w.publish(rec);
        connect(&mut w, &r);
        drop(r.open(rec).unwrap());
    }
    assert_eq!(w.total_len(), 64 * MIB);
}

#[test]
fn trim_punches_free_pages_above_keep() {
    let mut w = ArenaWriter::new(64 * KIB, 64 * MIB).unwrap();
    let r = ArenaReader::new();
    let held: Vec<_> = (0..40).map(|t| put(&mut w, &r, 32 * KIB, t)).collect();
    let refs: Vec<RecordRef> = held.iter().map(|h| h.record()).collect();
    let segments = w.segment_count();
    assert!(segments > 1);
    let keep = w.total_len() / 4;
    drop(held);
    let punched = w.trim(keep).unwrap();
    assert!(punched > 0 && punched <= w.total_len() - keep);
    // Nothing is held: the same allocations give the same layout again.
    let again: Vec<RecordRef> = (0..40).map(|_| w.alloc(32 * KIB).unwrap()).collect();
    assert_eq!(again, refs);
    assert_eq!(w.segment_count(), segments);
    // Below `keep` the old bytes are still there; the last record's pages
    // were given back and read as zeros.
    let first = again[0];
    assert!(w
        .payload_mut(first)
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern(0, i)));
    let last = *again.last().unwrap();
    assert!(w.payload_mut(last).iter().all(|&b| b == 0));
    w.check_invariants();
}

// ---------------------------------------------------------------------
// Property tests

#[derive(Clone, Debug)]
enum Op {
    /// Allocate a payload of this size; publish and open it unless `keep`.
    Alloc { len: usize, keep_writing: bool },
    /// Drop the handle of (or abandon) the n-th outstanding record.
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (prop_oneof![0usize..300, 0usize..5_000, 0usize..200_000], prop::bool::weighted(0.1))
            .prop_map(|(len, keep_writing)| Op::Alloc { len, keep_writing }),
        2 => any::<prop::sample::Index>().prop_map(|i| Op::Release(i.index(usize::MAX))),
    ]
}

/// An outstanding record in the model.
struct Outstanding {
    rec: RecordRef,
    tag: u64,
    handle: Option<RecordHandle>,
}

/// The oracle for first fit: the lowest gap between outstanding records
/// (released ones count as free, since `alloc` reclaims first).
fn expected_fit(w: &ArenaWriter, out: &[Outstanding], size: usize) -> Option<(u32, u64)> {
    for seg in 0..w.segment_count() as u32 {
        let end = w.segment_len(seg).unwrap() / RECORD_ALIGN * RECORD_ALIGN;
        let mut taken: Vec<(usize, usize)> = out
            .iter()
            .filter(|o| o.rec.segment == seg)
            .map(|o| {
                let start = o.rec.offset as usize - RECORD_HEADER_LEN;
                (start, start + size_of_record(o.rec.len as usize))
            })
            .collect();
        taken.sort_unstable();
        let mut at = SEGMENT_HEADER_LEN;
        for (a, b) in taken.into_iter().chain([(end, end)]) {
            if a >= at && a - at >= size {
                return Some((seg, (at + RECORD_HEADER_LEN) as u64));
            }
            at = at.max(b);
        }
    }
    None
}

proptest! {
    #![proptest_config(crate::testing::miri_friendly(ProptestConfig::with_cases(200)))]

    #[test]
    fn random_sizes_and_release_orders(ops in prop::collection::vec(op(), 1..scaled(120, 30) as usize)) {
        let limit = 4 * MIB;
        let mut w = ArenaWriter::new(64 * KIB, limit).unwrap();
        let r = ArenaReader::new();
        let mut out: Vec<Outstanding> = Vec::new();
        let mut tag = 0u64;
        for op in ops {
            match op {
                Op::Alloc { len, keep_writing } => {
                    let size = size_of_record(len);
                    let expect = expected_fit(&w, &out, size);
                    let segments = w.segment_count();
                    match w.alloc(len) {
                        Ok(rec) => {
                            match expect {
                                Some((seg, off)) => {
                                    prop_assert_eq!((rec.segment, rec.offset), (seg, off));
                                }
                                None => {
                                    prop_assert_eq!(rec.segment as usize, segments);
                                    prop_assert_eq!(rec.offset, FIRST);
                                }
                            }
                            tag += 1;
                            fill(&mut w, rec, tag);
                            let handle = if keep_writing {
                                None
                            } else {
                                w.publish(rec);
                                connect(&mut w, &r);
                                Some(r.open(rec).unwrap())
                            };
                            out.push(Outstanding { rec, tag, handle });
                        }
                        Err(ArenaError::LimitExceeded { limit: l, requested, live_bytes }) => {
                            prop_assert_eq!((l, requested), (limit, len));
                            prop_assert!(expect.is_none());
                            prop_assert_eq!(segments, w.segment_count());
                            prop_assert_eq!(
                                live_bytes,
                                out.iter().map(|o| size_of_record(o.rec.len as usize)).sum::<usize>()
                            );
                        }
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    }
                }
                Op::Release(i) => {
                    if !out.is_empty() {
                        let o = out.swap_remove(i % out.len());
                        match o.handle {
                            Some(h) => prop_assert!(intact(&h, o.tag)),
                            None => w.abandon(o.rec),
                        }
                    }
                }
            }
            w.check_invariants();
            prop_assert!(w.total_len() <= limit);
            for o in &out {
                if let Some(h) = &o.handle {
                    prop_assert!(intact_sampled(h, o.tag), "record {:?} overwritten", o.rec);
                }
            }
        }
        for o in out.drain(..) {
            if o.handle.is_none() {
                w.abandon(o.rec);
            }
        }
        w.reclaim();
        prop_assert_eq!(w.live_bytes(), 0);
        prop_assert_eq!(w.alloc(1).unwrap().offset, FIRST);
    }

    #[test]
    fn releases_from_threads_in_random_order(
        lens in prop::collection::vec(0usize..100_000, 1..60),
        order in any::<u64>(),
        threads in 1usize..5,
    ) {
        let mut w = ArenaWriter::new(128 * KIB, 256 * MIB).unwrap();
        let r = ArenaReader::new();
        let mut hs: Vec<(u64, RecordHandle)> = lens
            .iter()
            .enumerate()
            .map(|(t, &len)| (t as u64, put(&mut w, &r, len, t as u64)))
            .collect();
        let total = w.total_len();
        // A permutation from `order`, dealt to the threads round-robin.
        let mut rng = XorShift(order | 1);
        for i in (1..hs.len()).rev() {
            hs.swap(i, rng.below(i + 1));
        }
        let mut per: Vec<Vec<(u64, RecordHandle)>> = (0..threads).map(|_| Vec::new()).collect();
        for (k, h) in hs.into_iter().enumerate() {
            per[k % threads].push(h);
        }
        std::thread::scope(|s| {
            for v in per {
                s.spawn(move || {
                    for (t, h) in v {
                        assert!(intact(&h, t));
                    }
                });
            }
        });
        prop_assert_eq!(w.reclaim(), lens.len());
        prop_assert_eq!(w.live_bytes(), 0);
        w.check_invariants();
        // Everything coalesced: each segment is one free block again, so
        // the largest payload that fits segment 0 lands at its start.
        let seg0 = w.segment_len(0).unwrap();
        let whole = (seg0 - SEGMENT_HEADER_LEN) / RECORD_ALIGN * RECORD_ALIGN - RECORD_HEADER_LEN;
        let rec = w.alloc(whole).unwrap();
        prop_assert_eq!((rec.segment, rec.offset), (0, FIRST));
        prop_assert_eq!(w.total_len(), total);
    }
}

#[test]
// Hands segments over by fd: heap segments under Miri have none.
#[cfg_attr(miri, ignore)]
fn reader_registry_by_id() {
    let mut w = ArenaWriter::new(64 * KIB, MIB).unwrap();
    let r = ArenaReader::new();
    let rec = w.alloc(8).unwrap();
    w.publish(rec);
    assert!(r.open(rec).is_none(), "segment not yet added");
    let mut fds: HashMap<u32, std::os::fd::OwnedFd> = HashMap::new();
    for (id, fd) in w.take_new_segments() {
        fds.insert(id, fd.try_clone_to_owned().unwrap());
    }
    r.add_segment(0, Segment::from_fd(fds.remove(&0).unwrap()).unwrap());
    assert!(r.open(rec).is_some());
}
