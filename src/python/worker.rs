//! The worker process's Python side: a [`Host`] that calls the dataset and
//! collate and encodes batches; the protocol around it is
//! `crate::worker::serve` (the lifecycle is drawn there).

use std::collections::HashMap;

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use pyo3::{PyTraverseError, PyVisit};

use super::codec::encode_batch;
use super::collate::Sink;
use super::error::Class;
use super::fetch::{Fetcher, TableArg};
use super::ffi::adopt_fd;
use super::shards::{missing, PyShards, ShardsArg};
use super::torch::torch;
use crate::sampler::shards::Blocks;
use crate::wire::protocol::{LanePos, TaskIndices, Work};
use crate::worker::lanes::{BlockReader, Lane, LaneConfig, Pull, ShardSource};
use crate::worker::{serve, Blocking, Config, Host, Records, Reply};

/// A sharded dataset in this worker: its shards, this epoch's lanes, and
/// the reader of elastic sharding's addresses.
struct Sharded {
    src: PyShards,
    /// Items per batch (`None`: not batched).
    batch: Option<usize>,
    drop_last: bool,
    lanes: HashMap<u32, Lane<PyShards>>,
    reader: BlockReader<PyShards>,
    /// The lane of the batch just made, and where it stands.
    last: Option<(u32, LanePos)>,
}

/// What a lane's task produced.
enum LaneOut<'py> {
    Batch(Bound<'py, PyAny>),
    NeedWork(u32),
    Tail(Vec<Work>),
    Exhausted,
}

/// What a worker reads to send its replica's state: `current` is the
/// list `[iterator, whether it has state methods]` that the replica's
/// `make_iter` keeps up to date (an iterable), `dataset_stateful` whether
/// the dataset has state methods. A dict of these keys.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct ReplicaState {
    current: Py<PyList>,
    dataset_stateful: bool,
}

struct PyHost<'py> {
    py: Python<'py>,
    parts: Parts,
}

/// A worker host's state, apart from the interpreter token it is used with.
struct Parts {
    fetcher: Fetcher,
    iterable: bool,
    auto_collation: bool,
    drop_last: bool,
    make_iter: Py<PyAny>,
    wrap_exception: Py<PyAny>,
    iterator: Option<Py<PyAny>>,
    /// `worker_init_fn` raised: the first task answers with this.
    init_exception: Option<Vec<u8>>,
    ended: bool,
    epochs: usize,
    /// Called at the start of every epoch (per-sample seeding's epoch count).
    on_epoch: Option<Py<PyAny>>,
    /// A replica whose state travels with each batch (for snapshots).
    replica: Option<ReplicaState>,
    /// Nothing in the replica keeps a state this epoch: what keeps state is
    /// fixed for an epoch, so it is not asked again until the next.
    stateless_epoch: bool,
    sharded: Option<Sharded>,
    /// Stage timings since the last report.
    times: crate::stats::StageTimes,
}

impl std::ops::Deref for PyHost<'_> {
    type Target = Parts;
    fn deref(&self) -> &Parts {
        &self.parts
    }
}

impl std::ops::DerefMut for PyHost<'_> {
    fn deref_mut(&mut self) -> &mut Parts {
        &mut self.parts
    }
}

impl Blocking for PyHost<'_> {
    fn blocking<R: Send>(&mut self, f: impl FnOnce() -> R + Send) -> R {
        self.py.detach(f)
    }
}

impl<'py> PyHost<'py> {
    /// The user's exception as a pickled `ExceptionWrapper`.
    fn wrap(&self, e: PyErr) -> PyResult<Vec<u8>> {
        let wrapped = self
            .wrap_exception
            .bind(self.py)
            .call1((e.into_value(self.py),))?;
        Ok(wrapped.cast_into::<PyBytes>()?.as_bytes().to_vec())
    }

    /// Fetch and collate one task. `Ok(None)`: the replica is exhausted.
    fn fetch(&mut self, indices: TaskIndices) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = self.py;
        match indices {
            TaskIndices::Ints(v) => self.fetcher.batch_from_ints(py, &v).map(Some),
            TaskIndices::Int(i) => self
                .fetcher
                .sample(py, i.into_pyobject(py)?.into_any())
                .map(Some),
            TaskIndices::Pickled(b) => {
                let obj = torch(py)?.loads.bind(py).call1((PyBytes::new(py, &b),))?;
                if self.auto_collation {
                    self.fetcher.batch_from_obj(py, obj).map(Some)
                } else {
                    self.fetcher.sample(py, obj).map(Some)
                }
            }
            TaskIndices::Lane(_) | TaskIndices::Addresses(_) => {
                Err(Class::Internal.err("shard tasks are not fetched here"))
            }
            TaskIndices::Iterable(n) => {
                let it = self
                    .iterator
                    .as_ref()
                    .ok_or_else(|| Class::Internal.err("no dataset iterator"))?
                    .bind(py)
                    .clone();
                let mut ended = self.ended;
                let out = self.fetcher.batch_from_iterator(
                    py,
                    &it,
                    n.map(|n| n as usize),
                    self.drop_last,
                    &mut ended,
                );
                self.ended = ended;
                out
            }
        }
    }
}

impl<'py> PyHost<'py> {
    fn sharded(&mut self) -> PyResult<&mut Sharded> {
        self.sharded
            .as_mut()
            .ok_or_else(|| Class::Protocol.err("a shard task for a dataset that is not sharded"))
    }

    /// The batch of `items`: collated as a list, or the one item as is.
    fn collate_items(&self, items: Vec<Py<PyAny>>, batched: bool) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        if batched {
            return self.fetcher.collate(py, PyList::new(py, items)?.into_any());
        }
        let item = items
            .into_iter()
            .next()
            .ok_or_else(|| Class::Internal.err("an empty unbatched pull"))?;
        self.fetcher.collate(py, item.into_bound(py))
    }

    /// Lane `l`'s next batch.
    fn lane_batch(&mut self, l: u32) -> PyResult<LaneOut<'py>> {
        let sh = self.sharded()?;
        let batched = sh.batch.is_some();
        let lane = sh
            .lanes
            .get_mut(&l)
            .ok_or_else(|| Class::Protocol.err(format!("lane {l} is not this worker's")))?;
        match lane.pull(&mut sh.src)? {
            Pull::Batch(items) => {
                if sh.src.short_of_room() {
                    lane.let_go();
                }
                sh.last = lane.pos().map(|p| (l, p));
                self.collate_items(items, batched).map(LaneOut::Batch)
            }
            Pull::NeedWork => Ok(LaneOut::NeedWork(lane.given())),
            Pull::HandedBack(works) => Ok(LaneOut::Tail(works)),
            Pull::Exhausted => Ok(LaneOut::Exhausted),
        }
    }

    /// The items at `addresses` (elastic sharding), collated.
    fn address_batch(&mut self, addresses: &[(u32, u64)]) -> PyResult<Bound<'py, PyAny>> {
        let sh = self.sharded()?;
        let batched = sh.batch.is_some();
        let items = sh.reader.read(&mut sh.src, addresses, missing)?;
        self.collate_items(items, batched)
    }
}

impl Host for PyHost<'_> {
    type Error = PyErr;

    fn lanes(&mut self, lanes: Vec<u32>, shuffle: bool, block: u64, root: u64) {
        if let Some(sh) = &mut self.sharded {
            let config = LaneConfig {
                batch: sh.batch,
                drop_last: sh.drop_last,
                blocks: shuffle.then_some(Blocks { root, size: block }),
            };
            sh.lanes = lanes.into_iter().map(|l| (l, Lane::new(config))).collect();
            sh.reader = BlockReader::new(block);
        }
    }

    fn assign(&mut self, lane: u32, works: Vec<Work>, last: bool) {
        // a lane that is not this worker's fails its first task instead
        if let Some(lane) = self.sharded.as_mut().and_then(|s| s.lanes.get_mut(&lane)) {
            lane.assign(works, last);
        }
    }

    fn hand_back(&mut self, lane: u32) {
        if let Some(lane) = self.sharded.as_mut().and_then(|s| s.lanes.get_mut(&lane)) {
            lane.hand_back();
        }
    }

    fn lane_after_batch(&mut self) -> Option<(u32, LanePos)> {
        self.sharded.as_mut().and_then(|s| s.last.take())
    }

    fn take_times(&mut self) -> crate::stats::StageTimes {
        std::mem::take(&mut self.times)
    }

    fn start_epoch(&mut self) {
        let first = self.epochs == 0;
        self.stateless_epoch = false;
        self.epochs += 1;
        if let Some(sh) = &mut self.sharded {
            // the epoch's lanes arrive in a `Lanes` message
            sh.lanes.clear();
            sh.reader.clear();
            sh.last = None;
        }
        if let Some(f) = &self.on_epoch {
            if let Err(e) = f.bind(self.py).call0() {
                self.init_exception = self.wrap(e).ok();
                return;
            }
        }
        // A failed `worker_init_fn` is reported by the first task instead.
        if !self.iterable || self.sharded.is_some() || (first && self.init_exception.is_some()) {
            return;
        }
        self.ended = false;
        match self.make_iter.bind(self.py).call0() {
            Ok(it) => self.iterator = Some(it.unbind()),
            Err(e) => self.init_exception = self.wrap(e).ok(),
        }
    }

    fn setup_error(&self) -> Option<Vec<u8>> {
        self.init_exception.clone()
    }

    fn state_after_batch(&mut self) -> PyResult<Option<Vec<u8>>> {
        let Some(replica) = self.replica.as_ref().filter(|_| !self.stateless_epoch) else {
            return Ok(None);
        };
        let py = self.py;
        let dataset = self.fetcher.dataset.bind(py);
        // torchdata's layout: {"dataset": ..., "iterator": ...}, the
        // dataset's taken first; an iterator that is the dataset itself is
        // saved once, as the iterator
        let (own, it) = if self.iterable {
            let current = replica.current.bind(py);
            let it = current.get_item(0)?;
            let it_stateful: bool = current.get_item(1)?.extract()?;
            let own = replica.dataset_stateful && !it.is(dataset);
            if !(own || it_stateful) {
                self.stateless_epoch = true;
                return Ok(None);
            }
            (own, it_stateful.then_some(it))
        } else {
            (true, None)
        };
        let state = pyo3::types::PyDict::new(py);
        let ds = match own {
            true => Some(dataset.call_method0(pyo3::intern!(py, "state_dict"))?),
            false => None,
        };
        state.set_item("dataset", ds)?;
        let its = match it {
            Some(it) => Some(it.call_method0(pyo3::intern!(py, "state_dict"))?),
            None => None,
        };
        state.set_item("iterator", its)?;
        let bytes = torch(py)?.dumps.bind(py).call1((state,))?;
        Ok(Some(bytes.cast_into::<PyBytes>()?.as_bytes().to_vec()))
    }

    fn run(&mut self, indices: TaskIndices, records: &mut Records) -> PyResult<Reply> {
        // a panic is this task's InternalError, re-raised in the main
        // process, not a worker that dies without a word
        let (reply, panicked) =
            super::error::guard_panic("a worker's task", || self.run_task(indices, records));
        match reply {
            Err(e) if panicked => Ok(Reply::Failed(self.wrap(e)?)),
            other => other,
        }
    }
}

impl PyHost<'_> {
    /// One task (`Host::run`'s work, guarded there).
    fn run_task(&mut self, indices: TaskIndices, records: &mut Records) -> PyResult<Reply> {
        if let Some(payload) = self.init_exception.take() {
            return Ok(Reply::Failed(payload));
        }
        let py = self.py;
        let t0 = std::time::Instant::now();
        let fetched = match indices {
            TaskIndices::Lane(l) => match self.lane_batch(l) {
                Ok(LaneOut::NeedWork(given)) => return Ok(Reply::NeedWork { lane: l, given }),
                Ok(LaneOut::Tail(works)) => return Ok(Reply::Tail { lane: l, works }),
                Ok(LaneOut::Batch(b)) => Ok(Some(b)),
                Ok(LaneOut::Exhausted) => Ok(None),
                Err(e) => Err(e),
            },
            TaskIndices::Addresses(a) => self.address_batch(&a).map(Some),
            other => self.fetch(other),
        };
        let fetch_and_collate = crate::stats::since(t0);
        let collate = self.fetcher.take_collate_ns();
        self.times.collate += collate;
        self.times.fetch += fetch_and_collate.saturating_sub(collate);
        let t1 = std::time::Instant::now();
        let outcome = fetched.and_then(|b| b.map(|b| encode_batch(py, &b, records)).transpose());
        if matches!(outcome, Ok(Some(_))) {
            self.times.transfer += crate::stats::since(t1);
            self.times.batches += 1;
        }
        match outcome {
            Ok(Some(record)) => Ok(Reply::Batch(record)),
            Ok(None) if self.iterable => Ok(Reply::Exhausted),
            Ok(None) => Err(Class::Internal.err("map-style fetch ended")),
            Err(e) if self.iterable && e.is_instance_of::<PyStopIteration>(py) => {
                Ok(Reply::Exhausted)
            }
            // torch's worker wraps `Exception`s only: `SystemExit`,
            // `KeyboardInterrupt` and the like end the worker, and the main
            // process reports its exit (a `RuntimeError`), as torch does.
            Err(e) if !e.is_instance_of::<pyo3::exceptions::PyException>(py) => Err(e),
            Err(e) => Ok(Reply::Failed(self.wrap(e)?)),
        }
    }
}

/// What a worker serves with: one object across the boundary, a dict of
/// these keys (built by `ferroloader.hosts.entry`), each as Python set it up.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct WorkerSpec {
    dataset: Py<PyAny>,
    iterable: bool,
    auto_collation: bool,
    drop_last: bool,
    collate_fn: Option<Py<PyAny>>,
    getitems: Option<Py<PyAny>>,
    tensors: Option<Vec<Py<PyAny>>>,
    main_pid: i32,
    shm_initial: usize,
    shm_limit: usize,
    prefetch_factor: usize,
    make_iter: Py<PyAny>,
    wrap_exception: Py<PyAny>,
    init_exception: Option<Vec<u8>>,
    on_epoch: Option<Py<PyAny>>,
    replica: Option<ReplicaState>,
    sharded: Option<ShardsArg>,
    batch_size: Option<usize>,
    table: Option<TableArg>,
    trim: bool,
}

/// Serves tasks until the main process says stop or goes away.
#[pyfunction]
pub fn worker_loop(py: Python<'_>, fd: i32, spec: WorkerSpec) -> PyResult<()> {
    let fd = adopt_fd(fd)?;
    let (mut host, config) = host_from_spec(py, spec)?;
    serve(&mut host, fd, config)
}

/// A worker's host and arena settings from its spec (a worker process's
/// or thread's, and a remote actor's: `super::relay::ActorHost`).
fn host_from_spec(py: Python<'_>, spec: WorkerSpec) -> PyResult<(PyHost<'_>, Config)> {
    let WorkerSpec {
        dataset,
        iterable,
        auto_collation,
        drop_last,
        collate_fn,
        getitems,
        tensors,
        main_pid,
        shm_initial,
        shm_limit,
        prefetch_factor,
        make_iter,
        wrap_exception,
        init_exception,
        on_epoch,
        replica,
        sharded,
        batch_size,
        table,
        trim,
    } = spec;
    let fetcher = Fetcher::new(
        py,
        dataset,
        getitems,
        tensors,
        collate_fn,
        Sink::Deferred,
        table,
    )?;
    let host = PyHost {
        py,
        parts: Parts {
            fetcher,
            iterable,
            auto_collation,
            drop_last,
            make_iter,
            wrap_exception,
            iterator: None,
            init_exception,
            ended: false,
            epochs: 0,
            on_epoch,
            replica,
            stateless_epoch: false,
            sharded: sharded.map(|arg| Sharded {
                src: PyShards::new(arg),
                batch: batch_size.filter(|_| auto_collation),
                drop_last,
                lanes: HashMap::new(),
                reader: BlockReader::new(1),
                last: None,
            }),
            times: Default::default(),
        },
    };
    let config = Config {
        main_pid,
        shm_initial,
        shm_limit,
        prefetch_factor,
        trim,
    };
    Ok((host, config))
}

/// A worker host kept between calls from Python (a remote actor's): its
/// parts, and the host rebuilt over them for each call.
pub struct ParkedHost {
    parts: Option<Parts>,
    pub config: Config,
}

impl ParkedHost {
    pub fn new(py: Python<'_>, spec: WorkerSpec) -> PyResult<ParkedHost> {
        let (host, config) = host_from_spec(py, spec)?;
        Ok(ParkedHost {
            parts: Some(host.parts),
            config,
        })
    }

    /// Runs `f` over the host (the parts go back afterwards, also when `f`
    /// fails).
    pub fn with<R>(&mut self, py: Python<'_>, f: impl FnOnce(&mut dyn HostCalls) -> R) -> R {
        let parts = self.parts.take().expect("parked between calls");
        let mut host = PyHost { py, parts };
        let out = f(&mut host);
        self.parts = Some(host.parts);
        out
    }

    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.parts {
            Some(p) => {
                visit.call(&p.make_iter)?;
                visit.call(&p.wrap_exception)?;
                visit.call(&p.iterator)?;
                visit.call(&p.on_epoch)
            }
            None => Ok(()),
        }
    }
}

/// What a remote actor asks of its host: `Host`'s calls, object-safe.
pub trait HostCalls {
    fn start_epoch(&mut self);
    fn setup_error(&self) -> Option<Vec<u8>>;
    fn run(&mut self, indices: TaskIndices, records: &mut Records) -> PyResult<Reply>;
    fn state_after_batch(&mut self) -> PyResult<Option<Vec<u8>>>;
    fn lanes(&mut self, lanes: Vec<u32>, shuffle: bool, block: u64, root: u64);
    fn assign(&mut self, lane: u32, works: Vec<Work>, last: bool);
    fn hand_back(&mut self, lane: u32);
    fn lane_after_batch(&mut self) -> Option<(u32, LanePos)>;
    fn take_times(&mut self) -> crate::stats::StageTimes;
}

impl HostCalls for PyHost<'_> {
    fn start_epoch(&mut self) {
        Host::start_epoch(self)
    }
    fn setup_error(&self) -> Option<Vec<u8>> {
        Host::setup_error(self)
    }
    fn run(&mut self, indices: TaskIndices, records: &mut Records) -> PyResult<Reply> {
        Host::run(self, indices, records)
    }
    fn state_after_batch(&mut self) -> PyResult<Option<Vec<u8>>> {
        Host::state_after_batch(self)
    }
    fn lanes(&mut self, lanes: Vec<u32>, shuffle: bool, block: u64, root: u64) {
        Host::lanes(self, lanes, shuffle, block, root)
    }
    fn assign(&mut self, lane: u32, works: Vec<Work>, last: bool) {
        Host::assign(self, lane, works, last)
    }
    fn hand_back(&mut self, lane: u32) {
        Host::hand_back(self, lane)
    }
    fn lane_after_batch(&mut self) -> Option<(u32, LanePos)> {
        Host::lane_after_batch(self)
    }
    fn take_times(&mut self) -> crate::stats::StageTimes {
        Host::take_times(self)
    }
}
