//! Sampler engine benches: the work the main process does per epoch to
//! produce index batches, with no Python and no dataset involved.
//!
//! Fixed parameters: generator seed 0 (`Mt19937::new(0)`, the state a
//! `torch.Generator().manual_seed(0)` starts in) for `next_u32` and
//! `randperm`; the iterators draw from a generator they own, freshly seeded
//! (1, 2, 3, ...) for each pass as a `generator=None` sampler seeds a private
//! one per epoch (no user generator to read or write back); dataset length
//! 100_000 for the iterator benches;
//! `num_samples == n` for `RandomIter` (so a full pass also makes torch's
//! extra, empty-remainder `randperm(n)` draw at exhaustion); batch size 64
//! with `drop_last = false` for `BatchIter`.
//!
//! Swept parameters: `randperm` length n in {1e3, 1e5, 1e6}; `RandomIter`
//! replacement in {false, true}; the `BatchIter` source in {SequentialIter,
//! RandomIter without replacement}.
//!
//! Throughput is reported in elements (32-bit words, permutation entries or
//! indices). Run: `cargo bench --bench sampler` (add `-- --quick` for a fast
//! pass). Compare ratios between runs, not absolute times: the machines are
//! shared and noisy.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferroloader::sampler::{randperm, BatchIter, IndexSource, Mt19937, RandomIter, SequentialIter};
use std::convert::Infallible;
use std::hint::black_box;

const SEED: u64 = 0;
const DATASET_LEN: usize = 100_000;
const BATCH_SIZE: usize = 64;
const WORDS_PER_ITER: usize = 4096;

fn mt19937_next_u32(c: &mut Criterion) {
    let mut group = c.benchmark_group("mt19937");
    group.throughput(Throughput::Elements(WORDS_PER_ITER as u64));
    let mut rng = Mt19937::new(SEED);
    group.bench_function("next_u32", |b| {
        b.iter(|| {
            let mut acc = 0u32;
            for _ in 0..WORDS_PER_ITER {
                acc ^= rng.next_u32();
            }
            black_box(acc)
        })
    });
    group.finish();
}

fn randperm_sizes(c: &mut Criterion) {
    let mut group = c.benchmark_group("randperm");
    for n in [1_000usize, 100_000, 1_000_000] {
        group.throughput(Throughput::Elements(n as u64));
        if n >= 1_000_000 {
            group.sample_size(20);
        }
        let mut rng = Mt19937::new(SEED);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| black_box(randperm(black_box(n), &mut rng)))
        });
    }
    group.finish();
}

/// Pulls every index, returning a checksum so nothing is optimised away.
fn drain<S: IndexSource<Index = i64, Error = Infallible>>(mut source: S) -> i64 {
    let mut acc = 0i64;
    while let Ok(Some(i)) = source.next_index() {
        acc = acc.wrapping_add(i);
    }
    acc
}

fn random_iter_full_pass(c: &mut Criterion) {
    let mut group = c.benchmark_group("random_iter_full_pass");
    group.throughput(Throughput::Elements(DATASET_LEN as u64));
    for replacement in [false, true] {
        let name = if replacement {
            "with_replacement"
        } else {
            "without_replacement"
        };
        group.bench_with_input(
            BenchmarkId::new(name, DATASET_LEN),
            &DATASET_LEN,
            |b, &n| {
                let mut seed = SEED;
                b.iter(|| {
                    // A new generator per pass, as a sampler with generator=None
                    // seeds a private one per epoch.
                    seed = seed.wrapping_add(1);
                    drain(RandomIter::new(n, n, replacement, Mt19937::new(seed)))
                })
            },
        );
    }
    group.finish();
}

/// Pulls every batch, returning a checksum so nothing is optimised away.
fn drain_batches<S: IndexSource<Index = i64, Error = Infallible>>(source: S) -> i64 {
    let mut batches = BatchIter::new(source, BATCH_SIZE, false);
    let mut out = Vec::with_capacity(BATCH_SIZE);
    let mut acc = 0i64;
    while let Ok(true) = batches.next_batch(&mut out) {
        acc = acc.wrapping_add(out[0]).wrapping_add(out.len() as i64);
    }
    acc
}

fn batch_iter(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_iter");
    group.throughput(Throughput::Elements(DATASET_LEN as u64));
    group.bench_with_input(
        BenchmarkId::new("sequential", DATASET_LEN),
        &DATASET_LEN,
        |b, &n| b.iter(|| drain_batches(SequentialIter::new(black_box(n)))),
    );
    group.bench_with_input(
        BenchmarkId::new("random", DATASET_LEN),
        &DATASET_LEN,
        |b, &n| {
            let mut seed = SEED;
            b.iter(|| {
                seed = seed.wrapping_add(1);
                drain_batches(RandomIter::new(n, n, false, Mt19937::new(seed)))
            })
        },
    );
    group.finish();
}

criterion_group!(
    benches,
    mt19937_next_u32,
    randperm_sizes,
    random_iter_full_pass,
    batch_iter
);
criterion_main!(benches);
