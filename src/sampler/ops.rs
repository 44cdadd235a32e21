//! torch's CPU random kernels that samplers use, reproduced draw for draw.

use super::Mt19937;

/// Below this length `randperm` uses torch's original 32-bit swap loop;
/// at or above it, the 64-bit "inside-out" Fisher-Yates (TensorFactories.cpp).
const RANDPERM_SMALL_LIMIT: u64 = (u32::MAX / 20) as u64;

/// From this range on, `randint` takes a 64-bit draw per value.
const RANDINT_64BIT_RANGE: u64 = 1 << 28;

/// Indices stored as narrowly as their range allows: an epoch's
/// permutation of a large dataset is the sampler's largest allocation
/// (22 M rows: 179 MB as `i64`, half that as `u32`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexVec {
    U32(Vec<u32>),
    I64(Vec<i64>),
}

impl IndexVec {
    pub fn len(&self) -> usize {
        match self {
            IndexVec::U32(v) => v.len(),
            IndexVec::I64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<i64> {
        match self {
            IndexVec::U32(v) => v.get(i).map(|&x| i64::from(x)),
            IndexVec::I64(v) => v.get(i).copied(),
        }
    }

    pub fn truncate(&mut self, len: usize) {
        match self {
            IndexVec::U32(v) => v.truncate(len),
            IndexVec::I64(v) => v.truncate(len),
        }
    }

    pub fn into_i64(self) -> Vec<i64> {
        match self {
            IndexVec::U32(v) => v.into_iter().map(i64::from).collect(),
            IndexVec::I64(v) => v,
        }
    }
}

/// `torch.randperm(n, generator=g)` on CPU, stored compactly: below
/// torch's small-n limit (which is below 2**32) as `u32`.
pub fn randperm_compact(n: usize, rng: &mut Mt19937) -> IndexVec {
    if (n as u64) < RANDPERM_SMALL_LIMIT {
        let mut r: Vec<u32> = (0..n as u32).collect();
        for i in 0..n.saturating_sub(1) {
            let z = (rng.next_u32() as u64 % (n - i) as u64) as usize;
            r.swap(i, i + z);
        }
        IndexVec::U32(r)
    } else {
        let mut r: Vec<i64> = (0..n as i64).collect();
        for i in 0..n {
            let z = (rng.next_u64() % (i as u64 + 1)) as usize;
            r[i] = r[z];
            r[z] = i as i64;
        }
        IndexVec::I64(r)
    }
}

/// `torch.randperm(n, generator=g)` on CPU.
pub fn randperm(n: usize, rng: &mut Mt19937) -> Vec<i64> {
    randperm_compact(n, rng).into_i64()
}

/// `torch.randint(high=high, size=(count,), dtype=torch.int64, generator=g)`
/// appended to `out`. Public torch builds draw 64 bits once the range reaches
/// 2**28 (`uniform_int_from_to_distribution`, non-fbcode branch), not 2**32.
pub fn randint_into(high: i64, count: usize, rng: &mut Mt19937, out: &mut Vec<i64>) {
    debug_assert!(high > 0);
    let range = high as u64;
    out.reserve(count);
    for _ in 0..count {
        let v = if range >= RANDINT_64BIT_RANGE {
            rng.next_u64() % range
        } else {
            rng.next_u32() as u64 % range
        };
        out.push(v as i64);
    }
}

/// `torch.empty((), dtype=torch.int64).random_(generator=g).item()`: a value in
/// `[0, 2**63)`. Used for the loader's base seed and RandomSampler's seed.
pub fn random_int64(rng: &mut Mt19937) -> i64 {
    (rng.next_u64() % (1u64 << 63)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn randperm_is_a_permutation(n in 0usize..2000, seed in any::<u64>()) {
            let mut rng = Mt19937::new(seed);
            let mut p = randperm(n, &mut rng);
            p.sort_unstable();
            prop_assert_eq!(p, (0..n as i64).collect::<Vec<_>>());
        }

        #[test]
        fn randperm_draws_n_minus_one_words(n in 0usize..500, seed in any::<u64>()) {
            let mut a = Mt19937::new(seed);
            let mut b = Mt19937::new(seed);
            randperm(n, &mut a);
            for _ in 0..n.saturating_sub(1) { b.next_u32(); }
            prop_assert_eq!(a, b);
        }

        #[test]
        fn randint_in_range(high in 1i64..i64::MAX, count in 0usize..100, seed in any::<u64>()) {
            let mut rng = Mt19937::new(seed);
            let mut out = Vec::new();
            randint_into(high, count, &mut rng, &mut out);
            prop_assert_eq!(out.len(), count);
            prop_assert!(out.iter().all(|&v| (0..high).contains(&v)));
        }

        #[test]
        fn randint_chunks_equal_one_call(high in 1i64..1000, a in 0usize..70, b in 0usize..70, seed in any::<u64>()) {
            // torch's CPU randint kernel is serial, so chunked draws concatenate.
            let mut r1 = Mt19937::new(seed);
            let mut r2 = Mt19937::new(seed);
            let mut one = Vec::new();
            randint_into(high, a + b, &mut r1, &mut one);
            let mut two = Vec::new();
            randint_into(high, a, &mut r2, &mut two);
            randint_into(high, b, &mut r2, &mut two);
            prop_assert_eq!(one, two);
        }
    }

    #[test]
    fn random_int64_is_non_negative() {
        let mut rng = Mt19937::new(0);
        for _ in 0..1000 {
            assert!(random_int64(&mut rng) >= 0);
        }
    }
}
