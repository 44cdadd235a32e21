//! The climbing policy `num_workers="auto"` used before the model-based
//! one (`FERROLOADER_AUTOTUNE_POLICY=climb`): it climbs a ladder of worker
//! counts, keeps a step that gains 5 %, and stops where the loop is fed or
//! a step gains nothing. Kept beside the model for comparison; the loader
//! measures, records the changes and applies them in Python.

use super::Layout;

/// The worker counts the climb goes through.
const LADDER: [u32; 15] = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128];
/// A step is kept when the loop gets this much more (batches per second).
const GAIN: f64 = 1.05;
/// A change of method for as many workers is kept if it keeps this much.
const LATERAL: f64 = 0.95;
/// The loop is fed when it waits less than this share of its time.
const FED: f64 = 0.05;

/// One measurement as the climb reads it: batches handed over, the wall
/// time, the time the loop waited in `next()`, and the loader's CPU seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    pub batches: f64,
    pub wall: f64,
    pub wait: f64,
    pub cpu: f64,
}

impl Interval {
    pub fn rate(&self) -> f64 {
        if self.wall > 0.0 {
            self.batches / self.wall
        } else {
            0.0
        }
    }

    pub fn wait_share(&self) -> f64 {
        if self.wall > 0.0 {
            (self.wait / self.wall).min(1.0)
        } else {
            0.0
        }
    }
}

/// What bounds the climb now (the loader may change them between calls).
#[derive(Clone, Debug)]
pub struct Bounds {
    pub max_workers: u32,
    /// The CPU budget in cores, and how the user wrote it (for reasons).
    pub cpu: Option<(f64, String)>,
    pub ram: f64,
    /// Per worker process, the most its copy of this process may grow to.
    pub per_process: f64,
    /// Per worker, its arena.
    pub arena: f64,
    pub processes: bool,
    pub threads: bool,
    pub inner: bool,
    pub cores: f64,
    pub mid_epoch: bool,
}

impl Bounds {
    fn fits(&self, l: &Layout) -> bool {
        let need =
            f64::from(l.processes()) * self.per_process + f64::from(l.workers()) * self.arena;
        l.workers() <= self.max_workers && need <= self.ram
    }
}

/// A decision: the next layout and why (or none), a note for `stats()`,
/// and what to log.
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    pub next: Option<(Layout, String)>,
    pub note: Option<String>,
    pub said: Vec<String>,
}

/// The climb's state, one per loader (it outlives epochs and iterators).
#[derive(Clone, Debug)]
pub struct Climb {
    pub settled: bool,
    /// The fastest layout measured so far, to go back to.
    best: Option<(Layout, Interval)>,
    /// The layout measured last, which the next step is judged against.
    prev: Option<(Layout, Interval)>,
    /// How nearly linear the last step was.
    scaling: f64,
    /// Processes or threads is decided on the first workers measured.
    method_chosen: bool,
    tried_prefetch: bool,
}

impl Climb {
    /// `prefetch`: whether a deeper prefetch may be tried once.
    pub fn new(prefetch: bool) -> Self {
        Climb {
            settled: false,
            best: None,
            prev: None,
            scaling: 0.0,
            method_chosen: false,
            tried_prefetch: !prefetch,
        }
    }

    /// An interval `m` on `layout`: the next layout and why, or none to
    /// keep it. `settled_wait`: the loop's waiting share after the last
    /// change, if one was made and measured.
    pub fn observe(
        &mut self,
        m: Interval,
        layout: Layout,
        settled_wait: Option<f64>,
        b: &Bounds,
    ) -> Step {
        let mut step = Step::default();
        if self.settled {
            // starts climbing again if the loop waits much more than when
            // it settled (the data got slower)
            let base = settled_wait.unwrap_or(0.0);
            if m.wait_share() > (2.0 * base + 0.1).max(0.25) && b.mid_epoch {
                self.settled = false;
                self.best = None;
                self.prev = None;
            }
            return step;
        }
        // the first workers in place of the main process pay for their
        // transport before they scale: they are judged with the next step
        let first = self
            .prev
            .is_some_and(|(p, _)| p.num_workers == 0 && layout.num_workers > 0);
        // another method for as many workers need not gain, only not lose
        let lateral = self.prev.is_some_and(|(p, _)| {
            p.workers() == layout.workers() && p.prefetch_factor == layout.prefetch_factor
        });
        if let (Some((prev, pm)), Some((best, bm))) = (self.prev, self.best) {
            let need = pm.rate() * if lateral { LATERAL } else { GAIN };
            if !first && m.rate() < need && (m.wait_share() >= FED || m.rate() < pm.rate()) {
                // the step gained nothing (or took the loop's CPU): the best measured
                self.settled = true;
                if m.rate() >= bm.rate() {
                    return step;
                }
                step.next = Some((
                    best,
                    format!(
                        "{layout} gained nothing over {prev} ({:.1} vs {:.1} batches/s): back to {best}",
                        m.rate(),
                        pm.rate()
                    ),
                ));
                return step;
            }
        }
        if let Some((prev, pm)) = self.prev {
            if prev.workers() > 0 && layout.workers() > 0 && !first {
                self.scaling = (m.rate() / pm.rate().max(1e-9))
                    / (f64::from(layout.workers()) / f64::from(prev.workers()));
            }
        }
        self.prev = Some((layout, m));
        if self.best.is_none_or(|(_, bm)| m.rate() > bm.rate()) {
            self.best = Some((layout, m));
        }
        if m.wait_share() < FED {
            self.settled = true;
            step.said.push(format!(
                "settled on {layout}: the loop waits {:.1}%",
                100.0 * m.wait_share()
            ));
            return step;
        }
        self.grow(m, layout, b, &mut step);
        if step.next.is_none() {
            self.settled = true;
        }
        step
    }

    fn grow(&mut self, m: Interval, lay: Layout, b: &Bounds, step: &mut Step) {
        let why = format!("the loop waits {}", percent(m.wait_share()));
        let with = |l: Layout, n: u32| Layout {
            num_workers: n,
            ..l
        };
        if lay.num_workers == 0 {
            let thread = !b.processes;
            let of = |n| Layout {
                thread,
                ..Layout::processes_of(n)
            };
            if m.wait_share() > 0.9 && b.cores > 1.0 && b.max_workers >= 2 && b.fits(&of(2)) {
                // the loop only waits: one worker would not be faster than
                // the main process, two may
                step.next = Some((of(2), why));
            } else if b.fits(&of(1)) {
                step.next = Some((of(1), why));
            } else if b.threads && b.fits(&Layout::threads_of(1)) {
                step.next = Some((
                    Layout::threads_of(1),
                    format!("{why}; a process would not fit the RAM budget"),
                ));
            } else {
                step.note =
                    Some("no worker fits the RAM budget: loading in the main process".into());
            }
            return;
        }
        let busy = if m.wall > 0.0 {
            m.cpu / m.wall / f64::from(lay.workers().max(1))
        } else {
            1.0
        };
        let first_workers = !self.method_chosen;
        self.method_chosen = true;
        if first_workers && !lay.thread && lay.worker_threads == 1 && busy < 0.5 && b.threads {
            // its workers mostly wait (I/O): threads are cheaper to have many of
            step.next = Some((
                Layout {
                    thread: true,
                    ..lay
                },
                format!(
                    "{why}; each worker is busy {} of the time (it waits): threads",
                    percent(busy)
                ),
            ));
            return;
        }
        let mut budget = b.cpu.as_ref().map(|(c, _)| *c);
        let loop_share = 1.0 - m.wait_share(); // the loop's own step
        if budget.is_none() && loop_share > 0.1 {
            // the loop computes: the cores it leaves (when it only waits, a
            // step past the cores is measured, and kept only if it gains)
            budget = Some((b.cores - loop_share).max(0.5));
        }
        if let Some(budget) = budget {
            if m.cpu / m.wall > budget * 0.9 && busy > 0.5 {
                let stop = format!("the CPU budget ({budget:.1} cores) is used");
                return self.prefetch(lay, stop, step);
            }
        }
        let mut target = next_rung(lay.num_workers);
        if busy < 0.25 {
            // its workers wait nearly all the time: four times as many
            target = target.max(4 * lay.num_workers);
        } else if self.scaling >= 0.8 {
            // the last step scaled nearly linearly: a step to about as many
            // workers as would feed the loop, at most twice as many
            let need = (f64::from(lay.num_workers) / (1.0 - m.wait_share()).max(0.125)).ceil();
            target = target.max(need as u32).min(2 * lay.num_workers);
        }
        if target * lay.worker_threads > b.max_workers {
            target = b.max_workers / lay.worker_threads;
        }
        let cand = with(lay, target);
        if target <= lay.num_workers {
            return self.prefetch(lay, format!("max_workers={}", b.max_workers), step);
        }
        if let Some((cpu, text)) = &b.cpu {
            if busy * f64::from(cand.workers()) > *cpu {
                return self.prefetch(lay, format!("{cand} would exceed cpu={text}"), step);
            }
        }
        if !b.fits(&cand) {
            if !lay.thread && b.inner {
                let inner = Layout {
                    worker_threads: lay.worker_threads * 2,
                    ..lay
                };
                if lay.worker_threads < 4 && b.fits(&inner) {
                    step.next = Some((
                        inner,
                        format!("{why}; more processes would not fit the RAM budget"),
                    ));
                    return;
                }
            }
            if !lay.thread && b.threads {
                let alt = Layout {
                    thread: true,
                    worker_threads: 1,
                    num_workers: lay.workers() + 1,
                    ..lay
                };
                if b.fits(&alt) {
                    step.next = Some((
                        alt,
                        format!("{why}; more processes would not fit the RAM budget: threads"),
                    ));
                    return;
                }
            }
            return self.prefetch(lay, format!("{cand} would exceed the budgets"), step);
        }
        step.next = Some((cand, why));
    }

    /// Growing stops (`stop` says why): a deeper prefetch, once.
    fn prefetch(&mut self, lay: Layout, stop: String, step: &mut Step) {
        step.said.push(format!("stops growing: {stop}"));
        if self.tried_prefetch {
            return;
        }
        self.tried_prefetch = true;
        step.next = Some((
            Layout {
                prefetch_factor: 4,
                ..lay
            },
            format!("{stop}; a deeper prefetch"),
        ));
    }
}

fn next_rung(n: u32) -> u32 {
    LADDER.into_iter().find(|&r| r > n).unwrap_or(n * 2)
}

/// `x` as Python's `{:.0%}` writes it.
fn percent(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> Bounds {
        Bounds {
            max_workers: 32,
            cpu: Some((64.0, "64".into())),
            ram: 1e12,
            per_process: 100.0 * 1048576.0,
            arena: 64.0 * 1048576.0,
            processes: true,
            threads: true,
            inner: true,
            cores: 8.0,
            mid_epoch: true,
        }
    }

    /// Runs the climb on a model job (`rate` batches/s, the loop waiting
    /// `wait`): the layout it settles on.
    fn climb(b: &Bounds, rate: impl Fn(&Layout) -> f64, wait: impl Fn(&Layout) -> f64) -> Layout {
        let mut c = Climb::new(false);
        let mut lay = Layout::processes_of(0);
        // (the loop's wait measured after the last change, as the
        // changes the loader records say)
        let (mut changed, mut settled_wait) = (false, None);
        for _ in 0..30 {
            let m = Interval {
                batches: rate(&lay).floor(),
                wall: 1.0,
                wait: wait(&lay),
                cpu: f64::from(lay.workers().max(1)),
            };
            if changed && settled_wait.is_none() {
                settled_wait = Some(m.wait_share());
            }
            if let Some((next, _)) = c.observe(m, lay, settled_wait, b).next {
                lay = next;
                (changed, settled_wait) = (true, None);
            }
        }
        assert!(c.settled);
        lay
    }

    #[test]
    fn it_settles_where_the_loop_is_fed_and_goes_back_when_a_step_gains_nothing() {
        let b = Bounds {
            threads: false,
            inner: false,
            ..bounds()
        };
        let fed = |l: &Layout| {
            100.0 * f64::from(l.workers().min(3)) + 50.0 * f64::from(u8::from(l.workers() == 0))
        };
        let got = climb(&b, fed, |l| (1.0 - fed(l) / 300.0).max(0.02));
        assert_eq!(got.workers(), 3);
        let flat = |l: &Layout| match l.workers() {
            0 | 1 => 100.0,
            2 => 190.0,
            _ => 185.0,
        };
        assert_eq!(climb(&b, flat, |_| 0.5).workers(), 2);
    }

    #[test]
    fn the_ladder_and_percentages_read_as_the_python_policy_wrote_them() {
        assert_eq!(next_rung(0), 1);
        assert_eq!(next_rung(4), 6);
        assert_eq!(next_rung(128), 256);
        assert_eq!(percent(0.9), "90%");
        assert_eq!(percent(0.055), "6%");
    }
}
