//! Where the model missed, the policy measures rather than predicts: the
//! neighbours of the layout in force (more workers of its kind, fewer
//! threads, the other kind), each compared with the layout it left on the
//! noise of both; and a layout measured clearly more than the one in force
//! is gone to, before settling and after.

use super::*;

const CLIMB: u32 = 4; // moves past the model's plan (see `start_climb`)
const CLIMB_INTERVALS: u32 = 6; // intervals a neighbour is measured on (twice, untold)
const REACH: f64 = 0.9; // a trial predicted under this share of the layout in force is not made
const FED_WAIT: f64 = 0.08; // a loop waiting less than this share of its time is fed
const LATE_SHORT: f64 = 0.8; // see `late_trial`

/// As many workers as `lay` of the other kinds, the first to try first:
/// threads for processes; processes, then threads, for threads inside
/// processes; processes for threads. (As many as the candidates have:
/// past 64 their counts step by 4 %, and 100 processes of 4 threads have
/// no 400 processes or threads to compare with, but 394.)
fn others_of(lay: &Layout) -> Vec<Layout> {
    let of = |l: Layout| Layout {
        prefetch_factor: lay.prefetch_factor,
        ..l
    };
    let n = nearest_rung(lay.workers());
    match lay.kind() {
        Kind::Processes => vec![of(Layout::threads_of(n))],
        Kind::ProcessThreads => vec![of(Layout::processes_of(n)), of(Layout::threads_of(n))],
        Kind::Threads => vec![of(Layout::processes_of(n))],
    }
}

/// The count of workers among the candidates' (`next_count`) nearest to
/// `n`, the larger of two as near.
fn nearest_rung(n: u32) -> u32 {
    let mut rung = 1;
    loop {
        let next = next_count(rung);
        if next > n {
            return if next - n <= n - rung { next } else { rung };
        }
        rung = next;
    }
}

/// How `a`'s rate compares with `b`'s, past the noise of both: their
/// ratio moved towards 1 by twice the standard error of their difference
/// (each interval's spread relative to its layout's rate, at least
/// `floor`; `NOISE_PRIOR` with one interval: `mean_and_spread`).
fn compared(a: &[Measurement], b: &[Measurement], floor: f64) -> f64 {
    let (ra, rb) = (measured(a), measured(b));
    if a.is_empty() || b.is_empty() || ra.is_nan() || rb.is_nan() || rb <= 0.0 {
        return 1.0;
    }
    let var = |ms: &[Measurement], rate: f64| {
        let (_, spread) = mean_and_spread(&against(ms, rate));
        py_max(spread, floor).powi(2) / ms.len() as f64
    };
    let ratio = ra / rb;
    let se = ratio * (var(a, ra) + var(b, rb)).sqrt();
    let off = py_max(0.0, (ratio - 1.0).abs() - 2.0 * se);
    1.0 + off.copysign(ratio - 1.0)
}

impl Policy {
    /// Settles on the layout in force, unless another measured better
    /// past the noise of its intervals: then on that one.
    pub(super) fn settle_measured(&mut self) -> Decision {
        self.settle();
        let (to, rate) = self.better_measured()?;
        self.go_to_measured(to, rate)
    }

    /// Settled: to `to`, which measured `rate`, more than the layout in
    /// force past the noise.
    pub(super) fn go_to_measured(&mut self, to: Layout, rate: f64) -> Decision {
        self.settled_rate = rate;
        self.changes += 1;
        let lay = self.layout;
        Some((
            to,
            format!("{to}: it measured {rate:.0} samples/s, more than {lay} past the noise"),
        ))
    }

    /// The spread of an interval's rate about its layout's, pooled over
    /// every layout measured (a few intervals of one that happen to agree
    /// do not make the job's noise small), at least `NOISE_FLOOR`.
    fn spread(&self) -> f64 {
        let (mut sum, mut weight, mut df) = (0.0, 0.0, 0usize);
        for (_, ms) in &self.seen {
            if ms.len() < 2 {
                continue;
            }
            let rate = measured(ms);
            for m in ms {
                sum += m.wall * (m.rate() / rate - 1.0).powi(2);
                weight += m.wall;
            }
            df += ms.len() - 1;
        }
        if df == 0 || weight <= 0.0 {
            return NOISE_FLOOR;
        }
        let n = (df + self.seen.iter().filter(|(_, ms)| ms.len() >= 2).count()) as f64;
        py_max(NOISE_FLOOR, (sum / weight * n / df as f64).sqrt())
    }

    /// The fastest layout measured (on `MEASURE` intervals at least) that
    /// measured more than the one in force past the noise of both.
    pub(super) fn better_measured(&self) -> Option<(Layout, f64)> {
        let lay = self.layout;
        let ms = self.seen_of(&lay)?;
        let spread = self.spread();
        let mut best: Option<(Layout, f64)> = None;
        for (l, other) in &self.seen {
            if *l == lay || other.len() < MEASURE as usize || !self.fits(l) {
                continue;
            }
            let rate = measured(other);
            if compared(ms, other, spread) < 1.0 && best.is_none_or(|(_, r)| rate > r) {
                best = Some((*l, rate));
            }
        }
        best
    }

    /// Whether the layout in force measured as much in its later intervals
    /// as in its earlier ones, within the noise: a rate that fell is the
    /// machine's or the data's change (`watch`), not the model's miss.
    pub(super) fn steady(&self) -> bool {
        self.seen_of(&self.layout).is_some_and(|ms| {
            let (early, late) = ms.split_at(ms.len() / 2);
            compared(late, early, self.spread()) >= 1.0
        })
    }

    /// Back on a layout measured before, where this stay's intervals
    /// measured less than the earlier ones past the noise: the machine
    /// changed between them (a neighbour took cores, by less than `watch`
    /// calls a fall), and what every layout measured before is stale:
    /// only this stay's intervals are kept. Else the policy trades layouts
    /// on rates of another machine.
    pub(super) fn drop_stale(&mut self) {
        let lay = self.layout;
        let since = self.since as usize;
        let spread = self.spread();
        let Some(ms) = self.seen_of(&lay) else {
            return;
        };
        if since < MEASURE as usize || ms.len() <= since {
            return;
        }
        let (early, stay) = ms.split_at(ms.len() - since);
        if compared(stay, early, spread) < 1.0 {
            self.seen = vec![(lay, stay.to_vec())];
            self.corrections = [None; 3];
        }
    }

    /// Before settling, where the layout in force measured short of what
    /// the model predicted before it was bent to it (its knee fitted, the
    /// GIL's share read from the shortfall, its kind corrected): the
    /// model's account of the neighbours is then an extrapolation from one
    /// miss, so the next layout of its kind with more workers is measured,
    /// not predicted (`climbed` decides).
    pub(super) fn start_climb(&mut self) -> Decision {
        self.climb(false)
    }

    /// [`start_climb`], or on from a climb whose step measured more past
    /// the noise (`gained`): there the model, which predicted less, is not
    /// asked whether the next step could give more.
    fn climb(&mut self, gained: bool) -> Decision {
        let lay = self.layout;
        // (once from the plan; on from a climb that measured more)
        if self.tried_up && self.climb_from.is_none() {
            return None;
        }
        let (got, prior) = match self.missed() {
            Some(m) => m,
            None if gained => {
                let (got, prior, _) = self.against_prior(self.may_explore()?)?;
                (got, prior)
            }
            None => return None,
        };
        let up = self.up_of(&lay).filter(|up| !self.crowded(up))?;
        if !gained && self.prior(&up) < GAIN * got {
            return None; // (not even by the model as it was)
        }
        self.tried_up = true;
        self.trial(up, format!("a climb to {up}"), got, prior)
    }

    /// A move to `to`, measured against the layout in force (`climbed`
    /// decides), with why: what the layout in force measured, `got`,
    /// against the model's `prior`.
    fn trial(&mut self, to: Layout, what: String, got: f64, prior: f64) -> Decision {
        let lay = self.layout;
        self.climb_from = Some(lay);
        self.climbs += 1;
        Some((
            to,
            format!("{what}: {lay} measured {got:.0} samples/s, short of the model's {prior:.0}"),
        ))
    }

    /// Whether the layout in force measured short of what the model
    /// predicted before it was bent to it, past the noise, with a climb
    /// left to make: what it measured and what was predicted.
    fn missed(&self) -> Option<(f64, f64)> {
        let (got, prior, ratio) = self.against_prior(self.may_explore()?)?;
        // (measured as the model said, or better: it holds)
        (ratio < 1.0).then_some((got, prior))
    }

    /// What the layout in force measured over `ms`, what the model
    /// predicted of it before it was bent to it, and the one over the
    /// other past the noise (`past_noise`); none where there is no
    /// prediction.
    fn against_prior(&self, ms: &[Measurement]) -> Option<(f64, f64, f64)> {
        let prior = self.prior(&self.layout);
        if prior.is_nan() || prior <= 0.0 {
            return None;
        }
        Some((measured(ms), prior, past_noise(&against(ms, prior))))
    }

    /// The intervals of the layout in force, where a trial from it may be
    /// made: a climb left, time left to explore, a loop not fed.
    fn may_explore(&self) -> Option<&Vec<Measurement>> {
        let lay = self.layout;
        if self.climbs >= CLIMB || lay.num_workers == 0 || self.elapsed >= EXPLORE {
            return None;
        }
        let ms = self
            .seen_of(&lay)
            .filter(|ms| ms.len() >= MEASURE as usize)?;
        // (whole epochs shorter than an interval: a trial and its way back
        // each cost an epoch or two of new workers warming up, more than
        // the few epochs it measures could repay; there the plan decides
        // alone)
        if self.on_epochs() {
            return None;
        }
        // (a loop that hardly waits is fed: no layout would give it more,
        // whatever the model said; its step's noise is not a miss)
        (!self.fed_on(ms)).then_some(ms)
    }

    /// Whether the loop, stepping, waited under `FED_WAIT` of the
    /// intervals `ms`.
    fn fed_on(&self, ms: &[Measurement]) -> bool {
        self.step.value().is_some_and(|s| s > 0.0) && waited(ms) < FED_WAIT
    }

    /// Before settling on a layout kept because it is predicted near the
    /// best, where the plan has fewer workers of its kind predicted as
    /// near and the layout in force missed the model: the plan, measured
    /// (more workers can cost more than they give: a GIL that convoys,
    /// processes that contend).
    pub(super) fn start_down(&mut self, pick: Layout) -> Decision {
        let lay = self.layout;
        // (a step down of a few workers is not told apart from the noise:
        // a quarter at least)
        if 4 * pick.workers() > 3 * lay.workers()
            || !(lay.threaded() && self.gil_read)
            || pick.num_workers == 0
            || pick.kind() != lay.kind()
            || self.seen_of(&pick).is_some()
        {
            return None;
        }
        if self.tried_down {
            return None;
        }
        let (got, prior) = self.missed()?;
        if self.predict(&pick, &[]) < REACH * got {
            return None;
        }
        self.tried_down = true;
        self.trial(pick, format!("a trial of {pick}"), got, prior)
    }

    /// Before settling, where the layout in force missed the model: as
    /// many workers of the other kind (processes for threads, or threads
    /// inside processes; threads for processes), measured, once.
    pub(super) fn start_other(&mut self) -> Decision {
        let lay = self.layout;
        if self.tried_other {
            return None;
        }
        let (got, prior) = self.missed()?;
        let opts = self.options();
        // (only within reach by the model: a trial's intervals last two
        // rounds of its workers' batches, minutes at a fiftieth the rate)
        let pick = others_of(&lay).into_iter().find(|l| {
            opts.contains(l) && self.seen_of(l).is_none() && self.predict(l, &[]) >= REACH * got
        })?;
        self.tried_other = true;
        self.trial(pick, format!("a trial of {pick}"), got, prior)
    }

    /// Past `EXPLORE` seconds, where the layout in force measured far short
    /// of what the model predicted before it was bent to it (under
    /// `LATE_SHORT` of it, past the noise): as many workers of the other
    /// kind, else more of its own, once, where the model as it was
    /// predicts them `LATE_GAIN` over what it measured. A shortfall that
    /// large is one kind's (a GIL that convoys, processes that contend) or
    /// a knee far softer than the model's as often as the machine's, and
    /// only a neighbour, measured, tells which. (Batches of seconds spend
    /// the exploring time before a layout has two intervals.)
    pub(super) fn late_trial(&mut self) -> Decision {
        let lay = self.layout;
        if self.tried || lay.num_workers == 0 || self.on_epochs() {
            return None;
        }
        let ms = self
            .seen_of(&lay)
            .filter(|ms| ms.len() >= MEASURE as usize && !self.fed_on(ms))?;
        let (got, prior, ratio) = self.against_prior(ms)?;
        if ratio >= LATE_SHORT {
            return None;
        }
        let opts = self.options();
        let worth = |p: &Self, l: &Layout| {
            opts.contains(l) && p.seen_of(l).is_none() && p.prior(l) >= LATE_GAIN * got
        };
        let other = others_of(&lay).into_iter().find(|l| worth(self, l));
        let (to, what) = if let Some(other) = other.filter(|_| !self.tried_other) {
            self.tried_other = true;
            (other, format!("a trial of {other}"))
        } else {
            let up = self
                .up_of(&lay)
                .filter(|up| !self.tried_up && worth(self, up))?;
            self.tried_up = true;
            (up, format!("a climb to {up}"))
        };
        self.tried = true;
        self.trial(to, what, got, prior)
    }

    /// The next option of `lay`'s kind with about 1.5x its workers (threads
    /// inside processes: as many processes, more threads), not measured.
    fn up_of(&self, lay: &Layout) -> Option<Layout> {
        let want = (lay.workers() * 3).div_ceil(2).max(lay.workers() + 1);
        self.options()
            .into_iter()
            .filter(|l| {
                l.kind() == lay.kind()
                    && l.workers() > lay.workers()
                    && (lay.kind() != Kind::ProcessThreads || l.num_workers == lay.num_workers)
                    && self.seen_of(l).is_none()
            })
            .min_by_key(|l| (l.workers().abs_diff(want), l.workers()))
    }

    /// A move from `from` measured on `CLIMB_INTERVALS` intervals (twice
    /// as many where the two are not told apart; fewer where it is far
    /// worse): where it measured more, on up (a climb), else the other
    /// trials, else settled; where less, back to `from`, whose next plan
    /// tries the other ways.
    pub(super) fn climbed(&mut self, from: Layout) -> Decision {
        let lay = self.layout;
        let before = self.measured_of(&from);
        let now = self.measured_of(&lay);
        let long = self.long();
        if self.since < CLIMB_INTERVALS && now >= 0.8 * before && !long {
            return None;
        }
        let told = match (self.seen_of(&lay), self.seen_of(&from)) {
            (Some(a), Some(b)) => compared(a, b, self.spread()),
            _ => 1.0,
        };
        if told == 1.0 && self.since < 2 * CLIMB_INTERVALS && !long {
            return None; // (not told apart yet: more intervals)
        }
        let down = lay.workers() < from.workers();
        // (on up while more workers measured more, past the noise or not:
        // a knee softer than the model's gives a little at each step; not
        // told apart, the one that measured more)
        let more = told > 1.0 || (told == 1.0 && now >= before);
        if more && !down && lay.kind() == from.kind() {
            if let Some(up) = self.climb(told > 1.0) {
                return Some(up);
            }
        }
        self.climb_from = None;
        if more {
            let (pick, _) = self.plan();
            let next = self
                .start_down(pick)
                .or_else(|| self.start_climb())
                .or_else(|| self.start_other());
            return next.or_else(|| self.settle_measured());
        }
        // (back: the other way is measured next, if not yet)
        Some((
            from,
            format!("back to {from}: {lay} measured {now:.0} samples/s, no more"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_rung_is_a_candidates_count_and_none_is_nearer() {
        let counts: Vec<u32> = candidates(4096, true, false, false)
            .iter()
            .map(Layout::workers)
            .filter(|&n| n > 0)
            .collect();
        for n in 1..3000 {
            let r = nearest_rung(n);
            assert!(counts.contains(&r), "{n} -> {r}");
            let best = counts.iter().map(|c| c.abs_diff(n)).min().unwrap();
            assert_eq!(r.abs_diff(n), best, "{n} -> {r}");
        }
        assert_eq!(nearest_rung(64), 64);
        assert_eq!(nearest_rung(400), 394);
    }
}
