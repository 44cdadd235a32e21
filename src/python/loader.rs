//! The single-process loader iterator: `_SingleProcessDataLoaderIter` with
//! index generation, fetch and default collate in one native `__next__`.

use pyo3::exceptions::PyUserWarning;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use pyo3::types::PyList;

use super::collate::Sink;
use super::fetch::{Fetcher, TableArg};
use super::indices::{Indices, Item};
use super::shards::{
    missing, snapshot_to_py, AddressBatches, PyShards, ShardPlan, ShardsArg, Snapshot,
};
use super::stats::{MainTimes, StatsTuple};
use super::turns::{with_mut, with_ref};
use crate::scheduler::{LaneSet, Resumed};
use crate::stats::StageTimes;
use crate::worker::lanes::BlockReader;

/// Where the next batch's indices (or samples) come from.
enum Source {
    Indices(Indices),
    /// An `IterableDataset` replica's iterator.
    Iterable {
        iter: Py<PyAny>,
        ended: bool,
    },
    /// A sharded dataset's lanes, round-robin.
    Lanes {
        set: Box<LaneSet<PyShards>>,
        src: PyShards,
    },
    /// A sharded dataset read by address (elastic sharding).
    Addresses {
        batches: Py<AddressBatches>,
        reader: BlockReader<PyShards>,
        src: PyShards,
    },
}

#[pyclass(subclass, module = "ferroloader._core")]
pub struct SingleProcessIter {
    source: Source,
    fetcher: Fetcher,
    auto_collation: bool,
    batch_size: usize,
    drop_last: bool,
    /// `(pin_memory_fn, device)` when batches are pinned.
    pin: Option<(Py<PyAny>, Py<PyAny>)>,
    index_sampler: Py<PyAny>,
    len_called: Option<usize>,
    num_yielded: usize,
    /// Batches (or samples) drawn from the index stream this epoch, failed
    /// ones included: where a snapshot resumes.
    num_drawn: usize,
    /// The epoch ran to its end.
    ended: bool,
    /// Per-sample seeding in this process: `save()` before each batch and
    /// `restore()` after it keep the user's global generators untouched.
    rng_guard: Option<Py<PyAny>>,
    /// Called once, just before the epoch's first index is drawn (the
    /// sampler draws its randomness then, as torch's does).
    first_draw: Option<Py<PyAny>>,
    /// Where a resumed epoch took up (the default: the epoch's start).
    resumed: Resumed,
    times: MainTimes,
    /// Fetch and collate, done here.
    local: StageTimes,
}

/// A resumed epoch as Python hands it over: `(drawn at the snapshot,
/// the batches then in flight in the order they are re-drawn, each
/// worker's (batches handed over, pickled replica state))`.
pub type ResumedArg = (u64, Vec<u64>, Vec<(u64, Option<Vec<u8>>)>);

pub fn resumed_from((start, kept, workers): ResumedArg) -> Resumed {
    Resumed {
        start,
        kept,
        workers,
    }
}

/// How an epoch's one-process iterator runs: one object across the
/// boundary, a dict of these keys (built by `ferroloader.run.iterators`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct SingleSpec {
    iterable: bool,
    getitems: Option<Py<PyAny>>,
    tensors: Option<Vec<Py<PyAny>>>,
    auto_collation: bool,
    batch_size: usize,
    drop_last: bool,
    collate_fn: Option<Py<PyAny>>,
    pin: Option<(Py<PyAny>, Py<PyAny>)>,
    index_sampler: Py<PyAny>,
    len_called: Option<usize>,
    rng_guard: Option<Py<PyAny>>,
    sharded: Option<ShardsArg>,
    plan: Option<Py<ShardPlan>>,
    block: u64,
    table: Option<TableArg>,
    resumed: Option<ResumedArg>,
}

#[pymethods]
impl SingleProcessIter {
    #[new]
    fn new(source: &Bound<'_, PyAny>, dataset: Py<PyAny>, spec: SingleSpec) -> PyResult<Self> {
        super::error::guard("the loader's iter()", move || {
            let SingleSpec {
                iterable,
                getitems,
                tensors,
                auto_collation,
                batch_size,
                drop_last,
                collate_fn,
                pin,
                index_sampler,
                len_called,
                rng_guard,
                sharded,
                plan,
                block,
                table,
                resumed,
            } = spec;
            let py = source.py();
            let shards = sharded.map(PyShards::new);
            let batch = auto_collation.then_some(batch_size);
            let source = match (shards, plan) {
                (Some(src), Some(plan)) => Source::Lanes {
                    set: {
                        let plan = plan.borrow(py);
                        Box::new(LaneSet::with_source(
                            plan.plan.clone(),
                            batch,
                            drop_last,
                            plan.work_source(py),
                        ))
                    },
                    src,
                },
                (Some(src), None) => Source::Addresses {
                    batches: source.cast::<AddressBatches>()?.clone().unbind(),
                    reader: BlockReader::new(block),
                    src,
                },
                _ if iterable => Source::Iterable {
                    iter: source.clone().unbind(),
                    ended: false,
                },
                _ => Source::Indices(Indices::of(source)),
            };
            let fetcher = Fetcher::new(
                py,
                dataset,
                getitems,
                tensors,
                collate_fn,
                Sink::InProcess,
                table,
            )?;
            Ok(SingleProcessIter {
                source,
                fetcher,
                auto_collation,
                batch_size,
                drop_last,
                pin,
                index_sampler,
                len_called,
                num_yielded: 0,
                num_drawn: 0,
                ended: false,
                rng_guard,
                first_draw: None,
                resumed: resumed.map(resumed_from).unwrap_or_default(),
                times: MainTimes::default(),
                local: StageTimes::default(),
            })
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.source {
            Source::Indices(i) => i.traverse(&visit)?,
            Source::Iterable { iter, .. } => visit.call(iter)?,
            Source::Lanes { set, src } => {
                src.traverse(&visit)?;
                let held = std::cell::RefCell::new(Vec::new());
                set.held(&mut |o| held.borrow_mut().push(o), &mut |o| {
                    held.borrow_mut().push(o)
                });
                for o in held.into_inner() {
                    visit.call(o)?;
                }
            }
            Source::Addresses {
                batches,
                reader,
                src,
            } => {
                visit.call(batches)?;
                src.traverse(&visit)?;
                for o in reader.cached() {
                    visit.call(o)?;
                }
            }
        }
        self.fetcher.traverse(&visit)?;
        if let Some((f, d)) = &self.pin {
            visit.call(f)?;
            visit.call(d)?;
        }
        visit.call(&self.rng_guard)?;
        visit.call(&self.first_draw)?;
        visit.call(&self.index_sampler)
    }

    /// `callback()` runs once, just before the first index is drawn.
    fn _on_first_draw(&mut self, callback: Py<PyAny>) {
        self.first_draw = Some(callback);
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        // (without borrowing: another thread's next() may hold the object)
        slf
    }

    fn __len__(slf: &Bound<'_, Self>) -> PyResult<usize> {
        let py = slf.py();
        with_ref(slf, "len()", |it| it.index_sampler.bind(py).len())?
    }

    fn __next__<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = slf.py();
        // (another thread inside next() may have released the GIL to run
        // the dataset: each thread gets the following batch in turn)
        with_mut(slf, "next()", |mut it| {
            super::error::guard("the one-process loader's next()", || it.next_batch(py))
        })
    }

    fn __getstate__(&self) -> PyResult<()> {
        Err(pyo3::exceptions::PyNotImplementedError::new_err(
            "SingleProcessIter cannot be pickled",
        ))
    }

    /// `(drawn, pending, ended, exhausted)` in the epoch's numbering (also
    /// after a resume): index-stream draws (failed batches included; for
    /// an iterable, batches handed over), those drawn but not handed over
    /// (batches in flight at a resumed snapshot, not yet re-drawn), whether
    /// the epoch is over, and whether an iterable's iterator has run out
    /// (its last batch may still have been handed over).
    #[getter]
    fn _position(slf: &Bound<'_, Self>) -> PyResult<(u64, Vec<u64>, bool, bool)> {
        with_ref(slf, "_position", |it| {
            let exhausted = matches!(it.source, Source::Iterable { ended: true, .. });
            // an iterable's (a sharded one's too) is counted in batches handed over
            let n = match it.source {
                Source::Indices(_) => it.num_drawn,
                _ => it.num_yielded,
            };
            let (drawn, pending) = it.resumed.position(n as u64, &[]);
            (drawn, pending, it.ended, exhausted)
        })
    }

    /// Stage timings (ns) since this iterator began: `(wait, decode, pin,
    /// loop, batches)` and one `(fetch, collate, transfer, batches)` for
    /// the work done here.
    #[getter]
    fn _stats(slf: &Bound<'_, Self>) -> PyResult<StatsTuple> {
        with_ref(slf, "_stats", |it| it.times.tuple(vec![it.local]))
    }

    /// A sharded epoch's position: `(positions, next_lane, handed, rest)`
    /// (see `crate::scheduler::shards::LaneSnapshot`); `None` otherwise.
    #[getter]
    fn _lane_snapshot(slf: &Bound<'_, Self>) -> PyResult<Option<Snapshot>> {
        with_ref(slf, "_lane_snapshot", |it| match &it.source {
            Source::Lanes { set, .. } => Some(snapshot_to_py(set.snapshot())),
            _ => None,
        })
    }
}

impl SingleProcessIter {
    /// One `__next__`, with the iterator borrowed.
    fn next_batch<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.times.enter();
        let t0 = std::time::Instant::now();
        let fetched = match &self.rng_guard {
            None => self.next_data(py),
            Some(guard) => {
                let guard = guard.clone_ref(py);
                guard.call_method0(py, pyo3::intern!(py, "save"))?;
                let out = self.next_data(py);
                guard.call_method0(py, pyo3::intern!(py, "restore"))?;
                out
            }
        };
        let spent = crate::stats::since(t0);
        let collate = self.fetcher.take_collate_ns();
        self.local.collate += collate;
        self.local.fetch += spent.saturating_sub(collate);
        self.times.wait += spent;
        let Some(mut data) = fetched? else {
            self.ended = true;
            return Ok(None);
        };
        self.local.batches += 1;
        if let Some((pin_fn, device)) = &self.pin {
            let t1 = std::time::Instant::now();
            data = pin_fn.bind(py).call1((data, device))?;
            self.times.pin += crate::stats::since(t1);
        }
        self.num_yielded += 1;
        self.times.leave();
        self.times
            .maybe_warn(py, std::slice::from_ref(&self.local))?;
        if let Source::Iterable { .. } = &self.source {
            warn_past_reported_len(
                py,
                self.fetcher.dataset.bind(py),
                self.len_called,
                self.num_yielded,
                false,
            )?;
        }
        Ok(Some(data))
    }

    fn next_data<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let items = match &mut self.source {
            Source::Lanes { set, src } => set.next_batch(src)?,
            Source::Addresses {
                batches,
                reader,
                src,
            } => {
                let next = batches.bind(py).borrow_mut().next_batch();
                match next {
                    Some(a) => Some(reader.read(src, &a, missing)?),
                    None => None,
                }
            }
            _ => return self.next_indexed(py),
        };
        let Some(items) = items else {
            return Ok(None);
        };
        self.num_drawn += 1;
        if self.auto_collation {
            let list = PyList::new(py, items)?.into_any();
            return self.fetcher.collate(py, list).map(Some);
        }
        let item = items.into_iter().next().map(|i| i.into_bound(py));
        match item {
            Some(item) => self.fetcher.collate(py, item).map(Some),
            None => Ok(None),
        }
    }

    fn next_indexed<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let indices = match &mut self.source {
            Source::Iterable { iter, ended } => {
                let batch = self.auto_collation.then_some(self.batch_size);
                return self.fetcher.batch_from_iterator(
                    py,
                    iter.bind(py),
                    batch,
                    self.drop_last,
                    ended,
                );
            }
            Source::Indices(indices) => indices,
            Source::Lanes { .. } | Source::Addresses { .. } => unreachable!("next_data"),
        };
        if let Some(callback) = self.first_draw.take() {
            callback.call0(py)?;
        }
        let Some(item) = indices.next(py)? else {
            return Ok(None);
        };
        self.num_drawn += 1;
        let data = match item {
            Item::Batch(v) => self.fetcher.batch_from_ints(py, &v)?,
            Item::Index(i) => self.fetcher.sample(py, i.into_pyobject(py)?.into_any())?,
            Item::Object(obj) if self.auto_collation => self.fetcher.batch_from_obj(py, obj)?,
            Item::Object(obj) => self.fetcher.sample(py, obj)?,
        };
        Ok(Some(data))
    }
}

/// torch's warning when an `IterableDataset` yields more batches than
/// `len(dataloader)` reported (`_BaseDataLoaderIter.__next__`).
pub fn warn_past_reported_len(
    py: Python<'_>,
    dataset: &Bound<'_, PyAny>,
    reported: Option<usize>,
    yielded: usize,
    multiprocess: bool,
) -> PyResult<()> {
    let Some(reported) = reported.filter(|&r| yielded > r) else {
        return Ok(());
    };
    let mut msg = format!(
        "Length of IterableDataset {} was reported to be {reported}(when accessing len(dataloader)), but {yielded} samples have been fetched. ",
        dataset.str()?
    );
    if multiprocess {
        msg.push_str("For multiprocessing data-loading, this could be caused by not properly configuring the IterableDataset replica at each worker. Please see https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.");
    }
    let category = py.get_type::<PyUserWarning>();
    PyErr::warn(py, &category, &std::ffi::CString::new(msg)?, 2)
}
