//! Weighted mixtures of datasets: an epoch's sequence of draws, each a
//! (source, index) pair, as a fixed function of plain integers.
//!
//! Draw `p` picks its source from `derive(root, [SOURCE, p])` over the
//! weights in force at `p` among the sources still drawn from, so the
//! sequence depends on (seed, epoch, position) and the weights alone, never
//! on the number of workers or ranks that read it. Without replacement a
//! source is read through a permutation per pass (`randperm` seeded with
//! `derive(root, [PERM, source, pass])`); with replacement each draw takes
//! a uniform index of its own (`derive(root, [INDEX, p])`). A sharded
//! source (its shards' lengths given) is read shard after shard, its shard
//! order permuted per pass the same way, each shard's items in order: a
//! reader continues one shard instead of jumping through it.
//!
//! Weights may change part way (a job resumed with new weights): the
//! weights are [`Segment`]s, each in force from its start position on; the
//! draws before a change are those the old weights made, and each source's
//! read position carries over the change.

use super::seeds::derive;
use super::{randperm, Mt19937};

/// What an epoch does when a source runs out (without replacement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exhausted {
    /// The epoch ends at the first draw that picks a source with nothing
    /// left.
    StopFirst,
    /// A source that ran out is dropped and the weights of the others
    /// renormalised; the epoch ends when every source has run out (each
    /// item of each source once).
    Drop,
    /// A source that ran out starts a new pass (a new permutation); the
    /// epoch ends when every source of non-zero weight has run out once.
    Cycle,
}

impl Exhausted {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "stop_first" => Some(Self::StopFirst),
            "drop" => Some(Self::Drop),
            "cycle" => Some(Self::Cycle),
            _ => None,
        }
    }
}

/// Weights in force from position `start` on.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub start: u64,
    pub weights: Vec<f64>,
}

/// A mixture's sources and rules.
#[derive(Clone, Debug)]
pub struct Mix {
    /// Each source's length.
    pub lens: Vec<u64>,
    /// A sharded source's shard lengths (their sum is its length); `None`
    /// for a map-style source.
    pub shards: Vec<Option<Vec<u64>>>,
    pub replacement: bool,
    pub exhausted: Exhausted,
    /// At most this many draws per epoch (with replacement, the epoch's
    /// length; `None` there means the sources' total).
    pub num_samples: Option<u64>,
}

/// Stream tags of [`derive`] (the shard streams use 1 and 2).
const SOURCE: u64 = 11;
const INDEX: u64 = 12;
const PERM: u64 = 13;

/// A uniform draw in `[0, 1)` from 53 bits of a seed.
fn unit(x: u64) -> f64 {
    (x >> 10) as f64 / (1u64 << 53) as f64
}

/// The source a draw `u` in `[0, 1)` picks among `active` by `weights`;
/// `None` when no active source has weight.
fn pick(u: f64, weights: &[f64], active: &[bool]) -> Option<usize> {
    let total: f64 = weights
        .iter()
        .zip(active)
        .filter(|(_, a)| **a)
        .map(|(w, _)| *w)
        .sum();
    if total <= 0.0 {
        return None;
    }
    let target = u * total;
    let mut acc = 0.0;
    let mut last = None;
    for (s, (w, a)) in weights.iter().zip(active).enumerate() {
        if !*a || *w <= 0.0 {
            continue;
        }
        acc += *w;
        last = Some(s);
        if target < acc {
            return Some(s);
        }
    }
    last // rounding: the last source with weight
}

/// A sharded source's reading order for one pass: its shards in a
/// permuted order (`randperm` of the shard count), each shard's items in
/// order, as the source's own indices (shards laid end to end in their
/// given order).
fn shard_walk(shard_lens: &[u64], rng: &mut Mt19937) -> Vec<i64> {
    let mut starts = Vec::with_capacity(shard_lens.len());
    let mut acc = 0i64;
    for &l in shard_lens {
        starts.push(acc);
        acc += l as i64;
    }
    let mut out = Vec::with_capacity(acc as usize);
    for sh in randperm(shard_lens.len(), rng) {
        let sh = sh as usize;
        out.extend(starts[sh]..starts[sh] + shard_lens[sh] as i64);
    }
    out
}

/// The epoch's draws, `(source, index)` in order, under `segments` (sorted
/// by start, the first starting at 0), from the epoch's root seed.
pub fn mixture_draws(mix: &Mix, root: u64, segments: &[Segment]) -> Vec<(u32, u64)> {
    let n = mix.lens.len();
    let cap = if mix.replacement {
        mix.num_samples.unwrap_or_else(|| mix.lens.iter().sum())
    } else {
        mix.num_samples.unwrap_or(u64::MAX)
    };
    let mut out = Vec::new();
    let mut reads = vec![0u64; n]; // draws from each source so far
    let mut active: Vec<bool> = mix.lens.iter().map(|&l| l > 0).collect();
    let mut ran_out: Vec<bool> = mix.lens.iter().map(|&l| l == 0).collect();
    let mut perms: Vec<Option<(u64, Vec<i64>)>> = vec![None; n];
    let mut seg = 0;
    let mut p = 0u64;
    while p < cap {
        while seg + 1 < segments.len() && segments[seg + 1].start <= p {
            seg += 1;
        }
        let weights = &segments[seg].weights;
        if mix.exhausted == Exhausted::Cycle
            && !mix.replacement
            && (0..n).all(|s| ran_out[s] || weights[s] <= 0.0)
        {
            break;
        }
        let Some(s) = pick(unit(derive(root, &[SOURCE, p])), weights, &active) else {
            break;
        };
        let len = mix.lens[s];
        let index = if mix.replacement {
            derive(root, &[INDEX, p]) % len
        } else {
            let k = reads[s];
            if k >= len && mix.exhausted == Exhausted::StopFirst {
                break;
            }
            let (pass, j) = (k / len, k % len);
            let fresh = !matches!(&perms[s], Some((q, _)) if *q == pass);
            if fresh {
                let mut rng = Mt19937::new(derive(root, &[PERM, s as u64, pass]));
                let order = match mix.shards.get(s).and_then(Option::as_ref) {
                    None => randperm(len as usize, &mut rng),
                    Some(shard_lens) => shard_walk(shard_lens, &mut rng),
                };
                perms[s] = Some((pass, order));
            }
            let (_, perm) = perms[s].as_ref().expect("set above");
            perm[j as usize] as u64
        };
        reads[s] += 1;
        if !mix.replacement && reads[s] % len == 0 {
            ran_out[s] = true;
            if mix.exhausted == Exhausted::Drop {
                active[s] = false;
            }
        }
        out.push((s as u32, index));
        p += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mix(lens: &[u64], replacement: bool, exhausted: Exhausted) -> Mix {
        Mix {
            lens: lens.to_vec(),
            shards: vec![None; lens.len()],
            replacement,
            exhausted,
            num_samples: None,
        }
    }

    fn seg(weights: &[f64]) -> Vec<Segment> {
        vec![Segment {
            start: 0,
            weights: weights.to_vec(),
        }]
    }

    #[test]
    fn drop_reads_every_item_once() {
        let m = mix(&[5, 17, 3], false, Exhausted::Drop);
        let d = mixture_draws(&m, 7, &seg(&[0.2, 0.5, 0.3]));
        assert_eq!(d.len(), 25);
        for (s, &len) in m.lens.iter().enumerate() {
            let mut got: Vec<u64> = d.iter().filter(|x| x.0 == s as u32).map(|x| x.1).collect();
            got.sort_unstable();
            assert_eq!(got, (0..len).collect::<Vec<_>>());
        }
    }

    #[test]
    fn stop_first_ends_before_a_source_repeats() {
        let m = mix(&[4, 100], false, Exhausted::StopFirst);
        let d = mixture_draws(&m, 3, &seg(&[0.5, 0.5]));
        let small = d.iter().filter(|x| x.0 == 0).count();
        assert_eq!(
            small, 4,
            "the epoch ends when the small source is needed again"
        );
        assert!(d.len() < 104);
    }

    #[test]
    fn cycle_runs_until_every_source_ran_out_once() {
        let m = mix(&[3, 40], false, Exhausted::Cycle);
        let d = mixture_draws(&m, 5, &seg(&[0.5, 0.5]));
        let big = d.iter().filter(|x| x.0 == 1).count();
        assert_eq!(big, 40, "ends as the big source completes its pass");
        assert!(
            d.iter().filter(|x| x.0 == 0).count() > 3,
            "the small one cycled"
        );
    }

    #[test]
    fn a_weight_change_keeps_the_draws_before_it_and_the_read_positions() {
        let m = mix(&[50, 50], false, Exhausted::Drop);
        let old = mixture_draws(&m, 9, &seg(&[0.5, 0.5]));
        let changed = vec![
            Segment {
                start: 0,
                weights: vec![0.5, 0.5],
            },
            Segment {
                start: 30,
                weights: vec![0.0, 1.0],
            },
        ];
        let new = mixture_draws(&m, 9, &changed);
        assert_eq!(old[..30], new[..30]);
        let before_zero = new[..30].iter().filter(|x| x.0 == 0).count();
        // after the change, source 0 is never drawn; source 1 continues its
        // permutation where it was, to its end, with no item twice
        assert!(new[30..].iter().all(|x| x.0 == 1));
        assert_eq!(new.len(), 30 + (50 - (30 - before_zero)));
        let mut ones: Vec<u64> = new.iter().filter(|x| x.0 == 1).map(|x| x.1).collect();
        ones.sort_unstable();
        assert_eq!(ones, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn with_replacement_the_length_is_num_samples() {
        let mut m = mix(&[3, 4], true, Exhausted::Drop);
        assert_eq!(mixture_draws(&m, 1, &seg(&[1.0, 1.0])).len(), 7);
        m.num_samples = Some(100);
        let d = mixture_draws(&m, 1, &seg(&[1.0, 1.0]));
        assert_eq!(d.len(), 100);
        assert!(d.iter().all(|&(s, i)| i < m.lens[s as usize]));
    }

    #[test]
    fn a_sharded_source_is_read_shard_by_shard() {
        let mut m = mix(&[10], false, Exhausted::Drop);
        m.shards = vec![Some(vec![4, 0, 6])];
        let d = mixture_draws(&m, 2, &seg(&[1.0]));
        let idx: Vec<u64> = d.iter().map(|x| x.1).collect();
        // shard 0 is items 0..4, shard 2 items 4..10: one after the other
        let a: Vec<u64> = (0..4).collect();
        let b: Vec<u64> = (4..10).collect();
        assert!(idx == [a.clone(), b.clone()].concat() || idx == [b, a].concat());
    }

    proptest! {
        #[test]
        fn proportions_follow_the_weights(w in 0.05f64..0.95, seed in any::<u64>()) {
            let m = Mix { lens: vec![1000, 1000], shards: vec![None, None], replacement: true,
                          exhausted: Exhausted::Drop, num_samples: Some(20_000) };
            let d = mixture_draws(&m, seed, &seg(&[w, 1.0 - w]));
            let share = d.iter().filter(|x| x.0 == 0).count() as f64 / d.len() as f64;
            // binomial sd <= sqrt(0.25 / 20000) ~ 0.0035: 6 sd
            prop_assert!((share - w).abs() < 0.021, "share {} for weight {}", share, w);
        }

        #[test]
        fn the_sequence_is_a_function_of_its_inputs(
            lens in proptest::collection::vec(0u64..30, 1..5),
            seed in any::<u64>(),
            policy in 0usize..3,
        ) {
            let exhausted = [Exhausted::StopFirst, Exhausted::Drop, Exhausted::Cycle][policy];
            let m = Mix { lens: lens.clone(), shards: vec![None; lens.len()], replacement: false,
                          exhausted, num_samples: None };
            let w: Vec<f64> = (0..lens.len()).map(|i| 1.0 + i as f64).collect();
            let a = mixture_draws(&m, seed, &seg(&w));
            prop_assert_eq!(&a, &mixture_draws(&m, seed, &seg(&w)));
            for &(s, i) in &a {
                prop_assert!(i < lens[s as usize]);
            }
            if exhausted == Exhausted::Drop {
                prop_assert_eq!(a.len() as u64, lens.iter().sum::<u64>());
            }
        }
    }
}
