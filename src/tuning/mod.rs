//! The model `num_workers="auto"` plans with, and its policy
//! ([`policy::Policy`]): pure arithmetic over measured intervals, no clock,
//! process or `/proc` (the Python side measures and applies).
//!
//! A layout's rate is a soft minimum of the rates that bound it
//! ([`bounds`], [`soft_min`]): the workers and the cores, each process's
//! GIL where threads share one, the loop's own step. The layouts a tuner
//! may pick are [`candidates`]. Every sum runs in the order the Python
//! model this replaced ran it, so the simulator's figures are unchanged.

pub mod climb;
pub mod policy;
pub mod sim;

use std::fmt;

/// The soft minimum's sharpness: at two equal bounds a rate is
/// `2^(-1/6)` (0.89) of them (queues fall short of the tightest bound near
/// the knee).
pub const SHARPNESS: f64 = 6.0;
/// Between the workers' bound and the cores' for workers that only
/// compute: `2^(-1/40)` (0.98).
pub const KNEE: f64 = 40.0;
/// An interval's rate, relative: the spread assumed with one measured.
pub const NOISE_PRIOR: f64 = 0.2;
/// ... and the least assumed with more.
pub const NOISE_FLOOR: f64 = 0.05;

/// Where the loader's work runs: `num_workers` workers (processes, or
/// threads when `thread`), `worker_threads` threads inside each worker
/// process, `prefetch_factor` batches in flight per worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub num_workers: u32,
    pub thread: bool,
    pub worker_threads: u32,
    pub prefetch_factor: u32,
}

impl Layout {
    /// Worker processes (`n` of them), prefetch 2.
    pub fn processes_of(n: u32) -> Self {
        Layout {
            num_workers: n,
            thread: false,
            worker_threads: 1,
            prefetch_factor: 2,
        }
    }

    pub fn threads_of(n: u32) -> Self {
        Layout {
            thread: true,
            ..Self::processes_of(n)
        }
    }

    pub fn workers(&self) -> u32 {
        self.num_workers * self.worker_threads
    }

    pub fn processes(&self) -> u32 {
        if self.thread {
            0
        } else {
            self.num_workers
        }
    }

    pub fn kind(&self) -> Kind {
        if self.thread {
            Kind::Threads
        } else if self.worker_threads == 1 {
            Kind::Processes
        } else {
            Kind::ProcessThreads
        }
    }

    /// Threads share a process's GIL.
    pub fn threaded(&self) -> bool {
        self.kind() != Kind::Processes
    }

    /// How many threads share one GIL: every worker thread shares the
    /// loop's process's, threads inside a process share its own (0 in the
    /// main process, 1 for a worker process alone).
    pub fn sharing(&self) -> u32 {
        match (self.num_workers, self.thread) {
            (0, _) => 0,
            (n, true) => n * self.worker_threads.max(1),
            (_, false) => self.worker_threads.max(1),
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.num_workers == 0 {
            return f.write_str("main process");
        }
        let (kind, plural) = match (self.thread, self.num_workers == 1) {
            (_, true) => (if self.thread { "thread" } else { "process" }, ""),
            (true, false) => ("thread", "s"),
            (false, false) => ("process", "es"),
        };
        write!(f, "{} {kind}{plural}", self.num_workers)?;
        if self.worker_threads > 1 {
            write!(f, " x {} threads", self.worker_threads)?;
        }
        write!(f, ", prefetch {}", self.prefetch_factor)
    }
}

/// The kinds of layout whose predictions are corrected together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Processes,
    Threads,
    ProcessThreads,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Processes, Kind::Threads, Kind::ProcessThreads];

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Python's `max(a, b)`: `b` only when it is greater (`a` on ties, NaN).
pub(crate) fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

/// Python's `min(a, b)`.
pub(crate) fn py_min(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

/// The soft minimum of `bounds` (the finite ones): 0 where one is 0 or
/// less, infinite where none is finite.
pub fn soft_min(bounds: &[f64], sharpness: f64) -> f64 {
    let finite: Vec<f64> = bounds.iter().copied().filter(|b| b.is_finite()).collect();
    if finite.is_empty() {
        return f64::INFINITY;
    }
    if finite.iter().copied().fold(f64::INFINITY, py_min) <= 0.0 {
        return 0.0;
    }
    let sum = finite.iter().fold(0.0, |acc, b| acc + b.powf(-sharpness));
    sum.powf(-1.0 / sharpness)
}

/// The costs per sample a layout's bounds are made of: `cpu` seconds of
/// CPU and `wait` seconds of waiting in a worker, `moving` seconds of the
/// loop's CPU to take it from a worker process, the share `gil` of `cpu`
/// that holds the GIL, the loop's `step` per batch of `batch`, on `cores`.
#[derive(Clone, Copy, Debug)]
pub struct Costs {
    pub cpu: f64,
    pub wait: f64,
    pub moving: f64,
    pub gil: f64,
    pub step: f64,
    pub batch: f64,
    pub cores: f64,
}

impl Costs {
    /// The core seconds a sample takes in a worker layout: its loading,
    /// taking it from a worker process, its share of the loop's step.
    pub fn core_time(&self) -> f64 {
        self.cpu + self.moving + self.step / self.batch
    }

    /// The share of a worker's time per sample on the CPU (0 for none).
    pub fn busy(&self) -> f64 {
        if self.cpu + self.wait > 0.0 {
            self.cpu / (self.cpu + self.wait)
        } else {
            0.0
        }
    }
}

/// The rates (samples per second) that bound `layout`.
pub fn bounds(c: &Costs, layout: &Layout) -> Vec<f64> {
    let (cpu, wait) = (c.cpu, c.wait);
    if layout.num_workers == 0 {
        if cpu + wait + c.step > 0.0 {
            return vec![c.batch / (c.batch * (cpu + wait) + c.step)];
        }
        return vec![f64::INFINITY];
    }
    let per = c.core_time();
    // how many work at once, and the cores: queues form between them only
    // from when the workers wait (workers that only compute fill the cores
    // with none), so their knee is sharper the busier a worker is
    let busy = c.busy();
    let inf_or = |ok: bool, v: f64| if ok { v } else { f64::INFINITY };
    let mut out = vec![soft_min(
        &[
            inf_or(cpu + wait > 0.0, layout.workers() as f64 / (cpu + wait)),
            inf_or(per > 0.0, c.cores / per),
        ],
        SHARPNESS + (KNEE - SHARPNESS) * busy.powf(2.0),
    )];
    if c.gil * cpu > 0.0 && layout.sharing() > 1 {
        // one process runs its threads' Python one at a time (one thread
        // alone is bounded by its own time already)
        let procs = if layout.processes() > 0 {
            layout.num_workers
        } else {
            1
        };
        out.push(procs as f64 / (c.gil * cpu));
    }
    let lp = c.step + c.batch * c.moving;
    out.push(inf_or(lp > 0.0, c.batch / lp));
    out
}

/// The layouts a tuner may pick with at most `cap` workers: the main
/// process, processes, threads, and processes of 2 or 4 threads, of every
/// count to 64 and in steps of 4 % above.
pub fn candidates(cap: u32, processes: bool, threads: bool, inner: bool) -> Vec<Layout> {
    let mut out = vec![Layout::processes_of(0)];
    let mut n: u32 = 1;
    while n <= cap {
        if processes {
            out.push(Layout::processes_of(n));
        }
        if threads {
            out.push(Layout::threads_of(n));
        }
        if inner {
            for k in [2, 4] {
                if n * k <= cap {
                    out.push(Layout {
                        worker_threads: k,
                        ..Layout::processes_of(n)
                    });
                }
            }
        }
        n = next_count(n);
    }
    out
}

/// The candidates' worker count after `n`: every count to 64, then 4 %
/// more.
pub(crate) fn next_count(n: u32) -> u32 {
    if n < 64 {
        n + 1
    } else {
        (f64::from(n) * 1.04).ceil() as u32
    }
}

/// The mean of `(ratio, weight)` pairs moved towards 1 by twice its
/// standard error (an unknown spread, with one ratio, is
/// [`NOISE_PRIOR`]), within 0.5 and 1.5.
pub fn past_noise(ratios: &[(f64, f64)]) -> f64 {
    past_noise_within(ratios, 0.5, 1.5)
}

/// The weighted mean of `(value, weight)` pairs and their spread (the
/// weighted standard deviation, Bessel-corrected; [`NOISE_PRIOR`] with one
/// pair). Not empty.
pub fn mean_and_spread(pairs: &[(f64, f64)]) -> (f64, f64) {
    let weight = pairs.iter().fold(0.0, |acc, (_, w)| acc + w);
    let mean = pairs.iter().fold(0.0, |acc, (r, w)| acc + r * w) / weight;
    let n = pairs.len() as f64;
    let spread = if pairs.len() > 1 {
        let var = pairs
            .iter()
            .fold(0.0, |acc, (r, w)| acc + w * (r - mean).powf(2.0));
        (var / weight * n / (n - 1.0)).sqrt()
    } else {
        NOISE_PRIOR
    };
    (mean, spread)
}

/// [`past_noise`] within `lo` and `hi`.
pub fn past_noise_within(ratios: &[(f64, f64)], lo: f64, hi: f64) -> f64 {
    if ratios.is_empty() {
        return 1.0;
    }
    let (mean, spread) = mean_and_spread(ratios);
    let n = ratios.len() as f64;
    // (a few intervals that happen to agree do not make the noise small)
    let spread = py_max(spread, NOISE_FLOOR);
    let off = py_max(0.0, (mean - 1.0).abs() - 2.0 * spread / n.sqrt());
    py_min(hi, py_max(lo, 1.0 + off.copysign(mean - 1.0)))
}

/// A mean weighted by samples (`None` until a value comes).
#[derive(Clone, Copy, Debug, Default)]
pub struct Avg {
    total: f64,
    weight: f64,
}

impl Avg {
    pub fn add(&mut self, value: f64, weight: f64) {
        self.total += value * weight;
        self.weight += weight;
    }

    pub fn value(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.total / self.weight)
    }
}

/// One [`Avg`] per [`Kind`], for what is measured of each.
#[derive(Clone, Copy, Debug, Default)]
pub struct PerKind([Option<Avg>; 3]);

impl PerKind {
    pub fn get(&self, kind: Kind) -> Option<&Avg> {
        self.0[kind.index()].as_ref()
    }

    pub fn add(&mut self, kind: Kind, value: f64, weight: f64) {
        self.0[kind.index()]
            .get_or_insert_with(Avg::default)
            .add(value, weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_layout_reads_as_the_python_one_did() {
        assert_eq!(Layout::processes_of(0).to_string(), "main process");
        assert_eq!(Layout::processes_of(1).to_string(), "1 process, prefetch 2");
        assert_eq!(Layout::threads_of(3).to_string(), "3 threads, prefetch 2");
        let inner = Layout {
            worker_threads: 4,
            ..Layout::processes_of(2)
        };
        assert_eq!(inner.to_string(), "2 processes x 4 threads, prefetch 2");
        assert_eq!(inner.workers(), 8);
        assert_eq!(inner.kind(), Kind::ProcessThreads);
    }

    #[test]
    fn candidates_step_by_one_to_64_then_by_four_percent() {
        let counts: Vec<u32> = candidates(100, true, false, false)
            .iter()
            .map(|l| l.num_workers)
            .collect();
        assert_eq!(&counts[..3], &[0, 1, 2]);
        assert_eq!(counts[64], 64);
        assert_eq!(&counts[65..], &[67, 70, 73, 76, 80, 84, 88, 92, 96, 100]);
    }

    proptest! {
        #[test]
        fn the_soft_minimum_is_below_every_bound_and_near_the_least(
            b in proptest::collection::vec(1e-3f64..1e6, 1..6)
        ) {
            let s = soft_min(&b, SHARPNESS);
            let least = b.iter().copied().fold(f64::INFINITY, f64::min);
            prop_assert!(s <= least * (1.0 + 1e-12));
            prop_assert!(s >= least * (b.len() as f64).powf(-1.0 / SHARPNESS) * (1.0 - 1e-12));
        }

        #[test]
        fn a_correction_lies_within_half_and_one_and_a_half(
            ratios in proptest::collection::vec((0.0f64..3.0, 1e-3f64..10.0), 0..8)
        ) {
            let c = past_noise(&ratios);
            prop_assert!((0.5..=1.5).contains(&c));
        }
    }
}
