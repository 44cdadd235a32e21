//! The order in which a sharded dataset's items are read, and the elastic
//! split of a global sequence over ranks.
//!
//! A shard's items are read in *shard order*: with shuffling, the shard is
//! cut into blocks of `block` consecutive items (the last one shorter) and
//! each block is read in the order of
//! `torch.randperm(len, generator=torch.Generator().manual_seed(block_seed(root, shard, b)))`,
//! so position `k` of the shard order is item
//! `(k / block) * block + perm[k % block]`. Without shuffling, shard order is
//! the shard's own order. Either way a reader that resumes at position `k`
//! re-reads at most one block.

use super::seeds::block_seed;
use super::{randperm, Mt19937};

/// The epoch's order of `n` shards: the identity, or
/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))`.
pub fn shard_order(n: usize, seed: Option<u64>) -> Vec<u32> {
    match seed {
        None => (0..n as u32).collect(),
        Some(s) => randperm(n, &mut Mt19937::new(s))
            .into_iter()
            .map(|i| i as u32)
            .collect(),
    }
}

/// How shard items are shuffled within a shard: blocks of `size` items,
/// permuted from the epoch's `root` seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocks {
    pub root: u64,
    pub size: u64,
}

impl Blocks {
    /// The order of block `block` of `shard` (holding `len` items): entry
    /// `j` is the item (within the block) read `j`-th.
    pub fn perm(&self, shard: u32, block: u64, len: usize) -> Vec<i64> {
        randperm(len, &mut Mt19937::new(block_seed(self.root, shard, block)))
    }
}

/// What happens to the last global batch of an elastic split when it does
/// not fill every rank's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// Padded, by wrapping around to the start of the global sequence,
    /// to a multiple of the number of ranks (as `DistributedSampler`
    /// pads): every rank gets an equal last batch, short when the tail is
    /// (one rank pads nothing).
    Pad,
    /// Dropped: every rank gets the same number of full batches.
    Drop,
    /// Split as it falls: every position exactly once; ranks past its end
    /// get a shorter batch or none.
    Split,
}

/// The positions of the global sequence `[0, n)` that rank `rank` of
/// `world` reads from `start` on, batch after batch: global batch `g` is
/// positions `start + g * batch * world ..` and the rank takes its
/// `batch`-long slice. The sequence depends only on `n` and `start`, so a
/// job resumed on another number of ranks continues it exactly.
pub fn elastic_positions(
    n: u64,
    start: u64,
    batch: u64,
    world: u64,
    rank: u64,
    tail: Tail,
) -> Vec<u64> {
    assert!(batch > 0 && world > 0 && rank < world);
    let left = n.saturating_sub(start);
    // (saturating: a step past the sequence leaves one short global batch;
    // every position below is then at most `n` plus a batch, within u64 as
    // `n` and a rank's share of a tail are)
    let step = batch.saturating_mul(world);
    let full = left / step;
    let mut out = Vec::new();
    for g in 0..full {
        let s = start + g * step + rank * batch;
        out.extend(s..s + batch);
    }
    let rest = left % step;
    if rest == 0 {
        return out;
    }
    let tail_start = start + full * step;
    match tail {
        Tail::Drop => {}
        Tail::Split => {
            let s = tail_start.saturating_add(rank.saturating_mul(batch)).min(n);
            out.extend(s..s.saturating_add(batch).min(n));
        }
        Tail::Pad => {
            // each rank an equal share of the tail, padded up to a multiple
            // of the ranks; positions past the end wrap around to the start
            let share = rest.div_ceil(world);
            let s = tail_start + rank * share;
            out.extend((s..s + share).map(|p| if p < n { p } else { (p - n) % n }));
        }
    }
    out
}

/// Where global position `p` of a sharded epoch lies: shards concatenated
/// in the epoch's order, each read in shard order.
pub struct ShardAddresses {
    order: Vec<u32>,
    /// `starts[i]`: global position of the first item of `order[i]`; one
    /// more entry holds the total.
    starts: Vec<u64>,
    blocks: Option<Blocks>,
    /// The last block permutation computed: (shard, block, perm).
    cached: Option<(u32, u64, Vec<i64>)>,
}

impl ShardAddresses {
    /// The shards in the order the sequence reads them from position
    /// `start` on (what a prefetcher fetches ahead).
    pub fn read_order(&self, start: u64) -> Vec<u32> {
        self.order
            .iter()
            .zip(self.starts.windows(2))
            .filter(|(_, w)| w[1] > start && w[1] > w[0])
            .map(|(&s, _)| s)
            .collect()
    }

    /// `lens[s]`: the number of items of shard `s`.
    pub fn new(order: Vec<u32>, lens: &[u64], blocks: Option<Blocks>) -> Self {
        let mut starts = Vec::with_capacity(order.len() + 1);
        let mut total = 0u64;
        for &s in &order {
            starts.push(total);
            total += lens[s as usize];
        }
        starts.push(total);
        ShardAddresses {
            order,
            starts,
            blocks,
            cached: None,
        }
    }

    pub fn len(&self) -> u64 {
        *self.starts.last().expect("one entry at least")
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(shard, offset)`: the item at global position `p < len()`.
    pub fn address(&mut self, p: u64) -> (u32, u64) {
        debug_assert!(p < self.len());
        let i = self.starts.partition_point(|&s| s <= p) - 1;
        let shard = self.order[i];
        let k = p - self.starts[i];
        let Some(blocks) = self.blocks else {
            return (shard, k);
        };
        let block = k / blocks.size;
        let shard_len = self.starts[i + 1] - self.starts[i];
        let len = blocks.size.min(shard_len - block * blocks.size) as usize;
        let hit = matches!(&self.cached, Some((s, b, _)) if *s == shard && *b == block);
        if !hit {
            self.cached = Some((shard, block, blocks.perm(shard, block, len)));
        }
        let perm = &self.cached.as_ref().expect("set above").2;
        (
            shard,
            block * blocks.size + perm[(k % blocks.size) as usize] as u64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shard_order_is_torch_randperm_of_the_seed() {
        assert_eq!(shard_order(4, None), vec![0, 1, 2, 3]);
        let want: Vec<u32> = randperm(10, &mut Mt19937::new(7))
            .into_iter()
            .map(|i| i as u32)
            .collect();
        assert_eq!(shard_order(10, Some(7)), want);
    }

    #[test]
    fn elastic_tails() {
        // n = 10, batch 2, world 2: global batches of 4; tail of 2.
        assert_eq!(
            elastic_positions(10, 0, 2, 2, 0, Tail::Split),
            vec![0, 1, 4, 5, 8, 9]
        );
        assert_eq!(
            elastic_positions(10, 0, 2, 2, 1, Tail::Split),
            vec![2, 3, 6, 7]
        );
        assert_eq!(
            elastic_positions(10, 0, 2, 2, 1, Tail::Drop),
            vec![2, 3, 6, 7]
        );
        assert_eq!(
            elastic_positions(10, 0, 2, 2, 0, Tail::Drop),
            vec![0, 1, 4, 5]
        );
        // a tail of 2 over 2 ranks: one each, nothing padded
        assert_eq!(
            elastic_positions(10, 0, 2, 2, 1, Tail::Pad),
            vec![2, 3, 6, 7, 9]
        );
        // a tail of 3 over 2 ranks: two each, the fourth wraps to 0
        assert_eq!(
            elastic_positions(11, 0, 2, 2, 1, Tail::Pad),
            vec![2, 3, 6, 7, 10, 0]
        );
        // one rank pads nothing: DistributedSampler's 100, not 104
        assert_eq!(
            elastic_positions(100, 0, 8, 1, 0, Tail::Pad),
            (0..100).collect::<Vec<u64>>()
        );
    }

    proptest! {
        #![proptest_config(crate::testing::miri_friendly(ProptestConfig::default()))]
        /// Split tails cover every position from `start` on exactly once,
        /// whatever the world size: the union over ranks is the rest of the
        /// global sequence.
        #[test]
        fn split_covers_the_rest_exactly_once(n in 0u64..200, start in 0u64..200, batch in 1u64..9, world in 1u64..6) {
            let mut all: Vec<u64> = (0..world)
                .flat_map(|r| elastic_positions(n, start, batch, world, r, Tail::Split))
                .collect();
            all.sort_unstable();
            prop_assert_eq!(all, (start.min(n)..n).collect::<Vec<u64>>());
        }

        /// Pad and drop give every rank the same number of items, in the
        /// same number of batches; drop only full ones. Pad covers the rest
        /// of the sequence and adds what `DistributedSampler` adds: fewer
        /// than one position per rank.
        #[test]
        fn pad_and_drop_are_even(n in 1u64..200, start in 0u64..200, batch in 1u64..9, world in 1u64..6) {
            for tail in [Tail::Pad, Tail::Drop] {
                let lens: Vec<usize> = (0..world)
                    .map(|r| elastic_positions(n, start, batch, world, r, tail).len())
                    .collect();
                prop_assert!(lens.iter().all(|&l| l == lens[0]));
                if tail == Tail::Drop {
                    prop_assert!(lens[0] as u64 % batch == 0);
                }
                for r in 0..world {
                    prop_assert!(elastic_positions(n, start, batch, world, r, tail).iter().all(|&p| p < n));
                }
            }
            let mut all: Vec<u64> = (0..world)
                .flat_map(|r| elastic_positions(n, start, batch, world, r, Tail::Pad))
                .collect();
            let left = n.saturating_sub(start);
            prop_assert_eq!(all.len() as u64, left.div_ceil(world) * world);
            all.sort_unstable();
            prop_assert!((start.min(n)..n).all(|p| all.binary_search(&p).is_ok()));
        }

        /// Huge batches and world sizes neither overflow nor allocate
        /// beyond the sequence.
        #[test]
        fn huge_batches_stay_within_the_sequence(n in 0u64..50, batch_exp in 30u32..64, world in 1u64..4) {
            let batch = 1u64 << batch_exp;
            for tail in [Tail::Pad, Tail::Drop, Tail::Split] {
                for r in 0..world {
                    let got = elastic_positions(n, 0, batch, world, r, tail);
                    prop_assert!(got.len() as u64 <= n.max(1));
                }
            }
        }

        /// Addresses enumerate every item of every shard exactly once, in
        /// the epoch's shard order, each block a permutation of itself.
        #[test]
        fn addresses_are_a_bijection(lens in proptest::collection::vec(0u64..30, 1..6), seed in any::<u64>(), size in 1u64..8, shuffle in any::<bool>()) {
            let order = shard_order(lens.len(), shuffle.then_some(seed));
            let blocks = shuffle.then_some(Blocks { root: seed, size });
            let mut a = ShardAddresses::new(order.clone(), &lens, blocks);
            let got: Vec<(u32, u64)> = (0..a.len()).map(|p| a.address(p)).collect();
            let mut want = Vec::new();
            for &s in &order {
                want.extend((0..lens[s as usize]).map(|o| (s, o)));
            }
            // same shards in the same order, each shard's offsets permuted
            // only within blocks
            let mut sorted = got.clone();
            sorted.sort_unstable();
            let mut want_sorted = want.clone();
            want_sorted.sort_unstable();
            prop_assert_eq!(sorted, want_sorted);
            for (g, w) in got.iter().zip(&want) {
                prop_assert_eq!(g.0, w.0);
                prop_assert_eq!(g.1 / size.max(1), w.1 / size.max(1));
            }
        }
    }
}
