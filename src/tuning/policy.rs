//! `num_workers="auto"`'s decisions: a pure state machine. Each measured
//! interval goes in ([`Policy::observe`]); out comes a new layout and why,
//! or `None` to keep the one in force.
//!
//! From the intervals it estimates the job's costs per sample (the CPU and
//! the waiting of loading, measured in the main process; the workers' CPU;
//! the loop's own step and what taking a batch from a worker process costs
//! it; the GIL's share, where threads fall short) and predicts each
//! layout's rate with the model of [`super::bounds`]. It goes to the layout
//! with the fewest workers predicted within `1 - FEW` of the best that fits
//! the budgets (where the step hides the loading, within `1 - FED` of the
//! loop's rate), measures it, and corrects the predictions of the layouts
//! of its kind by what it measured. It decides every `MEASURE` intervals
//! and settles when the plan is not worth a change; once settled it moves
//! only for `SETTLED_GAIN`. A rate fallen far below the settled one starts
//! it over; the workers' memory over what was counted for them plans again.
//!
//! The model is fitted to what was measured ([`fit`]: the knee's
//! sharpness, a GIL's cost per thread), and where the layout in force
//! missed what the model predicted, its neighbours are measured rather
//! than predicted ([`explore`]): the model proposes, measurement decides.

use super::{
    bounds, candidates, mean_and_spread, next_count, past_noise, past_noise_within, py_max, py_min,
    soft_min, Avg, Costs, Kind, Layout, PerKind, NOISE_FLOOR, SHARPNESS,
};

mod explore;
mod fit;

const MEASURE: u32 = 2; // intervals on a layout before a decision
const FEW: f64 = 0.975; // the fewest workers within this share of the best
const FEW_EPOCHS: f64 = 0.9; // as many or fewer: kept within this, on short epochs
const FED: f64 = 0.985; // where the step hides the loading: of the loop's rate
const GAIN: f64 = 1.05; // a move to more workers must promise this much
const FEWER: f64 = 0.95; // where the loop is fed, a move to fewer workers must leave out 5 %
const SETTLED_GAIN: f64 = 1.1; // and once settled, any move
const MAX_CHANGES: u32 = 8;
const SETTLE_AFTER: u32 = 6; // intervals on a layout kept before it is settled on
const LONG: f64 = 8.0; // or seconds on a layout (slow batches make long intervals)
const DECIDE_AFTER: f64 = 10.0; // seconds on a layout: a decision, however few intervals
const EXPLORE: f64 = 45.0; // seconds of tuning, after which a settled layout is kept
const LATE_GAIN: f64 = 1.25; // unless a move promises this much
const REEXPLORE: f64 = 30.0; // seconds of tuning within which a settled layout's neighbours may be measured
/// The GIL's share of the CPU before threads ran.
pub const GIL_PRIOR: f64 = 0.25;
/// An interval under this share of its layout's median rate is a stall.
const SLOW: f64 = 0.5;
/// Workers per core past which those that only compute are not climbed to
/// (see `crowded`).
const CROWD: f64 = 2.0;
/// A worker busy this share of its time only computes.
const COMPUTES: f64 = 0.9;
/// The most workers the first worker layout starts (see `decide`).
const PROBE: u32 = 4;

/// One interval on `layout`: its seconds, the batches and samples the loop
/// got, the seconds the loop spent in `next()` and its thread's CPU there,
/// the workers' CPU seconds, the seconds spent in the dataset and the
/// collate (0 when not known), the workers' memory (0 when not read), the
/// seconds the change to this layout cost, and whether it is a whole epoch
/// shorter than an interval.
#[derive(Clone, Copy, Debug)]
pub struct Measurement {
    pub layout: Layout,
    pub wall: f64,
    pub batches: u64,
    pub samples: u64,
    pub wait: f64,
    pub loop_cpu: f64,
    pub cpu: f64,
    pub fetch: f64,
    pub memory: u64,
    pub start: f64,
    pub epoch_end: bool,
}

impl Measurement {
    pub fn rate(&self) -> f64 {
        if self.wall > 0.0 {
            self.samples as f64 / self.wall
        } else {
            0.0
        }
    }

    fn wait_share(&self) -> f64 {
        if self.wall > 0.0 {
            py_min(1.0, self.wait / self.wall)
        } else {
            0.0
        }
    }
}

/// What the policy knows before it measures: the cores, the budgets, each
/// worker process's memory at its worst and each worker's arena, the
/// methods allowed, the fewest workers, the batch size.
#[derive(Clone, Copy, Debug)]
pub struct Context {
    pub cores: f64,
    pub max_workers: u32,
    pub ram: f64,
    pub per_process: f64,
    pub per_worker: f64,
    pub cpu: Option<f64>,
    pub processes: bool,
    pub threads: bool,
    pub inner: bool,
    pub min_workers: u32,
    pub batch: u32,
    pub mid_epoch: bool,
}

fn measured(ms: &[Measurement]) -> f64 {
    let samples: u64 = ms.iter().map(|m| m.samples).sum();
    samples as f64 / ms.iter().fold(0.0, |acc, m| acc + m.wall)
}

/// Each interval's rate over `expected`, weighted by its seconds.
fn against(ms: &[Measurement], expected: f64) -> Vec<(f64, f64)> {
    ms.iter().map(|m| (m.rate() / expected, m.wall)).collect()
}

/// The share of the intervals' time the loop waited in `next()`.
fn waited(ms: &[Measurement]) -> f64 {
    ms.iter().fold(0.0, |a, m| a + m.wait) / ms.iter().fold(0.0, |a, m| a + m.wall)
}

/// Leaves out of a layout's intervals those slower than `SLOW` of their
/// median (a stall: a collection, a page-in, a neighbour's burst), which
/// say nothing of the layout and, kept, would move its rate and noise by
/// more than all the others.
fn prune(ms: &mut Vec<Measurement>) {
    if ms.len() < 2 {
        return;
    }
    let mut rates: Vec<f64> = ms.iter().map(Measurement::rate).collect();
    rates.sort_by(f64::total_cmp);
    // (of two, the faster: a stall is slow)
    let median = rates[rates.len() / 2];
    ms.retain(|m| m.rate() >= SLOW * median);
}

/// A decision: the layout to go to, and why.
pub type Decision = Option<(Layout, String)>;

/// See the module's documentation.
#[derive(Debug)]
pub struct Policy {
    ctx: Context,
    pub layout: Layout,
    pub settled: bool,
    /// The intervals measured on each layout, in the order first measured.
    pub seen: Vec<(Layout, Vec<Measurement>)>,
    pub changes: u32,
    pub per_process: f64,
    since: u32,     // intervals on the layout in force
    here: f64,      // seconds measured since the last decision
    in_force: f64,  // seconds measured on the layout in force
    fed: bool,      // the last plan: the step hides the loading
    tried: bool,    // the one trial before settling (see decide)
    gil_read: bool, // the GIL's share read from a shortfall, not assumed
    corrections: [Option<f64>; 3],
    // the job's costs (forget)
    cpu0: Avg,      // CPU per sample loading in the main process
    wait: Avg,      // waiting per sample
    step: Avg,      // the loop's own seconds per batch
    cpu_w: PerKind, // CPU per sample in workers, per kind
    moving: Avg,    // the loop's CPU per sample taken from worker processes
    pub gil: f64,
    settled_rate: f64,
    settled_gil: f64,
    low: u32,
    elapsed: f64, // seconds measured and changing since
    /// The knee's sharpness, fitted to what was measured (see `fit_knee`).
    pub sharp: f64,
    /// The cores the loading got when its rate fell (see `watch`): fewer
    /// than the machine's where a neighbour took some.
    cores_seen: Option<f64>,
    /// What each thread past the first that shares a GIL costs (see
    /// `fit_convoy`).
    pub convoy: f64,
    /// Climbing: the layout the one in force was climbed from (see
    /// `start_climb`), and the climbs made since the costs were learnt.
    climb_from: Option<Layout>,
    climbs: u32,
    tried_up: bool,
    tried_down: bool,
    tried_other: bool,
}

impl Policy {
    pub fn new(ctx: Context, layout: Layout) -> Self {
        let mut p = Policy {
            ctx,
            layout,
            settled: false,
            seen: Vec::new(),
            changes: 0,
            per_process: ctx.per_process,
            since: 0,
            here: 0.0,
            in_force: 0.0,
            fed: false,
            tried: false,
            gil_read: false,
            corrections: [None; 3],
            cpu0: Avg::default(),
            wait: Avg::default(),
            step: Avg::default(),
            cpu_w: PerKind::default(),
            moving: Avg::default(),
            gil: GIL_PRIOR,
            settled_rate: 0.0,
            settled_gil: GIL_PRIOR,
            low: 0,
            elapsed: 0.0,
            sharp: SHARPNESS,
            cores_seen: None,
            convoy: 0.0,
            climb_from: None,
            climbs: 0,
            tried_up: false,
            tried_down: false,
            tried_other: false,
        };
        p.forget();
        p
    }

    /// The job's costs, not measured yet.
    fn forget(&mut self) {
        self.cpu0 = Avg::default();
        self.wait = Avg::default();
        self.step = Avg::default();
        self.cpu_w = PerKind::default();
        self.moving = Avg::default();
        // the GIL's share of the CPU: unknown until threads run, when a
        // quarter is assumed (threads are tried where they could help, and
        // what they get corrects it)
        self.gil = GIL_PRIOR;
        self.settled_rate = 0.0;
        self.settled_gil = GIL_PRIOR;
        self.low = 0;
        self.elapsed = 0.0;
        self.sharp = SHARPNESS;
        self.convoy = 0.0;
        self.climb_from = None;
        self.climbs = 0;
        self.tried_up = false;
        self.tried_down = false;
        self.tried_other = false;
    }

    fn seen_of(&self, lay: &Layout) -> Option<&Vec<Measurement>> {
        self.seen.iter().find(|(k, _)| k == lay).map(|(_, ms)| ms)
    }

    fn measured_of(&self, lay: &Layout) -> f64 {
        self.seen_of(lay).map_or(f64::NAN, |ms| measured(ms))
    }

    /// One measured interval in; a new layout and why, or `None`.
    pub fn observe(&mut self, m: Measurement) -> Decision {
        if m.layout != self.layout {
            self.since = 0; // (the change asked for took effect)
            self.here = 0.0;
            self.in_force = 0.0;
        }
        self.layout = m.layout;
        if m.batches == 0 && m.memory > 0 {
            // (new workers' warm-up, no rate: their memory only)
            self.elapsed += py_max(0.0, m.wall) + m.start;
            return self.memory(&m);
        }
        if m.wall <= 0.0 || m.samples == 0 || m.batches == 0 {
            return None;
        }
        match self.seen.iter_mut().find(|(k, _)| *k == m.layout) {
            Some((_, ms)) => {
                ms.push(m);
                prune(ms);
            }
            None => self.seen.push((m.layout, vec![m])),
        }
        self.corrections = [None; 3];
        self.since += 1;
        self.here += m.wall;
        self.in_force += m.wall;
        self.elapsed += m.wall + m.start;
        self.learn(&m);
        if let Some(over) = self.memory(&m) {
            return Some(over);
        }
        if self.settled {
            self.watch(&m);
        }
        // a decision every MEASURE intervals (settled: every 4 * MEASURE),
        // on what the intervals so far taught (or once DECIDE_AFTER seconds
        // were measured since the last: slow batches make few, long
        // intervals)
        let scale = if self.settled && !self.relearned() {
            4
        } else {
            1
        };
        // (an epoch shorter than an interval: each is a decision, for the
        // next epoch, until settled: then a plan over every layout each
        // epoch would cost a short epoch several percent. Workers are
        // judged on two: their second epoch still faults in pages of
        // the dataset the first did not touch, and ran at 0.55 of the
        // next, which sent the policy back to the main process)
        let epoch_decides =
            m.epoch_end && !self.settled && (m.layout.num_workers == 0 || self.since >= MEASURE);
        if self.since % (MEASURE * scale) != 0
            && !epoch_decides
            && self.here < DECIDE_AFTER * f64::from(scale)
        {
            return None;
        }
        self.here = 0.0;
        self.decide()
    }

    /// The job's costs from an interval: averages over every interval
    /// (weighted by samples) of the steady quantities.
    fn learn(&mut self, m: &Measurement) {
        let lay = m.layout;
        let n = m.samples as f64;
        self.step
            .add(py_max(0.0, m.wall - m.wait) / m.batches as f64, n);
        if lay.num_workers == 0 {
            // (in the main process the loop's time in next() is the loading)
            self.cpu0.add(m.loop_cpu / n, n);
            let fetch = if m.fetch != 0.0 {
                m.fetch
            } else {
                py_max(0.0, m.wait)
            };
            // (not clamped per interval: a small wait's differences are
            // noisy around it, and clamping each would bias it up)
            self.wait.add((fetch - m.loop_cpu) / n, n);
            return;
        }
        let cpu = m.cpu / n;
        if lay.processes() > 0 {
            self.moving.add(m.loop_cpu / n, n);
        }
        self.cpu_w.add(lay.kind(), cpu, n);
        let threads = lay.threaded();
        let cores_free = m.cpu / m.wall < 0.8 * self.cores();
        if m.fetch > 0.0 && !threads && cores_free {
            // (a worker process's time in the fetch less its CPU; not when
            // the cores are taken, when it would count the waiting for one)
            self.wait.add(m.fetch / n - cpu, n);
        } else if self.wait.value().is_none() && m.wait_share() > 0.1 && !threads && cores_free {
            // (no fetch time: each worker was busy the whole interval)
            self.wait
                .add(f64::from(lay.workers()) * m.wall / n - cpu, n);
        }
        if cpu > 0.0 && threads {
            self.read_gil();
        }
    }

    /// The GIL's share from the layouts of threads measured: where one fell
    /// short of what the cores and its threads allow, the share whose
    /// bound, with the others, gives its rate (each layout's rate over all
    /// its intervals: one interval is too noisy).
    fn read_gil(&mut self) {
        let mut shares = Avg::default();
        let mut most = 1.0;
        for (lay, ms) in &self.seen {
            if !lay.threaded() {
                continue;
            }
            let cpu = match self.cpu_w.get(lay.kind()).and_then(Avg::value) {
                Some(c) if c != 0.0 => c,
                _ => continue,
            };
            let rate = measured(ms);
            let procs = f64::from(if lay.processes() > 0 {
                lay.num_workers
            } else {
                1
            });
            let free = self.model(lay, Some(0.0), self.sharp);
            // (only a shortfall past the noise of its intervals: near
            // another bound the inversion would turn noise into a share)
            if waited(ms) > 0.1 && past_noise(&against(ms, free)) < 1.0 {
                let held =
                    (rate.powf(-self.sharp) - free.powf(-self.sharp)).powf(-1.0 / self.sharp);
                let share = procs / (held * cpu);
                // (a share well over 1, all of the CPU holding the GIL and
                // more, cannot explain it: not the GIL's shortfall)
                if share <= 1.25 {
                    let samples: u64 = ms.iter().map(|m| m.samples).sum();
                    shares.add(py_min(1.0, py_max(0.02, share)), samples as f64);
                    continue;
                }
            }
            // (not held by it: at most what the rate allows)
            most = py_min(most, procs / (rate * cpu));
        }
        self.gil_read = shares.value().is_some();
        self.gil = match shares.value() {
            Some(v) => py_min(v, 1.0),
            None => py_min(GIL_PRIOR, most),
        };
    }

    /// The workers' memory over what was counted for them: a process is
    /// bigger than thought; where the layout no longer fits the budget,
    /// the plan is made again.
    fn memory(&mut self, m: &Measurement) -> Decision {
        let lay = m.layout;
        if lay.processes() == 0 || m.memory as f64 <= self.need(&lay) {
            return None;
        }
        let per = (m.memory as f64 - f64::from(lay.workers()) * self.ctx.per_worker)
            / f64::from(lay.processes());
        self.per_process = py_max(self.per_process, per * 1.1);
        if self.fits(&lay) {
            return None;
        }
        self.settled = false;
        let (next, why) = self.plan();
        if next == lay {
            return None;
        }
        self.changes += 1;
        Some((
            next,
            format!("the workers' memory is near the RAM budget; {why}"),
        ))
    }

    fn cores(&self) -> f64 {
        let known = match self.ctx.cpu {
            Some(c) if c != 0.0 => c,
            _ => self.ctx.cores,
        };
        self.cores_seen.map_or(known, |c| py_min(c, known))
    }

    fn bounds_of(&self, lay: &Layout, gil: Option<f64>) -> Vec<f64> {
        bounds(&self.costs_of(lay, gil), lay)
    }

    /// The job's costs as learnt for `lay` (the GIL's share `gil`, or the
    /// one learnt).
    fn costs_of(&self, lay: &Layout, gil: Option<f64>) -> Costs {
        // (a kind not measured yet: another kind's, or the main process's;
        // the main process not measured, the workers')
        let mut cpu = self.cpu0.value();
        if lay.num_workers > 0 || cpu.is_none() {
            let first = (lay.num_workers > 0).then(|| lay.kind());
            let order =
                first
                    .into_iter()
                    .chain([Kind::Processes, Kind::ProcessThreads, Kind::Threads]);
            for kind in order {
                if let Some(avg) = self.cpu_w.get(kind) {
                    cpu = avg.value();
                    break;
                }
            }
        }
        let or0 = |v: Option<f64>| v.filter(|x| *x != 0.0).unwrap_or(0.0);
        Costs {
            cpu: or0(cpu),
            wait: py_max(0.0, or0(self.wait.value())),
            moving: if lay.processes() > 0 {
                or0(self.moving.value())
            } else {
                0.0
            },
            gil: gil.unwrap_or(self.gil),
            step: or0(self.step.value()),
            batch: f64::from(self.ctx.batch),
            cores: self.cores(),
        }
    }

    /// `lay`'s rate by the model's bounds (the GIL's share `gil`, or the
    /// one learnt) and a knee of `sharp`ness.
    fn model(&self, lay: &Layout, gil: Option<f64>, sharp: f64) -> f64 {
        soft_min(&self.bounds_of(lay, gil), sharp)
    }

    /// `lay`'s rate by the model as fitted (its knee, a GIL's convoy),
    /// before any correction by what was measured.
    fn expected(&self, lay: &Layout) -> f64 {
        self.model(lay, None, self.sharp) * self.convoy_of(lay)
    }

    /// `lay`'s rate by the model before it was bent to what was measured:
    /// the GIL's prior share, the model's own knee.
    fn prior(&self, lay: &Layout) -> f64 {
        self.model(lay, Some(GIL_PRIOR), SHARPNESS)
    }

    /// `lay`'s rate by the model, corrected by what the layouts of its
    /// kind measured against their predictions, unless its kind is one of
    /// `uncorrected`.
    pub fn predict(&mut self, lay: &Layout, uncorrected: &[Kind]) -> f64 {
        let model = self.expected(lay);
        if lay.num_workers == 0 {
            return match self.seen_of(lay) {
                Some(ms) => measured(ms),
                None => model,
            };
        }
        let kind = lay.kind();
        if uncorrected.contains(&kind) {
            return model;
        }
        let predicted = model * self.correction(kind);
        // (a layout measured: what it measured, where that misses the
        // prediction of its kind past the noise; the model proposes, what
        // was measured decides)
        match self.seen_of(lay) {
            Some(ms) if ms.len() >= MEASURE as usize && predicted > 0.0 => {
                predicted * past_noise_within(&against(ms, predicted), 0.05, 20.0)
            }
            _ => predicted,
        }
    }

    /// What the layouts of `kind` measured against their predictions, past
    /// the noise (one interval's rate is noisy; the prediction stands where
    /// the measurements do not clearly miss it). Kept until the next
    /// interval.
    fn correction(&mut self, kind: Kind) -> f64 {
        if let Some(c) = self.corrections[kind.index()] {
            return c;
        }
        let ratios = self.against_expected(|k| k.kind() == kind);
        let c = if ratios.is_empty() && self.on_epochs() {
            // (on whole short epochs, a kind not measured yet: the
            // shortfall the others measured, the machine's as much as
            // theirs; else an untried kind looks the better for it, and
            // each move there costs an epoch or two of new workers. On
            // longer intervals, moves cost less than the trials they are:
            // the family measured a point or two worse with it)
            py_min(1.0, past_noise(&self.against_expected(|_| true)))
        } else {
            past_noise(&ratios)
        };
        self.corrections[kind.index()] = Some(c);
        c
    }

    /// What the worker layouts `keep` takes measured, each interval
    /// against its layout's prediction as fitted.
    fn against_expected(&self, keep: impl Fn(&Layout) -> bool) -> Vec<(f64, f64)> {
        let mut ratios = Vec::new();
        for (k, ms) in &self.seen {
            if k.num_workers > 0 && keep(k) {
                let expected = self.expected(k);
                if expected > 0.0 && expected.is_finite() {
                    ratios.extend(against(ms, expected));
                }
            }
        }
        ratios
    }

    pub fn need(&self, lay: &Layout) -> f64 {
        f64::from(lay.processes()) * self.per_process
            + f64::from(lay.workers()) * self.ctx.per_worker
    }

    pub fn fits(&self, lay: &Layout) -> bool {
        let ctx = &self.ctx;
        ctx.min_workers <= lay.workers()
            && lay.workers() <= ctx.max_workers
            && lay.num_workers >= ctx.min_workers
            && self.need(lay) <= ctx.ram
            && (lay.num_workers == 0
                || if lay.processes() > 0 {
                    ctx.processes
                } else {
                    ctx.threads
                })
            && (lay.worker_threads == 1 || ctx.inner)
    }

    fn options(&self) -> Vec<Layout> {
        let ctx = &self.ctx;
        candidates(ctx.max_workers, ctx.processes, ctx.threads, ctx.inner)
            .into_iter()
            .filter(|l| self.fits(l))
            .collect()
    }

    /// Whether `lay` has more than `CROWD` workers per core (and two) that
    /// only compute (`COMPUTES` of their time) where the cores bound them
    /// more tightly than the loop or a GIL, by the costs measured: no knee
    /// of any shape gives more there, and processes contend.
    pub(super) fn crowded(&self, lay: &Layout) -> bool {
        let c = self.costs_of(lay, None);
        let per = c.core_time();
        if f64::from(lay.workers()) <= CROWD * c.cores + 2.0 || c.busy() < COMPUTES || per <= 0.0 {
            return false;
        }
        let cores = c.cores / per;
        // (the bounds past the workers' own: a GIL's, the loop's)
        bounds(&c, lay)[1..].iter().all(|b| cores <= *b)
    }

    /// The layout with the fewest workers predicted within `FEW` of the
    /// best, and why; whether the step hides the loading (`fed`).
    fn plan(&mut self) -> (Layout, String) {
        let (pick, why, fed) = self.choose(&[]);
        self.fed = fed;
        (pick, why)
    }

    /// The plan: the layout, why, and whether the loop is fed (its
    /// predictions uncorrected for the kinds `uncorrected`).
    fn choose(&mut self, uncorrected: &[Kind]) -> (Layout, String, bool) {
        let mut opts = self.options();
        if opts.is_empty() {
            opts.push(self.layout);
        }
        let value: Vec<f64> = opts.iter().map(|l| self.predict(l, uncorrected)).collect();
        let top = value.iter().copied().reduce(py_max).unwrap_or(0.0);
        // a loop whose step hides the loading is fed when it waits under
        // 5 %: the fewest workers that get it there; else the most the
        // layouts give, within the noise of the estimates
        let step = self.step.value().filter(|s| *s != 0.0).unwrap_or(0.0);
        let fed = step > 0.0 && top >= 0.9 * f64::from(self.ctx.batch) / step;
        let share = if fed { FED } else { self.few() };
        // Among the near-best, the fewest processes (threads start sooner
        // and cost less memory), except on the move out of the main
        // process where the GIL's share is still the prior and loading is
        // the CPU's work rather than waiting: then processes of one thread
        // first. Processes
        // cannot fall short by the GIL, threads can, and the prior is a
        // guess: on PIL decoding threads ran 0.8x processes where the
        // prior predicts a tie, and reading that took the first 40-90
        // batches of an epoch.
        let waited = self.wait.value().unwrap_or(0.0);
        let cpu_bound = !self.gil_read
            && self.layout.num_workers == 0
            && self
                .cpu0
                .value()
                .is_some_and(|cpu| cpu > 0.0 && waited < 0.5 * cpu);
        // (a GIL of its own per worker, that is: processes of one thread;
        // threads inside processes share one as threads do, and start
        // slower)
        let own_gil = |l: &Layout| cpu_bound && l.processes() > 0 && l.sharing() == 1;
        let key = |l: &Layout| {
            (
                l.workers(),
                !own_gil(l),
                l.processes(),
                l.worker_threads,
                self.seen_of(l).is_none(),
            )
        };
        let (pick, pick_value) = opts
            .iter()
            .zip(&value)
            .filter(|(_, v)| **v >= share * top)
            .min_by_key(|(l, _)| key(l))
            .map_or((self.layout, top), |(l, v)| (*l, *v));
        let known = if self.seen_of(&pick).is_some() {
            "measured"
        } else {
            "predicted"
        };
        let what = if fed {
            "the fewest that feed the loop"
        } else {
            "the fewest near the best"
        };
        let why = format!(
            "{known} {pick_value:.0} samples/s, {what} of {} layouts (best {top:.0})",
            opts.len()
        );
        (pick, why, fed)
    }

    /// The plan, where it is worth a change: more workers must promise
    /// `GAIN`; fewer are taken unless the layout in force is within `FEW`
    /// of the best already.
    fn decide(&mut self) -> Decision {
        // (settled, a fall is the data's or the machine's: `watch`)
        self.drop_stale();
        if !self.settled || self.low == 0 {
            self.fit_knee();
            self.fit_convoy();
        }
        if let Some(from) = self.climb_from {
            return self.climbed(from);
        }
        if self.settled && self.low == 0 {
            // (settled on a layout another measured more than, past the
            // noise of what it has measured since: that one)
            let better = self
                .better_measured()
                .filter(|(_, rate)| *rate >= SETTLED_GAIN * self.measured_of(&self.layout));
            if let Some((to, rate)) = better {
                return self.go_to_measured(to, rate);
            }
        }
        if self.changes >= MAX_CHANGES {
            return self.settle_on_the_best_measured();
        }
        let opts = self.options();
        let (mut pick, mut why) = self.plan();
        let layout = self.layout;
        let here = self.predict(&layout, &[]);
        let predicted: Vec<f64> = opts.iter().map(|l| self.predict(l, &[])).collect();
        let top = predicted.into_iter().reduce(py_max).unwrap_or(here);
        let in_opts = opts.contains(&layout);
        let gain_of_pick = self.predict(&pick, &[]);
        // (back to a layout measured before only where it measured `GAIN`
        // better than the one in force: else two alike trade places on
        // each other's noise)
        let back = pick != layout
            && self.since >= MEASURE
            && self.seen_of(&pick).is_some()
            && self.measured_of(&pick) < GAIN * self.measured_of(&layout);
        let keep = back
            || if self.settled {
                // (settled: only a clear gain moves it; noise moves the
                // estimates, and a start costs; or, where the step hides the
                // loading, fewer workers that still feed it; after EXPLORE
                // seconds of tuning, only a large gain, unless the GIL's share
                // turned out far from what it settled on)
                let late = self.elapsed >= EXPLORE && !self.relearned();
                let gain = if late { LATE_GAIN } else { SETTLED_GAIN };
                in_opts
                    && gain_of_pick < gain * here
                    && !(self.fed && !late && pick.workers() < layout.workers())
            } else {
                let (pw, lw) = (pick.workers(), layout.workers());
                in_opts
                    && (pick == layout
                        || (pw > lw && gain_of_pick < GAIN * here)
                        || (pw <= lw && here >= self.few() * top)
                        || (self.fed
                            && FEWER * f64::from(lw) < f64::from(pw)
                            && pw < lw
                            && gain_of_pick < GAIN * here))
            };
        if keep {
            // (settled on MEASURE intervals at least: one long interval
            // moves, but is not enough to stay)
            if !self.settled && (self.since >= SETTLE_AFTER || self.long()) {
                // (one trial at most: each costs a change, and a start;
                // past EXPLORE seconds, only of threads inside processes)
                let trial = if self.tried {
                    None
                } else {
                    self.inner_trial().or_else(|| {
                        if self.elapsed >= EXPLORE {
                            self.late_trial()
                        } else {
                            self.threads_trial().or_else(|| self.kind_trial())
                        }
                    })
                };
                if trial.is_some() {
                    self.changes += 1;
                    return trial;
                }
                if let Some(next) = self.neighbour(pick) {
                    return Some(next);
                }
                return self.settle_measured();
            }
            if self.settled && self.low == 0 && self.elapsed < REEXPLORE && self.steady() {
                // (settled, the intervals since say what the few before
                // could not: where they part from the model past the noise,
                // the neighbours are measured after all)
                let next = self.neighbour(pick);
                if next.is_some() {
                    self.settled = false;
                }
                return next;
            }
            return None;
        }
        self.settled = false;
        if pick.workers() > PROBE && !self.seen.iter().any(|(k, _)| k.num_workers > 0) {
            // before many workers start, a few show what taking batches
            // from them costs the loop, and what threads get
            let mut smaller: Option<Layout> = None;
            for l in &opts {
                if 0 < l.workers() && l.workers() <= PROBE && l.kind() == pick.kind() {
                    let better = smaller.is_none_or(|s| {
                        (l.workers(), -i64::from(l.processes()))
                            > (s.workers(), -i64::from(s.processes()))
                    });
                    if better {
                        smaller = Some(*l);
                    }
                }
            }
            if let Some(s) = smaller {
                pick = s;
                why = format!("a probe of {pick} before {why}");
            }
        }
        self.changes += 1;
        Some((pick, why))
    }

    /// A neighbour of the layout in force to measure, where it missed the
    /// model (see [`explore`]): where the GIL's share was read from
    /// threads' shortfall, fewer first (a GIL that convoys costs more the
    /// more threads share it), else more workers; then the other kind.
    fn neighbour(&mut self, pick: Layout) -> Decision {
        let next = if self.layout.threaded() && self.gil_read {
            self.start_down(pick).or_else(|| self.start_climb())
        } else {
            self.start_climb().or_else(|| self.start_down(pick))
        };
        next.or_else(|| self.start_other())
    }

    /// The share of the best within which the fewest workers are taken,
    /// and kept: on whole short epochs a tenth (their rates swing by a
    /// tenth and more, and each move costs an epoch or two of new workers
    /// warming up), else `FEW`.
    fn few(&self) -> f64 {
        if self.on_epochs() {
            FEW_EPOCHS
        } else {
            FEW
        }
    }

    /// Whether the layout in force was measured on whole short epochs only.
    fn on_epochs(&self) -> bool {
        self.seen_of(&self.layout)
            .is_some_and(|ms| ms.iter().all(|m| m.epoch_end))
    }

    /// `LONG` seconds measured on the layout in force, in two intervals
    /// at least (one may be a stall).
    fn long(&self) -> bool {
        self.in_force >= LONG && self.since >= MEASURE
    }

    fn settle(&mut self) {
        self.settled = true;
        self.settled_gil = self.gil;
        self.settled_rate = self.measured_of(&self.layout);
    }

    /// `MAX_CHANGES` made: the best layout measured, for good (where the
    /// step hides the loading, the fewest workers measured to feed it).
    fn settle_on_the_best_measured(&mut self) -> Decision {
        if self.settled {
            return None;
        }
        self.settled = true;
        self.settled_gil = self.gil;
        let measured: Vec<(Layout, f64)> = self
            .seen
            .iter()
            .filter(|(l, _)| self.fits(l))
            .map(|(l, ms)| (*l, measured(ms)))
            .collect();
        let mut pick = self.layout;
        if let Some(top) = measured.iter().map(|(_, r)| *r).reduce(py_max) {
            let floor = if self.fed { FED } else { 1.0 } * top;
            let mut best: Option<(Layout, f64)> = None;
            for &(l, r) in measured.iter().filter(|(_, r)| *r >= floor) {
                // (the fewest workers, then the fastest: the first such)
                let better = best.is_none_or(|(b, br)| {
                    l.workers() < b.workers() || (l.workers() == b.workers() && -r < -br)
                });
                if better {
                    best = Some((l, r));
                }
            }
            if let Some((l, _)) = best {
                pick = l;
            }
        }
        self.settled_rate = measured
            .iter()
            .find(|(l, _)| *l == pick)
            .map_or(0.0, |(_, r)| *r);
        if pick == self.layout {
            return None;
        }
        Some((
            pick,
            format!("the best measured after {} changes", self.changes),
        ))
    }

    /// Before settling on worker processes that the budgets (the RAM, most
    /// often) hold no more of: their count with 2 threads each, once, where
    /// the GIL alone would hold it back. One measured layout settles a
    /// share read too high from a few noisy intervals of threads.
    fn inner_trial(&mut self) -> Decision {
        let lay = self.layout;
        let trial = Layout {
            worker_threads: 2,
            prefetch_factor: lay.prefetch_factor,
            ..Layout::processes_of(lay.num_workers)
        };
        if lay.processes() == 0
            || lay.worker_threads != 1
            || self.fed
            || self.fits(&Layout::processes_of(lay.num_workers + 1))
            || !self.fits(&trial)
            || self.seen_of(&trial).is_some()
        {
            return None;
        }
        let free = self.model(&trial, Some(0.0), self.sharp);
        if free < GAIN * self.measured_of(&lay) {
            return None; // (not even without the GIL)
        }
        self.tried = true;
        Some((
            trial,
            format!(
                "a trial of {trial}: the budgets hold no more processes, and the GIL's share \
                 ({:.2}) rests on a few intervals",
                self.gil
            ),
        ))
    }

    /// Before settling on a layout chosen over threads that the GIL's share
    /// held back: the fastest of those threads once more, where the share
    /// was read from a shortfall of a few intervals within 20 % of what
    /// they would get without it (near another bound such a shortfall is
    /// as likely the noise).
    fn threads_trial(&mut self) -> Decision {
        let layout = self.layout;
        if !self.gil_read || self.seen_of(&layout).is_none() {
            return None;
        }
        let here = self.measured_of(&layout);
        let mut best: Option<(f64, Layout)> = None;
        for (lay, ms) in &self.seen {
            if lay.workers() <= layout.workers()
                || !self.fits(lay)
                || ms.len() > (4 * MEASURE) as usize
                || !lay.threaded()
            {
                continue;
            }
            let free = self.model(lay, Some(0.0), self.sharp);
            let rate = measured(ms);
            if free >= GAIN * here
                && rate >= py_max(here, 0.8 * free)
                && best.is_none_or(|(r, _)| rate > r)
            {
                best = Some((rate, *lay));
            }
        }
        let (_, lay) = best?;
        self.tried = true;
        Some((
            lay,
            format!(
                "a trial of {lay} again: the GIL's share ({:.2}) was read from a shortfall \
                 within the noise",
                self.gil
            ),
        ))
    }

    /// Before settling: where another kind of layout was corrected down on
    /// a few intervals (a probe's, most often) and the plan without that
    /// correction is a layout of that kind with fewer workers or a clear
    /// gain, that layout, once.
    fn kind_trial(&mut self) -> Decision {
        let layout = self.layout;
        let mut doubted = Vec::new();
        for kind in Kind::ALL {
            if kind == layout.kind() {
                continue;
            }
            let n: usize = self
                .seen
                .iter()
                .filter(|(l, _)| l.num_workers > 0 && l.kind() == kind)
                .map(|(_, ms)| ms.len())
                .sum();
            if 0 < n && n <= (2 * MEASURE) as usize && self.correction(kind) < 1.0 {
                doubted.push(kind);
            }
        }
        if doubted.is_empty() {
            return None;
        }
        let (pick, _, _) = self.choose(&doubted);
        let gain = self.predict(&pick, &doubted) / self.predict(&layout, &[]);
        if !doubted.contains(&pick.kind())
            || self.seen_of(&pick).is_some()
            || !(pick.workers() < layout.workers() || gain >= GAIN)
        {
            return None;
        }
        self.tried = true;
        Some((
            pick,
            format!("a trial of {pick}: its kind was measured short on a few intervals"),
        ))
    }

    /// Settled on a GIL's share far from what it is now measured at.
    fn relearned(&self) -> bool {
        (self.gil - self.settled_gil).abs() >= 0.25
    }

    /// Settled: a rate far below the settled one three intervals in a row
    /// (the data got slower): what was learnt is forgotten, and the next
    /// decisions are made on new measurements.
    fn watch(&mut self, m: &Measurement) {
        // (against all the layout has measured, once that is more than
        // the two intervals it may have been settled on: two lucky ones
        // are no rate to fall from; a fall's own intervals under half the
        // median are left out of it as stalls)
        let settled = match self.seen_of(&m.layout) {
            Some(ms) if ms.len() > MEASURE as usize => measured(ms),
            _ => self.settled_rate,
        };
        self.low = if m.rate() < 0.6 * settled {
            self.low + 1
        } else {
            0
        };
        if self.low >= 3 && self.ctx.mid_epoch {
            // (the CPU the workers and the loop used: where the layout
            // asked for more than that and got it no longer, the cores it
            // can have now)
            let used = (m.cpu + m.loop_cpu) / m.wall;
            let asks = f64::from(m.layout.workers());
            if m.layout.num_workers > 0 && used < 0.8 * self.cores() && asks >= self.cores() {
                self.cores_seen = Some(py_max(1.0, (used * 1.05).ceil()));
            }
            self.settled = false;
            self.low = 0;
            self.changes = 0;
            self.seen = vec![(m.layout, vec![*m])];
            self.forget();
        }
    }
}
