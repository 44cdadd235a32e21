//! The permutations private generators drew that are still in use.
//!
//! A resumed epoch opens its sampler exactly as the interrupted one did, so a
//! private generator (`RandomSampler(generator=None)`) is seeded with the same
//! seed and draws the same permutation again: 0.45 s for 23 M samples. When
//! the interrupted epoch's iterator is still alive (the autotuner moving an
//! epoch to another layout, a `state_dict()` loaded while the first loader
//! still iterates), its permutation is handed over instead, with the
//! generator set to the state the draw would have left it in: the same
//! indices and the same generator, bit for bit, without the draw.
//!
//! Only `Weak` references are kept: a permutation lives as long as an
//! iterator holds it, never past its epoch.

use std::sync::{Arc, Mutex, TryLockError, Weak};

use super::{randperm_compact, IndexVec, Mt19937};

/// Below this many samples a draw takes under a millisecond: not worth a
/// look-up.
const WORTH_SHARING: usize = 1 << 16;
/// How many draws are remembered (dead ones are dropped first).
const KEPT: usize = 8;

struct Drawn {
    n: usize,
    before: Box<Mt19937>,
    after: Box<Mt19937>,
    perm: Weak<IndexVec>,
}

static RECENT: Mutex<Vec<Drawn>> = Mutex::new(Vec::new());

/// The list, unless another thread holds it: then the draw is made and not
/// shared, rather than waited for. (A process forked while a thread held
/// it, whose copy stays held, so never waits; a panic while it was held
/// leaves it whole: each entry is pushed or removed in one step.)
fn recent() -> Option<std::sync::MutexGuard<'static, Vec<Drawn>>> {
    match RECENT.try_lock() {
        Ok(list) => Some(list),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// `randperm_compact(n, rng)`, shared with a live iterator that drew the same
/// permutation from the same generator state, if there is one.
pub fn randperm_recent(n: usize, rng: &mut Mt19937) -> Arc<IndexVec> {
    if n < WORTH_SHARING {
        return Arc::new(randperm_compact(n, rng));
    }
    if let Some(list) = recent() {
        for d in list.iter().rev() {
            if d.n == n && *d.before == *rng {
                if let Some(perm) = d.perm.upgrade() {
                    *rng = (*d.after).clone();
                    return perm;
                }
            }
        }
    }
    let before = Box::new(rng.clone());
    let perm = Arc::new(randperm_compact(n, rng));
    let Some(mut list) = recent() else {
        return perm;
    };
    list.retain(|d| d.perm.strong_count() > 0);
    if list.len() >= KEPT {
        list.remove(0);
    }
    list.push(Drawn {
        n,
        before,
        after: Box::new(rng.clone()),
        perm: Arc::downgrade(&perm),
    });
    perm
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Two generators of one seed drawing in any order, each keeping or
        /// dropping what it drew: each sees torch's draws for its own state.
        #[test]
        fn any_interleaving_draws_what_each_generator_would(
            seed in any::<u64>(),
            extra in 0usize..64,
            steps in proptest::collection::vec((any::<bool>(), any::<bool>()), 1..8),
        ) {
            let n = WORTH_SHARING + extra;
            let mut gens = [Mt19937::new(seed), Mt19937::new(seed)];
            let mut refs = gens.clone();
            let mut held: Vec<Arc<IndexVec>> = Vec::new();
            for (which, keep) in steps {
                let k = usize::from(which);
                let got = randperm_recent(n, &mut gens[k]);
                prop_assert_eq!(&*got, &randperm_compact(n, &mut refs[k]));
                prop_assert_eq!(&gens[k], &refs[k]);
                if keep {
                    held.push(got);
                }
            }
        }
    }

    #[test]
    fn a_live_permutation_is_handed_over_with_the_generator_after_it() {
        let n = WORTH_SHARING + 3;
        // (another test thread holding the list makes a draw unshared: tried
        // again with another seed)
        let shared = (0..20u64).any(|k| {
            let seed = 41 + 1000 * k;
            let mut a = Mt19937::new(seed);
            let first = randperm_recent(n, &mut a);
            let mut b = Mt19937::new(seed);
            let again = randperm_recent(n, &mut b);
            let mut reference = Mt19937::new(seed);
            assert_eq!(*again, randperm_compact(n, &mut reference));
            assert_eq!((&a, &b), (&reference, &reference));
            Arc::ptr_eq(&first, &again)
        });
        assert!(shared, "no draw was handed over");
    }

    #[test]
    fn a_dropped_permutation_is_drawn_again_and_not_kept() {
        let n = WORTH_SHARING + 5;
        let mut a = Mt19937::new(42);
        let first = randperm_recent(n, &mut a);
        let weak = Arc::downgrade(&first);
        drop(first);
        assert!(
            weak.upgrade().is_none(),
            "the list keeps no permutation alive"
        );
        let mut b = Mt19937::new(42);
        let again = randperm_recent(n, &mut b);
        assert_eq!(a, b);
        let mut reference = Mt19937::new(42);
        assert_eq!(*again, randperm_compact(n, &mut reference));
    }

    #[test]
    fn another_state_or_length_draws_its_own() {
        let n = WORTH_SHARING + 7;
        let mut a = Mt19937::new(43);
        let first = randperm_recent(n, &mut a);
        // the same generator one draw on
        let mut next = a.clone();
        let second = randperm_recent(n, &mut next);
        assert!(!Arc::ptr_eq(&first, &second));
        let mut reference = a.clone();
        assert_eq!(*second, randperm_compact(n, &mut reference));
        // the same state, another length
        let mut c = Mt19937::new(43);
        let other = randperm_recent(n + 1, &mut c);
        assert_eq!(other.len(), n + 1);
        let mut reference = Mt19937::new(43);
        assert_eq!(*other, randperm_compact(n + 1, &mut reference));
        drop(first);
    }
}
