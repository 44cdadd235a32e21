"""The iterator of a ``num_workers="auto"`` loader (see
``ferroloader.tuning.bounds``): a fixed-layout iterator underneath, measured per
interval, and replaced between two batches when the tuner says: the
engine holds back new tasks, the batches in flight are handed over, the
loader's own state is taken (nothing pending) and the epoch continues from
it on the new layout."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any, Optional

import torch.utils.data.dataloader as _tdl

from ferroloader import _machine
from ferroloader._env import _INITIAL_ARENA
from ferroloader.epoch import state
from ferroloader.epoch.plan import stateful
from ferroloader.errors import ConfigError
from ferroloader.hosts.local import _thread_unsafe_attributes
from ferroloader.run.iterators import _harvest_stats
from ferroloader.tuning.bounds import _MAIN_INTERVAL, _MIN_INTERVAL, Autotune, Layout
from ferroloader.tuning.climb import Tuner, _Interval
from ferroloader.tuning.policy import Context, Measurement, Policy

_BUDGETS_FRESH = 2.0  # seconds


class ModelTuner(Tuner):
    """``num_workers="auto"``'s tuner: the model-based ``Policy`` decides
    on the loader's measurements; this keeps the bookkeeping (the changes
    with their reasons, the notes, the budgets) that ``stats()`` shows."""

    def __init__(self, bounds: Autotune, layout: Layout, mid_epoch: bool, notes: list[str],
                 batch: int) -> None:
        super().__init__(bounds, layout, mid_epoch, notes)
        self.batch = max(1, batch)
        self.policy: Optional[Policy] = None
        # a batch's bytes, once one is seen (a worker's arena holds its
        # batches in flight: what of it is touched is what it takes)
        self.batch_bytes = 0

    @property
    def per_worker(self) -> int:
        if not self.batch_bytes:
            return _INITIAL_ARENA
        return min(_INITIAL_ARENA, max(1 << 20, 2 * (self.layout.prefetch_factor + 1)
                                       * self.batch_bytes))

    def need(self, layout: Layout) -> int:
        return layout.processes * self.per_process + layout.workers * self.per_worker

    def context(self) -> Context:
        return Context(cores=_machine.cores(), max_workers=self.max_workers, ram=self.ram,
                       per_process=self.per_process, per_worker=self.per_worker, cpu=self.cpu,
                       processes=self.processes_ok, threads=self.threads_ok,
                       inner=self.inner_threads_ok, min_workers=self.min_workers,
                       batch=self.batch, mid_epoch=self.mid_epoch)

    def measured(self, m: Measurement) -> Optional[tuple[Layout, str]]:
        # (the change records and stats() show the interval in batches)
        if m.batches:  # (not new workers' warm-up, whose memory only is measured)
            seen = _Interval(m.batches, m.wall, m.wait, m.cpu)
            before = self.changes[-1] if self.changes else None
            if before is not None and before.rate_after is None:
                before.rate_after, before.wait_after = seen.rate, seen.wait_share
            self.current = seen
        if self.policy is None:
            self.policy = Policy(self.context(), self.layout)
        nxt = self.policy.observe(m)
        self.settled = self.policy.settled
        return nxt


class _Meter:
    """The loader's CPU: its worker processes', or for worker threads this
    process's less the training loop's thread."""

    def __init__(self, it: Any) -> None:
        self.pids = [p.pid for p in getattr(it, "_procs", ()) if hasattr(p, "pid")]
        self.threads = not self.pids and bool(getattr(it, "_procs", ()))
        self.last = self.read()

    def read(self) -> float:
        if self.pids:
            return sum(_machine.cpu_seconds(p) for p in self.pids)
        if self.threads:
            return _machine.cpu_seconds("self") - time.thread_time()
        return 0.0

    def delta(self) -> float:
        now = self.read()
        d, self.last = max(0.0, now - self.last), now
        return d


def mid_epoch_ok(loader: Any) -> Optional[str]:
    """Why the layout can change only between epochs, or ``None`` when it
    can change between any two batches."""
    if loader._dataset_kind == _tdl._DatasetKind.Iterable and not loader._sharded():
        return (
            "an IterableDataset shards itself by get_worker_info(): its layout changes "
            "only between epochs"
        )
    if getattr(loader, "pin_memory", False):
        return "pin_memory=True: the layout changes only between epochs"
    if stateful(loader.dataset):
        return (
            "the dataset keeps a state per worker replica (state_dict): its layout changes "
            "only between epochs"
        )
    return None


def threads_refusal(loader: Any) -> Optional[str]:
    """Why worker threads cannot serve this loader's dataset, or ``None``."""
    if stateful(loader.dataset):
        return "the dataset keeps a state per worker replica (state_dict): no threads"
    if loader.per_sample_seed and not loader.autotune.methods_given:
        return (
            "per_sample_seed=True: worker threads seed their own generators "
            "(torch.thread_safe_generator()), and a dataset drawing from the global ones "
            "would get other draws: no threads (name them in Autotune(methods=...) to allow)"
        )
    found = _thread_unsafe_attributes(loader.dataset)
    if found:
        name, problem = found[0]
        return f"the dataset's attribute {name!r} is {problem}: no threads"
    return None


def data_cap(loader: Any) -> Optional[tuple[int, str]]:
    """The most workers the loader's data can keep busy, and why; ``None``
    where it knows no bound. A worker past it would have nothing to read:
    static sharding's lanes, a dynamic queue's shards, an epoch's batches."""
    if loader._sharded():
        sharding = loader.sharding
        if sharding.mode == "static":
            return sharding.lanes, (f"static sharding reads with {sharding.lanes} lanes "
                                    "(Sharding(lanes=...))")
        if sharding.mode == "dynamic":
            shards = len(loader._shard_info()[0])
            return max(1, shards), f"dynamic sharding's workers read a shard each, of {shards}"
    if loader._dataset_kind == _tdl._DatasetKind.Iterable and not loader._sharded():
        return None
    try:
        batches = len(loader._index_sampler)
    except TypeError:  # a sampler without len()
        return None
    return max(1, batches), f"an epoch has {batches} batches"


def apply(loader: Any, layout: Layout) -> None:
    """Sets the loader's layout attributes (read by the next epoch start)."""
    loader._layout_in_force = layout
    loader.num_workers = layout.num_workers
    loader.worker_method = layout.worker_method if layout.num_workers else "multiprocessing"
    loader.worker_threads = layout.worker_threads if layout.num_workers else 1
    loader.prefetch_factor = layout.prefetch_factor if layout.num_workers else None


class AutoIter:
    """The iterator of a ``num_workers="auto"`` loader: a fixed-layout
    iterator underneath, replaced between two batches when the tuner says."""

    def __init__(self, loader: Any, fixed_iter: Any) -> None:
        self._loader = loader
        self._fixed_iter = fixed_iter
        tuner: Optional[Tuner] = loader._tuner
        if tuner is None:
            notes: list[str] = []
            no_threads = threads_refusal(loader)
            if no_threads is not None:
                notes.append(no_threads)
            why = mid_epoch_ok(loader)
            if why is not None:
                notes.append(why)
            if loader._auto_min_workers:
                notes.append(
                    "StatefulDataLoader draws its shuffle once more with workers than without "
                    "(as torchdata does): at least one worker, so that no change alters the order"
                )
            start = loader._tuned_layout or Layout(loader._auto_min_workers)
            policy = os.environ.get("FERROLOADER_AUTOTUNE_POLICY") or "model"
            if policy not in ("model", "climb"):
                raise ConfigError(
                    f"FERROLOADER_AUTOTUNE_POLICY should be 'model' or 'climb', got {policy!r}")
            if policy == "climb":
                # (the climbing policy that came before, kept for a
                # side-by-side: see the autotune guide)
                tuner = Tuner(loader.autotune, start, why is None, notes)
            else:
                tuner = ModelTuner(loader.autotune, start, why is None, notes,
                                   loader.batch_size or 1)
            tuner.min_workers = loader._auto_min_workers
            cap = data_cap(loader)
            if cap is not None:
                tuner.cap = (max(cap[0], tuner.min_workers), cap[1])
                tuner.read_budgets()
                if tuner.max_workers == tuner.cap[0]:
                    notes.append(f"at most {tuner.cap[0]} workers: {cap[1]}")
            if no_threads is not None:
                tuner.threads_ok = tuner.inner_threads_ok = False
                tuner.processes_ok = True
            loader._tuner = tuner
        elif time.monotonic() - tuner.budgets_read > _BUDGETS_FRESH:
            # (read again, the memory free having changed; not at every
            # iter(): reading /proc costs a short epoch a percent)
            tuner.read_budgets()
        self._tuner = tuner
        if loader._tuned_layout is not None:
            tuner.layout = loader._tuned_layout
        begun = time.perf_counter()  # (the tuner's own setup left out)
        if loader._iterator is not None and loader._layout_in_force != tuner.layout:
            # persistent workers of another layout: they go, new ones start,
            # on their base seed (torch draws none for persistent workers)
            old = loader._epoch
            _close(loader._iterator)
            loader._iterator = None
            if old is not None and old.base_seed is not None and not loader._resume_extra:
                loader._resume_extra = {"base_seed": int(old.base_seed)}
        # (new workers this epoch: the first batch's wait is their start)
        self._new_workers = bool(tuner.layout.num_workers) and (
            loader._iterator is None or loader._layout_in_force != tuner.layout)
        if self._new_workers:
            tuner.next_memory_check = 0.0  # (new workers: read at the first interval)
        apply(loader, tuner.layout)
        self._inner = fixed_iter()
        self._start()
        # the whole epoch from iter(), for one shorter than an interval (see
        # _epoch_end): the workers' reset for it is the loop's wait
        self._epoch_t0, self._epoch_cpu0 = begun, self._meter.last
        self._epoch_waited, self._epoch_loop_cpu = self._t0 - begun, 0.0
        self._epoch_start = 0.0
        self._pending: Optional[tuple[Layout, str]] = None
        self._start_cost = 0.0
        self._intervals = 0  # measured in this epoch
        self._tuner_bytes_seen = False
        self._handed = 0
        self._decided = False  # the next epoch's layout is chosen

    def _start(self) -> None:
        self._meter = _Meter(self._inner)
        self._t0 = time.perf_counter()
        self._batches = 0
        self._waited = 0.0
        self._loop_cpu = 0.0
        workers = self._tuner.layout.workers
        self._warm = max(1, workers)  # batches before measuring
        # an interval has at least two rounds of the workers' batches, which
        # come in bursts (the main process's come one by one: one batch)
        self._enough = 2 * workers or 1

    def __iter__(self) -> AutoIter:
        return self

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        # torch's iterator attributes (_workers, _shutdown_workers, ...)
        return getattr(self.__dict__["_inner"], name)

    def _force(self, layout: Layout) -> None:
        """Changes the layout before the next batch, or where the layout
        changes only between epochs, at the next epoch (for tests)."""
        if layout.num_workers < self._tuner.min_workers:
            raise ValueError(f"this loader keeps at least {self._tuner.min_workers} worker")
        # (a forced layout stays: epochs ending are not measured any more)
        self._tuner.forced = True
        if self._tuner.mid_epoch:
            self._pending = (layout, "forced")
        else:
            self._loader._tuned_layout = layout
            self._tuner.record(self._epoch_number(), self._handed, layout, "forced (next epoch)")

    def __next__(self) -> Any:
        t = time.perf_counter()
        tc = time.thread_time()
        while True:
            if self._pending is not None and self._drained():
                self._switch()
            try:
                batch = next(self._inner)
            except StopIteration:
                if self._pending is not None and self._drained_not_ended():
                    self._switch()  # nothing more comes from it: go on on the new layout
                    continue
                self._epoch_end()
                raise
            break
        now = time.perf_counter()
        spent = time.thread_time() - tc  # (read once: this is every batch)
        if self._handed == 0 and self._new_workers:
            self._epoch_start, self._epoch_t0 = now - self._epoch_t0, now
            self._epoch_waited = 0.0
        else:
            self._epoch_waited += now - t
            self._epoch_loop_cpu += spent
        self._handed += 1
        if not self._tuner_bytes_seen:
            self._tuner_bytes_seen = True
            if isinstance(self._tuner, ModelTuner):
                self._tuner.batch_bytes = _nbytes(batch)
        if self._warm > 0:
            self._warm -= 1
            if self._warm == 0:
                self._t0, self._batches, self._waited, self._loop_cpu = now, 0, 0.0, 0.0
                self._meter.delta()
            return batch
        self._batches += 1
        self._waited += now - t
        self._loop_cpu += spent
        if self._batches >= self._enough and self._pending is None and not self._decided:
            wall = now - self._t0
            if wall >= (_MIN_INTERVAL if self._tuner.layout.num_workers else _MAIN_INTERVAL):
                self._measure(wall)
        return batch

    def _epoch_end(self) -> None:
        """An epoch shorter than an interval is measured whole at its end,
        from ``iter()`` on: the workers' first batches of an epoch are what
        a short epoch pays for them (the first batch of new workers is
        their start, counted apart); what is decided takes effect in the
        next epoch. The first epoch of new persistent workers is their
        warm-up, not measured: they fault in the pages of the dataset they
        share and fill their caches, and ran it at half their rate (the
        next epochs, on the same workers, pay none of it)."""
        if self._decided or self._pending is not None or self._handed < 2 or self._intervals \
                or self._tuner.forced or not isinstance(self._tuner, ModelTuner):
            return
        wall = time.perf_counter() - self._epoch_t0
        if self._new_workers and self._loader.persistent_workers:
            # (their memory only, read now: the read walks their page
            # tables, which in the next epoch would cost it a tenth)
            self._batches, self._waited, self._loop_cpu = 0, 0.0, 0.0
            self._start_cost = self._epoch_start + wall
            self._measure(wall, epoch_end=True)
            return
        if wall > 0:
            self._batches, self._waited = self._handed - self._new_workers, self._epoch_waited
            self._loop_cpu, self._start_cost = self._epoch_loop_cpu, self._epoch_start
            self._meter.last = self._epoch_cpu0
            self._measure(wall, epoch_end=True)

    def _measure(self, wall: float, epoch_end: bool = False) -> None:
        self._intervals += 1
        now = time.perf_counter()
        tuner = self._tuner
        memory = 0
        if self._meter.pids and now >= tuner.next_memory_check:
            # (reading the workers' PSS walks their page tables: every 2 s)
            tuner.next_memory_check = now + 2.0
            memory = sum(_machine.pss(p) for p in self._meter.pids)
        m = Measurement(tuner.layout, wall, self._batches,
                        self._batches * (self._loader.batch_size or 1), self._waited,
                        self._loop_cpu, self._meter.delta(), memory=memory,
                        start=self._start_cost, epoch_end=epoch_end)
        self._start_cost = 0.0
        self._t0, self._batches, self._waited, self._loop_cpu = time.perf_counter(), 0, 0.0, 0.0
        decided = tuner.measured(m)
        over = decided is None and memory > 0.9 * tuner.ram
        if over:
            lay = tuner.layout
            smaller = replace(lay, num_workers=max(lay.num_workers // 2, tuner.min_workers))
            if tuner.threads_ok:
                smaller = replace(lay, worker_method="thread", worker_threads=1)
            decided = smaller, "the workers' memory is near the RAM budget"
            tuner.settled = True
        if decided is not None:
            layout, reason = decided
            if tuner.mid_epoch and not epoch_end:
                self._pending = decided
            else:
                self._loader._tuned_layout = layout
                tuner.record(self._epoch_number(), self._handed, layout, reason + " (next epoch)")
                # (what follows in this epoch still runs the old layout)
                self._decided = True

    def _epoch_number(self) -> int:
        return int(self._loader._epochs_started) - 1

    def _in_place(self, layout: Layout) -> bool:
        """The change needs no new workers: the layout in force, or only
        another prefetch depth, which the engine takes as it runs."""
        current = self._loader._layout_in_force
        return layout == current or (
            _only_prefetch(current, layout) and hasattr(self._inner, "_set_prefetch_factor")
        )

    def _drained_not_ended(self) -> bool:
        inner = self._inner
        return bool(getattr(inner, "_held", False)) and not inner._position[2]

    def _drained(self) -> bool:
        """Holds back new tasks; true once nothing is in flight."""
        inner = self._inner
        if not hasattr(inner, "_hold"):
            return True
        assert self._pending is not None
        if self._in_place(self._pending[0]):
            return True  # (no restart: nothing to drain)
        if not inner._held:
            inner._hold(True)
        return bool(inner._in_flight == 0)

    def _switch(self) -> None:
        assert self._pending is not None
        layout, reason = self._pending
        self._pending = None
        tuner = self._tuner
        loader = self._loader
        inner = self._inner
        current = loader._layout_in_force
        if self._in_place(layout):
            # another prefetch depth, or the layout in force asked for again
            # (e.g. while draining): the same workers go on
            if layout != current:
                tuner.record(self._epoch_number(), self._handed, layout, reason)
                inner._set_prefetch_factor(layout.prefetch_factor)
                apply(loader, layout)
                loader._tuned_layout = layout
                self._start()
            if getattr(inner, "_held", False):
                inner._hold(False)
            return
        tuner.record(self._epoch_number(), self._handed, layout, reason)
        t0 = time.perf_counter()
        snap = state.snapshot(loader)
        _close(inner)
        try:
            self._restart(layout, snap)
            self._start_cost = time.perf_counter() - t0
        except Exception as e:
            # (e.g. out of file descriptors): back on the layout that ran,
            # from the same state; if that fails too, its error is raised
            tuner.notes.append(f"{layout} could not start ({e!r}): back to {current}")
            tuner.record(self._epoch_number(), self._handed, current, "the new layout failed")
            tuner.settled = True
            self._restart(current, snap)

    def _restart(self, layout: Layout, snap: dict[str, Any]) -> None:
        """The epoch continues from ``snap`` on ``layout``."""
        loader = self._loader
        apply(loader, layout)
        loader._tuned_layout = layout
        state.load(loader, snap)
        self._inner = self._fixed_iter()
        self._tuner.next_memory_check = 0.0
        self._start()


def _nbytes(batch: Any, depth: int = 0) -> int:
    """A batch's bytes: its tensors' and arrays' (in dicts, lists and
    tuples), 64 for anything else."""
    n = getattr(batch, "nbytes", None)
    if isinstance(n, int):
        return n
    if depth < 4 and isinstance(batch, dict):
        return sum(_nbytes(v, depth + 1) for v in batch.values())
    if depth < 4 and isinstance(batch, (list, tuple)):
        return sum(_nbytes(v, depth + 1) for v in batch)
    return 64


def _only_prefetch(a: Layout, b: Layout) -> bool:
    return a.num_workers > 0 and replace(a, prefetch_factor=b.prefetch_factor) == b


def _close(it: Any) -> None:
    rec = getattr(it, "_epoch_record", None)
    if rec is not None:
        state.detach(rec, it)
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    _harvest_stats(it)
