//! Seeds derived from one loader seed: their one definition, which
//! `ferroloader.seeds` calls. Every stream is a fixed function of plain
//! integers, so any draw can be recomputed from (seed, epoch, index) in any
//! process.
//!
//! All of them mix with SplitMix64's finaliser (Steele, Lea and Flood, 2014)
//! and keep 63 bits, a valid seed for torch, `random` and numpy.

/// SplitMix64: the golden-ratio increment, then the finaliser.
pub fn mix64(x: u64) -> u64 {
    let mut x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The root of epoch `epoch` (0-based) of a loader seeded with `seed`: its
/// private generator is seeded with it (order, workers' base seed), and the
/// epoch's other streams derive from it.
pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    mix64(mix64(seed) ^ epoch) >> 1
}

/// The seed set before sample `index` of epoch `epoch` with
/// `per_sample_seed=True`.
pub fn sample_seed(seed: u64, epoch: u64, index: u64) -> u64 {
    mix64(epoch_seed(seed, epoch) ^ mix64(index)) >> 1
}

/// The index that stands for item `offset` of shard `shard` in
/// [`sample_seed`].
pub fn shard_item_index(shard: u64, offset: u64) -> u64 {
    (shard << 40).wrapping_add(offset)
}

/// `derive(root, parts)`: folds each part into the root.
pub fn derive(root: u64, parts: &[u64]) -> u64 {
    let mut h = root;
    for &p in parts {
        h = mix64(h ^ mix64(p));
    }
    h >> 1
}

/// Stream tags of [`derive`], so no two streams share a seed.
const SHARD_ORDER: u64 = 1;
const SHARD_BLOCK: u64 = 2;

/// The seed of an epoch's shard order (from the epoch's root).
pub fn shard_order_seed(root: u64) -> u64 {
    derive(root, &[SHARD_ORDER])
}

/// The seed of the permutation of block `block` of shard `shard`.
pub fn block_seed(root: u64, shard: u32, block: u64) -> u64 {
    derive(root, &[SHARD_BLOCK, u64::from(shard), block])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix64_is_splitmix64() {
        // SplitMix64's first outputs for state 0 (the reference generator
        // adds the increment before mixing, as `mix64` does).
        assert_eq!(mix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(mix64(0x9E37_79B9_7F4A_7C15), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn seeds_are_63_bit_and_distinct_per_stream() {
        let root = epoch_seed(1234, 3);
        let seeds = [
            root,
            shard_order_seed(root),
            block_seed(root, 0, 0),
            block_seed(root, 0, 1),
            block_seed(root, 1, 0),
        ];
        for s in seeds {
            assert!(s < 1 << 63);
        }
        for i in 0..seeds.len() {
            for j in i + 1..seeds.len() {
                assert_ne!(seeds[i], seeds[j]);
            }
        }
        assert_ne!(epoch_seed(1234, 3), epoch_seed(1234, 4));
    }
}
