//! A sharded epoch run in one process (the one-process loader,
//! `num_workers=0`): the training process's bookkeeping of a sharded
//! dataset (the round-robin over lanes, dynamic assignment through
//! [`ShardQueue`], the positions a snapshot holds) with each lane read
//! inline, as the one-process loader calls a worker's fetch and collate
//! inline. The lanes themselves, the readers a worker runs, are
//! `crate::worker::lanes`; with workers, the same plan is run by the
//! [`Loader`](super::Loader) over the pool.

use super::shards::{LanePlan, LaneSnapshot, QueueError, RanOut, ShardQueue, WorkSource};
use crate::sampler::shards::Blocks;
use crate::wire::protocol::LanePos;
use crate::worker::lanes::{Lane, LaneConfig, Pull, ShardSource};

/// Lanes run in one process, round-robin, skipping lanes that ran out:
/// the one-process loader's sharded epoch, the same batch sequence a pool
/// gives for the same plan.
pub struct LaneSet<S: ShardSource> {
    plan: LanePlan,
    lanes: Vec<Lane<S>>,
    queue: Option<ShardQueue>,
    active: Vec<bool>,
    cycle: usize,
    positions: Vec<Option<LanePos>>,
    handed: u64,
    budget: Option<u64>,
}

impl<S: ShardSource> LaneSet<S> {
    pub fn new(plan: LanePlan, batch: Option<usize>, drop_last: bool) -> Self {
        Self::with_source(plan, batch, drop_last, None)
    }

    /// [`LaneSet::new`], a dynamic queue going on with `source`'s works
    /// once its own are out (the job's shared queue).
    pub fn with_source(
        plan: LanePlan,
        batch: Option<usize>,
        drop_last: bool,
        source: Option<Box<dyn WorkSource>>,
    ) -> Self {
        let config = LaneConfig {
            batch,
            drop_last,
            blocks: plan.shuffle.then_some(Blocks {
                root: plan.root,
                size: plan.block,
            }),
        };
        let mut lanes: Vec<Lane<S>> = (0..plan.lanes).map(|_| Lane::new(config)).collect();
        let queue = match &plan.works {
            Some(works) => {
                for (lane, works) in lanes.iter_mut().zip(works) {
                    lane.assign(works.iter().copied(), true);
                }
                None
            }
            None => Some(ShardQueue::new(plan.queue.clone(), plan.lanes).with_source(source)),
        };
        LaneSet {
            active: vec![true; plan.lanes],
            cycle: plan.next_lane % plan.lanes.max(1),
            positions: plan.positions.clone(),
            handed: plan.handed,
            budget: plan.budget,
            lanes,
            queue,
            plan,
        }
    }

    /// The next batch of the round-robin; `None` at the epoch's end.
    pub fn next_batch(&mut self, src: &mut S) -> Result<Option<Vec<S::Item>>, S::Error>
    where
        S::Error: From<QueueError>,
    {
        if self.budget.is_some_and(|b| self.handed >= b) {
            return Ok(None);
        }
        let n = self.lanes.len();
        loop {
            let Some(l) = (0..n)
                .map(|k| (self.cycle + k) % n)
                .find(|&l| self.active[l])
            else {
                return Ok(None);
            };
            self.cycle = l;
            if let Some(q) = self.queue.as_mut() {
                // one shard queued behind the current one, to read ahead into
                if self.lanes[l].wants_work() {
                    if let Some(w) = q.assign_ahead(l) {
                        self.lanes[l].assign([w], false);
                    }
                }
                if let Some(e) = q.take_failure() {
                    return Err(e.into());
                }
            }
            let pulled = self.lanes[l].pull(src);
            if !matches!(pulled, Ok(Pull::NeedWork)) {
                // a batch, an end or an error: each takes the lane's turn
                self.cycle = (l + 1) % n;
            }
            match pulled? {
                Pull::Batch(items) => {
                    if src.short_of_room() {
                        self.lanes[l].let_go();
                    }
                    self.positions[l] = self.lanes[l].pos().map(|p| self.plan.absolute(l, p));
                    self.handed += 1;
                    return Ok(Some(items));
                }
                Pull::NeedWork => match self
                    .queue
                    .as_mut()
                    .map(|q| (q.ran_out(l), q.take_failure()))
                {
                    Some((_, Some(e))) => return Err(e.into()),
                    None => self.lanes[l].assign([], true),
                    Some((RanOut::Work(w), None)) => self.lanes[l].assign([w], false),
                    Some((RanOut::HandBack, None)) => self.lanes[l].hand_back(),
                    // (here every lane told to hand back already has: `last`)
                    Some((RanOut::Collect { works, last }, None)) => {
                        self.lanes[l].assign(works, last)
                    }
                },
                Pull::HandedBack(works) => {
                    self.active[l] = false;
                    let at = self.positions[l];
                    if let Some((c, works, last)) = self
                        .queue
                        .as_mut()
                        .and_then(|q| q.handed_back(l, at, works))
                    {
                        self.lanes[c].assign(works, last);
                    }
                }
                Pull::Exhausted => self.active[l] = false,
            }
        }
    }

    /// See [`Lane::held`].
    pub fn held<'a>(
        &'a self,
        item: &mut impl FnMut(&'a S::Item),
        iter: &mut impl FnMut(&'a S::Iter),
    ) {
        for lane in &self.lanes {
            lane.held(item, iter);
        }
    }

    /// Where the epoch stands (after the last batch handed over).
    pub fn snapshot(&self) -> LaneSnapshot {
        LaneSnapshot {
            positions: self.positions.clone(),
            next_lane: self.cycle,
            handed: self.handed,
            rest: self.queue.as_ref().map(|q| q.rest(&self.positions)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::shards::shard_order;
    use crate::scheduler::shards::{Mode, ShardSpec};
    use crate::wire::protocol::Work;
    use crate::worker::lanes::test_source::{src, Shards};
    use proptest::prelude::*;
    use std::sync::{Arc, Mutex};

    /// One queue shared by several ranks: each claim takes the next work.
    struct Shared {
        queue: Arc<Mutex<std::collections::VecDeque<Work>>>,
        fail_after: Option<usize>,
        claims: usize,
    }

    impl WorkSource for Shared {
        fn next_work(&mut self) -> Result<Option<Work>, QueueError> {
            self.claims += 1;
            if self.fail_after.is_some_and(|n| self.claims > n) {
                return Err(QueueError("the store went away".into()));
            }
            Ok(self.queue.lock().unwrap().pop_front())
        }
    }

    fn shared_plan(lanes: usize) -> LanePlan {
        ShardSpec {
            n_shards: 0,
            lens: None,
            order_seed: None,
            blocks: None,
            rank: 0,
            world: 1,
            mode: Mode::Dynamic(lanes),
            batch: Some(2),
            drop_last: false,
            even: false,
            largest_first: false,
        }
        .plan(None)
        .unwrap()
    }

    #[test]
    fn ranks_sharing_a_queue_read_every_item_once() {
        let lens = [5u64, 0, 7, 3, 9, 1, 4];
        let queue = Arc::new(Mutex::new(
            (0..lens.len() as u32).map(|s| Work::from(s, 0)).collect(),
        ));
        let mut sets: Vec<LaneSet<Shards>> = (0..3)
            .map(|r| {
                let source = Shared {
                    queue: queue.clone(),
                    fail_after: None,
                    claims: 0,
                };
                LaneSet::with_source(
                    shared_plan(1 + r % 2),
                    Some(2),
                    false,
                    Some(Box::new(source)),
                )
            })
            .collect();
        let mut s = src(&lens);
        let mut got = Vec::new();
        // the ranks take turns, a batch each, until all are done
        let mut live = vec![true; sets.len()];
        while live.iter().any(|&l| l) {
            for (r, set) in sets.iter_mut().enumerate() {
                if live[r] {
                    match set.next_batch(&mut s).unwrap() {
                        Some(b) => got.extend(b),
                        None => live[r] = false,
                    }
                }
            }
        }
        got.sort_unstable();
        let want: Vec<(u32, u64)> = lens
            .iter()
            .enumerate()
            .flat_map(|(sh, &n)| (0..n).map(move |o| (sh as u32, o)))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_failing_source_is_an_error_not_an_early_end() {
        let queue = Arc::new(Mutex::new((0..4).map(|s| Work::from(s, 0)).collect()));
        let source = Shared {
            queue,
            fail_after: Some(1),
            claims: 0,
        };
        let mut set: LaneSet<Shards> =
            LaneSet::with_source(shared_plan(1), Some(2), false, Some(Box::new(source)));
        let mut s = src(&[3, 3, 3, 3]);
        let mut result = Ok(Some(Vec::new()));
        while let Ok(Some(_)) = result {
            result = set.next_batch(&mut s);
        }
        assert_eq!(result.unwrap_err(), "the store went away");
    }

    proptest! {
        #![proptest_config(crate::testing::miri_friendly(ProptestConfig::default()))]
        /// A `LaneSet` stopped after any batch and resumed, from its
        /// snapshot, with another number of dynamic lanes (or the same
        /// static lanes) reads exactly the items that were left; static
        /// lanes also keep their order.
        #[test]
        fn lane_sets_resume_from_their_snapshot(lens in proptest::collection::vec(0u64..20, 1..7), seed in any::<u64>(), batch in 1usize..4, dynamic in any::<bool>(), lanes in 1usize..4, lanes_after in 1usize..4, stop in 0usize..40, rank in 0usize..2) {
            let spec = |lanes: usize| ShardSpec {
                n_shards: lens.len(),
                lens: Some(lens.clone()),
                order_seed: Some(seed),
                blocks: Some(Blocks { root: seed, size: 3 }),
                rank,
                world: 2,
                mode: if dynamic { Mode::Dynamic(lanes) } else { Mode::Static(lanes) },
                batch: Some(batch as u64),
                drop_last: false,
                even: false,
                largest_first: true,
            };
            let run = |set: &mut LaneSet<Shards>, s: &mut Shards, limit: usize| {
                let mut out = Vec::new();
                while out.len() < limit {
                    match set.next_batch(s).unwrap() {
                        Some(b) => out.push(b),
                        None => break,
                    }
                }
                out
            };
            let mut s = src(&lens);
            let mut whole = LaneSet::new(spec(lanes).plan(None).unwrap(), Some(batch), false);
            let all = run(&mut whole, &mut s, usize::MAX);
            // the count the plan announces (dynamic lanes: one lane's)
            prop_assert_eq!(Some(all.len() as u64), spec(lanes).batches());
            if dynamic {
                prop_assert!(all.iter().rev().skip(1).all(|b| b.len() == batch), "only the last batch is short");
            }
            let stop = stop.min(all.len());
            let mut first = LaneSet::new(spec(lanes).plan(None).unwrap(), Some(batch), false);
            let head = run(&mut first, &mut s, stop);
            let snap = first.snapshot();
            let after = if dynamic { lanes_after } else { lanes };
            // resume, take a second snapshot a batch or two in, resume again
            let mut resumed = LaneSet::new(spec(after).plan(Some(&snap)).unwrap(), Some(batch), false);
            let mut tail = run(&mut resumed, &mut s, stop % 3);
            let snap2 = resumed.snapshot();
            let mut again = LaneSet::new(spec(after).plan(Some(&snap2)).unwrap(), Some(batch), false);
            tail.extend(run(&mut again, &mut s, usize::MAX));
            if !dynamic {
                prop_assert_eq!(&head, &all[..stop].to_vec());
                prop_assert_eq!(&tail, &all[stop..].to_vec());
            }
            let mut got: Vec<(u32, u64)> = head.concat();
            got.extend(tail.concat());
            got.sort_unstable();
            let mut want: Vec<(u32, u64)> = all.concat();
            want.sort_unstable();
            prop_assert_eq!(&got, &want);
            // the rank reads only its own shards
            let order = shard_order(lens.len(), Some(seed));
            let mine: Vec<u32> = order.iter().skip(rank).step_by(2).copied().collect();
            prop_assert!(want.iter().all(|(sh, _)| mine.contains(sh)));
        }
    }
}
