//! Shard assignment: the main process's part of sharded loading.
//!
//! A rank reads the shards at positions `rank, rank + world, ...` of the
//! epoch's shard order. Within a rank, shards are read by *lanes* (logical
//! readers): each lane reads its shards one after the other, in shard order
//! (`crate::sampler::shards`), and makes batches of its own items; the rank
//! yields the lanes' batches round-robin, skipping lanes that ran out, as
//! torch yields an `IterableDataset`'s workers' batches.
//!
//! - **static**: a fixed number of lanes, independent of `num_workers`; lane
//!   `l` reads the rank's shards at positions `l, l + lanes, ...`. Workers
//!   only execute lanes (lane `l` runs on worker `l % num_workers`), so the
//!   batch sequence is the same for any `num_workers`.
//! - **dynamic**: one lane per worker; a lane that finishes a shard gets the
//!   next unread shard of its rank from the main process ([`ShardQueue`]),
//!   so uneven shards keep every worker busy. The order then depends on
//!   timing; the set of items does not, nor does the number of batches: a
//!   lane that runs out while others read on hands back its last items
//!   (less than a batch) instead of a short batch, and the last lane to run
//!   out reads them all, so the rank's batches are those of one lane
//!   reading all its items (`batches_of`).
//!
//! Lanes report, with every batch, where they stand ([`LanePos`]); the
//! positions of the batches handed over are the epoch's snapshot, from
//! which any number of lanes can continue ([`ShardQueue::rest`]).

use crate::sampler::shards::{shard_order, Blocks};
use crate::wire::protocol::{LanePos, Work};

/// How a sharded epoch starts (`Loader::start_lanes`, `LaneSet::new`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanePlan {
    /// Number of lanes; lane `l` runs on worker `l % num_workers`.
    pub lanes: usize,
    pub shuffle: bool,
    pub block: u64,
    pub root: u64,
    /// Static: every lane's works, given up front. Dynamic: `None`.
    pub works: Option<Vec<Vec<Work>>>,
    /// Dynamic: the shards to hand out as lanes ask.
    pub queue: Vec<Work>,
    /// The round-robin starts at this lane.
    pub next_lane: usize,
    /// Batches already handed over this epoch (a resumed epoch).
    pub handed: u64,
    /// The epoch ends after this many batches (ranks kept in step).
    pub budget: Option<u64>,
    /// Per lane, works of its plan begun before the first one it is given
    /// (a resumed static lane): added to the `started` it reports.
    pub bases: Vec<u32>,
    /// Per lane, the position it resumes from (until it hands over a batch).
    pub positions: Vec<Option<LanePos>>,
}

impl LanePlan {
    /// The shards in the order the epoch first reads them: static lanes
    /// read their works side by side (each lane's first, then each lane's
    /// second, ...), dynamic lanes take the queue in turn.
    pub fn read_order(&self) -> Vec<u32> {
        let mut out = Vec::new();
        if let Some(works) = &self.works {
            let longest = works.iter().map(Vec::len).max().unwrap_or(0);
            for k in 0..longest {
                out.extend(works.iter().filter_map(|w| w.get(k)).map(|w| w.shard));
            }
        }
        out.extend(self.queue.iter().map(|w| w.shard));
        out
    }

    /// A lane's position as it reports it, in its plan's numbering.
    pub fn absolute(&self, lane: usize, mut pos: LanePos) -> LanePos {
        pos.started += self.bases.get(lane).copied().unwrap_or(0);
        pos
    }
}

/// Where a sharded epoch stands, for a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneSnapshot {
    /// Each lane's position after its last handed-over batch.
    pub positions: Vec<Option<LanePos>>,
    /// The lane whose batch comes next.
    pub next_lane: usize,
    /// Batches handed over this epoch.
    pub handed: u64,
    /// Dynamic: what is left to read from the positions on.
    pub rest: Option<Vec<Work>>,
}

/// What decides a rank's lanes in an epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    pub n_shards: usize,
    /// Items per shard, when the dataset knows them.
    pub lens: Option<Vec<u64>>,
    /// Shuffle the shard order with this seed.
    pub order_seed: Option<u64>,
    /// Shuffle within shards.
    pub blocks: Option<Blocks>,
    pub rank: usize,
    pub world: usize,
    pub mode: Mode,
    pub batch: Option<u64>,
    pub drop_last: bool,
    /// Every rank yields the same number of batches.
    pub even: bool,
    /// Dynamic lanes get the longest shards first (when lengths are known),
    /// so an epoch does not end with one worker reading a large shard alone.
    pub largest_first: bool,
}

impl ShardSpec {
    /// The batches this rank yields in a whole epoch, when the shard lengths
    /// are known (exact in both modes; with even counts across ranks, the
    /// least over ranks).
    pub fn batches(&self) -> Option<u64> {
        let lens = self.lens.as_ref()?;
        let order = shard_order(self.n_shards, self.order_seed);
        if self.even && self.world > 1 {
            return Some(even_batches(
                &order,
                lens,
                self.world,
                self.mode,
                self.batch,
                self.drop_last,
            ));
        }
        Some(even_batches(
            &rank_shards(&order, self.rank, self.world),
            lens,
            1,
            self.mode,
            self.batch,
            self.drop_last,
        ))
    }

    /// The epoch's plan, or the plan that continues it from `resume`.
    pub fn plan(&self, resume: Option<&LaneSnapshot>) -> Result<LanePlan, String> {
        let order = shard_order(self.n_shards, self.order_seed);
        let mine = rank_shards(&order, self.rank, self.world);
        let budget = if self.even && self.world > 1 {
            let lens = self.lens.as_ref().ok_or_else(|| {
                "every rank must yield the same number of batches (even=True with more than \
                 one rank), which needs the length of every shard: define shard_len() on the \
                 dataset, or pass even=False to read every item exactly once with uneven \
                 batch counts"
                    .to_string()
            })?;
            Some(even_batches(
                &order,
                lens,
                self.world,
                self.mode,
                self.batch,
                self.drop_last,
            ))
        } else {
            None
        };
        let mut bases = Vec::new();
        let mut positions = Vec::new();
        let (lanes, works, queue) = match self.mode {
            Mode::Static(lanes) => {
                let plans = static_lanes(&mine, lanes);
                let works = match resume {
                    Some(s) => {
                        positions = s.positions.clone();
                        positions.resize(lanes, None);
                        bases = positions
                            .iter()
                            .map(|p| p.map_or(0, |p| p.started.saturating_sub(1)))
                            .collect();
                        resume_static(&plans, &s.positions)
                    }
                    None => plans,
                };
                (lanes, Some(works), Vec::new())
            }
            Mode::Dynamic(lanes) => {
                let queue = match resume.and_then(|s| s.rest.clone()) {
                    Some(rest) => rest,
                    None => {
                        let mut order = mine.clone();
                        if let (true, Some(lens)) = (self.largest_first, &self.lens) {
                            // stable: equal lengths keep the epoch's order
                            order.sort_by_key(|&s| std::cmp::Reverse(lens[s as usize]));
                        }
                        order
                            .into_iter()
                            .map(|shard| Work::from(shard, 0))
                            .collect()
                    }
                };
                (lanes, None, queue)
            }
        };
        bases.resize(lanes, 0);
        positions.resize(lanes, None);
        let blocks = self.blocks.unwrap_or(Blocks { root: 0, size: 1 });
        Ok(LanePlan {
            lanes,
            shuffle: self.blocks.is_some(),
            block: blocks.size,
            root: blocks.root,
            works,
            queue,
            next_lane: resume.map_or(0, |s| s.next_lane % lanes),
            handed: resume.map_or(0, |s| s.handed),
            budget,
            bases,
            positions,
        })
    }
}

/// The shards of rank `rank` of `world`, in reading order.
pub fn rank_shards(order: &[u32], rank: usize, world: usize) -> Vec<u32> {
    assert!(world > 0 && rank < world);
    order.iter().skip(rank).step_by(world).copied().collect()
}

/// Static lanes: lane `l` reads `shards[l], shards[l + lanes], ...`.
pub fn static_lanes(shards: &[u32], lanes: usize) -> Vec<Vec<Work>> {
    assert!(lanes > 0);
    (0..lanes)
        .map(|l| {
            shards
                .iter()
                .skip(l)
                .step_by(lanes)
                .map(|&shard| Work::from(shard, 0))
                .collect()
        })
        .collect()
}

/// The batches a lane makes from `items` items (`batch: None`: one per item).
pub fn batches_of(items: u64, batch: Option<u64>, drop_last: bool) -> u64 {
    match batch {
        None => items,
        Some(b) if drop_last => items / b,
        Some(b) => items.div_ceil(b),
    }
}

/// How a rank's lanes are formed, for counting its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// This many lanes, assigned statically.
    Static(usize),
    /// This many lanes, assigned on demand.
    Dynamic(usize),
}

/// The number of batches every rank can yield in an epoch, so that ranks
/// stay in step (`lens[s]`: items of shard `s`): the least over ranks of
/// each rank's exact count. Static lanes each cut their own items; dynamic
/// lanes together cut the rank's items as one lane would (their tails are
/// read by the last lane: `ShardQueue`), whichever lane read which shard.
pub fn even_batches(
    order: &[u32],
    lens: &[u64],
    world: usize,
    mode: Mode,
    batch: Option<u64>,
    drop_last: bool,
) -> u64 {
    (0..world)
        .map(|r| {
            let shards = rank_shards(order, r, world);
            match mode {
                Mode::Static(lanes) => static_lanes(&shards, lanes)
                    .iter()
                    .map(|works| {
                        let items = works.iter().map(|w| lens[w.shard as usize]).sum();
                        batches_of(items, batch, drop_last)
                    })
                    .sum(),
                // the last lane reads every other lane's tail: one lane's count
                Mode::Dynamic(_) => {
                    let items: u64 = shards.iter().map(|&s| lens[s as usize]).sum();
                    batches_of(items, batch, drop_last)
                }
            }
        })
        .min()
        .unwrap_or(0)
}

/// How a dynamic lane's part of an epoch ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Reading shards; it may ask for more.
    Reading,
    /// Told to hand back; its tail is on its way.
    HandingBack,
    /// Gave back its items not in a batch: its own stream ended after its
    /// last batch, at `at` (`None`: it made none).
    HandedBack { at: Option<LanePos> },
    /// The epoch's last lane: it reads the tails given back.
    Collecting,
}

/// What a dynamic lane that ran out of shards is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RanOut {
    /// Its next shard.
    Work(Work),
    /// Other lanes read on: it makes no short batch, but gives its items
    /// not yet in a batch back (`Pull::HandedBack`).
    HandBack,
    /// It is the epoch's last lane: it reads the tails given back so far
    /// (`works`, maybe none); `last`: none is still on its way.
    Collect { works: Vec<Work>, last: bool },
}

/// Where a dynamic queue's works come from once those it was made with are
/// handed out: a queue shared by every rank of the job (works claimed from
/// it ahead of need), `None` when no more will come this epoch.
pub trait WorkSource: Send + Sync {
    fn next_work(&mut self) -> Result<Option<Work>, QueueError>;

    /// A work to read ahead into, only if one is at hand now: `None` (not
    /// now; the lane asks again later), `Some(None)` (no more), or the
    /// work. A shared queue has one at hand only where its rank claims
    /// ahead: a slow rank's lanes then hold no work they have not begun.
    fn work_at_hand(&mut self) -> Result<Option<Option<Work>>, QueueError> {
        self.next_work().map(Some)
    }
}

/// The shared queue behind a [`WorkSource`] failed (its store went away).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueError(pub String);

impl std::fmt::Display for QueueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<QueueError> for String {
    fn from(e: QueueError) -> String {
        e.0
    }
}

/// Dynamic assignment: the rank's unread shards, handed to lanes as they
/// ask, and what each lane was given.
///
/// The epoch's end: a lane that runs out while others still read is told
/// to hand back the items it has not made a batch of (at most a batch's
/// worth, as works: shard ranges), and the last lane to run out reads them
/// all after its own. So only that lane's last batch is short, and the
/// rank yields as many batches as one lane reading all its items would
/// (`batches_of`), whichever lane read which shard.
pub struct ShardQueue {
    todo: Vec<Work>,
    next: usize,
    given: Vec<Vec<Work>>,
    ending: Vec<Ending>,
    /// Tails given back, not yet given to the collecting lane.
    tails: Vec<Work>,
    /// More works, once `todo` is out (the job's shared queue).
    source: Option<Box<dyn WorkSource>>,
    /// The source's failure, for the caller to raise.
    failed: Option<QueueError>,
}

impl std::fmt::Debug for ShardQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardQueue")
            .field("todo", &self.todo)
            .field("next", &self.next)
            .field("given", &self.given)
            .field("tails", &self.tails)
            .field("source", &self.source.is_some())
            .finish()
    }
}

impl ShardQueue {
    pub fn new(todo: Vec<Work>, lanes: usize) -> Self {
        ShardQueue {
            todo,
            next: 0,
            given: vec![Vec::new(); lanes],
            ending: vec![Ending::Reading; lanes],
            tails: Vec::new(),
            source: None,
            failed: None,
        }
    }

    /// The same queue, going on with `source`'s works after its own.
    pub fn with_source(mut self, source: Option<Box<dyn WorkSource>>) -> Self {
        self.source = source;
        self
    }

    /// The source's failure, once (the queue then hands out nothing more).
    pub fn take_failure(&mut self) -> Option<QueueError> {
        self.failed.take()
    }

    pub fn lanes(&self) -> usize {
        self.given.len()
    }

    /// How many works `lane` has been given.
    pub fn given(&self, lane: usize) -> u32 {
        self.given[lane].len() as u32
    }

    /// The next work for `lane`, recorded as its; `None` when all are out.
    pub fn assign(&mut self, lane: usize) -> Option<Work> {
        self.assign_from(lane, false)
    }

    /// A work for `lane` to read ahead into: as [`ShardQueue::assign`], but
    /// from a source only what it has at hand (`None` also when not now).
    pub fn assign_ahead(&mut self, lane: usize) -> Option<Work> {
        self.assign_from(lane, true)
    }

    fn assign_from(&mut self, lane: usize, ahead: bool) -> Option<Work> {
        if self.next == self.todo.len() {
            if let Some(source) = self.source.as_mut() {
                let got = if ahead {
                    source.work_at_hand()
                } else {
                    source.next_work().map(Some)
                };
                match got {
                    Ok(Some(Some(w))) => self.todo.push(w),
                    Ok(Some(None)) => self.source = None,
                    Ok(None) => return None,
                    Err(e) => {
                        self.source = None;
                        self.failed = Some(e);
                    }
                }
            }
        }
        let w = *self.todo.get(self.next)?;
        self.next += 1;
        self.given[lane].push(w);
        Some(w)
    }

    /// Each lane's first `per_lane` works, given in turn, and whether that
    /// is all it gets (it got none: it ends at once, and has nothing to
    /// hand back).
    pub fn first_works(&mut self, per_lane: usize) -> Vec<(Vec<Work>, bool)> {
        let n = self.lanes();
        let mut out: Vec<Vec<Work>> = vec![Vec::new(); n];
        for k in 0..per_lane {
            for (lane, works) in out.iter_mut().enumerate() {
                // (a lane's first work it waits for; those after it read
                // ahead into, where the source has them at hand)
                works.extend(if k == 0 {
                    self.assign(lane)
                } else {
                    self.assign_ahead(lane)
                });
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(lane, works)| {
                let last = works.is_empty();
                if last {
                    self.ending[lane] = Ending::HandedBack { at: None };
                }
                (works, last)
            })
            .collect()
    }

    /// `lane` asked for work: the next shard, or, when none is left, hand
    /// back (other lanes still read) or collect the tails (it is the last).
    pub fn ran_out(&mut self, lane: usize) -> RanOut {
        if let Some(w) = self.assign(lane) {
            return RanOut::Work(w);
        }
        let others_read = (0..self.lanes()).any(|l| l != lane && self.ending[l] == Ending::Reading);
        match self.ending[lane] {
            Ending::Reading if others_read => {
                self.ending[lane] = Ending::HandingBack;
                return RanOut::HandBack;
            }
            Ending::Reading | Ending::Collecting => {}
            // (a lane told to hand back does not ask again)
            Ending::HandingBack | Ending::HandedBack { .. } => return RanOut::HandBack,
        }
        self.ending[lane] = Ending::Collecting;
        let (works, last) = self.tails_for(lane);
        RanOut::Collect { works, last }
    }

    /// `lane` gave back `works` (its stream ended after its last batch, at
    /// `at`). When a lane collects, what it is to read now: `(that lane,
    /// works, last)`.
    pub fn handed_back(
        &mut self,
        lane: usize,
        at: Option<LanePos>,
        works: Vec<Work>,
    ) -> Option<(usize, Vec<Work>, bool)> {
        if lane >= self.lanes() || matches!(self.ending[lane], Ending::HandedBack { .. }) {
            return None;
        }
        self.ending[lane] = Ending::HandedBack { at };
        self.tails.extend(works);
        let c = self.ending.iter().position(|e| *e == Ending::Collecting)?;
        let (works, last) = self.tails_for(c);
        Some((c, works, last))
    }

    /// The tails for collecting lane `c`, recorded as its, and whether no
    /// more are on their way.
    fn tails_for(&mut self, c: usize) -> (Vec<Work>, bool) {
        let works = std::mem::take(&mut self.tails);
        self.given[c].extend(works.iter().copied());
        let last = !self.ending.contains(&Ending::HandingBack);
        (works, last)
    }

    /// Everything not yet read as of `positions` (each lane's position
    /// after its last handed-over batch): each lane's current shard from
    /// where it stands, then what lanes were given but had not begun, then
    /// the tails given back and not yet collected, then the shards never
    /// given out. A lane that handed back contributes only the batches it
    /// made that were not handed over. Any number of lanes can go on from
    /// it.
    pub fn rest(&self, positions: &[Option<LanePos>]) -> Vec<Work> {
        let mut current = Vec::new();
        let mut unbegun = Vec::new();
        for (lane, given) in self.given.iter().enumerate() {
            let started = positions.get(lane).copied().flatten();
            if let Ending::HandedBack { at } = self.ending[lane] {
                current.extend(between(given, started, at));
                continue;
            }
            let begun = started.map_or(0, |p| p.started as usize);
            if let Some(p) = started {
                current.push(Work {
                    shard: p.shard,
                    emitted: p.emitted,
                    end: work_end(given, p),
                });
            }
            unbegun.extend(given.iter().skip(begun).copied());
        }
        current.extend(unbegun);
        current.extend(self.tails.iter().copied());
        current.extend(self.todo[self.next..].iter().copied());
        current
    }
}

/// The end of the work a lane given `given` is reading at `p`.
fn work_end(given: &[Work], p: LanePos) -> u64 {
    (p.started as usize)
        .checked_sub(1)
        .and_then(|i| given.get(i))
        .filter(|w| w.shard == p.shard)
        .map_or(Work::OPEN, |w| w.end)
}

/// A lane's items from position `from` (`None`: its start) up to position
/// `to` (`None`: its start), as works (the lane read `given` in order).
fn between(given: &[Work], from: Option<LanePos>, to: Option<LanePos>) -> Vec<Work> {
    let Some(to) = to else {
        return Vec::new();
    };
    let (first, start) = match from {
        Some(p) => ((p.started as usize).saturating_sub(1), Some(p.emitted)),
        None => (0, None),
    };
    let last = (to.started as usize).saturating_sub(1);
    let mut out = Vec::new();
    for (i, w) in given.iter().enumerate().take(last + 1).skip(first) {
        let emitted = match start {
            Some(e) if i == first => e,
            _ => w.emitted,
        };
        let end = if i == last { to.emitted } else { w.end };
        if emitted < end {
            out.push(Work {
                shard: w.shard,
                emitted,
                end,
            });
        }
    }
    out
}

/// Static lanes resumed at `positions`: lane `l` goes on with its current
/// shard from where it stood, then the rest of its plan.
pub fn resume_static(plans: &[Vec<Work>], positions: &[Option<LanePos>]) -> Vec<Vec<Work>> {
    plans
        .iter()
        .enumerate()
        .map(|(l, plan)| match positions.get(l).copied().flatten() {
            None => plan.clone(),
            Some(p) => {
                let begun = p.started as usize;
                let mut works = vec![Work::from(p.shard, p.emitted)];
                works.extend(plan.iter().skip(begun).copied());
                works
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(shard: u32, emitted: u64) -> Work {
        Work::from(shard, emitted)
    }

    fn pos(started: u32, shard: u32, emitted: u64) -> Option<LanePos> {
        Some(LanePos {
            started,
            shard,
            emitted,
        })
    }

    #[test]
    fn ranks_and_static_lanes_take_positions_in_turn() {
        let order = [5, 3, 8, 1, 0, 2, 7];
        assert_eq!(rank_shards(&order, 0, 2), vec![5, 8, 0, 7]);
        assert_eq!(rank_shards(&order, 1, 2), vec![3, 1, 2]);
        let lanes = static_lanes(&[5, 8, 0, 7], 3);
        assert_eq!(
            lanes,
            vec![vec![w(5, 0), w(7, 0)], vec![w(8, 0)], vec![w(0, 0)]]
        );
    }

    #[test]
    fn even_batches_is_the_least_over_ranks() {
        // shards 0..4 with 10, 1, 1, 1 items; two ranks, batch 2
        let lens = [10, 1, 1, 1];
        let order = [0, 1, 2, 3];
        // rank 0: shards 0, 2 -> one lane each: 5 + 1 batches; rank 1: 1 + 1
        assert_eq!(
            even_batches(&order, &lens, 2, Mode::Static(2), Some(2), false),
            2
        );
        assert_eq!(
            even_batches(&order, &lens, 2, Mode::Static(2), Some(2), true),
            0
        );
        // dynamic: rank 1 has 2 items -> 1 batch, however its 2 lanes
        // split them (the last lane reads the other's tail)
        assert_eq!(
            even_batches(&order, &lens, 2, Mode::Dynamic(2), Some(2), false),
            1
        );
        assert_eq!(
            even_batches(&order, &lens, 2, Mode::Dynamic(2), Some(2), true),
            1
        );
        assert_eq!(
            even_batches(&order, &lens, 1, Mode::Static(1), None, false),
            13
        );
    }

    #[test]
    fn queue_rest_continues_current_shards_then_unbegun_then_unassigned() {
        let mut q = ShardQueue::new((0..6).map(|s| w(s, 0)).collect(), 2);
        assert_eq!(q.assign(0), Some(w(0, 0)));
        assert_eq!(q.assign(1), Some(w(1, 0)));
        assert_eq!(q.assign(0), Some(w(2, 0)));
        assert_eq!(q.given(0), 2);
        // lane 0 handed over a batch from its first shard, 4 items in;
        // lane 1 has handed over nothing yet
        let pos = [
            Some(LanePos {
                started: 1,
                shard: 0,
                emitted: 4,
            }),
            None,
        ];
        assert_eq!(
            q.rest(&pos),
            vec![w(0, 4), w(2, 0), w(1, 0), w(3, 0), w(4, 0), w(5, 0)]
        );
    }

    #[test]
    fn static_resume_keeps_each_lane_on_its_plan() {
        let plans = static_lanes(&[4, 5, 6, 7, 8], 2);
        let pos = [
            Some(LanePos {
                started: 2,
                shard: 6,
                emitted: 3,
            }),
            None,
        ];
        assert_eq!(
            resume_static(&plans, &pos),
            vec![vec![w(6, 3), w(8, 0)], vec![w(5, 0), w(7, 0)]]
        );
    }

    #[test]
    fn lanes_that_run_out_hand_back_and_the_last_collects() {
        let mut q = ShardQueue::new(vec![w(0, 0), w(1, 0), w(2, 0)], 3);
        let first = q.first_works(1);
        assert_eq!(
            first,
            vec![
                (vec![w(0, 0)], false),
                (vec![w(1, 0)], false),
                (vec![w(2, 0)], false)
            ]
        );
        // lanes 1 and 0 run out while others read: they hand back
        assert_eq!(q.ran_out(1), RanOut::HandBack);
        assert_eq!(q.ran_out(0), RanOut::HandBack);
        // lane 2 is the last: nothing is back yet, more is on its way
        assert_eq!(
            q.ran_out(2),
            RanOut::Collect {
                works: vec![],
                last: false
            }
        );
        let tail0 = Work {
            shard: 0,
            emitted: 6,
            end: Work::OPEN,
        };
        assert_eq!(
            q.handed_back(0, pos(1, 0, 6), vec![tail0]),
            Some((2, vec![tail0], false))
        );
        assert_eq!(
            q.handed_back(1, None, vec![w(1, 0)]),
            Some((2, vec![w(1, 0)], true))
        );
        assert_eq!(q.given(2), 3, "the tails are the collector's");
        // nothing is read twice or lost: lane 0's batches not handed over
        // (from item 2 to 6), lane 2's own shard and its tails
        let rest = q.rest(&[pos(1, 0, 2), None, None]);
        assert_eq!(
            rest,
            vec![
                Work {
                    shard: 0,
                    emitted: 2,
                    end: 6
                },
                w(2, 0),
                tail0,
                w(1, 0)
            ]
        );
        // once lane 0's batches are handed over it adds nothing
        assert_eq!(q.rest(&[pos(1, 0, 6), None, None])[0], w(2, 0));
    }

    #[test]
    fn a_lane_given_nothing_at_the_start_does_not_hold_up_the_last() {
        let mut q = ShardQueue::new(vec![w(4, 0)], 2);
        assert_eq!(
            q.first_works(2),
            vec![(vec![w(4, 0)], false), (vec![], true)]
        );
        assert_eq!(
            q.ran_out(0),
            RanOut::Collect {
                works: vec![],
                last: true
            }
        );
    }

    #[test]
    fn between_cuts_a_lanes_stream_at_two_positions() {
        let given = [
            w(3, 5),
            w(7, 0),
            Work {
                shard: 9,
                emitted: 2,
                end: 8,
            },
        ];
        // from inside the first work to inside the last
        assert_eq!(
            between(&given, pos(1, 3, 6), pos(3, 9, 4)),
            vec![
                w(3, 6),
                w(7, 0),
                Work {
                    shard: 9,
                    emitted: 2,
                    end: 4
                }
            ]
        );
        // from the start, within one work; an empty range
        assert_eq!(
            between(&given, None, pos(1, 3, 8)),
            vec![Work {
                shard: 3,
                emitted: 5,
                end: 8
            }]
        );
        assert_eq!(between(&given, pos(2, 7, 4), pos(2, 7, 4)), vec![]);
        assert_eq!(between(&given, None, None), vec![]);
    }
}
