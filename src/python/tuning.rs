//! The tuner's model and policy for Python (`ferroloader.tuning`): layouts
//! cross as `(num_workers, worker_method, worker_threads, prefetch_factor)`
//! tuples, intervals as the fields of `tuning.estimate.Measurement`. The
//! loader measures and applies in Python; the decisions are made here.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::tuning::climb::{Bounds, Climb, Interval};
use crate::tuning::policy::{Context, Measurement, Policy};
use crate::tuning::sim::{self, Job, Machine, Timing};
use crate::tuning::{self, Costs, Layout};

type LayoutTuple = (u32, String, u32, u32);

fn layout((num_workers, method, worker_threads, prefetch_factor): LayoutTuple) -> PyResult<Layout> {
    let thread = match method.as_str() {
        "thread" => true,
        "multiprocessing" => false,
        other => {
            return Err(PyValueError::new_err(format!(
                "the tuner's layouts run in processes or threads, not {other:?}"
            )))
        }
    };
    Ok(Layout {
        num_workers,
        thread,
        worker_threads,
        prefetch_factor,
    })
}

fn tuple(l: Layout) -> LayoutTuple {
    let method = if l.thread {
        "thread"
    } else {
        "multiprocessing"
    };
    (
        l.num_workers,
        method.to_string(),
        l.worker_threads,
        l.prefetch_factor,
    )
}

/// `tuning.estimate.Measurement`'s fields (its layout as a tuple).
#[derive(FromPyObject)]
pub struct MeasurementArgs {
    #[pyo3(attribute("layout"), from_py_with = layout_of)]
    layout: Layout,
    wall: f64,
    batches: i64,
    samples: i64,
    wait: f64,
    loop_cpu: f64,
    cpu: f64,
    fetch: f64,
    memory: i64,
    start: f64,
    epoch_end: bool,
}

fn layout_of(obj: &Bound<'_, PyAny>) -> PyResult<Layout> {
    layout((
        obj.getattr("num_workers")?.extract()?,
        obj.getattr("worker_method")?.extract()?,
        obj.getattr("worker_threads")?.extract()?,
        obj.getattr("prefetch_factor")?.extract()?,
    ))
}

fn measurement(m: MeasurementArgs) -> Measurement {
    // (a count of none or fewer is no interval: the policy skips it)
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Measurement {
        layout: m.layout,
        wall: m.wall,
        batches: count(m.batches),
        samples: count(m.samples),
        wait: m.wait,
        loop_cpu: m.loop_cpu,
        cpu: m.cpu,
        fetch: m.fetch,
        memory: count(m.memory),
        start: m.start,
        epoch_end: m.epoch_end,
    }
}

/// An interval as `tuning.estimate.Measurement`'s fields, its layout a tuple.
type MeasurementTuple = (
    LayoutTuple,
    f64,
    u64,
    u64,
    f64,
    f64,
    f64,
    f64,
    u64,
    f64,
    bool,
);

/// `tuning.policy.Policy`'s engine: a pure state machine over intervals.
#[pyclass(name = "TunePolicy", module = "ferroloader._core")]
pub struct TunePolicy {
    inner: Policy,
}

#[pymethods]
impl TunePolicy {
    #[new]
    fn new(#[pyo3(from_py_with = context_of)] ctx: Context, layout: LayoutTuple) -> PyResult<Self> {
        Ok(TunePolicy {
            inner: Policy::new(ctx, self::layout(layout)?),
        })
    }

    /// One interval (a `Measurement`) in: `(layout, why)` or `None`.
    fn observe(&mut self, m: MeasurementArgs) -> Option<(LayoutTuple, String)> {
        let decision = self.inner.observe(measurement(m));
        decision.map(|(l, why)| (tuple(l), why))
    }

    #[getter]
    fn settled(&self) -> bool {
        self.inner.settled
    }

    #[getter]
    fn gil(&self) -> f64 {
        self.inner.gil
    }

    #[getter]
    fn changes(&self) -> u32 {
        self.inner.changes
    }

    #[getter]
    fn layout(&self) -> LayoutTuple {
        tuple(self.inner.layout)
    }

    /// The intervals kept of each layout, in the order first measured.
    fn seen(&self) -> Vec<(LayoutTuple, Vec<MeasurementTuple>)> {
        self.inner
            .seen
            .iter()
            .map(|(l, ms)| (tuple(*l), ms.iter().map(measurement_tuple).collect()))
            .collect()
    }

    fn need(&self, layout: LayoutTuple) -> PyResult<f64> {
        Ok(self.inner.need(&self::layout(layout)?))
    }

    fn fits(&self, layout: LayoutTuple) -> PyResult<bool> {
        Ok(self.inner.fits(&self::layout(layout)?))
    }

    /// `layout`'s predicted rate (samples per second), as corrected by
    /// what was measured.
    fn predict(&mut self, layout: LayoutTuple) -> PyResult<f64> {
        Ok(self.inner.predict(&self::layout(layout)?, &[]))
    }
}

/// The climbing policy's state (`tuning.climb.Tuner`).
#[pyclass(name = "ClimbPolicy", module = "ferroloader._core")]
pub struct ClimbPolicy {
    inner: Climb,
}

/// A climb's step as Python takes it: the next layout and why (or
/// `None`), a note (or `None`), lines to log.
type ClimbStep = (Option<(LayoutTuple, String)>, Option<String>, Vec<String>);

/// What bounds the climb, as `tuning.climb.Tuner` holds it: `(max_workers,
/// cpu, ram, per_process, arena, processes, threads, inner, cores,
/// mid_epoch)`.
type BoundsTuple<'py> = (
    u32,
    Option<Bound<'py, PyAny>>,
    f64,
    f64,
    f64,
    bool,
    bool,
    bool,
    f64,
    bool,
);

#[pymethods]
impl ClimbPolicy {
    /// `prefetch`: whether a deeper prefetch may be tried once.
    #[new]
    fn new(prefetch: bool) -> Self {
        ClimbPolicy {
            inner: Climb::new(prefetch),
        }
    }

    /// Settled: it only watches for the loop waiting much more (the
    /// loader also settles it, on memory near the budget or a failed start).
    #[getter]
    fn settled(&self) -> bool {
        self.inner.settled
    }

    #[setter]
    fn set_settled(&mut self, settled: bool) {
        self.inner.settled = settled;
    }

    /// An interval `(batches, wall, wait, cpu)` on `layout`: `(the next
    /// layout and why or None, a note or None, lines to log)`.
    fn observe(
        &mut self,
        m: (f64, f64, f64, f64),
        layout: LayoutTuple,
        settled_wait: Option<f64>,
        bounds: BoundsTuple<'_>,
    ) -> PyResult<ClimbStep> {
        let (
            max_workers,
            cpu,
            ram,
            per_process,
            arena,
            processes,
            threads,
            inner,
            cores,
            mid_epoch,
        ) = bounds;
        let cpu = match cpu {
            Some(c) => Some((c.extract::<f64>()?, c.str()?.extract::<String>()?)),
            None => None,
        };
        let b = Bounds {
            max_workers,
            cpu,
            ram,
            per_process,
            arena,
            processes,
            threads,
            inner,
            cores,
            mid_epoch,
        };
        let m = Interval {
            batches: m.0,
            wall: m.1,
            wait: m.2,
            cpu: m.3,
        };
        let step = self
            .inner
            .observe(m, self::layout(layout)?, settled_wait, &b);
        Ok((
            step.next.map(|(l, why)| (tuple(l), why)),
            step.note,
            step.said,
        ))
    }
}

fn context_of(obj: &Bound<'_, PyAny>) -> PyResult<Context> {
    Ok(Context {
        cores: obj.getattr("cores")?.extract()?,
        max_workers: obj.getattr("max_workers")?.extract()?,
        ram: obj.getattr("ram")?.extract()?,
        per_process: obj.getattr("per_process")?.extract()?,
        per_worker: obj.getattr("per_worker")?.extract()?,
        cpu: obj.getattr("cpu")?.extract()?,
        processes: obj.getattr("processes")?.is_truthy()?,
        threads: obj.getattr("threads")?.is_truthy()?,
        inner: obj.getattr("inner")?.is_truthy()?,
        min_workers: obj.getattr("min_workers")?.extract()?,
        batch: obj.getattr("batch")?.extract()?,
        mid_epoch: obj.getattr("mid_epoch")?.is_truthy()?,
    })
}

/// The rates that bound `layout`, from costs per sample (`tuning.estimate.bounds`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn tune_bounds(
    cpu: f64,
    wait: f64,
    moving: f64,
    gil: f64,
    step: f64,
    batch: f64,
    cores: f64,
    layout: LayoutTuple,
) -> PyResult<Vec<f64>> {
    let costs = Costs {
        cpu,
        wait,
        moving,
        gil,
        step,
        batch,
        cores,
    };
    Ok(tuning::bounds(&costs, &self::layout(layout)?))
}

/// The soft minimum of `bounds` at `sharpness`.
#[pyfunction]
pub fn tune_soft_min(bounds: Vec<f64>, sharpness: f64) -> f64 {
    tuning::soft_min(&bounds, sharpness)
}

/// The layouts a tuner may pick with at most `cap` workers.
#[pyfunction]
pub fn tune_candidates(cap: u32, processes: bool, threads: bool, inner: bool) -> Vec<LayoutTuple> {
    tuning::candidates(cap, processes, threads, inner)
        .into_iter()
        .map(tuple)
        .collect()
}

/// `(ratio, weight)` pairs' mean, moved towards 1 past the noise.
#[pyfunction]
pub fn tune_past_noise(ratios: Vec<(f64, f64)>) -> f64 {
    tuning::past_noise(&ratios)
}

/// `tuning.model.Job`'s fields.
#[derive(FromPyObject)]
pub struct JobArgs {
    cpu: f64,
    wait: f64,
    bytes: f64,
    gil: f64,
    mem: f64,
    start: f64,
    per_byte: f64,
    step: f64,
    batch: u32,
    noise: f64,
}

impl From<JobArgs> for Job {
    fn from(j: JobArgs) -> Job {
        Job {
            cpu: j.cpu,
            wait: j.wait,
            bytes: j.bytes,
            gil: j.gil,
            mem: j.mem,
            start: j.start,
            per_byte: j.per_byte,
            step: j.step,
            batch: j.batch,
            noise: j.noise,
        }
    }
}

/// `tuning.model.Machine`'s fields.
#[derive(FromPyObject)]
pub struct MachineArgs {
    cores: u32,
    ram: f64,
    max_workers: u32,
    shape: String,
}

impl TryFrom<MachineArgs> for Machine {
    type Error = PyErr;

    fn try_from(m: MachineArgs) -> PyResult<Machine> {
        let shape = sim::SHAPES
            .iter()
            .find(|(name, _)| *name == m.shape)
            .map(|(_, shape)| *shape)
            .ok_or_else(|| {
                let names: Vec<&str> = sim::SHAPES.iter().map(|(n, _)| *n).collect();
                PyValueError::new_err(format!(
                    "Machine(shape={:?}): not a machine shape; the shapes are {}",
                    m.shape,
                    names.join(", ")
                ))
            })?;
        Ok(Machine {
            cores: m.cores,
            ram: m.ram,
            max_workers: m.max_workers,
            shape,
        })
    }
}

/// A job as `tuning.model.Job`'s fields in order.
type JobTuple = (f64, f64, f64, f64, f64, f64, f64, f64, u32, f64);

fn job_tuple(j: &Job) -> JobTuple {
    (
        j.cpu, j.wait, j.bytes, j.gil, j.mem, j.start, j.per_byte, j.step, j.batch, j.noise,
    )
}

fn measurement_tuple(m: &Measurement) -> MeasurementTuple {
    (
        tuple(m.layout),
        m.wall,
        m.batches,
        m.samples,
        m.wait,
        m.loop_cpu,
        m.cpu,
        m.fetch,
        m.memory,
        m.start,
        m.epoch_end,
    )
}

fn layouts(all: Vec<LayoutTuple>) -> PyResult<Vec<Layout>> {
    all.into_iter().map(layout).collect()
}

/// The model's rate of `layout` for a job on a machine (`tuning.model.rate`).
#[pyfunction]
pub fn tune_sim_rate(
    #[pyo3(from_py_with = job_of)] job: Job,
    #[pyo3(from_py_with = machine_of)] machine: Machine,
    layout: LayoutTuple,
) -> PyResult<f64> {
    Ok(sim::rate(&job, &machine, &self::layout(layout)?))
}

/// The fastest of `candidates` within the RAM budget, and its rate.
#[pyfunction]
pub fn tune_best(
    #[pyo3(from_py_with = job_of)] job: Job,
    #[pyo3(from_py_with = machine_of)] machine: Machine,
    candidates: Vec<LayoutTuple>,
    arena: f64,
) -> PyResult<(LayoutTuple, f64)> {
    let (top, rate) = sim::best(&job, &machine, &layouts(candidates)?, arena);
    Ok((tuple(top), rate))
}

/// `n` drawn (kind, job, cores and RAM) pairs (`tuning.model.draw`).
#[pyfunction]
pub fn tune_draw(n: usize, seed: u32) -> Vec<(&'static str, JobTuple, (u32, f64))> {
    sim::draw(n, seed)
        .iter()
        .map(|(kind, job, m)| (*kind, job_tuple(job), (m.cores, m.ram)))
        .collect()
}

/// A run's last layout against the model's best: `(best, its rate, the
/// ratio, the fewest workers within 0.95, the seconds to tell them)`.
#[pyfunction]
pub fn tune_outcome(
    #[pyo3(from_py_with = job_of)] job: Job,
    #[pyo3(from_py_with = machine_of)] machine: Machine,
    last: LayoutTuple,
) -> PyResult<(LayoutTuple, f64, f64, u32, f64)> {
    let (top, rate, ratio, fewest, telling) = sim::outcome(&job, &machine, &layout(last)?);
    Ok((tuple(top), rate, ratio, fewest, telling))
}

/// A simulated run (`tuning.model.simulate`): `decide` is called with each
/// interval (a `Measurement`'s fields) and returns a layout or `None`;
/// without it, the model-based policy for `context` decides, here.
/// Returns `(layouts with their times, settled at, peak memory, samples,
/// seconds)`.
#[pyfunction]
#[pyo3(signature = (job, machine, seed, start, seconds, arena, interval, stop_after, decide=None, context=None))]
#[allow(clippy::too_many_arguments)]
pub fn tune_simulate(
    #[pyo3(from_py_with = job_of)] job: Job,
    #[pyo3(from_py_with = machine_of)] machine: Machine,
    seed: u32,
    start: LayoutTuple,
    seconds: f64,
    arena: f64,
    interval: f64,
    stop_after: f64,
    decide: Option<&Bound<'_, PyAny>>,
    context: Option<&Bound<'_, PyAny>>,
) -> PyResult<SimRun> {
    let start = layout(start)?;
    let timing = Timing {
        seconds,
        arena,
        interval,
        stop_after,
    };
    let run = match (decide, context) {
        (Some(decide), _) => sim::simulate(
            |m| {
                let next = decide.call1((measurement_tuple(&m),))?;
                if next.is_none() {
                    Ok(None)
                } else {
                    layout_of(&next).map(Some)
                }
            },
            start,
            &job,
            &machine,
            seed,
            timing,
        )?,
        (None, Some(ctx)) => sim::run_policy(context_of(ctx)?, start, &job, &machine, seed, timing),
        (None, None) => {
            return Err(PyValueError::new_err(
                "tune_simulate needs a decide callable or a policy context",
            ))
        }
    };
    let layouts = run.layouts.iter().map(|(t, l)| (*t, tuple(*l))).collect();
    Ok((
        layouts,
        run.settled_at,
        run.peak_memory,
        run.samples,
        run.seconds,
    ))
}

type SimRun = (Vec<(f64, LayoutTuple)>, f64, f64, f64, f64);

fn job_of(obj: &Bound<'_, PyAny>) -> PyResult<Job> {
    Ok(obj.extract::<JobArgs>()?.into())
}

fn machine_of(obj: &Bound<'_, PyAny>) -> PyResult<Machine> {
    obj.extract::<MachineArgs>()?.try_into()
}
