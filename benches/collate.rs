//! Collate layout benches: the byte movement behind `default_collate` and the
//! `TensorDataset` gather, without Python.
//!
//! Fixed: 64-byte-aligned destination reused across iterations (as an arena
//! record is). Swept:
//! * `stack/{B}x{bytes}`: `stack_into` of B samples of `bytes` each (a leaf of
//!   B small tensors or numpy arrays), B in {64, 256}, bytes in {32, 4 KiB,
//!   600 KiB (a 3x224x224 f32 image)}.
//! * `gather/{rows}`: `gather_rows` of 256 random rows of 128 bytes (an
//!   (N, 32) f32 `TensorDataset`) from N in {1e4, 1e6}.
//!
//! Throughput in bytes moved; compare with a single `memcpy` of the same
//! total. Run: `cargo bench --bench collate` (`-- --quick` for a fast pass).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferroloader::collate::{gather_rows, stack_into};
use std::hint::black_box;

fn stack(c: &mut Criterion) {
    let mut g = c.benchmark_group("stack");
    for &batch in &[64usize, 256] {
        for &bytes in &[32usize, 4 << 10, 600 << 10] {
            if batch * bytes > 64 << 20 {
                continue;
            }
            let samples: Vec<Vec<u8>> = (0..batch).map(|i| vec![i as u8; bytes]).collect();
            let parts: Vec<&[u8]> = samples.iter().map(|s| s.as_slice()).collect();
            let mut dst = vec![0u8; batch * bytes];
            g.throughput(Throughput::Bytes((batch * bytes) as u64));
            g.bench_with_input(
                BenchmarkId::from_parameter(format!("{batch}x{bytes}")),
                &parts,
                |b, parts| b.iter(|| stack_into(black_box(&mut dst), black_box(parts))),
            );
        }
    }
    g.finish();
}

fn gather(c: &mut Criterion) {
    let mut g = c.benchmark_group("gather");
    let row = 128usize;
    for &rows in &[10_000usize, 1_000_000] {
        let src = vec![7u8; rows * row];
        // A fixed pseudo-random index pattern (an LCG), like a shuffled batch.
        let idx: Vec<i64> = (0..256u64)
            .map(|i| {
                ((i.wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407))
                    % rows as u64) as i64
            })
            .collect();
        let mut dst = vec![0u8; idx.len() * row];
        g.throughput(Throughput::Bytes((idx.len() * row) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(rows), &idx, |b, idx| {
            b.iter(|| {
                gather_rows(
                    black_box(&mut dst),
                    black_box(&src),
                    rows,
                    row,
                    black_box(idx),
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, stack, gather);
criterion_main!(benches);
