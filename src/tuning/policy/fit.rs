//! The model fitted to what was measured: the knee's sharpness, and what
//! each thread that shares a GIL costs the others.

use super::*;

/// The knees `fit_knee` may fit, softest first.
const KNEES: [f64; 9] = [1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 8.0, 12.0, 24.0];

impl Policy {
    /// The knee's sharpness that best explains the rates measured of worker
    /// layouts, where at the model's they miss their predictions past the
    /// noise: a machine's queues (its caches, SMT, other tenants) bend the
    /// rate near the tightest bound more or less than the model's soft
    /// minimum, and a softer knee wants more workers for the same share.
    pub(super) fn fit_knee(&mut self) {
        let of = |p: &Self, s: f64| -> Vec<(f64, f64)> {
            let mut ratios = Vec::new();
            for (lay, ms) in &p.seen {
                if lay.num_workers == 0 {
                    continue;
                }
                let expected = p.model(lay, None, s) * p.convoy_of(lay);
                if expected > 0.0 && expected.is_finite() {
                    ratios.extend(against(ms, expected));
                }
            }
            ratios
        };
        let at_model = of(self, SHARPNESS);
        if at_model.is_empty() || past_noise(&at_model) == 1.0 {
            self.sharp = SHARPNESS;
            return;
        }
        let error = |ratios: &[(f64, f64)]| {
            ratios
                .iter()
                .fold(0.0, |acc, (r, w)| acc + w * r.ln().powi(2))
        };
        let mut best = (error(&at_model), SHARPNESS);
        for s in KNEES {
            let e = error(&of(self, s));
            if e < best.0 {
                best = (e, s);
            }
        }
        self.sharp = best.1;
    }

    /// What threads sharing a GIL measured short of the model past the
    /// noise, as a cost per thread past the first (`convoy`): a GIL that
    /// convoys (each thread that wants it waits on the others' switches)
    /// costs more the more threads share it, which a share of the CPU
    /// alone does not predict.
    pub(super) fn fit_convoy(&mut self) {
        let mut cost = Avg::default();
        for (lay, ms) in &self.seen {
            let k = lay.sharing();
            if k < 2 || ms.len() < MEASURE as usize {
                continue;
            }
            let expected = self.model(lay, None, self.sharp);
            if !(expected > 0.0 && expected.is_finite()) {
                continue;
            }
            let r = past_noise(&against(ms, expected));
            let samples: u64 = ms.iter().map(|m| m.samples).sum();
            cost.add(
                py_max(0.0, 1.0 / r - 1.0) / f64::from(k - 1),
                samples as f64,
            );
        }
        self.convoy = cost.value().unwrap_or(0.0);
    }

    /// What the GIL's convoy leaves of `lay`'s rate.
    pub(super) fn convoy_of(&self, lay: &Layout) -> f64 {
        1.0 / (1.0 + self.convoy * f64::from(lay.sharing().saturating_sub(1)))
    }
}
