"""The model-based policy of ``num_workers="auto"``: ``Policy``, a pure
state machine over measured intervals, which plans with a model of the
machine (``bounds``, combined by ``soft_min``). The loader feeds it
(``tuning.live.ModelTuner``); ``ferroloader.tuning.model`` runs the same
``Policy`` in simulated time, from 2 to 128 cores.

>>> from ferroloader.tuning.bounds import Layout
>>> from ferroloader.tuning.estimate import Context, Measurement
>>> ctx = Context(cores=8, max_workers=32, ram=float(1 << 34), per_process=1 << 26,
...               per_worker=1 << 22, batch=32)
>>> policy = Policy(ctx, Layout(0))
>>> # the main process: 1 ms of CPU a sample, nothing waited, no step
>>> m = Measurement(Layout(0), wall=0.64, batches=20, samples=640, wait=0.64, loop_cpu=0.64)
>>> policy.observe(m) is None  # a decision every two intervals
True
>>> layout, why = policy.observe(m)
>>> layout.num_workers > 0
True
"""

from __future__ import annotations

import math
from typing import Optional

from ferroloader.tuning.bounds import Layout
from ferroloader.tuning.estimate import (
    SHARPNESS,
    Context,
    Measurement,
    _Avg,
    _measured,
    _past_noise,
    bounds,
    candidates,
    soft_min,
)


class Policy:
    """``num_workers="auto"``'s decisions: a pure state machine. Each
    measured interval goes in (``observe``); out comes a new layout and
    why, or ``None`` to keep the one in force. No clock, process or
    ``/proc`` is read here: the loader measures and applies.

    From the intervals it estimates the job's costs per sample (the CPU
    and the waiting of loading, measured in the main process; the workers'
    CPU; the loop's own step and what taking a batch from a worker process
    costs it; the GIL's share, where threads fall short) and predicts each
    layout's rate with the model of ``bounds``. It goes to the layout with
    the fewest workers predicted within ``1 - FEW`` of the best that fits
    the budgets (where the step hides the loading, within ``1 - FED`` of
    the loop's rate), measures it, and corrects the predictions of the
    layouts of its kind by what it measured. It decides every ``MEASURE``
    intervals and settles when the plan is not worth a change; once
    settled it moves only for ``SETTLED_GAIN``. A rate fallen far below
    the settled one starts it over; the workers' memory over what was
    counted for them plans again."""

    MEASURE = 2  # intervals on a layout before a decision
    FEW = 0.975  # the fewest workers within this share of the best
    FED = 0.965  # where the step hides the loading: of the loop's rate
    GAIN = 1.05  # a move to more workers must promise this much
    FEWER = 0.95  # where the loop is fed, a move to fewer workers must leave out 5 %
    SETTLED_GAIN = 1.1  # and once settled, any move
    MAX_CHANGES = 8
    DECIDE_AFTER = 10.0  # seconds on a layout: a decision, however few intervals
    EXPLORE = 45.0  # seconds of tuning, after which a settled layout is kept
    LATE_GAIN = 1.25  # unless a move promises this much

    def __init__(self, ctx: Context, layout: Layout) -> None:
        self.ctx = ctx
        self.layout = layout
        self.settled = False
        self.seen: dict[Layout, list[Measurement]] = {}
        self.changes = 0
        self.per_process = ctx.per_process
        self.since = 0  # intervals on the layout in force
        self.here = 0.0  # seconds measured since the last decision
        self.fed = False  # the last plan: the step hides the loading
        self.tried = False  # the one trial before settling (see _decide)
        self.gil_read = False  # the GIL's share read from a shortfall, not assumed
        self._corrections: dict[str, float] = {}
        self._forget()

    def _forget(self) -> None:
        """The job's costs, not measured yet."""
        self.cpu0 = _Avg()  # CPU per sample loading in the main process
        self.wait = _Avg()  # waiting per sample
        self.step = _Avg()  # the loop's own seconds per batch
        self.cpu_w: dict[str, _Avg] = {}  # CPU per sample in workers, per kind
        self.moving = _Avg()  # the loop's CPU per sample taken from worker processes
        self.gil_seen = _Avg()
        # the GIL's share of the CPU: unknown until threads run, when a
        # quarter is assumed (threads are tried where they could help, and
        # what they get corrects it)
        self.gil = GIL_PRIOR
        self.settled_rate = 0.0
        self.settled_gil = GIL_PRIOR  # the GIL's share when it settled
        self.low = 0
        self.elapsed = 0.0  # seconds measured and changing since

    # measurements in

    def observe(self, m: Measurement) -> Optional[tuple[Layout, str]]:
        if m.layout != self.layout:
            self.since = 0  # (the change asked for took effect)
            self.here = 0.0
        self.layout = m.layout
        if m.wall <= 0 or m.samples <= 0 or m.batches <= 0:
            return None
        self.seen.setdefault(m.layout, []).append(m)
        self._corrections = {}
        self.since += 1
        self.here += m.wall
        self.elapsed += m.wall + m.start
        self._learn(m)
        over = self._memory(m)
        if over is not None:
            return over
        if self.settled:
            self._watch(m)
        # a decision every MEASURE intervals (settled: every 4 * MEASURE),
        # on what the intervals so far taught
        scale = 4 if self.settled and not self._relearned() else 1
        # (or once DECIDE_AFTER seconds were measured since the last: slow
        # batches make few, long intervals)
        if self.since % (self.MEASURE * scale) and (not m.epoch_end or self.settled) \
                and self.here < self.DECIDE_AFTER * scale:
            # (an epoch shorter than an interval: each is a decision, for
            # the next epoch, until settled: then a plan over every layout
            # each epoch would cost a short epoch several percent)
            return None
        self.here = 0.0
        return self._decide()

    def _learn(self, m: Measurement) -> None:
        """The job's costs from an interval: averages over every interval
        (weighted by samples), of the steady quantities: CPU seconds and
        seconds in the fetch per sample, the loop's own time per batch."""
        lay = m.layout
        n = m.samples
        self.step.add(max(0.0, m.wall - m.wait) / m.batches, n)
        if lay.num_workers == 0:
            # (in the main process the loop's time in next() is the loading)
            self.cpu0.add(m.loop_cpu / n, n)
            fetch = m.fetch or max(0.0, m.wait)
            # (not clamped per interval: a small wait's differences are
            # noisy around it, and clamping each would bias it up)
            self.wait.add((fetch - m.loop_cpu) / n, n)
            return
        cpu = m.cpu / n
        if lay.processes:
            self.moving.add(m.loop_cpu / n, n)
        self.cpu_w.setdefault(_kind(lay), _Avg()).add(cpu, n)
        threads = _threaded(lay)
        if m.fetch > 0 and not threads and m.cpu / m.wall < 0.8 * self._cores():
            # (a worker process's time in the fetch less its CPU; not when
            # the cores are taken, when it would count the waiting for one)
            self.wait.add(m.fetch / n - cpu, n)
        elif self.wait.value is None and m.wait_share > 0.1 and not threads \
                and m.cpu / m.wall < 0.8 * self._cores():
            # (no fetch time: each worker was busy the whole interval)
            self.wait.add(lay.workers * m.wall / n - cpu, n)
        if cpu > 0 and threads:
            self._gil()

    def _gil(self) -> None:
        """The GIL's share from the layouts of threads measured: where one
        fell short of what the cores and its threads allow, the share whose
        bound, with the others, gives its rate (each layout's rate over all
        its intervals: one interval is too noisy)."""
        shares, most = _Avg(), 1.0
        for lay, ms in self.seen.items():
            if not _threaded(lay):
                continue
            kind = self.cpu_w.get(_kind(lay))
            cpu = kind.value if kind is not None else None
            if not cpu:
                continue
            rate = _measured(ms)
            procs = lay.num_workers if lay.processes else 1
            free = soft_min(self._bounds(lay, gil=0.0))
            waited = sum(m.wait for m in ms) / sum(m.wall for m in ms)
            # (only a shortfall past the noise of its intervals: near
            # another bound the inversion would turn noise into a share)
            if waited > 0.1 and _past_noise([(m.rate / free, m.wall) for m in ms]) < 1.0:
                held = (rate ** -SHARPNESS - free ** -SHARPNESS) ** (-1.0 / SHARPNESS)
                share = procs / (held * cpu)
                # (a share well over 1, all of the CPU holding the GIL and
                # more, cannot explain it: not the GIL's shortfall)
                if share <= 1.25:
                    shares.add(min(1.0, max(0.02, share)), sum(m.samples for m in ms))
                    continue
            # (not held by it: at most what the rate allows)
            most = min(most, procs / (rate * cpu))
        self.gil_read = shares.value is not None
        self.gil = min(shares.value, 1.0) if shares.value is not None else min(GIL_PRIOR, most)

    def _memory(self, m: Measurement) -> Optional[tuple[Layout, str]]:
        """The workers' memory over what was counted for them: a process is
        bigger than thought; where the layout no longer fits the budget,
        the plan is made again."""
        lay = m.layout
        if not lay.processes or m.memory <= self.need(lay):
            return None
        measured = (m.memory - lay.workers * self.ctx.per_worker) / lay.processes
        self.per_process = max(self.per_process, measured * 1.1)
        if self.fits(lay):
            return None
        self.settled = False
        nxt, why = self._plan()
        if nxt == lay:
            return None
        self.changes += 1
        return nxt, f"the workers' memory is near the RAM budget; {why}"

    # the model

    def _cores(self) -> float:
        return float(self.ctx.cpu) if self.ctx.cpu else float(self.ctx.cores)

    def _bounds(self, lay: Layout, gil: Optional[float] = None) -> list[float]:
        # (a kind not measured yet: another kind's, or the main process's;
        # the main process not measured, the workers')
        cpu = self.cpu0.value
        order = (_kind(lay), "p", "pt", "t") if lay.num_workers else ("p", "pt", "t")
        if lay.num_workers or cpu is None:
            for kind in order:
                if kind in self.cpu_w:
                    cpu = self.cpu_w[kind].value
                    break
        return bounds(cpu or 0.0, max(0.0, self.wait.value or 0.0),
                      (self.moving.value or 0.0) if lay.processes else 0.0,
                      self.gil if gil is None else gil, self.step.value or 0.0, self.ctx.batch,
                      self._cores(), lay)

    def predict(self, lay: Layout, uncorrected: frozenset[str] = frozenset()) -> float:
        """``lay``'s rate by the model, corrected by what the layouts of
        its kind measured against their predictions (one factor per kind,
        pooled over them: a single noisy interval moves it little), unless
        its kind is ``uncorrected``."""
        model = soft_min(self._bounds(lay))
        if not lay.num_workers:
            return _measured(self.seen[lay]) if lay in self.seen else model
        kind = _kind(lay)
        return model if kind in uncorrected else model * self._correction(kind)

    def _correction(self, kind: str) -> float:
        """What the layouts of ``kind`` measured against their predictions,
        past the noise: the mean of the intervals' ratios, moved towards 1
        by twice its standard error (one interval's rate is noisy; the
        prediction stands where the measurements do not clearly miss it).
        Cached until the next interval."""
        if kind not in self._corrections:
            ratios: list[tuple[float, float]] = []
            for k, ms in self.seen.items():
                if k.num_workers and _kind(k) == kind:
                    expected = soft_min(self._bounds(k))
                    if expected > 0 and math.isfinite(expected):
                        ratios += [(m.rate / expected, m.wall) for m in ms]
            self._corrections[kind] = _past_noise(ratios)
        return self._corrections[kind]

    def need(self, lay: Layout) -> float:
        return lay.processes * self.per_process + lay.workers * self.ctx.per_worker

    def fits(self, lay: Layout) -> bool:
        ctx = self.ctx
        return (ctx.min_workers <= lay.workers <= ctx.max_workers
                and lay.num_workers >= ctx.min_workers
                and self.need(lay) <= ctx.ram
                and (lay.num_workers == 0 or (ctx.processes if lay.processes else ctx.threads))
                and (lay.worker_threads == 1 or ctx.inner))

    def options(self) -> list[Layout]:
        ctx = self.ctx
        return [lay for lay in candidates(ctx.max_workers, ctx.processes, ctx.threads, ctx.inner)
                if self.fits(lay)]

    def _plan(self) -> tuple[Layout, str]:
        """The layout with the fewest workers predicted within ``FEW`` of
        the best, and why; whether the step hides the loading (``fed``)."""
        pick, why, self.fed = self._choose()
        return pick, why

    def _choose(self, uncorrected: frozenset[str] = frozenset()) -> tuple[Layout, str, bool]:
        """The plan: the layout, why, and whether the loop is fed (its
        predictions uncorrected for the kinds ``uncorrected``)."""
        opts = self.options() or [self.layout]
        value = {lay: self.predict(lay, uncorrected) for lay in opts}
        top = max(value.values())
        # a loop whose step hides the loading is fed when it waits under
        # 5 %: the fewest workers that get it there; else the most the
        # layouts give, within the noise of the estimates
        step = self.step.value or 0.0
        fed = step > 0 and top >= 0.9 * self.ctx.batch / step
        share = self.FED if fed else self.FEW
        few = [lay for lay in opts if value[lay] >= share * top]
        pick = min(few, key=lambda lay: (lay.workers, lay.processes, lay.worker_threads,
                                         lay not in self.seen))
        known = "measured" if pick in self.seen else "predicted"
        what = "the fewest that feed the loop" if fed else "the fewest near the best"
        return pick, (f"{known} {value[pick]:.0f} samples/s, {what} of {len(opts)} layouts "
                      f"(best {top:.0f})"), fed

    def _decide(self) -> Optional[tuple[Layout, str]]:
        """The plan, where it is worth a change: more workers must promise
        ``GAIN``; fewer are taken unless the layout in force is within
        ``FEW`` of the best already."""
        if self.changes >= self.MAX_CHANGES:
            if self.settled:
                return None
            self.settled = True
            self.settled_gil = self.gil
            measured = {lay: _measured(ms) for lay, ms in self.seen.items() if self.fits(lay)}
            pick = self.layout
            if measured:
                # (where the step hides the loading, the fewest workers
                # measured to feed it)
                top = max(measured.values())
                near = [k for k in measured if measured[k] >= (self.FED if self.fed else 1) * top]
                pick = min(near, key=lambda k: (k.workers, -measured[k]))
            self.settled_rate = measured.get(pick, 0.0)
            if pick == self.layout:
                return None
            return pick, f"the best measured after {self.changes} changes"
        opts = self.options()
        pick, why = self._plan()
        here = self.predict(self.layout)
        top = max(self.predict(lay) for lay in opts) if opts else here
        if self.settled:
            # (settled: only a clear gain moves it; noise moves the
            # estimates, and a start costs)
            # (or, where the step hides the loading, fewer workers that
            # still feed it)
            # (after EXPLORE seconds of tuning, only a large gain: the
            # layout is kept unless the data or what was learnt changes)
            # (unless the GIL's share turned out far from what it settled
            # on: the layout was chosen on a guess)
            late = self.elapsed >= self.EXPLORE and not self._relearned()
            gain = self.LATE_GAIN if late else self.SETTLED_GAIN
            keep = self.layout in opts and self.predict(pick) < gain * here \
                and not (self.fed and not late and pick.workers < self.layout.workers)
        else:
            keep = self.layout in opts and (
                pick == self.layout
                or (pick.workers > self.layout.workers and self.predict(pick) < self.GAIN * here)
                or (pick.workers <= self.layout.workers and here >= self.FEW * top)
                or (self.fed and self.FEWER * self.layout.workers < pick.workers
                    < self.layout.workers and self.predict(pick) < self.GAIN * here))
        if keep:
            # (settled on MEASURE intervals at least: one long interval
            # moves, but is not enough to stay)
            if not self.settled and self.since >= self.MEASURE:
                # (one trial at most: each costs a change, and a start;
                # past EXPLORE seconds, only of threads inside processes)
                trial = None if self.tried else self._inner_trial() \
                    or (None if self.elapsed >= self.EXPLORE else
                        self._threads_trial() or self._kind_trial())
                if trial is not None:
                    self.changes += 1
                    return trial
                self.settled = True
                self.settled_gil = self.gil
                self.settled_rate = _measured(self.seen[self.layout])
            return None
        self.settled = False
        if pick.workers > PROBE and not any(k.num_workers for k in self.seen):
            # before many workers start, a few show what taking batches
            # from them costs the loop, and what threads get
            smaller = [lay for lay in opts if 0 < lay.workers <= PROBE
                       and _kind(lay) == _kind(pick)]
            if smaller:
                pick = max(smaller, key=lambda lay: (lay.workers, -lay.processes))
                why = f"a probe of {pick} before {why}"
        self.changes += 1
        return pick, why

    def _inner_trial(self) -> Optional[tuple[Layout, str]]:
        """Before settling on worker processes that the budgets (the RAM,
        most often) hold no more of: their count with 2 threads each, once, where the GIL
        alone would hold it back. A share read from a few noisy intervals
        of threads that is too high is never corrected, since threads are
        then never run again; one measured layout settles it."""
        lay = self.layout
        trial = Layout(lay.num_workers, "multiprocessing", 2, lay.prefetch_factor)
        if not lay.processes or lay.worker_threads != 1 or self.fed \
                or self.fits(Layout(lay.num_workers + 1, "multiprocessing")) \
                or not self.fits(trial) or trial in self.seen:
            return None
        free = soft_min(self._bounds(trial, gil=0.0))
        if free < self.GAIN * _measured(self.seen[lay]):
            return None  # (not even without the GIL)
        self.tried = True
        return trial, (f"a trial of {trial}: the budgets hold no more processes, and the "
                       f"GIL's share ({self.gil:.2f}) rests on a few intervals")

    def _threads_trial(self) -> Optional[tuple[Layout, str]]:
        """Before settling on a layout chosen over threads that the GIL's
        share held back: the fastest of those threads once more, where the
        share was read from a shortfall of a few intervals within 20 % of
        what they would get without it. Near another bound (the loop's,
        the cores') such a shortfall is as likely the noise, and a share
        read too high is never corrected, since the threads are then not
        run again; their intervals pooled settle it."""
        if not self.gil_read or self.layout not in self.seen:
            return None
        here = _measured(self.seen[self.layout])
        best: Optional[tuple[float, Layout]] = None
        for lay, ms in self.seen.items():
            if lay.workers <= self.layout.workers or not self.fits(lay) \
                    or len(ms) > 4 * self.MEASURE \
                    or not _threaded(lay):
                continue
            free = soft_min(self._bounds(lay, gil=0.0))
            rate = _measured(ms)
            if free >= self.GAIN * here and rate >= max(here, 0.8 * free) \
                    and (best is None or rate > best[0]):
                best = (rate, lay)
        if best is None:
            return None
        self.tried = True
        return best[1], (f"a trial of {best[1]} again: the GIL's share ({self.gil:.2f}) was "
                         f"read from a shortfall within the noise")

    def _kind_trial(self) -> Optional[tuple[Layout, str]]:
        """Before settling: where another kind of layout was corrected
        down on a few intervals (a probe's, most often) and the plan without
        that correction is a layout of that kind with fewer workers or a
        clear gain, that layout, once. Two intervals 18 % slow by the noise
        would otherwise keep a kind out for good."""
        few = {k: 0 for k in ("p", "t", "pt") if k != _kind(self.layout)}
        for lay, ms in self.seen.items():
            if lay.num_workers and _kind(lay) in few:
                few[_kind(lay)] += len(ms)
        doubted = frozenset(k for k, n in few.items()
                            if 0 < n <= 2 * self.MEASURE and self._correction(k) < 1.0)
        if not doubted:
            return None
        pick, _, _ = self._choose(doubted)
        gain = self.predict(pick, doubted) / self.predict(self.layout)
        if _kind(pick) not in doubted or pick in self.seen \
                or not (pick.workers < self.layout.workers or gain >= self.GAIN):
            return None
        self.tried = True
        return pick, f"a trial of {pick}: its kind was measured short on a few intervals"

    def _relearned(self) -> bool:
        """Settled on a GIL's share far from what it is now measured at
        (the prior, before threads ran many at once)."""
        return abs(self.gil - self.settled_gil) >= 0.25

    def _watch(self, m: Measurement) -> None:
        """Settled: a rate far below the settled one three intervals in a
        row (the data got slower): what was learnt is forgotten, and the
        next decisions are made on new measurements."""
        self.low = self.low + 1 if m.rate < 0.6 * self.settled_rate else 0
        if self.low >= 3 and self.ctx.mid_epoch:
            self.settled = False
            self.low = 0
            self.changes = 0
            self.seen = {m.layout: [m]}
            self._forget()


GIL_PRIOR = 0.25
# the most workers the first worker layout starts (see Policy._decide)
PROBE = 4


def _kind(lay: Layout) -> str:
    return "t" if lay.worker_method == "thread" else "p" if lay.worker_threads == 1 else "pt"


def _threaded(lay: Layout) -> bool:
    """Threads share a process's GIL in ``lay``."""
    return _kind(lay) != "p"


__all__ = ["Context", "Measurement", "Policy", "bounds", "candidates", "soft_min"]
