//! A resumed epoch's numbering. The iterator of a resumed epoch counts its
//! draws from 0: first the batches that were in flight at the snapshot
//! (re-sent), then the epoch's next ones. A snapshot taken from it must
//! speak of the epoch as a whole, so its position is translated back into
//! the epoch's own sequence numbers here.

use super::IterablePosition;

/// Where a resumed epoch took up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resumed {
    /// Batches drawn in the epoch at the snapshot.
    pub start: u64,
    /// The batches in flight at the snapshot (epoch sequence numbers, all
    /// below `start`), in the order the resumed iterator draws them first.
    pub kept: Vec<u64>,
    /// An iterable epoch's workers at the snapshot: the batches each had
    /// handed over, and the replica state that came with its last one.
    pub workers: Vec<(u64, Option<Vec<u8>>)>,
}

impl Resumed {
    /// The epoch sequence number of the resumed iterator's `i`-th draw.
    fn seq(&self, i: u64) -> u64 {
        let k = self.kept.len() as u64;
        if i < k {
            self.kept[i as usize]
        } else {
            self.start + (i - k)
        }
    }

    /// The iterator's `(drawn, pending)` as the epoch's: batches drawn in
    /// the epoch, and the sequence numbers drawn but not handed over
    /// (those in flight at the snapshot and not yet re-drawn among them).
    pub fn position(&self, drawn: u64, pending: &[u64]) -> (u64, Vec<u64>) {
        let k = self.kept.len() as u64;
        let mut out: Vec<u64> = pending.iter().map(|&i| self.seq(i)).collect();
        out.extend(self.kept.iter().skip(drawn.min(k) as usize));
        out.sort_unstable();
        (self.start + drawn.saturating_sub(k), out)
    }

    /// An iterable epoch's per-worker position as the epoch's: batches
    /// handed over since the epoch began, and the last state a worker sent
    /// (the snapshot's until it sends one).
    pub fn iterable(&self, mut p: IterablePosition) -> IterablePosition {
        for (w, (delivered, state)) in self.workers.iter().enumerate() {
            if let Some(d) = p.delivered.get_mut(w) {
                *d += delivered;
            }
            if let Some(s) = p.states.get_mut(w) {
                if s.is_none() {
                    s.clone_from(state);
                }
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// A snapshot at `start` draws with `in_flight` pending, then a
    /// resumed iterator that has drawn `d` and hands over all but `p`: the
    /// epoch's position is what a model of handed-over batches says.
    fn case() -> impl Strategy<Value = (u64, Vec<u64>, u64, Vec<u64>)> {
        (0u64..40).prop_flat_map(|start| {
            let in_flight =
                proptest::sample::subsequence((0..start).collect::<Vec<_>>(), 0..=start as usize);
            (Just(start), in_flight, 0u64..60).prop_flat_map(|(start, kept, d)| {
                let pending =
                    proptest::sample::subsequence((0..d).collect::<Vec<_>>(), 0..=d as usize);
                (Just(start), Just(kept), Just(d), pending)
            })
        })
    }

    proptest! {
        #![proptest_config(crate::testing::miri_friendly(ProptestConfig::with_cases(256)))]

        #[test]
        fn position_is_the_epochs(( start, kept, d, pending) in case()) {
            let r = Resumed { start, kept: kept.clone(), workers: vec![] };
            // the model: handed over = before the snapshot and not in
            // flight, plus the resumed draws not pending
            let mut handed: BTreeSet<u64> = (0..start).filter(|s| !kept.contains(s)).collect();
            for i in 0..d {
                if !pending.contains(&i) {
                    handed.insert(r.seq(i));
                }
            }
            let (drawn, out) = r.position(d, &pending);
            let k = kept.len() as u64;
            prop_assert_eq!(drawn, start + d.saturating_sub(k));
            let expect: Vec<u64> = (0..drawn.max(start)).filter(|s| !handed.contains(s)).collect();
            prop_assert_eq!(out, expect);
        }
    }

    #[test]
    fn a_fresh_numbering_changes_nothing() {
        let r = Resumed::default();
        assert_eq!(r.position(5, &[3, 4]), (5, vec![3, 4]));
    }

    #[test]
    fn iterable_workers_add_the_snapshots_counts_and_keep_its_state_until_a_new_one() {
        let r = Resumed {
            start: 0,
            kept: vec![],
            workers: vec![(3, Some(b"old0".to_vec())), (2, Some(b"old1".to_vec()))],
        };
        let p = IterablePosition {
            delivered: vec![1, 0],
            states: vec![Some(b"new0".to_vec()), None],
            exhausted: vec![false, true],
            done: vec![false, true],
            next_worker: 1,
        };
        let got = r.iterable(p);
        assert_eq!(got.delivered, vec![4, 2]);
        assert_eq!(
            got.states,
            vec![Some(b"new0".to_vec()), Some(b"old1".to_vec())]
        );
        assert_eq!(got.done, vec![false, true]);
    }
}
