//! Lanes: the logical readers of a sharded dataset (which shards each one
//! reads is the main process's: `crate::scheduler::shards`; the order of a
//! shard's items is `crate::sampler::shards`).
//!
//! A lane reads the shards it is given one after the other and cuts the
//! items into batches; a batch may span a shard boundary. After each batch
//! it can say where it stands ([`Lane::pos`]): a lane given the same works
//! and that position continues with exactly the items that came next.
//! Lanes are generic over the dataset ([`ShardSource`]): in a worker they
//! call Python, in the tests plain Rust.

use std::collections::VecDeque;

use crate::sampler::shards::Blocks;
use crate::scheduler::protocol::{LanePos, Work};

/// Opens and reads shards: the dataset's side of a lane.
pub trait ShardSource {
    type Item;
    type Iter;
    type Error;
    /// An iterator over `shard`'s items from item `start` on.
    fn open(&mut self, shard: u32, start: u64) -> Result<Self::Iter, Self::Error>;
    /// The next item of `it`, which is item `offset` of `shard` (`None`:
    /// the shard ended).
    fn next(
        &mut self,
        it: &mut Self::Iter,
        shard: u32,
        offset: u64,
    ) -> Result<Option<Self::Item>, Self::Error>;
}

/// What a lane gave for a task.
#[derive(Debug, PartialEq, Eq)]
pub enum Pull<I> {
    /// The next batch (one item when unbatched).
    Batch(Vec<I>),
    /// The lane ran out of shards and more may come: ask, then pull again
    /// (the items read so far are kept).
    NeedWork,
    /// The lane is done for the epoch.
    Exhausted,
}

/// The shard a lane is reading.
struct Reading<I, It> {
    shard: u32,
    iter: It,
    /// The offset of the next item `iter` yields.
    raw: u64,
    /// Items of the shard order emitted so far.
    emitted: u64,
    /// Shuffled: the current block's items not yet emitted, next first.
    block: VecDeque<I>,
    /// Items of the first block already emitted before a resume.
    skip: u64,
    /// `iter` has ended.
    ended: bool,
}

/// How a lane cuts its items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneConfig {
    /// `None`: one item per pull, not batched.
    pub batch: Option<usize>,
    pub drop_last: bool,
    /// Shuffle each shard in blocks.
    pub blocks: Option<Blocks>,
}

pub struct Lane<S: ShardSource> {
    config: LaneConfig,
    works: VecDeque<Work>,
    /// Works begun so far (the current one included).
    started: u32,
    /// More works may be assigned (dynamic lanes until told otherwise).
    more: bool,
    reading: Option<Reading<S::Item, S::Iter>>,
    /// Where the last shard read ended, once it has.
    ended_at: Option<(u32, u64)>,
    /// Items of the batch being made.
    partial: Vec<S::Item>,
}

impl<S: ShardSource> Lane<S> {
    pub fn new(config: LaneConfig) -> Self {
        Lane {
            config,
            works: VecDeque::new(),
            started: 0,
            more: true,
            reading: None,
            ended_at: None,
            partial: Vec::new(),
        }
    }

    /// Queues `works`; `last`: nothing more will come this epoch.
    pub fn assign(&mut self, works: impl IntoIterator<Item = Work>, last: bool) {
        self.works.extend(works);
        if last {
            self.more = false;
        }
    }

    /// Works given to this lane so far.
    pub fn given(&self) -> u32 {
        self.started + self.works.len() as u32
    }

    /// Where the lane stands (after the last item it emitted); `None`
    /// before it has begun any work.
    pub fn pos(&self) -> Option<LanePos> {
        let (shard, emitted) = match (&self.reading, self.ended_at) {
            (Some(r), _) => (r.shard, r.emitted),
            (None, Some(at)) => at,
            (None, None) => return None,
        };
        Some(LanePos {
            started: self.started,
            shard,
            emitted,
        })
    }

    /// The next batch, [`Pull::NeedWork`] or [`Pull::Exhausted`]. An error
    /// from the dataset drops the batch being made (as torch's fetcher
    /// does) and ends the shard it came from.
    pub fn pull(&mut self, src: &mut S) -> Result<Pull<S::Item>, S::Error> {
        let want = self.config.batch.unwrap_or(1);
        while self.partial.len() < want {
            match self.next_item(src) {
                Ok(Some(item)) => self.partial.push(item),
                Ok(None) if self.more => return Ok(Pull::NeedWork),
                Ok(None) => break,
                Err(e) => {
                    self.partial.clear();
                    if let Some(r) = self.reading.take() {
                        self.ended_at = Some((r.shard, r.emitted));
                    }
                    return Err(e);
                }
            }
        }
        let short = self.partial.len() < want;
        if self.partial.is_empty()
            || (short && self.config.drop_last && self.config.batch.is_some())
        {
            self.partial.clear();
            return Ok(Pull::Exhausted);
        }
        Ok(Pull::Batch(std::mem::take(&mut self.partial)))
    }

    /// The next item of the lane's stream; `None` when its works are done.
    fn next_item(&mut self, src: &mut S) -> Result<Option<S::Item>, S::Error> {
        loop {
            if self.reading.is_none() {
                let Some(work) = self.works.pop_front() else {
                    return Ok(None);
                };
                self.started += 1;
                let (start, skip) = match self.config.blocks {
                    Some(b) => (work.emitted / b.size * b.size, work.emitted % b.size),
                    None => (work.emitted, 0),
                };
                let iter = src.open(work.shard, start)?;
                self.reading = Some(Reading {
                    shard: work.shard,
                    iter,
                    raw: start,
                    emitted: work.emitted,
                    block: VecDeque::new(),
                    skip,
                    ended: false,
                });
            }
            let r = self.reading.as_mut().expect("opened above");
            let item = match self.config.blocks {
                None if r.ended => None,
                None => {
                    let item = src.next(&mut r.iter, r.shard, r.raw)?;
                    r.raw += 1;
                    item
                }
                Some(b) => {
                    if r.block.is_empty() && !r.ended {
                        fill_block(src, r, b)?;
                    }
                    r.block.pop_front()
                }
            };
            match item {
                Some(item) => {
                    r.emitted += 1;
                    return Ok(Some(item));
                }
                None => {
                    self.ended_at = Some((r.shard, r.emitted));
                    self.reading = None;
                }
            }
        }
    }
}

/// Reads the next block of `r`'s shard and puts it in shard order, minus
/// the items a resume skips.
fn fill_block<S: ShardSource>(
    src: &mut S,
    r: &mut Reading<S::Item, S::Iter>,
    b: Blocks,
) -> Result<(), S::Error> {
    let block_no = r.raw / b.size;
    let mut items = Vec::new();
    while (items.len() as u64) < b.size {
        match src.next(&mut r.iter, r.shard, r.raw)? {
            Some(item) => {
                items.push(Some(item));
                r.raw += 1;
            }
            None => {
                r.ended = true;
                break;
            }
        }
    }
    let perm = b.perm(r.shard, block_no, items.len());
    r.block = perm
        .iter()
        .map(|&j| items[j as usize].take().expect("a permutation"))
        .collect();
    let skip = std::mem::take(&mut r.skip).min(r.block.len() as u64) as usize;
    r.block.drain(..skip);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::shards::ShardAddresses;
    use proptest::prelude::*;

    /// Shard `s` holds `lens[s]` items `(s, 0), (s, 1), ...`; `fail` makes
    /// reading that item an error.
    struct Shards {
        lens: Vec<u64>,
        fail: Option<(u32, u64)>,
        opens: usize,
    }

    impl ShardSource for Shards {
        type Item = (u32, u64);
        type Iter = ();
        type Error = String;
        fn open(&mut self, _shard: u32, _start: u64) -> Result<(), String> {
            self.opens += 1;
            Ok(())
        }
        fn next(
            &mut self,
            _: &mut (),
            shard: u32,
            offset: u64,
        ) -> Result<Option<(u32, u64)>, String> {
            if self.fail == Some((shard, offset)) {
                return Err(format!("item {shard}/{offset}"));
            }
            Ok((offset < self.lens[shard as usize]).then_some((shard, offset)))
        }
    }

    fn src(lens: &[u64]) -> Shards {
        Shards {
            lens: lens.to_vec(),
            fail: None,
            opens: 0,
        }
    }

    fn works(shards: &[u32]) -> Vec<Work> {
        shards
            .iter()
            .map(|&shard| Work { shard, emitted: 0 })
            .collect()
    }

    fn drain(lane: &mut Lane<Shards>, s: &mut Shards) -> Vec<Vec<(u32, u64)>> {
        let mut out = Vec::new();
        loop {
            match lane.pull(s).unwrap() {
                Pull::Batch(b) => out.push(b),
                Pull::Exhausted => return out,
                Pull::NeedWork => panic!("a static lane asked for work"),
            }
        }
    }

    fn config(batch: Option<usize>, drop_last: bool, blocks: Option<Blocks>) -> LaneConfig {
        LaneConfig {
            batch,
            drop_last,
            blocks,
        }
    }

    #[test]
    fn batches_span_shard_boundaries_and_the_last_may_be_short() {
        let mut s = src(&[3, 2]);
        let mut lane = Lane::new(config(Some(2), false, None));
        lane.assign(works(&[0, 1]), true);
        let got = drain(&mut lane, &mut s);
        assert_eq!(
            got,
            vec![vec![(0, 0), (0, 1)], vec![(0, 2), (1, 0)], vec![(1, 1)]]
        );
        let mut lane = Lane::new(config(Some(2), true, None));
        lane.assign(works(&[0, 1]), true);
        assert_eq!(
            drain(&mut lane, &mut s).len(),
            2,
            "drop_last drops the short one"
        );
    }

    #[test]
    fn a_dynamic_lane_asks_and_keeps_its_partial_batch() {
        let mut s = src(&[3, 2]);
        let mut lane = Lane::new(config(Some(2), false, None));
        assert_eq!(lane.pull(&mut s).unwrap(), Pull::NeedWork);
        assert_eq!(lane.given(), 0);
        lane.assign(works(&[0]), false);
        assert_eq!(
            lane.pull(&mut s).unwrap(),
            Pull::Batch(vec![(0, 0), (0, 1)])
        );
        assert_eq!(lane.pull(&mut s).unwrap(), Pull::NeedWork);
        lane.assign(works(&[1]), false);
        assert_eq!(
            lane.pull(&mut s).unwrap(),
            Pull::Batch(vec![(0, 2), (1, 0)])
        );
        assert_eq!(lane.given(), 2);
        assert_eq!(lane.pull(&mut s).unwrap(), Pull::NeedWork);
        lane.assign([], true);
        assert_eq!(lane.pull(&mut s).unwrap(), Pull::Batch(vec![(1, 1)]));
        assert_eq!(lane.pull(&mut s).unwrap(), Pull::Exhausted);
    }

    #[test]
    fn an_error_drops_the_batch_and_ends_that_shard() {
        let mut s = src(&[4, 2]);
        s.fail = Some((0, 1));
        let mut lane = Lane::new(config(Some(2), false, None));
        lane.assign(works(&[0, 1]), true);
        assert_eq!(lane.pull(&mut s).unwrap_err(), "item 0/1");
        assert_eq!(
            lane.pull(&mut s).unwrap(),
            Pull::Batch(vec![(1, 0), (1, 1)])
        );
        assert_eq!(lane.pull(&mut s).unwrap(), Pull::Exhausted);
    }

    proptest! {
        /// A lane's items are its shards in shard order: the order
        /// `ShardAddresses` defines for the same blocks.
        #[test]
        fn lane_reads_the_shard_order(lens in proptest::collection::vec(0u64..25, 1..5), root in any::<u64>(), size in 1u64..7, batch in 1usize..5, shuffle in any::<bool>()) {
            let blocks = shuffle.then_some(Blocks { root, size });
            let order: Vec<u32> = (0..lens.len() as u32).collect();
            let mut s = src(&lens);
            let mut lane = Lane::new(config(Some(batch), false, blocks));
            lane.assign(works(&order), true);
            let got: Vec<(u32, u64)> = drain(&mut lane, &mut s).concat();
            let mut a = ShardAddresses::new(order, &lens, blocks);
            let want: Vec<(u32, u64)> = (0..a.len()).map(|p| a.address(p)).collect();
            prop_assert_eq!(got, want);
        }

        /// Stopping after any batch and resuming a fresh lane from `pos()`
        /// with the rest of the works gives exactly the batches that came
        /// next.
        #[test]
        fn resuming_at_pos_continues_exactly(lens in proptest::collection::vec(0u64..25, 1..5), root in any::<u64>(), size in 1u64..7, batch in 1usize..5, shuffle in any::<bool>(), stop in 0usize..30) {
            let blocks = shuffle.then_some(Blocks { root, size });
            let order: Vec<u32> = (0..lens.len() as u32).collect();
            let cfg = config(Some(batch), false, blocks);
            let mut s = src(&lens);
            let mut whole = Lane::new(cfg);
            whole.assign(works(&order), true);
            let all = drain(&mut whole, &mut s);
            let stop = stop.min(all.len());
            let mut first = Lane::new(cfg);
            first.assign(works(&order), true);
            for b in &all[..stop] {
                prop_assert_eq!(&first.pull(&mut s).unwrap(), &Pull::Batch(b.clone()));
            }
            let mut resumed = Lane::new(cfg);
            match first.pos() {
                None => resumed.assign(works(&order), true),
                Some(p) => {
                    let mut rest = vec![Work { shard: p.shard, emitted: p.emitted }];
                    rest.extend(works(&order[p.started as usize..]));
                    resumed.assign(rest, true);
                }
            }
            prop_assert_eq!(drain(&mut resumed, &mut s), all[stop..].to_vec());
        }
    }
}
