//! The job's shared queue's bookkeeping for Python (`ferroloader.epoch.world`):
//! a rank's claims (`WorldClaims`, which the lanes pull from without
//! Python), and what a list of the ranks' accounts leaves to read. Python
//! keeps the store's client: it makes the `add` calls and exchanges the
//! accounts.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;

use super::error::Class;
use crate::scheduler::shards::WorkSource;
use crate::scheduler::world::{self, Account, Claims, ClaimsSource};
use crate::wire::protocol::Work;

type WorkTuple = (u32, u64, u64);

fn work((shard, emitted, end): WorkTuple) -> Work {
    Work {
        shard,
        emitted,
        end,
    }
}

fn tuple(w: Work) -> WorkTuple {
    (w.shard, w.emitted, w.end)
}

/// A rank's account as its state holds it (a dict of these keys; `rest`'s
/// works as `[shard, emitted]` run to their shard's end).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct AccountArgs {
    #[pyo3(default)]
    rank: Option<i64>,
    #[pyo3(default)]
    world: Option<i64>,
    list_id: String,
    list: Vec<Vec<u64>>,
    claimed: Vec<u64>,
    rest: Vec<Vec<u64>>,
}

fn as_work(v: &[u64], what: &str) -> PyResult<Work> {
    match *v {
        [s, e] => Ok(Work::from(s as u32, e)),
        [s, e, end] => Ok(Work {
            shard: s as u32,
            emitted: e,
            end,
        }),
        _ => Err(Class::Config.err(format!(
            "a state's {what} holds a work that is not \
                                            (shard, emitted[, end])"
        ))),
    }
}

fn accounts(args: Vec<AccountArgs>) -> PyResult<Vec<Account>> {
    args.into_iter()
        .map(|a| {
            Ok(Account {
                rank: a.rank.unwrap_or(-1),
                world: a.world.unwrap_or(-1),
                list_id: a.list_id,
                list: a
                    .list
                    .iter()
                    .map(|w| as_work(w, "list"))
                    .collect::<PyResult<_>>()?,
                claimed: a.claimed,
                rest: a
                    .rest
                    .iter()
                    .map(|w| as_work(w, "rest"))
                    .collect::<PyResult<_>>()?,
            })
        })
        .collect()
}

/// Every rank of the saved job exactly once (a `ConfigError` naming the
/// ranks missing or repeated); `what` names the call.
#[pyfunction]
pub fn world_check_ranks(accounts_: Vec<AccountArgs>, what: &str) -> PyResult<()> {
    world::check_ranks(&accounts(accounts_)?, what).map_err(|e| Class::Config.err(e))
}

/// What an epoch has left to read, from every rank's account of it.
#[pyfunction]
pub fn world_remaining(accounts_: Vec<AccountArgs>) -> PyResult<Vec<WorkTuple>> {
    let left = world::remaining(&accounts(accounts_)?).map_err(|e| Class::Config.err(e))?;
    Ok(left.into_iter().map(tuple).collect())
}

/// Works of a shuffled epoch (blocks of `size_from` items, root
/// `root_from`) as works reading the same items in the epoch of root
/// `root_to` (blocks of `size_to`).
#[pyfunction]
pub fn world_translate(
    works: Vec<WorkTuple>,
    lens: Vec<u64>,
    size_from: u64,
    size_to: u64,
    root_from: u64,
    root_to: u64,
) -> Vec<WorkTuple> {
    let works: Vec<Work> = works.into_iter().map(work).collect();
    world::translate(&works, &lens, (size_from, root_from), (size_to, root_to))
        .into_iter()
        .map(tuple)
        .collect()
}

/// [`world_even_budget`] of a list of `items` whose longest work has
/// `longest` (what `len()` predicts before the list exists).
#[pyfunction]
pub fn world_even_count(items: u64, longest: u64, world: u64, batch: u64) -> u64 {
    world::even_count(items, longest, world, batch)
}

/// `(items per range, shuffle block)` of the list of a job of `world`
/// ranks over `total` items (`crate::scheduler::world::unit_of`).
#[pyfunction]
pub fn world_unit(total: u64, world: u64, block: u64, shuffled: bool) -> (u64, u64) {
    world::unit_of(total, world, block, shuffled)
}

/// `works` as works of at most `unit` items.
#[pyfunction]
pub fn world_cut(works: Vec<WorkTuple>, lens: Vec<u64>, unit: u64) -> Vec<WorkTuple> {
    let works: Vec<Work> = works.into_iter().map(work).collect();
    world::cut(&works, &lens, unit)
        .into_iter()
        .map(tuple)
        .collect()
}

/// The digest of an epoch's list every rank compares.
#[pyfunction]
pub fn world_list_id(works: Vec<WorkTuple>) -> String {
    let works: Vec<Work> = works.into_iter().map(work).collect();
    world::list_id(&works)
}

/// Batches each rank yields with even counts (`sizes`: the list's items).
#[pyfunction]
pub fn world_even_budget(sizes: Vec<u64>, world: u64, batch: u64) -> u64 {
    world::even_budget(&sizes, world, batch)
}

/// A rank's claims of an epoch (see `crate::scheduler::world::Claims`).
#[pyclass(module = "ferroloader._core", frozen)]
pub struct WorldClaims {
    pub claims: Arc<Claims>,
}

impl WorldClaims {
    /// The lanes' source of works, pulled without Python.
    pub fn source(&self) -> Box<dyn WorkSource> {
        Box::new(Unlocked(ClaimsSource(self.claims.clone())))
    }
}

/// A source whose wait must not hold the GIL: the claims it waits for are
/// made by a Python thread (the engine may pull with the GIL held, as a
/// one-process iterator does while it starts).
struct Unlocked(ClaimsSource);

impl WorkSource for Unlocked {
    fn next_work(&mut self) -> Result<Option<Work>, crate::scheduler::shards::QueueError> {
        let source = &mut self.0;
        Python::attach(|py| py.detach(|| source.next_work()))
    }

    fn work_at_hand(
        &mut self,
    ) -> Result<Option<Option<Work>>, crate::scheduler::shards::QueueError> {
        // (no wait: the GIL may stay)
        self.0.work_at_hand()
    }
}

#[pymethods]
impl WorldClaims {
    #[new]
    #[pyo3(signature = (works, sizes, quota, most_ahead, horizon, lanes))]
    fn new(
        works: Vec<WorkTuple>,
        sizes: Vec<Option<u64>>,
        quota: Option<u64>,
        most_ahead: usize,
        horizon: f64,
        lanes: usize,
    ) -> PyResult<Self> {
        if sizes.len() != works.len() {
            return Err(Class::Internal.err("WorldClaims: one size per work"));
        }
        let works = works.into_iter().map(work).collect();
        Ok(WorldClaims {
            claims: Arc::new(Claims::new(works, sizes, quota, most_ahead, horizon, lanes)),
        })
    }

    /// Waits, without the GIL, until claims are wanted: how many to claim
    /// at once; `0` once no more will be this epoch.
    fn wanted(&self, py: Python<'_>) -> usize {
        let claims = self.claims.clone();
        py.detach(move || claims.wanted())
    }

    /// The counter gave `position` after `seconds` on the store: whether it
    /// is a work of the list (else the list is spent).
    fn record(&self, position: u64, seconds: f64) -> bool {
        let nanos =
            Duration::try_from_secs_f64(seconds.max(0.0)).map_or(0, |d| d.as_nanos() as u64);
        self.claims.record(position, nanos)
    }

    /// The store failed: the lanes' next pull raises `why`.
    fn fail(&self, why: String) {
        self.claims.fail(why)
    }

    fn stop(&self) {
        self.claims.stop()
    }

    /// The work at `position` of the epoch's list.
    fn work(&self, position: usize) -> Option<WorkTuple> {
        self.claims.work(position).map(tuple)
    }

    /// `(positions claimed, unread works among them)`, read together.
    fn account(&self) -> (Vec<usize>, Vec<WorkTuple>) {
        let (claimed, unread) = self.claims.account();
        (claimed, unread.into_iter().map(tuple).collect())
    }

    /// `(works claimed, their items, seconds on the store)`.
    fn counts(&self) -> (u64, u64, f64) {
        self.claims.counts()
    }

    /// `(unread works held, how many the horizon wants held)`.
    fn ahead(&self) -> (usize, usize) {
        self.claims.ahead()
    }
}
