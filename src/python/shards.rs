//! Sharded datasets: the dataset's `iter_shard` as the engine's shard
//! source, the epoch's lane plan, and the address batches of elastic
//! sharding. Assignment and reading order are the engine's
//! (`crate::scheduler::shards`, `crate::worker::lanes`).

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use super::error::Class;
use super::fetch::next;
use crate::sampler::seeds::shard_order_seed;
use crate::sampler::shards::{elastic_positions, shard_order, Blocks, ShardAddresses, Tail};
use crate::sampler::{randperm, Mt19937};
use crate::scheduler::shards::{LanePlan, LaneSnapshot, Mode, QueueError, ShardSpec, WorkSource};
use crate::wire::protocol::{LanePos, Work};

/// A `ShardedDataset` as the engine reads it: `iter_shard(shards[s],
/// start)` opens shard `s`; `seed(s, offset)`, when per-sample seeding is
/// on, runs before each item is drawn.
pub struct PyShards {
    iter_shard: Py<PyAny>,
    shards: Vec<Py<PyAny>>,
    seed: Option<Py<PyAny>>,
    short_of_room: Option<Py<PyAny>>,
}

/// How Python hands a sharded dataset over: `(iter_shard, shards, seed,
/// short_of_room)`; the last, for shards read through a cache, answers
/// whether lanes should let go of their shards between batches.
pub type ShardsArg = (
    Py<PyAny>,
    Vec<Py<PyAny>>,
    Option<Py<PyAny>>,
    Option<Py<PyAny>>,
);

impl PyShards {
    pub fn new(arg: ShardsArg) -> Self {
        let (iter_shard, shards, seed, short_of_room) = arg;
        PyShards {
            iter_shard,
            shards,
            seed,
            short_of_room,
        }
    }

    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.iter_shard)?;
        visit.call(&self.seed)?;
        visit.call(&self.short_of_room)?;
        for s in &self.shards {
            visit.call(s)?;
        }
        Ok(())
    }
}

impl crate::worker::lanes::ShardSource for PyShards {
    type Item = Py<PyAny>;
    type Iter = Py<PyAny>;
    type Error = PyErr;

    fn open(&mut self, shard: u32, start: u64) -> PyResult<Py<PyAny>> {
        Python::attach(|py| {
            let desc = self
                .shards
                .get(shard as usize)
                .ok_or_else(|| Class::Internal.err(format!("no shard {shard}")))?;
            let items = self.iter_shard.bind(py).call1((desc.bind(py), start))?;
            Ok(items.try_iter()?.into_any().unbind())
        })
    }

    fn next(&mut self, it: &mut Py<PyAny>, shard: u32, offset: u64) -> PyResult<Option<Py<PyAny>>> {
        Python::attach(|py| {
            if let Some(seed) = &self.seed {
                seed.bind(py).call1((shard, offset))?;
            }
            Ok(next(it.bind(py))?.map(Bound::unbind))
        })
    }

    fn share(&mut self, item: &Py<PyAny>) -> Py<PyAny> {
        Python::attach(|py| item.clone_ref(py))
    }

    fn short_of_room(&mut self) -> bool {
        let Some(f) = &self.short_of_room else {
            return false;
        };
        // best effort: a check that fails keeps the shards open, as before
        Python::attach(|py| {
            f.bind(py)
                .call0()
                .and_then(|v| v.is_truthy())
                .unwrap_or(false)
        })
    }
}

/// An address past its shard's end: the shard is shorter than its
/// `shard_len()` said.
pub fn missing(shard: u32, offset: u64) -> PyErr {
    pyo3::exceptions::PyIndexError::new_err(format!(
        "shard {shard} has no item {offset}: it is shorter than its shard_len()"
    ))
}

/// A sharded epoch's plan for one rank (opaque to Python).
#[pyclass(module = "ferroloader._core", frozen)]
pub struct ShardPlan {
    pub plan: LanePlan,
    batches: Option<u64>,
    /// Where a dynamic queue's works come from once its own are out: a
    /// Python callable giving `(shard, emitted, end)` or `None` (the job's
    /// shared queue, `ferroloader.epoch.world`).
    source: Option<Py<PyAny>>,
}

impl ShardPlan {
    /// The engine's side of [`ShardPlan::source`]: a rank's claims of the
    /// shared queue are pulled without Python; another source is called.
    pub fn work_source(&self, py: Python<'_>) -> Option<Box<dyn WorkSource>> {
        self.source.as_ref().map(|f| {
            if let Ok(claims) = f.bind(py).cast::<super::world::WorldClaims>() {
                return claims.get().source();
            }
            Box::new(PyWorkSource {
                next: f.clone_ref(py),
            }) as Box<dyn WorkSource>
        })
    }
}

/// The job's shared queue as the engine pulls from it: each call may wait
/// for a claim under way (without the GIL, in Python's own wait).
struct PyWorkSource {
    next: Py<PyAny>,
}

impl WorkSource for PyWorkSource {
    fn next_work(&mut self) -> Result<Option<Work>, QueueError> {
        Python::attach(|py| {
            let got = self
                .next
                .bind(py)
                .call0()
                .map_err(|e| QueueError(e.value(py).to_string()))?;
            if got.is_none() {
                return Ok(None);
            }
            let (shard, emitted, end): (u32, u64, u64) = got.extract().map_err(|e| {
                QueueError(format!("a claimed work is not (shard, emitted, end): {e}"))
            })?;
            Ok(Some(Work {
                shard,
                emitted,
                end,
            }))
        })
    }
}

#[pymethods]
impl ShardPlan {
    /// Batches every rank yields this epoch (`None`: not kept even).
    #[getter]
    fn budget(&self) -> Option<u64> {
        self.plan.budget
    }

    #[getter]
    fn lanes(&self) -> usize {
        self.plan.lanes
    }

    /// Batches this rank yields in the whole epoch, when the shard lengths
    /// are known (dynamic lanes without even counts: the least it can be).
    #[getter]
    fn batches(&self) -> Option<u64> {
        self.batches
    }

    /// The shards in the order the epoch first reads them.
    #[getter]
    fn read_order(&self) -> Vec<u32> {
        self.plan.read_order()
    }
}

/// A saved position: `(positions, next_lane, handed, rest)`; each work of
/// `rest` is `[shard, emitted]`, or `[shard, emitted, end]` when it ends
/// before its shard does.
pub type Snapshot = (
    Vec<Option<(u32, u32, u64)>>,
    usize,
    u64,
    Option<Vec<Vec<u64>>>,
);

pub fn snapshot_to_py(s: LaneSnapshot) -> Snapshot {
    (
        s.positions
            .iter()
            .map(|p| p.map(|p| (p.started, p.shard, p.emitted)))
            .collect(),
        s.next_lane,
        s.handed,
        s.rest.map(|r| {
            r.iter()
                .map(|w| {
                    let mut v = vec![u64::from(w.shard), w.emitted];
                    if w.end != Work::OPEN {
                        v.push(w.end);
                    }
                    v
                })
                .collect()
        }),
    )
}

fn work_from_py(w: &[u64]) -> PyResult<Work> {
    let bad = || {
        Class::Config.err(format!(
            "a saved shard work {w:?} is not [shard, emitted(, end)]"
        ))
    };
    let (shard, emitted, end) = match *w {
        [shard, emitted] => (shard, emitted, Work::OPEN),
        [shard, emitted, end] if end >= emitted => (shard, emitted, end),
        _ => return Err(bad()),
    };
    Ok(Work {
        shard: u32::try_from(shard).map_err(|_| bad())?,
        emitted,
        end,
    })
}

fn snapshot_from_py(s: Snapshot) -> PyResult<LaneSnapshot> {
    let rest = match s.3 {
        Some(r) => Some(r.iter().map(|w| work_from_py(w)).collect::<PyResult<_>>()?),
        None => None,
    };
    Ok(LaneSnapshot {
        positions: s
            .0
            .into_iter()
            .map(|p| {
                p.map(|(started, shard, emitted)| LanePos {
                    started,
                    shard,
                    emitted,
                })
            })
            .collect(),
        next_lane: s.1,
        handed: s.2,
        rest,
    })
}

/// What `shard_plan` takes: one rank's sharding of an epoch, as
/// `ferroloader.epoch.shards` describes it (a dict of these keys).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct PlanArgs {
    n_shards: usize,
    lens: Option<Vec<u64>>,
    block: u64,
    root: u64,
    shuffle: bool,
    rank: usize,
    world: usize,
    dynamic: bool,
    lanes: usize,
    batch: Option<u64>,
    drop_last: bool,
    even: bool,
    largest_first: bool,
    resume: Option<Snapshot>,
    /// The job's shared queue (dynamic lanes only): the rank's queue
    /// starts empty and pulls from it.
    shared: Option<SharedArgs>,
}

/// A dynamic epoch fed by the job's shared queue: the callable the works
/// come from, the batches the rank yields (even counts) and those it had
/// handed over already (a resumed epoch).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct SharedArgs {
    source: Py<PyAny>,
    budget: Option<u64>,
    handed: u64,
}

/// The epoch's lane plan for one rank (see `crate::scheduler::shards`),
/// or the plan that continues a saved position.
#[pyfunction]
pub fn shard_plan(args: PlanArgs) -> PyResult<ShardPlan> {
    super::error::guard("a sharded epoch's plan", move || {
        let PlanArgs {
            n_shards,
            lens,
            block,
            root,
            shuffle,
            rank,
            world,
            dynamic,
            lanes,
            batch,
            drop_last,
            even,
            largest_first,
            resume,
            shared,
        } = args;
        if lanes == 0 || world == 0 || rank >= world || block == 0 {
            return Err(Class::Config.err(format!(
                "sharding needs lanes >= 1, shuffle_block >= 1 and 0 <= rank < world_size \
             (got lanes={lanes}, shuffle_block={block}, rank={rank}, world_size={world})"
            )));
        }
        let spec = ShardSpec {
            n_shards,
            lens,
            order_seed: shuffle.then(|| shard_order_seed(root)),
            blocks: shuffle.then_some(Blocks { root, size: block }),
            rank,
            world,
            mode: if dynamic {
                Mode::Dynamic(lanes)
            } else {
                Mode::Static(lanes)
            },
            batch,
            drop_last,
            even,
            largest_first,
        };
        let resume = resume.map(snapshot_from_py).transpose()?;
        let Some(shared) = shared else {
            let plan = spec
                .plan(resume.as_ref())
                .map_err(|e| Class::Config.err(e))?;
            return Ok(ShardPlan {
                plan,
                batches: spec.batches(),
                source: None,
            });
        };
        // every work comes from the shared queue; the batch count is the
        // job's to decide (Python's even count), not this rank's shards'
        let spec = ShardSpec {
            mode: Mode::Dynamic(lanes),
            n_shards: 0,
            even: false,
            ..spec
        };
        let mut plan = spec.plan(None).map_err(|e| Class::Config.err(e))?;
        plan.budget = shared.budget;
        plan.handed = shared.handed;
        Ok(ShardPlan {
            plan,
            batches: shared.budget,
            source: Some(shared.source),
        })
    })
}

/// What `AddressBatches` takes (a dict of these keys).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct AddressArgs {
    lens: Vec<u64>,
    block: u64,
    root: u64,
    shuffle: bool,
    start: u64,
    batch: u64,
    world: u64,
    rank: u64,
    tail: String,
}

/// Elastic sharding's batches of one rank: the global sequence of the
/// epoch's items (shards in order, each in shard order) from position
/// `start`, cut into global batches of `batch * world` items, this rank
/// taking its slice of each; every batch a list of `(shard, offset)`.
#[pyclass(module = "ferroloader._core")]
pub struct AddressBatches {
    addresses: ShardAddresses,
    start: u64,
    positions: std::vec::IntoIter<u64>,
    batch: usize,
}

impl AddressBatches {
    /// The next batch's addresses; `None` at the end.
    pub fn next_batch(&mut self) -> Option<Vec<(u32, u64)>> {
        let mut out = Vec::with_capacity(self.batch.min(self.positions.len()));
        for p in self.positions.by_ref().take(self.batch) {
            out.push(self.addresses.address(p));
        }
        (!out.is_empty()).then_some(out)
    }
}

#[pymethods]
impl AddressBatches {
    #[new]
    fn new(args: AddressArgs) -> PyResult<Self> {
        super::error::guard("an elastic epoch's batches", move || {
            let AddressArgs {
                lens,
                block,
                root,
                shuffle,
                start,
                batch,
                world,
                rank,
                tail,
            } = args;
            let tail = parse_tail(&tail)?;
            if batch == 0 || world == 0 || rank >= world || block == 0 {
                return Err(Class::Config.err(format!(
                    "elastic sharding needs batch_size >= 1, shuffle_block >= 1 and \
                 0 <= rank < world_size (got {batch}, {block}, {rank}, {world})"
                )));
            }
            let order = shard_order(lens.len(), shuffle.then(|| shard_order_seed(root)));
            let blocks = shuffle.then_some(Blocks { root, size: block });
            let addresses = ShardAddresses::new(order, &lens, blocks);
            let n = addresses.len();
            Ok(AddressBatches {
                addresses,
                start,
                positions: elastic_positions(n, start, batch, world, rank, tail).into_iter(),
                batch: batch as usize,
            })
        })
    }

    /// The shards in the order the rest of the sequence reads them.
    #[getter]
    fn read_order(&self) -> Vec<u32> {
        self.addresses.read_order(self.start)
    }

    /// Items in the whole global sequence of the epoch.
    #[getter]
    fn total(&self) -> u64 {
        self.addresses.len()
    }

    /// Batches left.
    fn __len__(&self) -> usize {
        self.positions.len().div_ceil(self.batch)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self) -> Option<Vec<(u32, u64)>> {
        self.next_batch()
    }

    /// Draws and drops `n` batches; how many there were.
    fn _skip(&mut self, n: usize) -> usize {
        (0..n).take_while(|_| self.next_batch().is_some()).count()
    }
}

fn parse_tail(tail: &str) -> PyResult<Tail> {
    match tail {
        "pad" => Ok(Tail::Pad),
        "drop" => Ok(Tail::Drop),
        "split" => Ok(Tail::Split),
        other => Err(Class::Internal.err(format!("tail {other:?}"))),
    }
}

/// `ElasticBatchSampler`'s indices for one rank: positions of the global
/// sequence (`torch.randperm(n, generator=torch.Generator().manual_seed(seed))`,
/// or `range(n)` without a seed) from `start`, cut into global batches of
/// `batch * world`, this rank's slice of each, concatenated.
#[pyfunction]
#[pyo3(signature = (n, *, start, batch, world, rank, tail, seed=None))]
pub fn elastic_indices(
    n: usize,
    start: u64,
    batch: u64,
    world: u64,
    rank: u64,
    tail: &str,
    seed: Option<u64>,
) -> PyResult<Vec<i64>> {
    super::error::guard("ElasticBatchSampler's indices", move || {
        let tail = parse_tail(tail)?;
        if batch == 0 || world == 0 || rank >= world {
            return Err(Class::Config.err(format!(
                "ElasticBatchSampler needs batch_size >= 1 and 0 <= rank < world_size \
             (got {batch}, {rank}, {world})"
            )));
        }
        let positions = elastic_positions(n as u64, start, batch, world, rank, tail);
        Ok(match seed {
            None => positions.into_iter().map(|p| p as i64).collect(),
            Some(s) => {
                let perm = randperm(n, &mut Mt19937::new(s));
                positions.into_iter().map(|p| perm[p as usize]).collect()
            }
        })
    })
}

/// What `mixture_indices` takes (a dict of these keys; `shards` may be
/// left out).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct MixtureArgs {
    lens: Vec<u64>,
    segments: Vec<(u64, Vec<f64>)>,
    root: u64,
    replacement: bool,
    exhausted: String,
    num_samples: Option<u64>,
    start: u64,
    batch: u64,
    world: u64,
    rank: u64,
    tail: String,
    #[pyo3(default)]
    shards: Option<Vec<Option<Vec<u64>>>>,
}

/// A sharded source's shard: `(source, shard)`.
type ShardRef = (u32, usize);

/// Rank `rank`'s indices of a mixture's epoch (`ferroloader.Mixture`): the
/// epoch's draws (`sampler::mixture`) as global indices (each source's
/// offset plus its index), read from global position `start` on as
/// `elastic_indices` reads a permutation. Returns the epoch's length too,
/// and the sharded sources' shards `(source, shard)` in the order these
/// indices first reach them: the order they are fetched ahead in.
#[pyfunction]
pub fn mixture_indices(args: MixtureArgs) -> PyResult<(u64, Vec<i64>, Vec<ShardRef>)> {
    super::error::guard("a mixture's draws", move || {
        let MixtureArgs {
            lens,
            segments,
            root,
            replacement,
            exhausted,
            num_samples,
            start,
            batch,
            world,
            rank,
            tail,
            shards,
        } = args;
        use crate::sampler::mixture::{mixture_draws, Exhausted, Mix, Segment};
        let (exhausted, tail) = (exhausted.as_str(), tail.as_str());
        let tail = parse_tail(tail)?;
        let exhausted = Exhausted::parse(exhausted).ok_or_else(|| {
            Class::Config.err(format!(
                "exhausted should be 'stop_first', 'drop' or 'cycle', got {exhausted:?}"
            ))
        })?;
        let sound = segments.first().is_some_and(|s| s.0 == 0)
            && segments.windows(2).all(|w| w[0].0 < w[1].0)
            && segments
                .iter()
                .all(|s| s.1.len() == lens.len() && s.1.iter().all(|w| w.is_finite() && *w >= 0.0));
        if !sound || batch == 0 || world == 0 || rank >= world || (replacement && lens.contains(&0))
        {
            return Err(Class::Config.err(
                "mixture: weights must be one finite, non-negative number per source, in \
             segments starting at 0; batch >= 1, 0 <= rank < world_size; with replacement \
             no source may be empty",
            ));
        }
        let shards = shards.unwrap_or_else(|| vec![None; lens.len()]);
        let shards_sound = shards.len() == lens.len()
            && shards
                .iter()
                .zip(&lens)
                .all(|(s, &l)| s.as_ref().is_none_or(|s| s.iter().sum::<u64>() == l));
        if !shards_sound {
            return Err(Class::Config
                .err("mixture: a sharded source's shard lengths must add up to its length"));
        }
        let mix = Mix {
            lens: lens.clone(),
            shards,
            replacement,
            exhausted,
            num_samples,
        };
        let segments: Vec<Segment> = segments
            .into_iter()
            .map(|(start, weights)| Segment { start, weights })
            .collect();
        let draws = mixture_draws(&mix, root, &segments);
        let mut offsets = Vec::with_capacity(lens.len());
        let mut acc = 0i64;
        for &l in &lens {
            offsets.push(acc);
            acc += l as i64;
        }
        let n = draws.len() as u64;
        let positions = elastic_positions(n, start, batch, world, rank, tail);
        let out = positions
            .iter()
            .map(|&p| {
                let (s, i) = draws[p as usize];
                offsets[s as usize] + i as i64
            })
            .collect();
        let reach = first_reach(&mix.shards, positions.iter().map(|&p| draws[p as usize]));
        Ok((n, out, reach))
    })
}

/// The shards `(source, shard)` of the sharded sources (`shards[s]`: its
/// shards' lengths, laid end to end) in the order `draws` first reach them.
fn first_reach(
    shards: &[Option<Vec<u64>>],
    draws: impl Iterator<Item = (u32, u64)>,
) -> Vec<ShardRef> {
    let ends: Vec<Option<Vec<u64>>> = shards
        .iter()
        .map(|lens| {
            lens.as_ref().map(|lens| {
                lens.iter()
                    .scan(0u64, |acc, &l| {
                        *acc += l;
                        Some(*acc)
                    })
                    .collect()
            })
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (s, i) in draws {
        if let Some(ends) = &ends[s as usize] {
            let k = ends.partition_point(|&end| end <= i);
            if seen.insert((s, k)) {
                out.push((s, k));
            }
        }
    }
    out
}
