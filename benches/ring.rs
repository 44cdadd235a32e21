//! Shared-memory arena ("ring") benches: the worker-side and main-side cost
//! of moving one record through the protocol, and why reuse matters.
//!
//! Every bench runs writer and reader in one process, the reader over its
//! own second mapping of each segment (`Segment::from_fd` of a dup'ed fd), as
//! the main process maps it.
//!
//! * `ring_cycle/{1KiB,64KiB,4MiB}`: one `alloc`, `publish`, reader `open`
//!   and drop of the handle (the release store), with the record at steady
//!   state (reclaimed by the next `alloc`). No payload bytes are touched:
//!   this is the protocol's own per-batch overhead, which must not depend on
//!   the record size. Throughput in records.
//! * `ring_write/{reused,fresh,heap_memcpy}/{4MiB,32MiB}`: writing a payload
//!   of that size. `reused`: a full cycle (alloc, copy, publish, open,
//!   release) into an arena whose record pages were touched before, i.e.
//!   steady state. `fresh`: `alloc` + the same copy in a newly created arena
//!   (created untimed), so every page costs a first-touch fault, which is
//!   what a new shared-memory segment per batch would cost. `heap_memcpy`:
//!   the same copy into a reused heap buffer, the memcpy bound. Throughput
//!   in bytes; `reused` should sit near `heap_memcpy` and far above `fresh`.
//!
//! Run: `cargo bench --bench ring` (add `-- --quick` for a fast pass).
//! Compare ratios between runs, not absolute times: the machines are shared
//! and noisy.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use ferroloader::ring::{ArenaReader, ArenaWriter, Segment};
use std::hint::black_box;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

fn label(len: usize) -> String {
    if len >= MIB {
        format!("{}MiB", len / MIB)
    } else {
        format!("{}KiB", len / KIB)
    }
}

/// An arena with its reader, every segment mapped a second time.
fn pair(initial: usize) -> (ArenaWriter, ArenaReader) {
    let mut w = ArenaWriter::new(initial, 1 << 40).expect("arena");
    let r = ArenaReader::new();
    sync(&mut w, &r);
    (w, r)
}

fn sync(w: &mut ArenaWriter, r: &ArenaReader) {
    for (id, fd) in w.take_new_segments() {
        let seg = Segment::from_fd(fd.try_clone_to_owned().expect("dup")).expect("map");
        r.add_segment(id, seg);
    }
}

fn ring_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring_cycle");
    group.throughput(Throughput::Elements(1));
    for len in [KIB, 64 * KIB, 4 * MIB] {
        let (mut w, r) = pair(2 * len + MIB);
        group.bench_function(BenchmarkId::from_parameter(label(len)), |b| {
            b.iter(|| {
                let rec = w.alloc(black_box(len)).expect("alloc");
                w.publish(rec);
                let h = r.open(rec).expect("open");
                black_box(h.as_ptr());
                drop(h);
            })
        });
        assert_eq!(w.segment_count(), 1, "steady state never grows");
    }
    group.finish();
}

fn ring_write(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring_write");
    for len in [4 * MIB, 32 * MIB] {
        group.throughput(Throughput::Bytes(len as u64));
        let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();

        let (mut w, r) = pair(len + MIB);
        group.bench_with_input(BenchmarkId::new("reused", label(len)), &src, |b, src| {
            b.iter(|| {
                let rec = w.alloc(len).expect("alloc");
                w.payload_mut(rec).copy_from_slice(src);
                w.publish(rec);
                let h = r.open(rec).expect("open");
                black_box(h.bytes()[len - 1]);
            })
        });
        assert_eq!(w.segment_count(), 1, "steady state never grows");
        drop((w, r));

        group.bench_with_input(BenchmarkId::new("fresh", label(len)), &src, |b, src| {
            b.iter_batched(
                || ArenaWriter::new(len + MIB, 1 << 40).expect("arena"),
                |mut w| {
                    let rec = w.alloc(len).expect("alloc");
                    let dst = w.payload_mut(rec);
                    dst.copy_from_slice(src);
                    black_box(dst[len - 1]);
                    w // dropped (munmap) outside the timed section
                },
                BatchSize::PerIteration,
            )
        });

        let mut heap = vec![0u8; len];
        group.bench_with_input(
            BenchmarkId::new("heap_memcpy", label(len)),
            &src,
            |b, src| {
                b.iter(|| {
                    heap.copy_from_slice(src);
                    black_box(heap[len - 1]);
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, ring_cycle, ring_write);
criterion_main!(benches);
