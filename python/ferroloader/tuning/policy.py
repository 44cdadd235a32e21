"""The model-based policy of ``num_workers="auto"``: ``Policy``, a pure
state machine over measured intervals, which plans with a model of the
machine (``tuning.estimate``). The decisions are made in the engine
(``src/tuning/policy.rs``, where each rule is written down); the loader
feeds it (``tuning.live.ModelTuner``), and ``ferroloader.tuning.model``
runs the same ``Policy`` in simulated time, from 2 to 128 cores.

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

from typing import Optional

import ferroloader._core as _core
from ferroloader.tuning.bounds import Layout
from ferroloader.tuning.estimate import (
    Context,
    Measurement,
    bounds,
    candidates,
    key,
    soft_min,
)


class Policy:
    """``num_workers="auto"``'s decisions. Each measured interval goes in
    (``observe``); out comes a new layout and why, or ``None`` to keep the
    one in force. No clock, process or ``/proc`` is read here: the loader
    measures and applies.

    It estimates the job's costs per sample from the intervals, predicts
    each layout's rate with the model, goes to the layout with the fewest
    workers predicted near the best that fits the budgets, measures it and
    corrects the predictions of its kind by what it measured; it settles
    when the plan is not worth a change, and starts over when the rate
    falls far below the settled one."""

    def __init__(self, ctx: Context, layout: Layout) -> None:
        self.ctx = ctx
        self._native = _core.TunePolicy(ctx, key(layout))

    def observe(self, m: Measurement) -> Optional[tuple[Layout, str]]:
        out = self._native.observe(m)
        return None if out is None else (Layout(*out[0]), out[1])

    @property
    def settled(self) -> bool:
        return self._native.settled

    @property
    def layout(self) -> Layout:
        return Layout(*self._native.layout)

    @property
    def gil(self) -> float:
        """The GIL's share of the workers' CPU, as measured (or assumed)."""
        return self._native.gil

    @property
    def changes(self) -> int:
        return self._native.changes

    @property
    def seen(self) -> dict[Layout, list[Measurement]]:
        """The intervals kept of each layout, in the order first measured."""
        return {Layout(*lay): [Measurement(Layout(*m[0]), *m[1:]) for m in ms]
                for lay, ms in self._native.seen()}

    def need(self, lay: Layout) -> float:
        """The memory ``lay``'s workers take, as counted so far."""
        return self._native.need(key(lay))

    def fits(self, lay: Layout) -> bool:
        """``lay`` is within the budgets and the methods allowed."""
        return self._native.fits(key(lay))

    def predict(self, lay: Layout) -> float:
        """``lay``'s rate by the model, corrected by what was measured."""
        return self._native.predict(key(lay))


__all__ = ["Context", "Measurement", "Policy", "bounds", "candidates", "soft_min"]
