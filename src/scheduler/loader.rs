//! One multi-process iterator's engine: the [`Scheduler`]'s bookkeeping
//! driven by the [`WorkerPool`]'s events. What it cannot do itself is the
//! host's: drawing indices (a sampler may be Python), releasing the
//! interpreter while it sleeps, and turning a record into a batch.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::pool::{Event, WorkerPool};
use super::shards::{LanePlan, LaneSnapshot, RanOut, ShardQueue, WorkSource};
use super::{Next, Scheduler};
use crate::error::{Error, Result};
use crate::ring::{RecordHandle, RecordRef};
use crate::wire::protocol::{LanePos, TaskIndices, ToWorker, Work};
use crate::wire::transport::Blocking;

/// The longest the loader sleeps without giving the host a chance to
/// deliver an interrupt (Ctrl-C).
pub const INTERRUPT_SLICE: Duration = Duration::from_millis(50);
/// How long the loader keeps checking the mailboxes before sleeping.
pub const SPIN: Duration = Duration::from_micros(100);

/// A host the loader can wait in: it lets others run while the loader
/// sleeps ([`Blocking`]) and, between sleeps, delivers its interrupts.
pub trait Waiter: Blocking {
    type Error: From<Error>;
    /// Called after every sleep slice; an error (e.g. `KeyboardInterrupt`)
    /// ends the wait with it.
    fn check_interrupts(&mut self) -> Result<(), Self::Error>;
}

/// What a worker answered for a task.
#[derive(Debug, PartialEq, Eq)]
pub enum Payload {
    /// A batch record in the worker's arena.
    Batch(RecordRef),
    /// The user's exception, serialised by the worker.
    Error(Vec<u8>),
}

pub struct Loader {
    pool: WorkerPool,
    sched: Scheduler<Payload>,
    /// Results that arrived out of order and are handed over as they came
    /// (`in_order=False`), with their sequence numbers.
    early: VecDeque<(u64, usize, Payload)>,
    persistent: bool,
    /// Workers that have not yet acknowledged `Resume` (a new epoch).
    awaiting_resume: usize,
    closed: bool,
    /// Per worker, this epoch: batches handed over, the replica states that
    /// came with batches not yet handed over (in the worker's order), and
    /// the state that came with the last one handed over. An iterable's
    /// snapshot is made of these.
    delivered: Vec<u64>,
    states: Vec<VecDeque<Vec<u8>>>,
    last_state: Vec<Option<Vec<u8>>>,
    /// The state a worker's replica sent when it ran out (its epoch's end).
    end_state: Vec<Option<Vec<u8>>>,
    prefetch_factor: usize,
    in_order: bool,
    /// A sharded epoch's lanes (`None`: tasks go to workers as in torch).
    lanes: Option<Lanes>,
    /// Each worker's stage timings, as reported.
    worker_times: Vec<crate::stats::StageTimes>,
    /// Per worker, this epoch: it acknowledged `Resume` (always, in the
    /// first epoch), and it reported its setup over (`Started`).
    acked: Vec<bool>,
    started: Vec<bool>,
    /// The first error a worker's setup raised this epoch, as it came.
    setup_error: Option<Vec<u8>>,
    /// No task goes out: the epoch is being drained, to end between two
    /// batches with nothing in flight (a layout change).
    held: bool,
}

/// A sharded epoch as the loader drives it.
struct Lanes {
    plan: LanePlan,
    worker_of: Vec<usize>,
    queue: Option<ShardQueue>,
    /// Per worker: the lane positions that came with its batches not yet
    /// handed over, in its order.
    pending: Vec<VecDeque<(u32, LanePos)>>,
    /// Each lane's position after its last handed-over batch.
    positions: Vec<Option<LanePos>>,
    /// Each lane's position after the last batch it made (handed over or
    /// not): where a lane that hands back ended its own stream.
    produced: Vec<Option<LanePos>>,
    /// The collecting lane's task, held until tails still on their way
    /// come: `(worker, seq, lane)`.
    deferred: Option<(usize, u64, u32)>,
    /// The lane told it reads the epoch's last items (tails collected,
    /// none to come): its last batch, the one that may be short, is handed
    /// over after every other batch, whatever its sequence number.
    collector: Option<usize>,
    /// The collector's latest batch, kept until its next answer says
    /// whether it was its last: `(seq, batch)`.
    held: Option<(u64, Payload)>,
    /// The collector's last batch, handed over once the rest are:
    /// `(seq, lane, batch)`.
    last_batch: Option<(u64, usize, Payload)>,
    handed: u64,
    budget: Option<u64>,
}

/// Where each worker of an iterable epoch stands, for a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IterablePosition {
    /// Batches each worker has handed over this epoch.
    pub delivered: Vec<u64>,
    /// The replica state that came with each worker's last handed-over
    /// batch, or with its end once it is `done`.
    pub states: Vec<Option<Vec<u8>>>,
    /// Workers whose replica ran out (or that are gone).
    pub exhausted: Vec<bool>,
    /// Workers whose replica ran out and whose every batch was handed over.
    pub done: Vec<bool>,
    /// The worker whose batch comes next in the round-robin.
    pub next_worker: usize,
}

impl Loader {
    pub fn new(pool: WorkerPool, prefetch_factor: usize, in_order: bool, persistent: bool) -> Self {
        let n = pool.len();
        let sched = Scheduler::new(n, prefetch_factor, in_order);
        Loader {
            pool,
            sched,
            early: VecDeque::new(),
            persistent,
            awaiting_resume: 0,
            closed: false,
            delivered: vec![0; n],
            states: vec![VecDeque::new(); n],
            last_state: vec![None; n],
            end_state: vec![None; n],
            prefetch_factor,
            in_order,
            lanes: None,
            worker_times: vec![Default::default(); n],
            acked: vec![true; n],
            started: vec![false; n],
            setup_error: None,
            held: false,
        }
    }

    /// Holds back (or lets go) new tasks. A held loader hands over what is
    /// in flight and then answers `Stop` without closing: the epoch is not
    /// over, only drained, and a snapshot then has nothing pending.
    pub fn hold(&mut self, held: bool) {
        self.held = held;
    }

    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Whether a `Stop` from [`Loader::step`] ends the epoch: a held loader
    /// that ran dry is only drained, unless the epoch's budget is spent.
    pub fn stop_is_final(&self) -> bool {
        !self.held || self.budget_spent()
    }

    /// A sharded epoch handed over every batch its rank owes (`even`).
    pub fn budget_spent(&self) -> bool {
        self.lanes
            .as_ref()
            .is_some_and(|l| l.budget.is_some_and(|b| l.handed >= b))
    }

    /// A new prefetch depth for the rest of the epoch (and the next ones).
    pub fn set_prefetch_factor(&mut self, prefetch_factor: usize) {
        self.prefetch_factor = prefetch_factor;
        self.sched
            .set_max_tasks(super::window(prefetch_factor, self.pool.len()));
    }

    /// Answers still to hand over: tasks in flight or waiting their turn,
    /// and results that came early (`in_order=False`).
    pub fn in_flight(&self) -> usize {
        let last = self.lanes.as_ref().is_some_and(|l| l.last_batch.is_some());
        self.sched.in_flight() + self.early.len() + usize::from(last)
    }

    /// Each worker's stage timings reported so far (all epochs): every
    /// batch read from a worker is counted (its timings come with it).
    pub fn worker_times(&self) -> &[crate::stats::StageTimes] {
        &self.worker_times
    }

    /// A sharded epoch: tasks cycle over `plan.lanes` lanes instead of the
    /// workers. Sends each worker its lanes (and static lanes their works,
    /// dynamic ones a first shard). Call before the first task of the
    /// epoch (after [`Loader::restart_epoch`] for persistent workers).
    pub fn start_lanes(&mut self, plan: LanePlan) -> Result<()> {
        self.start_lanes_with(plan, None)
    }

    /// [`Loader::start_lanes`], a dynamic queue going on with `source`'s
    /// works once its own are out (the job's shared queue).
    pub fn start_lanes_with(
        &mut self,
        plan: LanePlan,
        source: Option<Box<dyn WorkSource>>,
    ) -> Result<()> {
        let n = self.pool.len();
        let max_tasks = super::window(self.prefetch_factor, n);
        self.sched = Scheduler::with_lanes(plan.lanes, max_tasks, self.in_order);
        self.sched.restore_cycle(plan.next_lane);
        let worker_of: Vec<usize> = (0..plan.lanes).map(|l| l % n).collect();
        for w in 0..n {
            let lanes = (0..plan.lanes as u32)
                .filter(|&l| worker_of[l as usize] == w)
                .collect();
            let msg = ToWorker::Lanes {
                lanes,
                shuffle: plan.shuffle,
                block: plan.block,
                root: plan.root,
            };
            self.pool.send(w, &msg)?;
        }
        let mut queue = None;
        match &plan.works {
            Some(works) => {
                for (lane, works) in works.iter().cloned().enumerate() {
                    let msg = ToWorker::Assign {
                        lane: lane as u32,
                        works,
                        last: true,
                    };
                    self.pool.send(worker_of[lane], &msg)?;
                }
            }
            None => {
                // two shards each, the second to read ahead into; lanes get
                // a third as soon as they begin their second (`LanePos`)
                let mut q = ShardQueue::new(plan.queue.clone(), plan.lanes).with_source(source);
                let first = q.first_works(2);
                if let Some(e) = q.take_failure() {
                    return Err(Error::Queue(e.0));
                }
                for (lane, (works, last)) in first.into_iter().enumerate() {
                    let msg = ToWorker::Assign {
                        lane: lane as u32,
                        works,
                        last,
                    };
                    self.pool.send(worker_of[lane], &msg)?;
                }
                queue = Some(q);
            }
        }
        self.lanes = Some(Lanes {
            worker_of,
            queue,
            pending: vec![VecDeque::new(); n],
            positions: plan.positions.clone(),
            produced: plan.positions.clone(),
            deferred: None,
            collector: None,
            held: None,
            last_batch: None,
            handed: plan.handed,
            budget: plan.budget,
            plan,
        });
        Ok(())
    }

    /// Where a sharded epoch stands; `None` for other epochs.
    pub fn lane_snapshot(&self) -> Option<LaneSnapshot> {
        let lanes = self.lanes.as_ref()?;
        Some(LaneSnapshot {
            positions: lanes.positions.clone(),
            next_lane: self.sched.next_worker(),
            handed: lanes.handed,
            rest: lanes.queue.as_ref().map(|q| q.rest(&lanes.positions)),
        })
    }

    pub fn pool(&self) -> &WorkerPool {
        &self.pool
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Stops every worker; the iterator yields nothing more.
    pub fn close(&mut self) {
        self.closed = true;
        self.pool.close();
    }

    /// The worker processes to end once closed (see [`super::pool::end_processes`]).
    pub fn processes(&self) -> Vec<&crate::wire::transport::Watched> {
        self.pool.processes()
    }

    /// `_try_put_index`: if the prefetch window has room, draw the next
    /// indices and send them to the next worker in the cycle.
    pub fn put_task<E: From<Error>>(
        &mut self,
        draw: &mut impl FnMut() -> Result<Option<TaskIndices>, E>,
    ) -> Result<(), E> {
        self.try_put_task(draw).map(|_| ())
    }

    /// [`Loader::put_task`], saying whether a task went out.
    fn try_put_task<E: From<Error>>(
        &mut self,
        draw: &mut impl FnMut() -> Result<Option<TaskIndices>, E>,
    ) -> Result<bool, E> {
        if self.held || !self.sched.can_dispatch() {
            return Ok(false);
        }
        if let Some(lanes) = &self.lanes {
            // a lane's task is "your next batch": nothing to draw
            let Some(d) = self.sched.dispatch() else {
                return Ok(false);
            };
            let task = ToWorker::Task {
                seq: d.seq,
                indices: TaskIndices::Lane(d.worker as u32),
            };
            self.pool.send(lanes.worker_of[d.worker], &task)?;
            return Ok(true);
        }
        let Some(indices) = draw()? else {
            return Ok(false);
        };
        let Some(d) = self.sched.dispatch() else {
            return Ok(false);
        };
        let task = ToWorker::Task {
            seq: d.seq,
            indices,
        };
        self.pool.send(d.worker, &task)?;
        Ok(true)
    }

    /// Fills the prefetch window (`_reset`'s loop).
    pub fn prime<E: From<Error>>(
        &mut self,
        draw: &mut impl FnMut() -> Result<Option<TaskIndices>, E>,
    ) -> Result<(), E> {
        for _ in 0..self.sched.max_tasks() {
            if !self.try_put_task(draw)? {
                break; // the sampler ran out, or the window is full
            }
        }
        Ok(())
    }

    /// The next answer to hand over, `Wait`, or `Stop` at the epoch's end
    /// (closing the workers unless they persist).
    pub fn step(&mut self) -> Next<Payload> {
        let spent = self.budget_spent();
        let next = if spent {
            Next::Stop
        } else {
            let next = match self.early.pop_front() {
                Some((_, worker, data)) => Next::Yield { worker, data },
                None => match self.sched.next_step() {
                    // every other batch is out: the collector's last one
                    Next::Stop => match self.lanes.as_mut().and_then(|l| l.last_batch.take()) {
                        Some((_, lane, data)) => Next::Yield { worker: lane, data },
                        None => Next::Stop,
                    },
                    next => next,
                },
            };
            match (next, &self.lanes) {
                // the scheduler's units are lanes: name the worker that ran it
                (Next::Yield { worker: lane, data }, Some(lanes)) => Next::Yield {
                    worker: lanes.worker_of[lane],
                    data,
                },
                (next, _) => next,
            }
        };
        match &next {
            Next::Yield {
                worker,
                data: Payload::Batch(_),
            } => {
                // a worker's batches are handed over in the order it made them
                self.delivered[*worker] += 1;
                self.last_state[*worker] = self.states[*worker].pop_front();
                if let Some(lanes) = &mut self.lanes {
                    lanes.handed += 1;
                    if let Some((lane, pos)) = lanes.pending[*worker].pop_front() {
                        let lane = lane as usize;
                        if lane < lanes.positions.len() {
                            lanes.positions[lane] = Some(lanes.plan.absolute(lane, pos));
                        }
                    }
                }
            }
            Next::Stop if !self.persistent && self.stop_is_final() => self.close(),
            _ => {}
        }
        next
    }

    /// Where each worker of an iterable epoch stands (see
    /// [`IterablePosition`]); read between batches.
    pub fn iterable_position(&self) -> IterablePosition {
        let n = self.pool.len();
        let exhausted: Vec<bool> = (0..n).map(|w| !self.sched.is_active(w)).collect();
        let done: Vec<bool> = (0..n)
            .map(|w| {
                exhausted[w]
                    && self.states[w].is_empty()
                    && !self.sched.holds_result_of(w)
                    && !self.early.iter().any(|(_, e, _)| *e == w)
            })
            .collect();
        let states = (0..n)
            .map(|w| match (&self.end_state[w], done[w]) {
                (Some(end), true) => Some(end.clone()),
                _ => self.last_state[w].clone(),
            })
            .collect();
        IterablePosition {
            delivered: self.delivered.clone(),
            states,
            exhausted,
            done,
            next_worker: self.sched.next_worker(),
        }
    }

    /// A resumed iterable epoch: the round-robin starts at `next_worker`,
    /// and workers whose replica had run out get no task (and are stopped
    /// unless they persist). Call before the first dispatch.
    pub fn restore_round_robin(&mut self, next_worker: usize, exhausted: &[bool]) -> Result<()> {
        self.sched.restore_cycle(next_worker);
        for (w, &done) in exhausted.iter().enumerate().take(self.pool.len()) {
            if done {
                self.sched.mark_unavailable(w);
                if !self.persistent {
                    self.pool.stop(w)?;
                }
            }
        }
        Ok(())
    }

    /// Whether an out-of-order result is ready for [`Loader::step`].
    pub fn has_early(&self) -> bool {
        !self.early.is_empty()
    }

    /// Reads what the workers sent and updates the scheduler. Returns how
    /// many task answers (or, during [`Loader::begin_epoch`], acks) came in.
    /// A dead worker closes the loader and is the error.
    pub fn pump<E: From<Error>>(
        &mut self,
        host: &mut impl Blocking,
        draw: &mut impl FnMut() -> Result<Option<TaskIndices>, E>,
    ) -> Result<usize, E> {
        if let Err(e) = self.pool.poll(host) {
            if matches!(e, Error::Corrupt { .. }) {
                // that worker's stream cannot be trusted past this point
                self.close();
            }
            return Err(e.into());
        }
        let mut got = 0;
        while let Some(event) = self.pool.next_event() {
            got += self.handle(event, draw)?;
        }
        Ok(got)
    }

    fn handle<E: From<Error>>(
        &mut self,
        event: Event,
        draw: &mut impl FnMut() -> Result<Option<TaskIndices>, E>,
    ) -> Result<usize, E> {
        if let Event::Batch { worker, times, .. } = &event {
            // counted as it arrives, whichever epoch it belongs to: the
            // worker made it
            self.add_times(*worker, times);
        }
        let (seq, worker, payload) = match event {
            Event::Died { worker, pid, exit } => {
                self.sched.mark_unavailable(worker);
                self.close();
                return Err(Error::WorkerDied { worker, pid, exit }.into());
            }
            Event::LanePos { .. }
            | Event::NeedWork { .. }
            | Event::Retry { .. }
            | Event::Tail { .. }
                if self.awaiting_resume > 0 =>
            {
                return Ok(0)
            }
            Event::Stats { worker, times } => {
                self.add_times(worker, &times);
                return Ok(0);
            }
            Event::Retry { worker, seq } => {
                if let Some(lane) = self.sched.owner(seq) {
                    let task = ToWorker::Task {
                        seq,
                        indices: TaskIndices::Lane(lane as u32),
                    };
                    self.pool.send(worker, &task)?;
                }
                return Ok(0);
            }
            Event::LanePos {
                worker, lane, pos, ..
            } => {
                if let Some(lanes) = &mut self.lanes {
                    lanes.pending[worker].push_back((lane, pos));
                    if let Some(p) = lanes.produced.get_mut(lane as usize) {
                        *p = Some(lanes.plan.absolute(lane as usize, pos));
                    }
                    if let Some(q) = &mut lanes.queue {
                        // a dynamic lane began its last shard: one more, so
                        // it can read ahead into it
                        let l = lane as usize;
                        if l < q.lanes() && q.given(l) <= pos.started {
                            if let Some(w) = q.assign_ahead(l) {
                                let msg = ToWorker::Assign {
                                    lane,
                                    works: vec![w],
                                    last: false,
                                };
                                self.pool.send(worker, &msg)?;
                            }
                            if let Some(e) = q.take_failure() {
                                return Err(Error::Queue(e.0).into());
                            }
                        }
                    }
                }
                return Ok(0);
            }
            Event::NeedWork {
                worker,
                seq,
                lane,
                given,
            } => {
                self.give_work(worker, seq, lane, given)?;
                return Ok(0);
            }
            Event::Tail {
                worker,
                lane,
                works,
                ..
            } => {
                self.take_tail(worker, lane, works)?;
                return Ok(0);
            }
            Event::Resumed { worker } if self.awaiting_resume > 0 => {
                self.awaiting_resume -= 1;
                self.acked[worker] = true;
                return Ok(1);
            }
            Event::Started { worker, error } => {
                // (a `Started` sent before the worker saw `Resume` is the
                // abandoned epoch's)
                if self.acked[worker] {
                    self.started[worker] = true;
                    if self.setup_error.is_none() {
                        self.setup_error = error;
                    }
                }
                return Ok(0);
            }
            Event::Resumed { .. } => return Ok(0),
            Event::State { .. } if self.awaiting_resume > 0 => return Ok(0),
            Event::State {
                worker, payload, ..
            } => {
                self.states[worker].push_back(payload);
                return Ok(0);
            }
            _ if self.awaiting_resume > 0 => {
                // An answer from the epoch being abandoned: release its record.
                if let Event::Batch { worker, record, .. } = event {
                    self.pool.discard(worker, record);
                }
                return Ok(0);
            }
            Event::Exhausted { worker, seq } => {
                if let Some(lanes) = &mut self.lanes {
                    // a lane ran out; its worker stops once all its lanes have
                    let Some(lane) = self.sched.owner(seq) else {
                        return Ok(0);
                    };
                    if lanes.collector == Some(lane) {
                        // the batch kept was the epoch's last: after the rest
                        if let Some((held, data)) = lanes.held.take() {
                            self.sched.withdraw(held);
                            lanes.last_batch = Some((held, lane, data));
                        }
                    }
                    self.sched.on_exhausted(lane);
                    let done = (0..lanes.worker_of.len())
                        .filter(|&l| lanes.worker_of[l] == worker)
                        .all(|l| !self.sched.is_active(l));
                    if done && !self.persistent {
                        self.pool.stop(worker)?;
                    }
                } else {
                    // the replica's state at its end came just before
                    self.end_state[worker] = self.states[worker].pop_back();
                    self.sched.on_exhausted(worker);
                    if !self.persistent {
                        // `_mark_worker_as_unavailable`: this replica is done.
                        self.pool.stop(worker)?;
                    }
                }
                self.put_task(draw)?;
                return Ok(1);
            }
            Event::Batch {
                worker,
                seq,
                record,
                ..
            } => (seq, worker, Payload::Batch(record)),
            Event::Failed {
                worker,
                seq,
                payload,
            } => (seq, worker, Payload::Error(payload)),
        };
        debug_assert!(worker < self.pool.len());
        if self.collector_answered(seq) {
            if let Payload::Batch(_) = payload {
                // kept until the collector's next answer says whether it
                // was its last
                self.sched.answered();
                if let Some(lanes) = &mut self.lanes {
                    lanes.held = Some((seq, payload));
                }
                return Ok(0);
            }
        }
        if let Some((worker, data)) = self.sched.on_result(seq, payload) {
            self.early.push_back((seq, worker, data));
        }
        Ok(1)
    }

    /// Whether task `seq` is the collector's: its batch kept before is
    /// not its last after all, so it takes its turn now.
    fn collector_answered(&mut self, seq: u64) -> bool {
        // (every batch passes here: the lookup only once a lane collects)
        let Some(lanes) = self.lanes.as_mut().filter(|l| l.collector.is_some()) else {
            return false;
        };
        if self.sched.owner(seq) != lanes.collector {
            return false;
        }
        if let Some((held, data)) = lanes.held.take() {
            if let Some((worker, data)) = self.sched.deliver(held, data) {
                self.early.push_back((held, worker, data));
            }
        }
        true
    }

    fn add_times(&mut self, worker: usize, times: &crate::stats::StageTimes) {
        if let Some(t) = self.worker_times.get_mut(worker) {
            t.add(times);
        }
    }

    /// A dynamic lane ran out of shards on task `seq`: give it the next one
    /// (or, when none are left, tell it to hand back its last items, or
    /// give it the tails to read if it is the last lane) unless that is
    /// already on its way, then send the task again; it keeps its place in
    /// the sequence. The last lane's task waits for tails still on their
    /// way.
    fn give_work(&mut self, worker: usize, seq: u64, lane: u32, given: u32) -> Result<()> {
        let lanes = self.lanes.as_mut();
        let Some((queue, deferred, collector)) =
            lanes.and_then(|l| Some((l.queue.as_mut()?, &mut l.deferred, &mut l.collector)))
        else {
            return Err(Error::Corrupt {
                worker,
                what: crate::record::DecodeError("a static lane asked for work"),
            });
        };
        let l = lane as usize;
        if l >= queue.lanes() {
            return Err(Error::Corrupt {
                worker,
                what: crate::record::DecodeError("lane number"),
            });
        }
        if queue.given(l) <= given {
            let ran_out = queue.ran_out(l);
            if let Some(e) = queue.take_failure() {
                return Err(Error::Queue(e.0));
            }
            let msg = match ran_out {
                RanOut::Work(w) => ToWorker::Assign {
                    lane,
                    works: vec![w],
                    last: false,
                },
                RanOut::HandBack => ToWorker::HandBack { lane },
                RanOut::Collect { works, last } => {
                    if works.is_empty() && !last {
                        *deferred = Some((worker, seq, lane));
                        return Ok(());
                    }
                    if last {
                        *collector = Some(l);
                    }
                    ToWorker::Assign { lane, works, last }
                }
            };
            self.pool.send(worker, &msg)?;
        }
        let task = ToWorker::Task {
            seq,
            indices: TaskIndices::Lane(lane),
        };
        self.pool.send(worker, &task)
    }

    /// A lane told to hand back gave back `works`: they go to the lane
    /// that reads the tails, once there is one (with its held task).
    fn take_tail(&mut self, worker: usize, lane: u32, works: Vec<Work>) -> Result<()> {
        let Some(lanes) = self.lanes.as_mut() else {
            return Ok(());
        };
        let l = lane as usize;
        let at = lanes.produced.get(l).copied().flatten();
        let Some(queue) = lanes.queue.as_mut() else {
            return Err(Error::Corrupt {
                worker,
                what: crate::record::DecodeError("a static lane handed back"),
            });
        };
        let Some((c, works, last)) = queue.handed_back(l, at, works) else {
            return Ok(());
        };
        if works.is_empty() && !last {
            return Ok(());
        }
        if last {
            lanes.collector = Some(c);
        }
        let msg = ToWorker::Assign {
            lane: c as u32,
            works,
            last,
        };
        self.pool.send(lanes.worker_of[c], &msg)?;
        if let Some((w, seq, lane)) = lanes.deferred.take() {
            let task = ToWorker::Task {
                seq,
                indices: TaskIndices::Lane(lane),
            };
            self.pool.send(w, &task)?;
        }
        Ok(())
    }

    /// Blocks until at least one answer arrives (or a worker fails, or
    /// `timeout` passes, naming `after` in the error): mailboxes first, a
    /// short spin, then a sleep on every worker at once inside
    /// `host.blocking`, in slices short enough to deliver interrupts
    /// promptly.
    pub fn wait<W: Waiter>(
        &mut self,
        host: &mut W,
        draw: &mut impl FnMut() -> Result<Option<TaskIndices>, W::Error>,
        timeout: Option<(Duration, &str)>,
    ) -> Result<(), W::Error> {
        self.wait_until(host, draw, timeout, |l, got| got > 0 || l.has_early())
    }

    /// [`Loader::wait`]'s loop, until `done(self, answers pumped)`.
    fn wait_until<W: Waiter>(
        &mut self,
        host: &mut W,
        draw: &mut impl FnMut() -> Result<Option<TaskIndices>, W::Error>,
        timeout: Option<(Duration, &str)>,
        done: impl Fn(&Self, usize) -> bool,
    ) -> Result<(), W::Error> {
        let started = Instant::now();
        loop {
            let got = self.pump(host, draw)?;
            if done(self, got) {
                return Ok(());
            }
            // without the GIL: worker threads (worker_method="thread")
            // need it to make the batch being waited for
            let pool = &self.pool;
            if host.blocking(|| pool.spin(SPIN)) {
                continue;
            }
            let mut slice = INTERRUPT_SLICE;
            if let Some((limit, after)) = timeout {
                let spent = started.elapsed();
                if spent >= limit {
                    let after = after.to_string();
                    return Err(Error::Timeout { after }.into());
                }
                slice = slice.min(limit - spent);
            }
            self.sleep_on(host, slice)?;
        }
    }

    /// Sleeps on every worker for up to `slice` with the host's blessing,
    /// then lets the host deliver an interrupt.
    fn sleep_on<W: Waiter>(&mut self, host: &mut W, slice: Duration) -> Result<(), W::Error> {
        let pool = &mut self.pool;
        host.blocking(|| pool.sleep(slice))?;
        host.check_interrupts()
    }

    /// Persistent workers: a new epoch over the same workers. Sends
    /// `Resume`; results of the old epoch still in flight are released
    /// until every worker has acknowledged ([`Loader::resuming`]).
    fn begin_epoch(&mut self) -> Result<()> {
        self.early.clear();
        self.held = false;
        if self.lanes.take().is_some() {
            // the next epoch may not be sharded the same way (start_lanes)
            self.sched = Scheduler::new(self.pool.len(), self.prefetch_factor, self.in_order);
        }
        self.sched.reset();
        let n = self.pool.len();
        self.delivered = vec![0; n];
        self.states = vec![VecDeque::new(); n];
        // a persistent replica begins the epoch in the state it ended the
        // last one in: a snapshot before its first batch carries that
        self.last_state = (0..n)
            .map(|w| self.end_state[w].take().or(self.last_state[w].take()))
            .collect();
        self.end_state = vec![None; n];
        self.acked = vec![false; n];
        self.started = vec![false; n];
        self.setup_error = None;
        for w in 0..self.pool.len() {
            self.pool.send(w, &ToWorker::Resume)?;
        }
        self.awaiting_resume = self.pool.len();
        Ok(())
    }

    /// Blocks until every running worker has set up for the epoch, and
    /// returns the first error a setup raised, if one did (torchdata raises
    /// it from `iter()`). Batches that come meanwhile stay queued.
    pub fn await_setup<W: Waiter>(
        &mut self,
        host: &mut W,
        draw: &mut impl FnMut() -> Result<Option<TaskIndices>, W::Error>,
        timeout: Option<(Duration, &str)>,
    ) -> Result<Option<Vec<u8>>, W::Error> {
        self.wait_until(host, draw, timeout, |l, _| {
            let n = l.pool.len();
            l.setup_error.is_some() || (0..n).all(|w| l.started[w] || !l.pool.is_running(w))
        })?;
        Ok(self.setup_error.clone())
    }

    pub fn resuming(&self) -> bool {
        self.awaiting_resume > 0
    }

    /// Persistent workers: [`Loader::begin_epoch`], then waits until every
    /// worker has acknowledged, releasing the old epoch's results.
    pub fn restart_epoch<W: Waiter>(
        &mut self,
        host: &mut W,
        draw: &mut impl FnMut() -> Result<Option<TaskIndices>, W::Error>,
    ) -> Result<(), W::Error> {
        self.begin_epoch()?;
        while self.resuming() {
            if self.pump(host, draw)? == 0 && self.resuming() {
                self.sleep_on(host, INTERRUPT_SLICE)?;
            }
        }
        Ok(())
    }

    /// The epoch's position for a snapshot: tasks drawn so far, and the
    /// sequence numbers not yet handed over (out-of-order arrivals waiting
    /// in `early` included). Read between batches; workers keep running.
    pub fn position(&self) -> (u64, Vec<u64>) {
        let (drawn, mut pending) = self.sched.position();
        pending.extend(self.early.iter().map(|(seq, ..)| *seq));
        let last = self.lanes.as_ref().and_then(|l| l.last_batch.as_ref());
        pending.extend(last.map(|(seq, ..)| *seq));
        pending.sort_unstable();
        (drawn, pending)
    }

    /// Opens the record of a batch being handed over.
    pub fn open(&self, worker: usize, record: RecordRef) -> Result<RecordHandle> {
        self.pool.open(worker, record)
    }
}
