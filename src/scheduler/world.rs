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

use std::collections::{HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

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
    let n: u64 = sizes.iter().sum();
    let held = (world.saturating_sub(1)).saturating_mul(m.saturating_sub(1));
    n.saturating_sub(held) / (world.max(1) * batch.max(1))
}

/// The items of `work` when its shard has `len` items.
pub fn work_size(work: &Work, len: u64) -> u64 {
    work.end.min(len).saturating_sub(work.emitted)
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

/// Works of a shuffled epoch (positions in its block orders, root
/// `root_from`) as works that read the same items in another epoch
/// (`root_to`): whole blocks are the same items in any order; each item of
/// a block begun is a work of one item at its place in the new order.
pub fn translate(
    works: &[Work],
    lens: &[u64],
    size: u64,
    root_from: u64,
    root_to: u64,
) -> Vec<Work> {
    let size = size.max(1);
    let mut out: Vec<Work> = Vec::new();
    for w in works {
        let n = lens.get(w.shard as usize).copied().unwrap_or(0);
        let stop = w.end.min(n);
        let mut p = w.emitted;
        while p < stop {
            let b = p / size;
            let (lo, hi) = (b * size, ((b + 1) * size).min(n));
            let upto = stop.min(hi);
            if p == lo && upto == hi {
                match out.last_mut() {
                    Some(last) if last.shard == w.shard && last.end == lo => last.end = hi,
                    _ => out.push(Work {
                        shard: w.shard,
                        emitted: lo,
                        end: hi,
                    }),
                }
            } else {
                let len = (hi - lo) as usize;
                let old = block_perm(root_from, w.shard, b, len);
                let new = block_perm(root_to, w.shard, b, len);
                let mut place = vec![0u64; len];
                for (q, raw) in new.iter().enumerate() {
                    place[*raw as usize] = q as u64;
                }
                for q in (p - lo)..(upto - lo) {
                    let j = lo + place[old[q as usize] as usize];
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

/// One rank's claims of one epoch: the epoch's list, each work's items
/// (`None` where unknown), the most unread claims to hold (`ahead`) and,
/// with even counts, the items after which it claims no more (`quota`).
/// The caller claims (an atomic `add` on the store's counter) while
/// [`Claims::wanted`] says so and records each position it got.
pub struct Claims {
    works: Vec<Work>,
    sizes: Vec<Option<u64>>,
    quota: Option<u64>,
    ahead: usize,
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
}

impl Claims {
    pub fn new(
        works: Vec<Work>,
        sizes: Vec<Option<u64>>,
        quota: Option<u64>,
        ahead: usize,
    ) -> Self {
        Claims {
            works,
            sizes,
            quota,
            ahead: ahead.max(1),
            state: Mutex::new(ClaimState::default()),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ClaimState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until a claim is wanted (fewer than `ahead` unread, the quota
    /// not reached): `true`; `false` once no more will be (the quota met
    /// marks the claims done).
    pub fn wanted(&self) -> bool {
        let mut st = self.lock();
        loop {
            if st.stopped || st.done {
                return false;
            }
            if self.quota.is_some_and(|q| st.items >= q) {
                st.done = true;
                self.changed.notify_all();
                return false;
            }
            if st.buffer.len() < self.ahead {
                return true;
            }
            st = self
                .changed
                .wait_timeout(st, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
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

    /// The next claimed work, waiting for a claim under way; `None` when
    /// this rank gets no more this epoch.
    pub fn next(&self) -> Result<Option<Work>, QueueError> {
        let mut st = self.lock();
        loop {
            if let Some(p) = st.buffer.pop_front() {
                self.changed.notify_all();
                return Ok(Some(self.works[p]));
            }
            if st.done || st.stopped {
                return match &st.error {
                    Some(e) => Err(QueueError(e.clone())),
                    None => Ok(None),
                };
            }
            st = self
                .changed
                .wait_timeout(st, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// [`Claims`] as the lanes' source of works.
pub struct ClaimsSource(pub std::sync::Arc<Claims>);

impl WorkSource for ClaimsSource {
    fn next_work(&mut self) -> Result<Option<Work>, QueueError> {
        self.0.next()
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
            let items = |works: &[Work], root: u64| -> Vec<(u32, u64)> {
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
            let moved = translate(&works, &lens, size, roots.0, roots.1);
            prop_assert_eq!(items(&works, roots.0), items(&moved, roots.1));
        }
    }

    #[test]
    fn claims_hand_out_in_order_within_ahead_and_quota() {
        let list: Vec<Work> = (0..5).map(|s| w(s, 0, Work::OPEN)).collect();
        let c = Arc::new(Claims::new(list.clone(), vec![Some(4); 5], Some(10), 2));
        let claimer = {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut next = 0;
                while c.wanted() {
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
        let c = Claims::new(vec![w(0, 0, 1)], vec![None], None, 1);
        c.fail("gone".into());
        assert_eq!(c.next(), Err(QueueError("gone".into())));
        assert!(!c.wanted());
    }
}
