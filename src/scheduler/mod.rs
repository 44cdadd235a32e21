//! The main process's bookkeeping for multi-process loading: which worker
//! holds which task, how many tasks are in flight, reassembly in sequence
//! order, and which workers are still active.
//!
//! It is a port of torch's `_MultiProcessingDataLoaderIter` state machine
//! (`_try_put_index`, `_next_data`, `_process_data`) with the I/O taken out,
//! so batch order (including an `IterableDataset`'s round-robin over the
//! workers still alive) is torch's by construction:
//!
//! ```text
//!  dispatch(): sampler ──next index──▶ worker = next active in the cycle
//!              (at most prefetch_factor * num_workers tasks outstanding)
//!  next():     rcvd_idx ─▶ has data?       ──yes──▶ Yield(worker, data)
//!                        └ worker inactive? ──yes──▶ skip the task
//!                        └ otherwise              ─▶ Wait (caller reads results
//!                                                    and calls on_result / on_exhausted)
//!              rcvd_idx == send_idx          ──────▶ Stop
//! ```
//! With `in_order=False` a result that is not next in sequence is yielded
//! as soon as it arrives.
//!
//! A sharded dataset's lanes ([`shards`]) take the workers' place in this
//! bookkeeping ([`Scheduler::with_lanes`]): tasks cycle over lanes, each
//! lane runs on one worker, and the prefetch window stays
//! `prefetch_factor * num_workers`. Without workers, [`LaneSet`] runs the
//! same plan's lanes in this process (reading them through
//! `crate::worker::lanes`), round-robin, for the same batch sequence.
//!
//! Messages to and from the workers, and the sockets they travel on, are
//! `crate::wire`'s.

mod lane_set;
mod loader;
pub mod pool;
mod resumed;
pub mod shards;
pub mod world;

#[cfg(test)]
mod pool_tests;

pub use lane_set::LaneSet;
pub use loader::{IterablePosition, Loader, Payload, Waiter};
pub use pool::{Event, WorkerPool};
pub use resumed::Resumed;
pub use shards::{LanePlan, LaneSnapshot};

use std::collections::HashMap;

/// What the caller does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<T> {
    /// Hand `data` to the training loop; it came from `worker`.
    Yield { worker: usize, data: T },
    /// Nothing is ready: read a result from the workers.
    Wait,
    /// The epoch is over.
    Stop,
}

/// A task to send: sequence number and destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatch {
    pub seq: u64,
    pub worker: usize,
}

struct TaskInfo<T> {
    worker: usize,
    data: Option<T>,
}

pub struct Scheduler<T> {
    /// Workers, or lanes when a sharded dataset's lanes are scheduled.
    num_workers: usize,
    max_tasks: usize,
    in_order: bool,
    send_idx: u64,
    rcvd_idx: u64,
    task_info: HashMap<u64, TaskInfo<T>>,
    tasks_outstanding: usize,
    workers_status: Vec<bool>,
    workers_num_tasks: Vec<usize>,
    cycle: usize,
}

/// The prefetch window: at most this many tasks are in flight at once
/// (torch's `prefetch_factor * num_workers`).
pub fn window(prefetch_factor: usize, num_workers: usize) -> usize {
    // torch takes any prefetch_factor (and with 2**63 loops that many
    // times filling its window); more tasks in flight than this changes
    // nothing but memory
    prefetch_factor.saturating_mul(num_workers).min(MAX_WINDOW)
}

/// The most tasks ever in flight at once.
pub const MAX_WINDOW: usize = 1 << 16;

impl<T> Scheduler<T> {
    pub fn new(num_workers: usize, prefetch_factor: usize, in_order: bool) -> Self {
        assert!(num_workers > 0 && prefetch_factor > 0);
        Self::with_lanes(num_workers, window(prefetch_factor, num_workers), in_order)
    }

    /// Tasks cycle over `lanes` (each with its own status, as a worker
    /// has), with at most `max_tasks` outstanding.
    pub fn with_lanes(lanes: usize, max_tasks: usize, in_order: bool) -> Self {
        assert!(lanes > 0 && max_tasks > 0);
        let num_workers = lanes;
        Scheduler {
            num_workers,
            max_tasks,
            in_order,
            send_idx: 0,
            rcvd_idx: 0,
            task_info: HashMap::new(),
            tasks_outstanding: 0,
            workers_status: vec![true; num_workers],
            workers_num_tasks: vec![0; num_workers],
            cycle: 0,
        }
    }

    /// `_reset`: a new epoch over the same workers.
    pub fn reset(&mut self) {
        *self = Scheduler::with_lanes(self.num_workers, self.max_tasks, self.in_order);
    }

    pub fn max_tasks(&self) -> usize {
        self.max_tasks
    }

    /// Changes the window between batches (a tuner's new prefetch depth):
    /// a larger one takes tasks at the next dispatch; under a smaller one
    /// none go out until the outstanding tasks fall below it.
    pub fn set_max_tasks(&mut self, max_tasks: usize) {
        assert!(max_tasks > 0);
        self.max_tasks = max_tasks;
    }

    /// Tasks sent and not yet handed over (in flight, or waiting their turn).
    pub fn in_flight(&self) -> usize {
        self.task_info.len()
    }

    /// The worker (or lane) that task `seq` went to, while it is pending.
    pub fn owner(&self, seq: u64) -> Option<usize> {
        self.task_info.get(&seq).map(|i| i.worker)
    }

    /// `_try_put_index` once the caller has drawn an index from the sampler
    /// (torch draws it first, so an index is consumed even when no worker is
    /// active). `None`: no active worker takes it.
    pub fn dispatch(&mut self) -> Option<Dispatch> {
        assert!(
            self.tasks_outstanding < self.max_tasks(),
            "too many outstanding tasks"
        );
        let active = self.workers_status.iter().filter(|&&a| a).count();
        let mut chosen = None;
        for _ in 0..self.num_workers {
            let w = self.cycle;
            self.cycle = (self.cycle + 1) % self.num_workers;
            if self.workers_status[w]
                && (self.in_order
                    || self.workers_num_tasks[w] < (self.max_tasks() / active.max(1)).max(1))
            {
                chosen = Some(w);
                break;
            }
        }
        let worker = chosen?;
        let seq = self.send_idx;
        self.task_info.insert(seq, TaskInfo { worker, data: None });
        self.workers_num_tasks[worker] += 1;
        self.tasks_outstanding += 1;
        self.send_idx += 1;
        Some(Dispatch { seq, worker })
    }

    /// Whether `dispatch` may be called (`_try_put_index` asserts this).
    pub fn can_dispatch(&self) -> bool {
        self.tasks_outstanding < self.max_tasks()
    }

    /// The `_next_data` loop up to the point where it would block.
    pub fn next_step(&mut self) -> Next<T> {
        loop {
            if self.rcvd_idx >= self.send_idx {
                return Next::Stop;
            }
            match self.task_info.get(&self.rcvd_idx) {
                Some(info) if info.data.is_some() || self.workers_status[info.worker] => {
                    if info.data.is_some() {
                        let info = self.task_info.remove(&self.rcvd_idx).expect("present");
                        self.rcvd_idx += 1;
                        self.workers_num_tasks[info.worker] -= 1;
                        return Next::Yield {
                            worker: info.worker,
                            data: info.data.expect("checked"),
                        };
                    }
                    return Next::Wait;
                }
                Some(_) => {
                    self.task_info.remove(&self.rcvd_idx);
                    self.rcvd_idx += 1;
                }
                None => self.rcvd_idx += 1,
            }
        }
    }

    /// A result for task `seq`. With `in_order=False` it is returned, to be
    /// handed over in arrival order (the caller queues it), as torch hands
    /// over each result as it is received; in order, it waits its turn.
    pub fn on_result(&mut self, seq: u64, data: T) -> Option<(usize, T)> {
        self.answered();
        self.deliver(seq, data)
    }

    /// A result for task `seq` that the caller keeps aside for now: the
    /// window counts it as answered (more tasks may go out) while its turn
    /// waits for [`Scheduler::deliver`] or [`Scheduler::withdraw`].
    pub fn answered(&mut self) {
        self.tasks_outstanding = self.tasks_outstanding.saturating_sub(1);
    }

    /// A result kept aside ([`Scheduler::answered`]) takes its turn after
    /// all (returned at once with `in_order=False`, as `on_result` does).
    pub fn deliver(&mut self, seq: u64, data: T) -> Option<(usize, T)> {
        if !self.in_order {
            let info = self.task_info.remove(&seq)?;
            self.workers_num_tasks[info.worker] -= 1;
            return Some((info.worker, data));
        }
        if let Some(info) = self.task_info.get_mut(&seq) {
            info.data = Some(data);
        }
        None
    }

    /// A result kept aside ([`Scheduler::answered`]) leaves the sequence:
    /// the caller hands it over itself. The lane it came from.
    pub fn withdraw(&mut self, seq: u64) -> Option<usize> {
        let info = self.task_info.remove(&seq)?;
        self.workers_num_tasks[info.worker] -= 1;
        Some(info.worker)
    }

    /// An `IterableDataset` replica ran out (`_IterableDatasetStopIteration`).
    pub fn on_exhausted(&mut self, worker: usize) {
        self.tasks_outstanding = self.tasks_outstanding.saturating_sub(1);
        self.workers_status[worker] = false;
    }

    /// A worker is gone for good (shut down or failed).
    pub fn mark_unavailable(&mut self, worker: usize) {
        self.workers_status[worker] = false;
    }

    pub fn is_active(&self, worker: usize) -> bool {
        self.workers_status[worker]
    }

    /// Whether a result of `worker`'s has arrived and waits its turn.
    pub fn holds_result_of(&self, worker: usize) -> bool {
        self.task_info
            .values()
            .any(|i| i.worker == worker && i.data.is_some())
    }

    /// Workers that still owe a result for a task in flight.
    pub fn workers_with_pending_tasks(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .task_info
            .values()
            .filter(|i| i.data.is_none())
            .map(|i| i.worker)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    pub fn tasks_outstanding(&self) -> usize {
        self.tasks_outstanding
    }

    /// The worker the next result in sequence comes from: the one holding
    /// the oldest task not handed over, else the next in the cycle.
    pub fn next_worker(&self) -> usize {
        self.task_info
            .iter()
            .min_by_key(|(seq, _)| **seq)
            .map_or(self.cycle, |(_, info)| info.worker)
    }

    /// A resumed epoch: dispatch starts at `worker` (call before any task).
    pub fn restore_cycle(&mut self, worker: usize) {
        self.cycle = worker % self.num_workers;
    }

    /// How far the epoch has come, for a snapshot: the number of tasks
    /// drawn from the sampler, and the sequence numbers among them not yet
    /// handed to the caller (in flight, or arrived and waiting their turn).
    pub fn position(&self) -> (u64, Vec<u64>) {
        let mut pending: Vec<u64> = self.task_info.keys().copied().collect();
        pending.sort_unstable();
        (self.send_idx, pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Simulates workers that answer their tasks in order, each producing
    /// `lens[w]` batches before reporting exhaustion; results arrive in the
    /// order given by `pick` among the workers that have an answer pending.
    fn simulate(
        lens: &[usize],
        prefetch: usize,
        mut pick: impl FnMut(&[usize]) -> usize,
    ) -> Vec<(usize, usize)> {
        let n = lens.len();
        let mut s: Scheduler<(usize, usize)> = Scheduler::new(n, prefetch, true);
        let mut queues: Vec<VecDeque<u64>> = vec![VecDeque::new(); n];
        let mut produced = vec![0usize; n];
        let mut done = vec![false; n];
        let mut out = Vec::new();
        let put = |s: &mut Scheduler<(usize, usize)>, queues: &mut Vec<VecDeque<u64>>| {
            if let Some(d) = s.dispatch() {
                queues[d.worker].push_back(d.seq);
            }
        };
        for _ in 0..prefetch * n {
            put(&mut s, &mut queues);
        }
        loop {
            match s.next_step() {
                Next::Yield { data, .. } => {
                    out.push(data);
                    put(&mut s, &mut queues);
                }
                Next::Stop => return out,
                Next::Wait => {
                    let ready: Vec<usize> = (0..n)
                        .filter(|&w| !done[w] && !queues[w].is_empty())
                        .collect();
                    let w = ready[pick(&ready) % ready.len()];
                    let seq = queues[w].pop_front().unwrap();
                    if produced[w] < lens[w] {
                        s.on_result(seq, (w, produced[w]));
                        produced[w] += 1;
                    } else {
                        done[w] = true;
                        s.on_exhausted(w);
                        put(&mut s, &mut queues);
                    }
                }
            }
        }
    }

    #[test]
    fn equal_replicas_round_robin() {
        let got = simulate(&[2, 2], 2, |_| 0);
        assert_eq!(got, vec![(0, 0), (1, 0), (0, 1), (1, 1)]);
    }

    #[test]
    fn exhausted_worker_is_skipped() {
        let got = simulate(&[1, 3], 2, |_| 0);
        assert_eq!(got, vec![(0, 0), (1, 0), (1, 1), (1, 2)]);
    }

    #[test]
    fn in_order_results_do_not_depend_on_arrival_order_for_map_style() {
        // Map-style: every task answered; arrival order must not matter.
        for prefetch in 1..4 {
            for seed in 0..20usize {
                let mut s: Scheduler<u64> = Scheduler::new(3, prefetch, true);
                let mut pending: Vec<u64> = Vec::new();
                let total = 25u64;
                let mut drawn = 0u64;
                let mut out = Vec::new();
                while drawn < total && s.can_dispatch() {
                    pending.push(s.dispatch().unwrap().seq);
                    drawn += 1;
                }
                let mut k = seed;
                loop {
                    match s.next_step() {
                        Next::Yield { data, .. } => {
                            out.push(data);
                            if drawn < total {
                                pending.push(s.dispatch().unwrap().seq);
                                drawn += 1;
                            }
                        }
                        Next::Stop => break,
                        Next::Wait => {
                            k = k.wrapping_mul(31).wrapping_add(7);
                            let i = k % pending.len();
                            let seq = pending.swap_remove(i);
                            assert!(s.on_result(seq, seq).is_none());
                        }
                    }
                }
                assert_eq!(out, (0..total).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn out_of_order_mode_yields_on_arrival() {
        let mut s: Scheduler<u64> = Scheduler::new(2, 1, false);
        let a = s.dispatch().unwrap();
        let b = s.dispatch().unwrap();
        assert_eq!((a.worker, b.worker), (0, 1));
        assert_eq!(s.next_step(), Next::Wait);
        assert_eq!(s.on_result(b.seq, 10), Some((1, 10)));
        // the next in sequence is handed back too: arrival order is kept
        assert_eq!(s.on_result(a.seq, 20), Some((0, 20)));
        assert_eq!(s.next_step(), Next::Stop);
    }

    #[test]
    fn position_counts_what_is_drawn_and_not_yet_handed_over() {
        let mut s: Scheduler<u32> = Scheduler::new(2, 2, false);
        for _ in 0..4 {
            s.dispatch().expect("room");
        }
        assert_eq!(s.position(), (4, vec![0, 1, 2, 3]));
        // out of order: a result is the caller's once it arrives
        assert_eq!(s.on_result(2, 7), Some((0, 7)));
        assert_eq!(s.position(), (4, vec![0, 1, 3]));
        assert_eq!(s.on_result(0, 5), Some((0, 5)));
        assert_eq!(s.position(), (4, vec![1, 3]));
        let mut s: Scheduler<u32> = Scheduler::new(2, 2, true);
        for _ in 0..2 {
            s.dispatch().expect("room");
        }
        s.on_result(1, 9); // in order: waits for seq 0, still pending
        assert_eq!(s.position(), (2, vec![0, 1]));
    }

    #[test]
    fn prefetch_bounds_outstanding_tasks() {
        let mut s: Scheduler<()> = Scheduler::new(2, 3, true);
        let mut n = 0;
        while s.can_dispatch() {
            s.dispatch().unwrap();
            n += 1;
        }
        assert_eq!(n, 6);
        assert_eq!(s.tasks_outstanding(), 6);
    }
}
