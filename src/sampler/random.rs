use std::sync::Arc;

use super::{IndexSource, IndexVec, RngSource};

/// torch draws with-replacement samples in chunks of this many.
const REPLACEMENT_CHUNK: usize = 32;

/// `RandomSampler.__iter__`, segment by segment.
///
/// Without replacement torch yields `num_samples // n` full permutations and
/// then a permutation truncated to `num_samples % n`, drawn even when that
/// remainder is 0 (when the consumer asks past the last sample; a private
/// generator, whose state no one else reads, leaves that draw out). With
/// replacement it yields `num_samples // 32` chunks of 32 `randint`s and then
/// one chunk of `num_samples % 32`. A segment is drawn when the consumer
/// first asks for an index beyond the previous one, as a Python generator would.
pub struct RandomIter<G> {
    n: usize,
    num_samples: usize,
    replacement: bool,
    rng: G,
    /// The segment drawn last (a permutation may be shared with another
    /// iterator: see `recent`), of which the first `len` are handed out.
    buf: Arc<IndexVec>,
    len: usize,
    pos: usize,
    next_segment: usize,
    segments: usize,
}

impl<G: RngSource> RandomIter<G> {
    /// `n` is `len(data_source)` and must be positive (torch raises otherwise,
    /// and callers leave that case to torch).
    pub fn new(n: usize, num_samples: usize, replacement: bool, rng: G) -> Self {
        assert!(n > 0, "RandomIter needs a non-empty data source");
        let segments = if replacement {
            num_samples / REPLACEMENT_CHUNK + 1
        } else {
            num_samples / n + 1
        };
        RandomIter {
            n,
            num_samples,
            replacement,
            rng,
            buf: Arc::new(IndexVec::I64(Vec::new())),
            len: 0,
            pos: 0,
            next_segment: 0,
            segments,
        }
    }

    /// The generator this sampler draws from.
    pub fn rng(&self) -> &G {
        &self.rng
    }

    fn draw_segment(&mut self) -> Result<(), G::Error> {
        let last = self.next_segment + 1 == self.segments;
        self.next_segment += 1;
        self.pos = 0;
        self.len = 0;
        let n = self.n;
        if self.replacement {
            let count = if last {
                self.num_samples % REPLACEMENT_CHUNK
            } else {
                REPLACEMENT_CHUNK
            };
            if count > 0 {
                // (the chunk's buffer is this iterator's own: refilled in place)
                if let Some(IndexVec::I64(v)) = Arc::get_mut(&mut self.buf) {
                    v.clear();
                    self.rng.randint(n as i64, count, v)?;
                } else {
                    let mut drawn = Vec::with_capacity(REPLACEMENT_CHUNK);
                    self.rng.randint(n as i64, count, &mut drawn)?;
                    self.buf = Arc::new(IndexVec::I64(drawn));
                }
                self.len = count;
            }
        } else if last && self.num_samples % n == 0 && self.next_segment > 1 && self.rng.private() {
            // torch draws a last permutation and keeps none of it; from a
            // private generator no one sees the draw (23 M samples: 0.45 s
            // at each epoch's end)
            self.buf = Arc::new(IndexVec::I64(Vec::new()));
        } else {
            self.buf = self.rng.randperm_shared(n)?;
            self.len = if last { self.num_samples % n } else { n };
        }
        Ok(())
    }
}

impl<G: RngSource> IndexSource for RandomIter<G> {
    type Index = i64;
    type Error = G::Error;
    fn next_index(&mut self) -> Result<Option<i64>, G::Error> {
        loop {
            if self.pos < self.len {
                let i = self.buf.get(self.pos);
                self.pos += 1;
                return Ok(i);
            }
            if self.next_segment == self.segments {
                return Ok(None);
            }
            self.draw_segment()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{random_int64, randperm, Mt19937};
    use proptest::prelude::*;

    fn drain<S: IndexSource<Index = i64>>(s: &mut S) -> Vec<i64>
    where
        S::Error: std::fmt::Debug,
    {
        let mut v = Vec::new();
        while let Some(i) = s.next_index().unwrap() {
            v.push(i);
        }
        v
    }

    #[test]
    fn full_pass_draws_a_second_permutation_at_exhaustion() {
        let mut it = RandomIter::new(10, 10, false, Mt19937::new(3));
        let got = drain(&mut it);
        let mut reference = Mt19937::new(3);
        assert_eq!(got, randperm(10, &mut reference));
        randperm(10, &mut reference);
        assert_eq!(it.rng, reference);
    }

    #[test]
    fn a_private_generator_skips_the_unused_last_draw_only() {
        use crate::sampler::SeededOnFirstUse;
        for (k, draws) in [(10, 1), (20, 2), (23, 3), (7, 1)] {
            let mut it = RandomIter::new(10, k, false, SeededOnFirstUse::Pending(Mt19937::new(5)));
            let got = drain(&mut it);
            let mut global = Mt19937::new(5);
            let mut private = Mt19937::new(random_int64(&mut global) as u64);
            let mut want = Vec::new();
            for _ in 0..k / 10 {
                want.extend(randperm(10, &mut private));
            }
            if k % 10 > 0 {
                want.extend(&randperm(10, &mut private)[..k % 10]);
            }
            assert_eq!(got, want, "num_samples={k}");
            let SeededOnFirstUse::Ready(left) = it.rng else {
                panic!("seeded")
            };
            let mut reference = Mt19937::new(random_int64(&mut Mt19937::new(5)) as u64);
            for _ in 0..draws {
                randperm(10, &mut reference);
            }
            assert_eq!(*left, reference, "num_samples={k}: {draws} draws");
        }
    }

    proptest! {
        #[test]
        fn yields_num_samples_in_range(n in 1usize..50, k in 1usize..200, repl in any::<bool>(), seed in any::<u64>()) {
            let mut it = RandomIter::new(n, k, repl, Mt19937::new(seed));
            let v = drain(&mut it);
            prop_assert_eq!(v.len(), k);
            prop_assert!(v.iter().all(|&i| (0..n as i64).contains(&i)));
            if !repl && k <= n {
                let mut s = v.clone();
                s.sort_unstable();
                s.dedup();
                prop_assert_eq!(s.len(), k);
            }
        }
    }
}
