//! The job's shared shard queue (`Sharding(across="world")`), its
//! bookkeeping: every rank computes the epoch's list of works alike, and a
//! counter in the job's store hands its positions out (the store's client
//! is Python's, so the binding makes the `add` calls; this module keeps
//! what they mean).
//!
//! - [`Claims`]: one rank's claims of one epoch: positions claimed ahead of
//!   need up to `ahead` unread ones (and, with even counts, up to a quota
//!   of items), handed to the lanes through [`WorkSource`], and the
//!   rank's account of them for a snapshot.
//! - [`remaining`]: what an epoch has left, from every rank's account of
//!   it (checked first: every rank of the saved job exactly once).
//! - [`translate`]: works of a shuffled epoch as works that read the same
//!   items in another epoch's block orders (what even counts held back is
//!   read first in the next epoch).
//! - [`unit_of`] and [`cut`]: the list's unit. Shards of known length are
//!   cut into ranges of about a 64th of a rank's share, so that the balance
//!   between ranks does not hang on how many shards there are: a rank that
//!   reads slowly holds a few small ranges, not a few whole shards.

use std::collections::{HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::shards::{QueueError, WorkSource};
use crate::sampler::seeds::block_seed;
use crate::sampler::{randperm, Mt19937};
use crate::wire::protocol::Work;

/// One rank's account of an epoch of the shared queue, as its state saves
/// it: its rank and the job's size, the epoch's list (and its digest), the
/// positions it claimed, and the unread parts of its claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub rank: i64,
    pub world: i64,
    pub list_id: String,
    pub list: Vec<Work>,
    pub claimed: Vec<u64>,
    pub rest: Vec<Work>,
}

/// A digest of an epoch's list (every rank's must be the same): FNV-1a of
/// its works, as 16 hex digits.
pub fn list_id(works: &[Work]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in works {
        for b in (w.shard as u64)
            .to_le_bytes()
            .iter()
            .chain(&w.emitted.to_le_bytes())
            .chain(&w.end.to_le_bytes())
        {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Batches each rank yields with even counts: with `N` items in the list,
/// the longest work `M`, `W` ranks and batches of `B`,
/// `(N - (W - 1) * (M - 1)) // (W * B)`; no rank can then run short.
pub fn even_budget(sizes: &[u64], world: u64, batch: u64) -> u64 {
    let Some(&m) = sizes.iter().max() else {
        return 0;
    };
    even_count(sizes.iter().sum(), m, world, batch)
}

/// [`even_budget`] of a list of `n` items whose longest work has `m`.
pub fn even_count(n: u64, m: u64, world: u64, batch: u64) -> u64 {
    let held = (world.saturating_sub(1)).saturating_mul(m.saturating_sub(1));
    n.saturating_sub(held) / (world.max(1) * batch.max(1))
}

/// The items of `work` when its shard has `len` items.
pub fn work_size(work: &Work, len: u64) -> u64 {
    work.end.min(len).saturating_sub(work.emitted)
}

/// Claims an epoch's list makes per rank, at the least (where the shards'
/// lengths allow): a rank ten times slower than the others then ends at
/// most a few of its small ranges after them.
pub const UNITS_PER_RANK: u64 = 64;
/// No range shorter than this many items: below it a claim's round trip
/// and a shard's reopening cost more than the balance gains.
pub const MIN_UNIT: u64 = 8;

/// The unit of the list of a job of `world` ranks over `total` items, and
/// the shuffle block that goes with it: `(items per range, block)`. A range
/// is whole blocks (a part of a block would read the whole block), so with
/// `shuffled` the range is a multiple of `block`, or, where a rank's share
/// is too small for that, the block shrinks to the range.
pub fn unit_of(total: u64, world: u64, block: u64, shuffled: bool) -> (u64, u64) {
    let block = block.max(1);
    let unit = total
        .div_ceil(UNITS_PER_RANK.saturating_mul(world.max(1)))
        .max(MIN_UNIT);
    if !shuffled {
        (unit, block)
    } else if unit >= block {
        (unit.div_ceil(block).saturating_mul(block), block)
    } else {
        (unit, unit)
    }
}

/// `works` (of shards of `lens` items) as works of at most `unit` items,
/// in order; each work's last piece keeps its end (a whole shard's,
/// [`Work::OPEN`], runs to the shard's end).
pub fn cut(works: &[Work], lens: &[u64], unit: u64) -> Vec<Work> {
    let unit = unit.max(1);
    let mut out = Vec::new();
    for w in works {
        let stop = w.end.min(lens.get(w.shard as usize).copied().unwrap_or(0));
        let mut lo = w.emitted;
        while lo + unit < stop {
            out.push(Work {
                shard: w.shard,
                emitted: lo,
                end: lo + unit,
            });
            lo += unit;
        }
        out.push(Work {
            shard: w.shard,
            emitted: lo,
            end: w.end,
        });
    }
    out
}

/// Every rank of the saved job exactly once, all of one epoch of one job:
/// a rank missing would leave its claims unread, one given twice would read
/// them twice. `what` names the call in the message.
pub fn check_ranks(accounts: &[Account], what: &str) -> Result<(), String> {
    let ids: HashSet<&str> = accounts.iter().map(|a| a.list_id.as_str()).collect();
    if ids.len() != 1 {
        return Err(format!(
            "{what}: the ranks' states describe different epochs of the shared queue (their \
             lists differ): give every rank the states saved at the same step"
        ));
    }
    let mut worlds: Vec<i64> = accounts.iter().map(|a| a.world).collect();
    worlds.sort_unstable();
    worlds.dedup();
    if worlds.len() != 1 || worlds[0] < 1 {
        return Err(format!(
            "{what}: the states were saved by jobs of different sizes (world sizes {worlds:?}): \
             give the states of every rank of one job, saved at the same step"
        ));
    }
    let world = worlds[0];
    let mut counts = vec![0usize; world as usize];
    let mut stray: Vec<i64> = Vec::new();
    for a in accounts {
        match usize::try_from(a.rank) {
            Ok(r) if r < counts.len() => counts[r] += 1,
            _ => stray.push(a.rank),
        }
    }
    let missing: Vec<String> = (0..counts.len())
        .filter(|&r| counts[r] == 0)
        .map(|r| r.to_string())
        .collect();
    let mut problems = Vec::new();
    if !missing.is_empty() {
        let (s, be) = if missing.len() > 1 {
            ("s", "are")
        } else {
            ("", "is")
        };
        problems.push(format!(
            "the state of rank{s} {} {be} missing",
            missing.join(", ")
        ));
    }
    for (r, &n) in counts.iter().enumerate() {
        if n > 1 {
            problems.push(format!("rank {r}'s state is given {n} times"));
        }
    }
    stray.sort_unstable();
    if let Some(r) = stray.first() {
        problems.push(format!("a state names rank {r}, not a rank of {world}"));
    }
    if problems.is_empty() {
        return Ok(());
    }
    let s = if world > 1 { "s" } else { "" };
    Err(format!(
        "{what}: the states given are not one state per rank of the saved job of {world} \
         rank{s}: {}. Each rank's state holds only its own claims, so every rank's state, saved \
         at the same step, is needed exactly once (gather them with \
         torch.distributed.all_gather_object)",
        problems.join("; ")
    ))
}

/// What an epoch has left, from every rank's account of it: the unread
/// parts of the works the ranks claimed (ordered by shard and position),
/// then the works nobody claimed, in the list's order. Every rank computes
/// the same list from the same accounts.
pub fn remaining(accounts: &[Account]) -> Result<Vec<Work>, String> {
    check_ranks(accounts, "iter()")?;
    let claimed: HashSet<u64> = accounts.iter().flat_map(|a| a.claimed.clone()).collect();
    let mut rest: Vec<Work> = accounts
        .iter()
        .flat_map(|a| a.rest.iter().copied())
        .filter(|w| w.emitted < w.end)
        .collect();
    rest.sort_by_key(|w| (w.shard, w.emitted, w.end));
    rest.extend(
        accounts[0]
            .list
            .iter()
            .enumerate()
            .filter(|(p, _)| !claimed.contains(&(*p as u64)))
            .map(|(_, w)| *w),
    );
    Ok(rest)
}

/// Block `block` of `shard` (of `n` items) in an epoch of root `root`:
/// shuffled position `p` holds the block's raw item `perm[p]`.
fn block_perm(root: u64, shard: u32, block: u64, n: usize) -> Vec<i64> {
    randperm(n, &mut Mt19937::new(block_seed(root, shard, block)))
}

/// Works of a shuffled epoch (positions in its block orders of `from.0`
/// items, root `from.1`) as works that read the same items in another
/// epoch (blocks of `to.0`, root `to.1`): whole blocks of the same size are
/// the same items in any order; each other item is a work of one item at
/// its place in the new order.
pub fn translate(works: &[Work], lens: &[u64], from: (u64, u64), to: (u64, u64)) -> Vec<Work> {
    let ((size, root_from), (size_to, root_to)) = ((from.0.max(1), from.1), (to.0.max(1), to.1));
    let mut out: Vec<Work> = Vec::new();
    // the new order's block last used: (shard, block, raw item -> position)
    let mut placed: Option<(u32, u64, Vec<u64>)> = None;
    for w in works {
        let n = lens.get(w.shard as usize).copied().unwrap_or(0);
        let stop = w.end.min(n);
        let mut p = w.emitted;
        while p < stop {
            let b = p / size;
            let (lo, hi) = (b * size, ((b + 1) * size).min(n));
            let upto = stop.min(hi);
            if p == lo && upto == hi && size == size_to {
                match out.last_mut() {
                    Some(last) if last.shard == w.shard && last.end == lo => last.end = hi,
                    _ => out.push(Work {
                        shard: w.shard,
                        emitted: lo,
                        end: hi,
                    }),
                }
            } else {
                let old = block_perm(root_from, w.shard, b, (hi - lo) as usize);
                for q in (p - lo)..(upto - lo) {
                    let raw = lo + old[q as usize] as u64;
                    let nb = raw / size_to;
                    let nlo = nb * size_to;
                    let fresh = !matches!(&placed, Some((s, k, _)) if *s == w.shard && *k == nb);
                    if fresh {
                        let len = (((nb + 1) * size_to).min(n) - nlo) as usize;
                        let perm = block_perm(root_to, w.shard, nb, len);
                        let mut place = vec![0u64; len];
                        for (pos, r) in perm.iter().enumerate() {
                            place[*r as usize] = pos as u64;
                        }
                        placed = Some((w.shard, nb, place));
                    }
                    let j = nlo
                        + placed
                            .as_ref()
                            .map_or(0, |(_, _, pl)| pl[(raw - nlo) as usize]);
                    out.push(Work {
                        shard: w.shard,
                        emitted: j,
                        end: j + 1,
                    });
                }
            }
            p = upto;
        }
    }
    out
}

/// How far ahead of its reading a rank claims, in seconds of its own rate,
/// at the least: enough to hide a store's round trip (and the claim
/// thread's turn at the GIL); the caller gives more where a claimed shard
/// is downloaded first. Four round trips are added as they are measured.
pub const HORIZON: f64 = 0.1;
pub const MAX_HORIZON: f64 = 30.0;
/// Works handed to the lanes that the rate is measured over.
const RATE_WINDOW: usize = 16;

/// One rank's claims of one epoch: the epoch's list, each work's items
/// (`None` where unknown), the most unread claims to hold (`most_ahead`)
/// and, with even counts, the items after which it claims no more
/// (`quota`); `lanes`: the rank's readers. A rank holds unread what its lanes take within a horizon at
/// the rate they took works so far (at least one work): a slow rank holds
/// about one, a fast one more. The caller claims (an atomic `add` on the
/// store's counter) as many as [`Claims::wanted`] says and records each
/// position it got.
pub struct Claims {
    works: Vec<Work>,
    sizes: Vec<Option<u64>>,
    quota: Option<u64>,
    most_ahead: usize,
    /// Hand-outs of the first burst, left out of the rate.
    burst: usize,
    state: Mutex<ClaimState>,
    changed: Condvar,
}

#[derive(Default)]
struct ClaimState {
    /// Claimed positions not yet handed to a lane, in order.
    buffer: VecDeque<usize>,
    /// Every position claimed, in order.
    claimed: Vec<usize>,
    items: u64,
    /// No more claims: the list or the quota is spent, or the store failed.
    done: bool,
    stopped: bool,
    error: Option<String>,
    /// Works claimed that exist (the counter may pass the list's end).
    works: u64,
    nanos_on_store: u64,
    /// The last works handed to the lanes after the first burst (each lane
    /// takes one to read and one to read ahead into at once): when, and
    /// their items.
    handed: VecDeque<(Instant, u64)>,
    /// Works handed to the lanes.
    handed_count: usize,
    /// Lanes waiting in [`Claims::next`] for a claim.
    waiting: usize,
    /// Seconds of this rank's reading to hold claimed ahead (besides four
    /// round trips to the store).
    horizon: f64,
}

impl ClaimState {
    /// Unread works to hold: what the lanes take within the horizon at the
    /// rate they took the last works (1 until that rate is known). None
    /// where they take less than half a work in it: each lane already
    /// holds the work it reads ahead into, claimed when it began the one
    /// before, which hides a round trip.
    fn target(&self, most: usize) -> usize {
        let n = self.handed.len();
        if n < 3 {
            return 1;
        }
        let (first, last) = (self.handed[0].0, self.handed[n - 1].0);
        let secs = last.duration_since(first).as_secs_f64();
        let items: u64 = self.handed.iter().skip(1).map(|h| h.1).sum();
        let mean = self.handed.iter().map(|h| h.1).sum::<u64>() as f64 / n as f64;
        if secs <= 0.0 || mean <= 0.0 {
            return if items > 0 { most } else { 1 };
        }
        let trip = if self.works > 0 {
            self.nanos_on_store as f64 / 1e9 / self.works as f64
        } else {
            0.0
        };
        let horizon = (self.horizon + 4.0 * trip).min(MAX_HORIZON);
        let want = items as f64 / secs * horizon / mean;
        if want < 0.5 {
            return 0;
        }
        (want.ceil() as usize).clamp(1, most.max(1))
    }
}

impl Claims {
    pub fn new(
        works: Vec<Work>,
        sizes: Vec<Option<u64>>,
        quota: Option<u64>,
        most_ahead: usize,
        horizon: f64,
        lanes: usize,
    ) -> Self {
        Claims {
            works,
            sizes,
            quota,
            most_ahead: most_ahead.max(1),
            burst: 2 * lanes.max(1) - 1,
            state: Mutex::new(ClaimState {
                horizon: horizon.clamp(0.0, MAX_HORIZON),
                ..ClaimState::default()
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ClaimState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until claims are wanted (fewer unread than the horizon holds,
    /// the quota not reached): how many to claim in one call to the store
    /// (one with a quota, which each claim is checked against); `0` once no
    /// more will be (the quota met marks the claims done).
    pub fn wanted(&self) -> usize {
        let mut st = self.lock();
        loop {
            if st.stopped || st.done {
                return 0;
            }
            if self.quota.is_some_and(|q| st.items >= q) {
                st.done = true;
                self.changed.notify_all();
                return 0;
            }
            // (a lane waiting is owed a claim whatever the horizon says)
            let target = st.target(self.most_ahead).max(st.waiting);
            if st.buffer.len() < target {
                return if self.quota.is_some() {
                    1
                } else {
                    target - st.buffer.len()
                };
            }
            st = self
                .changed
                .wait_timeout(st, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// `(unread works held, how many the horizon wants held)`.
    pub fn ahead(&self) -> (usize, usize) {
        let st = self.lock();
        (st.buffer.len(), st.target(self.most_ahead))
    }

    /// The counter gave `position` after `nanos` on the store: claimed
    /// (`true`), or past the list's end (`false`: no more this epoch).
    pub fn record(&self, position: u64, nanos: u64) -> bool {
        let mut st = self.lock();
        st.nanos_on_store += nanos;
        let claimed = match usize::try_from(position) {
            Ok(p) if p < self.works.len() => {
                st.claimed.push(p);
                st.buffer.push_back(p);
                st.items += self.sizes[p].unwrap_or(0);
                st.works += 1;
                true
            }
            _ => {
                st.done = true;
                false
            }
        };
        self.changed.notify_all();
        claimed
    }

    /// The store failed: every later [`WorkSource::next_work`] says why.
    pub fn fail(&self, why: String) {
        let mut st = self.lock();
        st.error = Some(why);
        st.done = true;
        self.changed.notify_all();
    }

    pub fn stop(&self) {
        self.lock().stopped = true;
        self.changed.notify_all();
    }

    /// The work at `position` of the epoch's list.
    pub fn work(&self, position: usize) -> Option<Work> {
        self.works.get(position).copied()
    }

    /// The positions claimed so far and the works among them not yet
    /// handed to a lane, read together.
    pub fn account(&self) -> (Vec<usize>, Vec<Work>) {
        let st = self.lock();
        let unread = st.buffer.iter().map(|&p| self.works[p]).collect();
        (st.claimed.clone(), unread)
    }

    /// `(works claimed, their items, seconds on the store)`.
    pub fn counts(&self) -> (u64, u64, f64) {
        let st = self.lock();
        let items = st.claimed.iter().map(|&p| self.sizes[p].unwrap_or(0)).sum();
        (st.works, items, st.nanos_on_store as f64 / 1e9)
    }

    /// Hands claimed position `p` to a lane (counted for the rate).
    fn hand(&self, st: &mut ClaimState, p: usize) -> Work {
        st.handed_count += 1;
        if st.handed_count >= self.burst {
            if st.handed.len() == RATE_WINDOW {
                st.handed.pop_front();
            }
            let items = self.sizes[p].unwrap_or(0);
            st.handed.push_back((Instant::now(), items));
        }
        self.changed.notify_all();
        self.works[p]
    }

    /// A claimed work if one is unread now (`None`: not now, `Some(None)`:
    /// no more this epoch), without waiting.
    pub fn at_hand(&self) -> Result<Option<Option<Work>>, QueueError> {
        let mut st = self.lock();
        if let Some(p) = st.buffer.pop_front() {
            return Ok(Some(Some(self.hand(&mut st, p))));
        }
        if st.done || st.stopped {
            return match &st.error {
                Some(e) => Err(QueueError(e.clone())),
                None => Ok(Some(None)),
            };
        }
        Ok(None)
    }

    /// The next claimed work, waiting for a claim under way; `None` when
    /// this rank gets no more this epoch.
    pub fn next(&self) -> Result<Option<Work>, QueueError> {
        let mut st = self.lock();
        loop {
            if let Some(p) = st.buffer.pop_front() {
                return Ok(Some(self.hand(&mut st, p)));
            }
            if st.done || st.stopped {
                return match &st.error {
                    Some(e) => Err(QueueError(e.clone())),
                    None => Ok(None),
                };
            }
            st.waiting += 1;
            self.changed.notify_all();
            st = self
                .changed
                .wait_timeout(st, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            st.waiting -= 1;
        }
    }
}

/// [`Claims`] as the lanes' source of works.
pub struct ClaimsSource(pub std::sync::Arc<Claims>);

impl WorkSource for ClaimsSource {
    fn next_work(&mut self) -> Result<Option<Work>, QueueError> {
        self.0.next()
    }

    fn work_at_hand(&mut self) -> Result<Option<Option<Work>>, QueueError> {
        self.0.at_hand()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn w(shard: u32, emitted: u64, end: u64) -> Work {
        Work {
            shard,
            emitted,
            end,
        }
    }

    fn account(rank: i64, world: i64, list: &[Work], claimed: &[u64], rest: &[Work]) -> Account {
        Account {
            rank,
            world,
            list_id: list_id(list),
            list: list.to_vec(),
            claimed: claimed.to_vec(),
            rest: rest.to_vec(),
        }
    }

    #[test]
    fn a_rank_missing_or_repeated_is_named() {
        let list = [
            w(0, 0, Work::OPEN),
            w(1, 0, Work::OPEN),
            w(2, 0, Work::OPEN),
        ];
        let a = |r| account(r, 3, &list, &[r as u64], &[]);
        assert!(check_ranks(&[a(0), a(1), a(2)], "x").is_ok());
        let e = check_ranks(&[a(0), a(1)], "x").unwrap_err();
        assert!(e.contains("the state of rank 2 is missing"), "{e}");
        let e = check_ranks(&[a(0), a(0), a(0)], "x").unwrap_err();
        assert!(e.contains("rank 0's state is given 3 times"), "{e}");
        assert!(e.contains("ranks 1, 2 are missing"), "{e}");
        let mut other = a(1);
        other.world = 2;
        assert!(check_ranks(&[a(0), other, a(2)], "x")
            .unwrap_err()
            .contains("different sizes"));
        let mut later = a(1);
        later.list_id = "0".into();
        assert!(check_ranks(&[a(0), later, a(2)], "x")
            .unwrap_err()
            .contains("different epochs"));
        let e = check_ranks(&[a(0), a(1), a(2), a(5)], "x").unwrap_err();
        assert!(e.contains("names rank 5, not a rank of 3"), "{e}");
    }

    #[test]
    fn remaining_is_the_unread_claims_then_the_unclaimed_works() {
        let list = [w(0, 0, 9), w(1, 0, 9), w(2, 0, 9), w(3, 0, 9)];
        let got = remaining(&[
            account(0, 2, &list, &[0, 2], &[w(2, 4, 9)]),
            account(1, 2, &list, &[1], &[w(1, 9, 9), w(1, 3, 5)]),
        ])
        .unwrap();
        assert_eq!(got, vec![w(1, 3, 5), w(2, 4, 9), w(3, 0, 9)]);
    }

    #[test]
    fn even_budget_leaves_no_rank_short() {
        assert_eq!(even_budget(&[], 2, 4), 0);
        assert_eq!(even_budget(&[9, 4, 7], 2, 3), (20 - 8) / 6);
        assert_eq!(even_budget(&[100], 8, 1), 0);
    }

    proptest! {
        /// The works translated read the same items as the works in the
        /// other epoch's order: each (shard, raw item) once.
        #[test]
        fn translate_keeps_the_items(
            lens in prop::collection::vec(0u64..30, 1..5),
            size in 1u64..9,
            cuts in prop::collection::vec((0usize..5, 0u64..30, 0u64..31), 0..6),
            roots in (0u64..1000, 0u64..1000),
        ) {
            let items = |works: &[Work], root: u64, size: u64| -> Vec<(u32, u64)> {
                let mut out = Vec::new();
                for w in works {
                    let n = lens[w.shard as usize];
                    for p in w.emitted..w.end.min(n) {
                        let (b, lo) = (p / size, p / size * size);
                        let perm = block_perm(root, w.shard, b, ((b + 1) * size).min(n) as usize - lo as usize);
                        out.push((w.shard, lo + perm[(p - lo) as usize] as u64));
                    }
                }
                out.sort_unstable();
                out
            };
            let works: Vec<Work> = cuts
                .iter()
                .filter(|(s, _, _)| *s < lens.len())
                .map(|&(s, a, b)| w(s as u32, a.min(b), a.max(b)))
                .collect();
            let moved = translate(&works, &lens, (size, roots.0), (size, roots.1));
            prop_assert_eq!(items(&works, roots.0, size), items(&moved, roots.1, size));
            let other = size % 5 + 1;
            let moved = translate(&works, &lens, (size, roots.0), (other, roots.1));
            prop_assert_eq!(items(&works, roots.0, size), items(&moved, roots.1, other));
        }
    }

    #[test]
    fn claims_hand_out_in_order_within_ahead_and_quota() {
        let list: Vec<Work> = (0..5).map(|s| w(s, 0, Work::OPEN)).collect();
        let c = Arc::new(Claims::new(
            list.clone(),
            vec![Some(4); 5],
            Some(10),
            2,
            HORIZON,
            1,
        ));
        let claimer = {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut next = 0;
                loop {
                    let n = c.wanted();
                    if n == 0 {
                        break;
                    }
                    // (one at a time under a quota)
                    assert_eq!(n, 1);
                    c.record(next, 1);
                    next += 1;
                }
                next
            })
        };
        let mut got = Vec::new();
        while let Some(work) = c.next().unwrap() {
            got.push(work);
        }
        // three claims reach the quota of 10 items (4 each)
        assert_eq!(claimer.join().unwrap(), 3);
        assert_eq!(got, list[..3].to_vec());
        assert_eq!(c.account(), (vec![0, 1, 2], vec![]));
        assert_eq!(c.counts().0, 3);
    }

    #[test]
    fn a_failed_store_is_every_later_answer() {
        let c = Claims::new(vec![w(0, 0, 1)], vec![None], None, 1, HORIZON, 1);
        c.fail("gone".into());
        assert_eq!(c.next(), Err(QueueError("gone".into())));
        assert_eq!(c.wanted(), 0);
    }

    /// A rank holds unread what its lanes take within the horizon: about
    /// one work when it reads slowly, many (up to the most) when fast.
    #[test]
    fn claims_ahead_follow_the_ranks_own_rate() {
        // a lane that takes a work of 10 items every `pause`, beside a
        // claimer as a rank runs one: what the horizon wants held at the end
        let held = |pause: Duration, rounds: usize| {
            let list: Vec<Work> = (0..200).map(|s| w(s, 0, Work::OPEN)).collect();
            let c = Arc::new(Claims::new(list, vec![Some(10); 200], None, 32, 0.1, 1));
            let claimer = {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut next = 0u64;
                    loop {
                        let n = c.wanted();
                        if n == 0 {
                            break;
                        }
                        for _ in 0..n {
                            c.record(next, 0);
                            next += 1;
                        }
                    }
                })
            };
            for _ in 0..rounds {
                c.next().unwrap().unwrap();
                std::thread::sleep(pause);
            }
            let target = c.ahead().1;
            c.stop();
            claimer.join().unwrap();
            target
        };
        // 10 items per 60 ms: 17 items in 0.1 s, under two works
        assert!((1..=2).contains(&held(Duration::from_millis(60), 8)));
        // 10 items per 0.3 s: none held beyond what a lane waits for
        assert_eq!(held(Duration::from_millis(300), 5), 0);
        // 10 items per 0.5 ms: 2,000 in 0.1 s, more than the most (32)
        assert_eq!(held(Duration::from_micros(500), 20), 32);
    }

    #[test]
    fn the_unit_is_a_64th_of_a_ranks_share_in_whole_blocks() {
        // 4 ranks over 1,000,000 items: 3,907 a range, 62 blocks of 64
        assert_eq!(unit_of(1_000_000, 4, 64, true), (3_968, 64));
        assert_eq!(unit_of(1_000_000, 4, 64, false), (3_907, 64));
        // a share too small for whole blocks: the block is the range
        assert_eq!(unit_of(2_000, 4, 64, true), (8, 8));
        assert_eq!(unit_of(20_000, 4, 64, true), (128, 64));
        assert_eq!(unit_of(12_000, 4, 64, true), (47, 47));
        assert_eq!(unit_of(0, 4, 64, false), (MIN_UNIT, 64));
    }

    proptest! {
        /// The ranges of a cut read every item of every shard once, none
        /// longer than the unit, each shard's last one open-ended.
        #[test]
        fn a_cut_reads_every_item_once(
            lens in prop::collection::vec(0u64..100, 1..6),
            unit in 1u64..40,
        ) {
            let order: Vec<u32> = (0..lens.len() as u32).rev().collect();
            let whole: Vec<Work> = order.iter().map(|&s| w(s, 0, Work::OPEN)).collect();
            let works = cut(&whole, &lens, unit);
            // (cutting again changes nothing; a part keeps its end)
            prop_assert_eq!(&cut(&works, &lens, unit), &works);
            let part = [w(0, 1, lens[0].saturating_sub(1).max(1))];
            let parts = cut(&part, &lens, unit);
            prop_assert_eq!(parts.last().map(|p| p.end), Some(part[0].end));
            let mut seen = Vec::new();
            for wk in &works {
                let n = lens[wk.shard as usize];
                prop_assert!(wk.end.min(n) - wk.emitted.min(n) <= unit);
                seen.extend((wk.emitted..wk.end.min(n)).map(|i| (wk.shard, i)));
            }
            let mut all: Vec<(u32, u64)> = order
                .iter()
                .flat_map(|&s| (0..lens[s as usize]).map(move |i| (s, i)))
                .collect();
            prop_assert_eq!(&seen, &all);
            all.dedup();
            prop_assert_eq!(works.iter().filter(|wk| wk.end == Work::OPEN).count(), lens.len());
        }
    }
}
