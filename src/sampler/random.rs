use super::{IndexSource, IndexVec, RngSource};

/// torch draws with-replacement samples in chunks of this many.
const REPLACEMENT_CHUNK: usize = 32;

/// `RandomSampler.__iter__`, segment by segment.
///
/// Without replacement torch yields `num_samples // n` full permutations and
/// then a permutation truncated to `num_samples % n`, drawn even when that
/// remainder is 0 (when the consumer asks past the last sample). With
/// replacement it yields `num_samples // 32` chunks of 32 `randint`s and then
/// one chunk of `num_samples % 32`. A segment is drawn when the consumer
/// first asks for an index beyond the previous one, as a Python generator would.
pub struct RandomIter<G> {
    n: usize,
    num_samples: usize,
    replacement: bool,
    rng: G,
    buf: IndexVec,
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
            buf: IndexVec::I64(Vec::new()),
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
        self.buf = IndexVec::I64(Vec::new());
        self.pos = 0;
        let n = self.n;
        if self.replacement {
            let count = if last {
                self.num_samples % REPLACEMENT_CHUNK
            } else {
                REPLACEMENT_CHUNK
            };
            if count > 0 {
                let mut drawn = Vec::with_capacity(count);
                self.rng.randint(n as i64, count, &mut drawn)?;
                self.buf = IndexVec::I64(drawn);
            }
        } else {
            let mut perm = self.rng.randperm(n)?;
            if last {
                perm.truncate(self.num_samples % n);
            }
            self.buf = perm;
        }
        Ok(())
    }
}

impl<G: RngSource> IndexSource for RandomIter<G> {
    type Index = i64;
    type Error = G::Error;
    fn next_index(&mut self) -> Result<Option<i64>, G::Error> {
        loop {
            if let Some(i) = self.buf.get(self.pos) {
                self.pos += 1;
                return Ok(Some(i));
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
    use crate::sampler::{randperm, Mt19937};
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
