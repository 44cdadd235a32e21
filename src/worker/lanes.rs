//! Lanes: the logical readers of a sharded dataset. Which shards each one
//! reads is decided in the training process (`src/scheduler/shards.rs`; a
//! one-process loader runs its lanes there too, `src/scheduler/lane_set.rs`);
//! the order of a shard's items is `crate::sampler::shards`.
//!
//! A lane reads the shards it is given one after the other and cuts the
//! items into batches; a batch may span a shard boundary. Shuffled, a lane
//! reads the next block ahead while it emits the current one, spreading the
//! reads evenly over the emissions, and at a shard's last block it reads
//! ahead into its next work's first block; so every batch costs about the
//! same (a lane that stalled for a whole block would hold back every other
//! lane behind it in the round-robin). Only a lane's very first block is
//! read whole. After each batch
//! it can say where it stands ([`Lane::pos`]): a lane given the same works
//! and that position continues with exactly the items that came next.
//! Lanes are generic over the dataset ([`ShardSource`]): in a worker they
//! call Python, in the tests plain Rust.

use std::collections::VecDeque;

use crate::sampler::shards::Blocks;
use crate::wire::protocol::{LanePos, Work};

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
    /// Another reference to `item` (reads by address may repeat an item).
    fn share(&mut self, item: &Self::Item) -> Self::Item;
    /// Whether a lane should let go of its open shards after each batch
    /// ([`Lane::let_go`]): the store they are read through is short of
    /// room, and a lane waiting for its next turn must not hold a shard
    /// that another reader needs room for.
    fn short_of_room(&mut self) -> bool {
        false
    }
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
    /// The lane was told to hand back ([`Lane::hand_back`]) and is done:
    /// the works holding the items it read but made no batch of (none when
    /// it had none), for another lane to read. It ends with this once; an
    /// [`Pull::Exhausted`] follows.
    HandedBack(Vec<Work>),
}

/// The shard a lane is reading.
struct Reading<I, It> {
    shard: u32,
    /// `None` once the shard is read to its end or the work's limit, or
    /// after the lane let go of it: then reopened at `raw` when needed.
    iter: Option<It>,
    /// The offset of the next item `iter` yields.
    raw: u64,
    /// Items of the shard order emitted so far.
    emitted: u64,
    /// Shuffled: the current block's items not yet emitted, next first.
    block: VecDeque<I>,
    /// Shuffled: the next block's items read so far, in shard order.
    ahead: Vec<I>,
    /// Items of the first block already emitted before a resume.
    skip: u64,
    /// `iter` has ended (or reached `limit`).
    ended: bool,
    /// The work's end in the shard order ([`Work::OPEN`]: the shard's).
    end: u64,
    /// The raw offset past the last item the work needs: `end`, or the
    /// end of the block holding position `end - 1` when shuffled.
    limit: u64,
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
    /// Every work given, in order (`started` counts into it).
    assigned: Vec<Work>,
    /// Works begun so far (the current one included).
    started: u32,
    /// More works may be assigned (dynamic lanes until told otherwise).
    more: bool,
    /// Told to hand back its last items instead of batching them; and
    /// whether it has.
    hand_back: bool,
    handed_back: bool,
    reading: Option<Reading<S::Item, S::Iter>>,
    /// The next work, opened early to read its first block ahead.
    next: Option<Reading<S::Item, S::Iter>>,
    /// The next work failed as it was opened or read ahead: `(shard,
    /// emitted)`. It is begun (and ends at once) when `reading` ends, so
    /// `started` always counts up to the work being read.
    failed_next: Option<(u32, u64)>,
    /// The last error came from reading ahead into the next work.
    next_failed: bool,
    /// Indices (in `assigned`) of works that failed as they were read
    /// ahead: a tail leaves them out (their error was raised).
    failed: Vec<u32>,
    /// Where the items not yet in a batch begin: the works begun then, and
    /// what was left of the one being read (set after each batch and
    /// error).
    mark: (u32, Option<Work>),
    /// Where the last shard read ended, once it has.
    ended_at: Option<(u32, u64)>,
    /// Items of the batch being made.
    partial: Vec<S::Item>,
}

impl<I, It> Reading<I, It> {
    /// Opens `work` where its shard order resumes: at the start of the
    /// block holding its next item.
    fn open<S: ShardSource<Item = I, Iter = It>>(
        src: &mut S,
        work: Work,
        blocks: Option<Blocks>,
    ) -> Result<Self, S::Error> {
        let (start, skip, limit) = match blocks {
            Some(b) => (
                work.emitted / b.size * b.size,
                work.emitted % b.size,
                work.end.div_ceil(b.size).saturating_mul(b.size),
            ),
            None => (work.emitted, 0, work.end),
        };
        Ok(Reading {
            shard: work.shard,
            iter: Some(src.open(work.shard, start)?),
            raw: start,
            emitted: work.emitted,
            block: VecDeque::new(),
            ahead: Vec::new(),
            skip,
            ended: false,
            end: work.end,
            limit,
        })
    }

    /// The item at `raw` (`None`: the shard or the work's limit ended),
    /// reopening the shard there if the lane let go of it. The iterator is
    /// dropped as soon as nothing more is needed from it, so a lane holds
    /// at most one shard open (a shard read through a cache stays pinned
    /// while its iterator lives).
    fn read<S: ShardSource<Item = I, Iter = It>>(
        &mut self,
        src: &mut S,
    ) -> Result<Option<I>, S::Error> {
        if self.raw >= self.limit {
            self.iter = None;
            return Ok(None);
        }
        let it = match &mut self.iter {
            Some(it) => it,
            None => self.iter.insert(src.open(self.shard, self.raw)?),
        };
        match src.next(it, self.shard, self.raw)? {
            Some(item) => {
                self.raw += 1;
                if self.raw >= self.limit {
                    self.iter = None;
                }
                Ok(Some(item))
            }
            None => {
                self.iter = None;
                Ok(None)
            }
        }
    }
}

impl<S: ShardSource> Lane<S> {
    pub fn new(config: LaneConfig) -> Self {
        Lane {
            config,
            works: VecDeque::new(),
            assigned: Vec::new(),
            started: 0,
            more: true,
            hand_back: false,
            handed_back: false,
            reading: None,
            next: None,
            failed_next: None,
            next_failed: false,
            failed: Vec::new(),
            mark: (0, None),
            ended_at: None,
            partial: Vec::new(),
        }
    }

    /// Nothing queued behind the work being read: a dynamic lane would
    /// like its next shard now, to read ahead into it.
    pub fn wants_work(&self) -> bool {
        self.more && self.works.is_empty() && self.next.is_none() && self.failed_next.is_none()
    }

    /// Queues `works`; `last`: nothing more will come this epoch.
    pub fn assign(&mut self, works: impl IntoIterator<Item = Work>, last: bool) {
        let from = self.assigned.len();
        self.assigned.extend(works);
        self.works.extend(self.assigned[from..].iter().copied());
        if last {
            self.more = false;
        }
    }

    /// Nothing more will come this epoch, and the lane makes no short
    /// batch of its last items: it gives them back
    /// ([`Pull::HandedBack`]), for the lane that ends the epoch.
    pub fn hand_back(&mut self) {
        self.more = false;
        self.hand_back = true;
    }

    /// The works holding the items read since the last batch (or error)
    /// and the items not read yet: from the mark on, without the works
    /// that failed.
    fn tail(&self) -> Vec<Work> {
        let (begun, current) = self.mark;
        let rest = self
            .assigned
            .iter()
            .enumerate()
            .skip(begun as usize)
            .filter(|(i, _)| !self.failed.contains(&(*i as u32)))
            .map(|(_, w)| *w);
        current.into_iter().chain(rest).collect()
    }

    /// Sets the mark where the lane stands.
    fn mark_here(&mut self) {
        let current = self.reading.as_ref().map(|r| Work {
            shard: r.shard,
            emitted: r.emitted,
            end: r.end,
        });
        self.mark = (self.started, current);
    }

    /// Calls `item` and `iter` on every item and iterator the lane holds
    /// (for a garbage collector that must see them).
    pub fn held<'a>(
        &'a self,
        item: &mut impl FnMut(&'a S::Item),
        iter: &mut impl FnMut(&'a S::Iter),
    ) {
        self.partial.iter().for_each(&mut *item);
        for r in self.reading.iter().chain(&self.next) {
            r.block.iter().for_each(&mut *item);
            r.ahead.iter().for_each(&mut *item);
            if let Some(it) = &r.iter {
                iter(it);
            }
        }
    }

    /// Closes the shards the lane has open (the one it reads, the next it
    /// reads ahead into); each is reopened where it stood when the lane
    /// reads from it again. Between its batches a lane then holds nothing
    /// open: fewer shards pinned at once when the cache is short of room,
    /// for the cost of a reopen per batch.
    pub fn let_go(&mut self) {
        for r in self.reading.iter_mut().chain(self.next.iter_mut()) {
            r.iter = None;
        }
    }

    /// Works given to this lane so far.
    pub fn given(&self) -> u32 {
        self.started
            + self.works.len() as u32
            + u32::from(self.next.is_some())
            + u32::from(self.failed_next.is_some())
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
                    // the next shard failed as it was read ahead (or opened):
                    // it ends (`failed_next`) and the current one goes on
                    if !std::mem::take(&mut self.next_failed) {
                        if let Some(r) = self.reading.take() {
                            self.ended_at = Some((r.shard, r.emitted));
                        }
                    }
                    self.mark_here();
                    return Err(e);
                }
            }
        }
        let short = self.partial.len() < want;
        if short && self.hand_back && !self.handed_back {
            self.handed_back = true;
            let tail = if self.partial.is_empty() {
                Vec::new()
            } else {
                self.tail()
            };
            self.partial.clear();
            return Ok(Pull::HandedBack(tail));
        }
        if self.partial.is_empty()
            || (short && self.config.drop_last && self.config.batch.is_some())
        {
            self.partial.clear();
            return Ok(Pull::Exhausted);
        }
        let batch = std::mem::take(&mut self.partial);
        self.mark_here();
        Ok(Pull::Batch(batch))
    }

    /// The next item of the lane's stream; `None` when its works are done.
    fn next_item(&mut self, src: &mut S) -> Result<Option<S::Item>, S::Error> {
        loop {
            if self.reading.is_none() {
                if let Some(at) = self.failed_next.take() {
                    // begun, and over: its error was raised
                    self.started += 1;
                    self.ended_at = Some(at);
                    continue;
                }
                let reading = match self.next.take() {
                    Some(r) => r,
                    None => {
                        let Some(work) = self.works.pop_front() else {
                            return Ok(None);
                        };
                        match Reading::open(src, work, self.config.blocks) {
                            Ok(r) => r,
                            Err(e) => {
                                // a shard that fails to open was begun and
                                // ends: counted, or a dynamic lane's `given`
                                // falls behind what it was given and it is
                                // never given more
                                self.started += 1;
                                self.ended_at = Some((work.shard, work.emitted));
                                return Err(e);
                            }
                        }
                    }
                };
                self.started += 1;
                self.reading = Some(reading);
            }
            let item = match self.config.blocks {
                None => {
                    let r = self.reading.as_mut().expect("opened above");
                    if r.ended {
                        None
                    } else {
                        r.read(src)?
                    }
                }
                Some(b) => {
                    let r = self.reading.as_mut().expect("opened above");
                    if r.emitted >= r.end {
                        None
                    } else {
                        if r.block.is_empty() {
                            next_block(src, r, b)?;
                        }
                        if !r.block.is_empty() {
                            self.read_ahead_for_one(src, b)?;
                        }
                        self.reading.as_mut().expect("still open").block.pop_front()
                    }
                }
            };
            let r = self.reading.as_mut().expect("opened above");
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

    /// Before one item of the current block is emitted: reads its share of
    /// the next block (so that block is complete when this one is spent),
    /// in this shard or, once this shard is read to its end, in the next
    /// work.
    fn read_ahead_for_one(&mut self, src: &mut S, b: Blocks) -> Result<(), S::Error> {
        let r = self.reading.as_mut().expect("reading");
        let left = r.block.len() as u64;
        if !r.ended {
            let reads = (b.size - r.ahead.len() as u64).div_ceil(left);
            for _ in 0..reads {
                if r.ended || r.ahead.len() as u64 >= b.size {
                    break;
                }
                read_ahead(src, r)?;
            }
            return Ok(());
        }
        if self.failed_next.is_some() {
            return Ok(());
        }
        if self.next.is_none() {
            let Some(work) = self.works.pop_front() else {
                return Ok(());
            };
            match Reading::open(src, work, Some(b)) {
                Ok(n) => self.next = Some(n),
                Err(e) => {
                    self.fail_next(work.shard, work.emitted);
                    return Err(e);
                }
            }
        }
        let n = self.next.as_mut().expect("opened above");
        // a resumed work's first block: what it skips is read too
        let reads = (b.size - n.ahead.len() as u64).div_ceil(left);
        for _ in 0..reads {
            if n.ended || n.ahead.len() as u64 >= b.size {
                break;
            }
            if let Err(e) = read_ahead(src, n) {
                // nothing of it was emitted: `emitted` is where it began
                let (shard, emitted) = (n.shard, n.emitted);
                self.next = None;
                self.fail_next(shard, emitted);
                return Err(e);
            }
        }
        Ok(())
    }

    /// The next work (the one after `reading`) failed as it was read
    /// ahead; its error is raised now.
    fn fail_next(&mut self, shard: u32, emitted: u64) {
        self.next_failed = true;
        self.failed_next = Some((shard, emitted));
        self.failed.push(self.started);
    }
}

/// Reads items by address (`(shard, offset)`, elastic sharding): each
/// shard is read in blocks of `block` items from block-aligned starts, and
/// the last block read is kept, so a batch whose items lie in one block
/// opens its shard once.
pub struct BlockReader<S: ShardSource> {
    block: u64,
    cached: Option<(u32, u64, Vec<S::Item>)>,
}

impl<S: ShardSource> BlockReader<S> {
    pub fn new(block: u64) -> Self {
        BlockReader {
            block: block.max(1),
            cached: None,
        }
    }

    /// The items at `addresses`, in that order. An address past its
    /// shard's end is an error of the caller's making: `missing` builds it.
    pub fn read(
        &mut self,
        src: &mut S,
        addresses: &[(u32, u64)],
        missing: impl Fn(u32, u64) -> S::Error,
    ) -> Result<Vec<S::Item>, S::Error> {
        let mut out = Vec::with_capacity(addresses.len());
        for &(shard, offset) in addresses {
            let block = offset / self.block;
            let hit = matches!(&self.cached, Some((s, b, _)) if *s == shard && *b == block);
            if !hit {
                self.cached = None;
                let start = block * self.block;
                let mut it = src.open(shard, start)?;
                let mut items = Vec::new();
                while (items.len() as u64) < self.block {
                    match src.next(&mut it, shard, start + items.len() as u64)? {
                        Some(item) => items.push(item),
                        None => break,
                    }
                }
                self.cached = Some((shard, block, items));
            }
            let items = &self.cached.as_ref().expect("set above").2;
            match items.get((offset % self.block) as usize) {
                Some(item) => {
                    let item = src.share(item);
                    out.push(item);
                }
                None => return Err(missing(shard, offset)),
            }
        }
        Ok(out)
    }

    /// Drops the cached block (a new epoch).
    pub fn clear(&mut self) {
        self.cached = None;
    }

    pub fn cached(&self) -> impl Iterator<Item = &S::Item> {
        self.cached.iter().flat_map(|(_, _, items)| items.iter())
    }
}

/// Reads one item of `r`'s shard into the next block.
fn read_ahead<S: ShardSource>(
    src: &mut S,
    r: &mut Reading<S::Item, S::Iter>,
) -> Result<(), S::Error> {
    // (past the block of the work's last item: not needed)
    match r.read(src)? {
        Some(item) => r.ahead.push(item),
        None => r.ended = true,
    }
    Ok(())
}

/// Makes the block read ahead (completed first) the current one, in shard
/// order, minus the items a resume skips.
fn next_block<S: ShardSource>(
    src: &mut S,
    r: &mut Reading<S::Item, S::Iter>,
    b: Blocks,
) -> Result<(), S::Error> {
    while !r.ended && (r.ahead.len() as u64) < b.size {
        read_ahead(src, r)?;
    }
    // blocks start at multiples of the block size (a resume opens there)
    let block_no = (r.raw - r.ahead.len() as u64) / b.size;
    let mut items: Vec<Option<S::Item>> =
        std::mem::take(&mut r.ahead).into_iter().map(Some).collect();
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
/// A shard source for the tests of lanes and of the scheduler's lane set.
pub(crate) mod test_source {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::ShardSource;

    /// Shard `s` holds `lens[s]` items `(s, 0), (s, 1), ...`; `fail` makes
    /// reading that item an error.
    pub(crate) struct Shards {
        pub(crate) lens: Vec<u64>,
        pub(crate) fail: Option<(u32, u64)>,
        /// Opening this shard is an error.
        pub(crate) fail_open: Option<u32>,
        pub(crate) opens: usize,
        /// Iterators alive now, and the most alive at once.
        pub(crate) live: Rc<Cell<usize>>,
        pub(crate) most_live: usize,
        /// What `short_of_room` answers.
        pub(crate) short: bool,
    }

    /// An open shard: where it stands, counted while it lives.
    pub(crate) struct Open {
        shard: u32,
        pos: u64,
        live: Rc<Cell<usize>>,
    }

    impl Drop for Open {
        fn drop(&mut self) {
            self.live.set(self.live.get() - 1);
        }
    }

    impl ShardSource for Shards {
        type Item = (u32, u64);
        type Iter = Open;
        type Error = String;
        fn open(&mut self, shard: u32, start: u64) -> Result<Open, String> {
            self.opens += 1;
            if self.fail_open == Some(shard) {
                return Err(format!("open {shard}"));
            }
            self.live.set(self.live.get() + 1);
            self.most_live = self.most_live.max(self.live.get());
            Ok(Open {
                shard,
                pos: start,
                live: self.live.clone(),
            })
        }
        fn next(
            &mut self,
            it: &mut Open,
            shard: u32,
            offset: u64,
        ) -> Result<Option<(u32, u64)>, String> {
            // the iterator yields what lies where it stands: a lane that
            // reopened a shard at the wrong place reads the wrong items
            assert_eq!((it.shard, it.pos), (shard, offset), "read out of place");
            if self.fail == Some((shard, offset)) {
                return Err(format!("item {shard}/{offset}"));
            }
            let item = (it.pos < self.lens[shard as usize]).then_some((shard, it.pos));
            it.pos += 1;
            Ok(item)
        }
        fn share(&mut self, item: &(u32, u64)) -> (u32, u64) {
            *item
        }
        fn short_of_room(&mut self) -> bool {
            self.short
        }
    }

    pub(crate) fn src(lens: &[u64]) -> Shards {
        Shards {
            lens: lens.to_vec(),
            fail: None,
            fail_open: None,
            opens: 0,
            live: Rc::default(),
            most_live: 0,
            short: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_source::{src, Open, Shards};
    use super::*;
    use crate::sampler::shards::ShardAddresses;
    use proptest::prelude::*;

    fn works(shards: &[u32]) -> Vec<Work> {
        shards.iter().map(|&shard| Work::from(shard, 0)).collect()
    }

    fn drain(lane: &mut Lane<Shards>, s: &mut Shards) -> Vec<Vec<(u32, u64)>> {
        let mut out = Vec::new();
        loop {
            match lane.pull(s).unwrap() {
                Pull::Batch(b) => out.push(b),
                Pull::Exhausted => return out,
                Pull::NeedWork | Pull::HandedBack(_) => panic!("a static lane asked for work"),
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
    fn a_lane_told_to_hand_back_gives_its_unbatched_items_as_works() {
        for blocks in [None, Some(Blocks { root: 5, size: 3 })] {
            // batches of 4 over shards of 5 and 6 items (drop_last, which
            // a hand-back ignores): after two batches 3 items are left over
            let mut s = src(&[5, 6]);
            let mut lane = Lane::new(config(Some(4), true, blocks));
            lane.assign(works(&[0, 1]), false);
            let mut got = Vec::new();
            loop {
                match lane.pull(&mut s).unwrap() {
                    Pull::Batch(b) => got.extend(b),
                    Pull::NeedWork => break,
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(got.len(), 8, "{blocks:?}");
            lane.hand_back();
            let Pull::HandedBack(tail) = lane.pull(&mut s).unwrap() else {
                panic!("no tail");
            };
            assert_eq!(lane.pull(&mut s).unwrap(), Pull::Exhausted);
            // another lane reads the tail: exactly the 3 items left
            let mut other = Lane::new(config(Some(4), false, blocks));
            other.assign(tail, true);
            let rest: Vec<_> = drain(&mut other, &mut s).concat();
            assert_eq!(rest.len(), 3, "{blocks:?}");
            got.extend(rest);
            got.sort_unstable();
            let want: Vec<_> = (0..5)
                .map(|o| (0, o))
                .chain((0..6).map(|o| (1, o)))
                .collect();
            assert_eq!(got, want, "{blocks:?}");
        }
        // nothing left over: an empty tail
        let mut s = src(&[4]);
        let mut lane = Lane::new(config(Some(2), false, None));
        lane.assign(works(&[0]), false);
        assert_eq!(drain_until_need(&mut lane, &mut s).len(), 4);
        lane.hand_back();
        assert_eq!(lane.pull(&mut s).unwrap(), Pull::HandedBack(vec![]));
        assert_eq!(lane.pull(&mut s).unwrap(), Pull::Exhausted);
    }

    #[test]
    fn a_failed_shard_is_left_out_of_a_tail() {
        let mut s = src(&[4, 3, 2]);
        s.fail_open = Some(1);
        let blocks = Some(Blocks { root: 1, size: 2 });
        let mut lane = Lane::new(config(Some(3), false, blocks));
        lane.assign(works(&[0, 1, 2]), false);
        let mut got = Vec::new();
        let mut errors = 0;
        loop {
            match lane.pull(&mut s) {
                Ok(Pull::Batch(b)) => got.extend(b),
                Ok(Pull::NeedWork) => break,
                Ok(other) => panic!("{other:?}"),
                Err(_) => errors += 1,
            }
        }
        assert_eq!(errors, 1);
        lane.hand_back();
        let Pull::HandedBack(tail) = lane.pull(&mut s).unwrap() else {
            panic!("no tail");
        };
        assert!(tail.iter().all(|w| w.shard != 1), "{tail:?}");
        let mut other = Lane::new(config(Some(3), false, blocks));
        other.assign(tail, true);
        got.extend(drain(&mut other, &mut s).concat());
        assert!(got.iter().all(|&(sh, _)| sh != 1));
        assert!(got.len() == got.iter().collect::<std::collections::HashSet<_>>().len());
        assert!((0..2).all(|o| got.contains(&(2, o))), "{got:?}");
    }

    #[test]
    fn a_bounded_work_reads_its_range_of_the_shard_order() {
        for blocks in [None, Some(Blocks { root: 9, size: 4 })] {
            let lens = [23];
            let mut a = ShardAddresses::new(vec![0], &lens, blocks);
            let order: Vec<(u32, u64)> = (0..a.len()).map(|p| a.address(p)).collect();
            for (from, to) in [(0, 23), (3, 9), (5, 6), (8, 8), (20, 23)] {
                let mut s = src(&lens);
                let mut lane = Lane::new(config(Some(5), false, blocks));
                lane.assign(
                    [Work {
                        shard: 0,
                        emitted: from,
                        end: to,
                    }],
                    true,
                );
                let got: Vec<_> = drain(&mut lane, &mut s).concat();
                assert_eq!(
                    got,
                    order[from as usize..to as usize],
                    "{blocks:?} {from}..{to}"
                );
            }
        }
    }

    fn drain_until_need(lane: &mut Lane<Shards>, s: &mut Shards) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        while let Pull::Batch(b) = lane.pull(s).unwrap() {
            out.extend(b);
        }
        out
    }

    /// Counts the items read from the dataset.
    struct Counting {
        inner: Shards,
        reads: usize,
    }

    impl ShardSource for Counting {
        type Item = (u32, u64);
        type Iter = Open;
        type Error = String;
        fn open(&mut self, shard: u32, start: u64) -> Result<Open, String> {
            self.inner.open(shard, start)
        }
        fn next(
            &mut self,
            it: &mut Open,
            shard: u32,
            offset: u64,
        ) -> Result<Option<(u32, u64)>, String> {
            self.reads += 1;
            self.inner.next(it, shard, offset)
        }
        fn share(&mut self, item: &(u32, u64)) -> (u32, u64) {
            *item
        }
    }

    #[test]
    fn a_shuffled_lane_reads_one_item_ahead_per_item_it_emits() {
        let mut s = Counting {
            inner: src(&[40]),
            reads: 0,
        };
        let blocks = Some(Blocks { root: 1, size: 8 });
        let mut lane = Lane::new(config(Some(2), false, blocks));
        lane.assign(works(&[0]), true);
        let mut emitted = 0;
        while let Pull::Batch(b) = lane.pull(&mut s).unwrap() {
            emitted += b.len();
            // the first block whole, then one ahead per item emitted
            assert!(
                s.reads <= 8 + emitted,
                "{} reads for {emitted} items",
                s.reads
            );
        }
        assert_eq!(emitted, 40);
    }

    #[test]
    fn reads_stay_even_across_shard_boundaries() {
        // shards of 1, 2.5 and 4 blocks of 8, batches of 2: after the
        // lane's first block, no pull reads much more than its items (a
        // whole next block read in one pull is the stall this prevents)
        let mut s = Counting {
            inner: src(&[8, 20, 32, 12]),
            reads: 0,
        };
        let blocks = Some(Blocks { root: 3, size: 8 });
        let mut lane = Lane::new(config(Some(2), false, blocks));
        lane.assign(works(&[0, 1, 2, 3]), true);
        let mut per_pull = Vec::new();
        let mut emitted = 0;
        loop {
            let before = s.reads;
            match lane.pull(&mut s).unwrap() {
                Pull::Batch(b) => emitted += b.len(),
                Pull::Exhausted => break,
                Pull::NeedWork | Pull::HandedBack(_) => unreachable!(),
            }
            per_pull.push(s.reads - before);
            assert!(s.reads <= emitted + 2 * 8, "at most the next block ahead");
        }
        assert_eq!(emitted, 72);
        let worst = per_pull[1..].iter().max().copied().unwrap_or(0);
        assert!(worst <= 6, "a pull read {worst} items: {per_pull:?}");
    }

    #[test]
    fn a_block_reader_opens_each_block_once_per_batch() {
        let mut s = src(&[10, 3]);
        let mut r: BlockReader<Shards> = BlockReader::new(4);
        let got = r
            .read(&mut s, &[(0, 5), (0, 4), (0, 7), (1, 2)], |sh, o| {
                format!("{sh}/{o}")
            })
            .unwrap();
        assert_eq!(got, vec![(0, 5), (0, 4), (0, 7), (1, 2)]);
        assert_eq!(s.opens, 2);
        assert_eq!(
            r.read(&mut s, &[(1, 3)], |sh, o| format!("{sh}/{o}")),
            Err("1/3".into())
        );
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

    /// A dynamic lane given shards one at a time, as the main process
    /// gives them: `NeedWork` is answered with the next shard while the
    /// lane's `given` counts every shard it was given.
    fn drain_dynamic(
        lane: &mut Lane<Shards>,
        s: &mut Shards,
        mut order: VecDeque<u32>,
    ) -> (Vec<Vec<(u32, u64)>>, Vec<String>) {
        let (mut out, mut errs) = (Vec::new(), Vec::new());
        let mut handed = 0u32;
        for _ in 0..100 {
            match lane.pull(s) {
                Ok(Pull::Batch(b)) => out.push(b),
                Ok(Pull::Exhausted) => return (out, errs),
                Ok(Pull::HandedBack(_)) => unreachable!("not told to"),
                Ok(Pull::NeedWork) => {
                    // the main process gives more only past what it gave
                    assert_eq!(lane.given(), handed, "the lane lost count of its shards");
                    let next = order.pop_front();
                    handed += u32::from(next.is_some());
                    lane.assign(
                        works(&next.into_iter().collect::<Vec<_>>()),
                        order.is_empty(),
                    );
                }
                Err(e) => errs.push(e),
            }
        }
        panic!("the lane did not finish: {out:?} {errs:?}");
    }

    #[test]
    fn a_shard_that_fails_to_open_ends_and_a_dynamic_lane_goes_on() {
        for blocks in [None, Some(Blocks { root: 3, size: 2 })] {
            let mut s = src(&[3, 2, 2]);
            s.fail_open = Some(1);
            let mut lane = Lane::new(config(Some(2), false, blocks));
            let (out, errs) = drain_dynamic(&mut lane, &mut s, VecDeque::from([0, 1, 2]));
            assert_eq!(errs, vec!["open 1".to_string()], "{blocks:?}");
            let items: Vec<_> = out.into_iter().flatten().collect();
            let mut sorted = items.clone();
            sorted.sort_unstable();
            assert!(!items.iter().any(|&(sh, _)| sh == 1), "{blocks:?}");
            assert!(
                sorted.contains(&(2, 0)) && sorted.contains(&(2, 1)),
                "{blocks:?}: {items:?}"
            );
        }
    }

    proptest! {
        #![proptest_config(crate::testing::miri_friendly(ProptestConfig::default()))]
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

        /// A lane that lets go of its shards after every batch (a cache
        /// short of room) gives the same batches, and holds at most one
        /// shard open at any time (none between its batches); one that
        /// keeps them holds at most one too.
        #[test]
        fn letting_go_changes_no_batch_and_holds_one_shard(lens in proptest::collection::vec(0u64..25, 1..5), root in any::<u64>(), size in 1u64..7, batch in 1usize..5, shuffle in any::<bool>()) {
            let blocks = shuffle.then_some(Blocks { root, size });
            let order: Vec<u32> = (0..lens.len() as u32).collect();
            let cfg = config(Some(batch), false, blocks);
            let mut s = src(&lens);
            let mut kept = Lane::new(cfg);
            kept.assign(works(&order), true);
            let want = drain(&mut kept, &mut s);
            prop_assert!(s.most_live <= 1, "kept: {} open at once", s.most_live);
            let mut s = src(&lens);
            s.short = true;
            let mut lane = Lane::new(cfg);
            lane.assign(works(&order), true);
            let mut got = Vec::new();
            loop {
                match lane.pull(&mut s).unwrap() {
                    Pull::Batch(b) => got.push(b),
                    Pull::Exhausted => break,
                    other => panic!("{other:?}"),
                }
                if s.short_of_room() {
                    lane.let_go();
                }
                prop_assert_eq!(s.live.get(), 0, "a shard open between batches");
            }
            prop_assert!(s.most_live <= 1, "let go: {} open at once", s.most_live);
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
                    let mut rest = vec![Work::from(p.shard, p.emitted)];
                    rest.extend(works(&order[p.started as usize..]));
                    resumed.assign(rest, true);
                }
            }
            prop_assert_eq!(drain(&mut resumed, &mut s), all[stop..].to_vec());
        }
    }
}
