//! The main process's stage timings (the workers' come from the engine,
//! `crate::stats`): time the training loop waited inside `next()`, decoding
//! batches, pinning them, and the loop's own time between batches; and the
//! opt-in warning (`FERROLOADER_WARN_WAITING`, a share such as `0.3`) when
//! the loop waits on data for more than that share of its time, naming the
//! stage that limits it.

use std::sync::OnceLock;
use std::time::Instant;

use pyo3::exceptions::PyUserWarning;
use pyo3::prelude::*;

use crate::stats::{since, StageTimes};

/// Batches between two looks at the waiting share.
const WINDOW: u64 = 256;

fn threshold() -> Option<f64> {
    static T: OnceLock<Option<f64>> = OnceLock::new();
    *T.get_or_init(|| crate::settings::warn_waiting_env().ok().flatten())
}

/// `(wait, decode, pin, loop, batches)` in ns, then the per-worker (or
/// in-process) `(fetch, collate, transfer, batches)`.
pub type StatsTuple = ((u64, u64, u64, u64, u64), Vec<(u64, u64, u64, u64)>);

#[derive(Default)]
pub struct MainTimes {
    pub wait: u64,
    pub decode: u64,
    pub pin: u64,
    pub looped: u64,
    pub batches: u64,
    last_yield: Option<Instant>,
    /// `(wait, loop, batches)` when the current window began.
    window: (u64, u64, u64),
    warned: bool,
}

impl MainTimes {
    /// `next()` was called: the time since the last batch was the loop's.
    pub fn enter(&mut self) {
        if let Some(t) = self.last_yield.take() {
            self.looped += since(t);
        }
    }

    /// `next()` hands a batch over.
    pub fn leave(&mut self) {
        self.batches += 1;
        self.last_yield = Some(Instant::now());
    }

    pub fn tuple(&self, workers: Vec<StageTimes>) -> StatsTuple {
        (
            (self.wait, self.decode, self.pin, self.looped, self.batches),
            workers
                .iter()
                .map(|w| (w.fetch, w.collate, w.transfer, w.batches))
                .collect(),
        )
    }

    /// Every [`WINDOW`] batches: warns once if the loop waited on data for
    /// more than the configured share of the window.
    pub fn maybe_warn(&mut self, py: Python<'_>, workers: &[StageTimes]) -> PyResult<()> {
        let Some(limit) = threshold() else {
            return Ok(());
        };
        if self.warned || self.batches < self.window.2 + WINDOW {
            return Ok(());
        }
        let (w0, l0, b0) = self.window;
        self.window = (self.wait, self.looped, self.batches);
        let (wait, looped) = (self.wait - w0, self.looped - l0);
        let share = wait as f64 / (wait + looped).max(1) as f64;
        if share <= limit {
            return Ok(());
        }
        self.warned = true;
        let mut total = StageTimes::default();
        for w in workers {
            total.add(w);
        }
        let per = |ns: u64, n: u64| ns as f64 / n.max(1) as f64;
        let stages = [
            ("fetch (the dataset's __getitem__ / iterator; more num_workers or faster reads help)", per(total.fetch, total.batches)),
            ("collate (collate_fn)", per(total.collate, total.batches)),
            ("transfer (writing batches to shared memory)", per(total.transfer, total.batches)),
            ("decode (rebuilding batches in the main process)", per(self.decode, self.batches)),
            ("pin (pin_memory)", per(self.pin, self.batches)),
        ];
        let (stage, _) =
            stages.iter().copied().fold(
                ("fetch", -1.0),
                |best, s| if s.1 > best.1 { s } else { best },
            );
        let msg = format!(
            "ferroloader: the training loop waited for data {:.0}% of its time over the last \
             {} batches; the slowest stage is {stage}. See DataLoader.stats().",
            share * 100.0,
            self.batches - b0,
        );
        let category = py.get_type::<PyUserWarning>();
        PyErr::warn(py, &category, &std::ffi::CString::new(msg)?, 2)
    }
}
