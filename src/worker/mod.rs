//! The worker process side of multi-process loading: the receive loop, its
//! channel to the main process, the watchdog, and the [`lanes`] that read a
//! sharded dataset. What a worker computes (calling the dataset, collating,
//! encoding a record) is its [`Host`]'s: the Python bindings in the
//! extension, a plain Rust host in the tests.
//!
//! # Worker lifecycle and message protocol
//!
//! One worker process per `worker_id`, one Unix socket pair and one mailbox
//! (two shared-memory rings) per worker, one arena the worker writes batches
//! into. Messages, their framing and the socket are the wire's
//! (`crate::wire`); the training process's side is the worker pool
//! (`src/scheduler/pool.rs`).
//!
//! ```text
//!   main process                                   worker
//!   ------------                                   ------
//!   spawn (multiprocessing: fork/spawn/forkserver)
//!                                                  Python entry: seeds, worker info,
//!                                                  worker_init_fn, then serve():
//!                                                  watchdog on the main pid
//!   Mailbox (+ memfd) ───────────────────────────▶ Opening ──▶ Idle
//!                                                  (host.start_epoch: iter(dataset))
//!                           ◀──── Started{error?}  (set up; `error`: what the setup
//!                                 raised, which the first task answers too)
//!   Task{seq, indices} ──────────────────────────▶ Idle ──▶ Working ──▶ Idle
//!                           ◀──── Segment{id} (+ memfd), when the arena grew
//!                           ◀──── State{seq, bytes}, before the batch, when the
//!                                 iterable replica has state methods (snapshots)
//!                           ◀──── Stats{times}, before an Error or Exhausted, when the
//!                                 worker has stage timings not yet sent
//!                           ◀──── Batch{seq, record, times} | Error{seq, wrapper}
//!                                 | Exhausted{seq} (then Drained: later tasks ignored)
//!   Resume (persistent workers, next epoch) ─────▶ Idle | Drained ──▶ Idle
//!                           ◀──── Resumed, Started{error?} (host.start_epoch again)
//!   Lanes{lanes, shuffle, block, root}  (sharded datasets, each epoch) ──▶ Idle
//!   Assign{lane, works, last} ───────────────────▶ Idle (the lane queues the shards)
//!   HandBack{lane} ──────────────────────────────▶ Idle (dynamic: no shards are left and
//!                                                  other lanes read on)
//!   Task{seq, Lane(l)} ──────────────────────────▶ Working: the lane's next batch
//!                           ◀──── LanePos{seq, lane, pos}, before the batch
//!                           ◀──── NeedWork{seq, lane, given}: out of shards (dynamic);
//!                                 the main process assigns and sends the task again
//!                           ◀──── Tail{seq, lane, works}, then Exhausted{seq}: a lane
//!                                 told to hand back ends, giving back the items it made
//!                                 no batch of, for the epoch's last lane to read
//!                           ◀──── Retry{seq}: a task of a lane with an earlier task sent
//!                                 back and not yet run (sent again, unchanged), so a
//!                                 lane's batches are made in the order of their tasks
//!   Shutdown, socket or tasks ring closed ───────▶ any ──▶ Exited (returns Ok;
//!                                                  what is queued is not run)
//!   main process dies ───── watchdog ────────────▶ any ──▶ SIGKILL
//! ```
//!
//! States of the worker (`serve`):
//! - **Opening**: waits for the `Mailbox` frame; a closed socket here is a
//!   quiet exit (the loader was dropped before the worker started).
//! - **Idle**: spins on the tasks ring for `SPIN`, then announces that it
//!   sleeps and sleeps on the socket; the main process sends an empty frame
//!   to wake it when it finds the flag set.
//! - **Working**: the host runs the task: `Batch` (a published record),
//!   `Error` (the user's exception, wrapped), or `Exhausted` (an iterable
//!   replica ended; the worker is **Drained** until the next `Resume`).
//! - **Exited**: `Shutdown`, EOF, the tasks ring closed (tasks still queued
//!   are not run), or the main process closing its end while the worker
//!   writes (a clean stop, not an error).
//!
//! The main process's view of each worker (`pool::Link`): **Running** while
//! it is expected to answer; **Stopped** once told `Shutdown` (or its
//! replica is exhausted and workers are not persistent); **Dead** when its
//! pidfd fires while Running (reported once as `Event::Died`). A result is
//! never lost to a close: on EOF the main process drains the mailbox before
//! it drops the link.
//!
//! Back-pressure: a full results ring makes the worker wait (checking the
//! socket for EOF every millisecond); the main process never blocks on a
//! write (its frames are queued), so neither side can deadlock the other.
//! Memory: records come from [`Records`], whose budget keeps at most
//! `prefetch_factor` large records live while the loop drops its batches.

mod channel;
pub mod lanes;
mod watchdog;

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

pub use channel::{Channel, Received};
pub use watchdog::start as start_watchdog;

use crate::error::{Error, Result};
use crate::record::DecodeError;
use crate::ring::{ArenaWriter, RecordBudget, RecordRef};
use crate::wire::protocol::{FromWorker, LanePos, TaskIndices, ToWorker, Work};
pub use crate::wire::transport::Blocking;

/// What a task produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A published record in the worker's arena.
    Batch(RecordRef),
    /// An iterable replica ran out.
    Exhausted,
    /// The user's code raised: the serialised exception, for the main
    /// process to re-raise.
    Failed(Vec<u8>),
    /// A sharded lane ran out of shards after the `given` it had; the
    /// task is to be sent again once the main process assigned more.
    NeedWork { lane: u32, given: u32 },
    /// A lane told to hand back ended: the works holding the items it
    /// made no batch of (the main process gives them to another lane).
    Tail { lane: u32, works: Vec<Work> },
}

/// The worker's computation: everything that is not protocol.
pub trait Host: Blocking {
    /// Errors that stop the worker (its own, not the user's: those are
    /// [`Reply::Failed`]).
    type Error: From<Error>;
    /// A new epoch begins (at start and after each `Resume`).
    fn start_epoch(&mut self);
    /// What the last `start_epoch` (or the worker's start) raised, if it
    /// did, serialised; the first task reports it too.
    fn setup_error(&self) -> Option<Vec<u8>> {
        None
    }
    /// Runs one task, writing a batch into `records`.
    fn run(&mut self, indices: TaskIndices, records: &mut Records) -> Result<Reply, Self::Error>;
    /// The replica's serialised state after the batch just produced, when
    /// it has one (an iterable with state methods); sent before the batch.
    fn state_after_batch(&mut self) -> Result<Option<Vec<u8>>, Self::Error> {
        Ok(None)
    }
    /// A sharded epoch begins: the lanes this worker runs and how shards
    /// are read (see `ToWorker::Lanes`).
    fn lanes(&mut self, _lanes: Vec<u32>, _shuffle: bool, _block: u64, _root: u64) {}
    /// More shards for `lane`.
    fn assign(&mut self, _lane: u32, _works: Vec<Work>, _last: bool) {}
    /// No more shards for `lane`: it hands back its last items
    /// (`Lane::hand_back`).
    fn hand_back(&mut self, _lane: u32) {}
    /// Where the lane of the batch just produced stands, when it was a
    /// lane's; sent before the batch.
    fn lane_after_batch(&mut self) -> Option<(u32, LanePos)> {
        None
    }
    /// The stage timings since the last call, reset.
    fn take_times(&mut self) -> crate::stats::StageTimes {
        crate::stats::StageTimes::default()
    }
}

/// How often a worker looks at giving memory back, busy or idle.
const TRIM_EVERY: Duration = Duration::from_millis(200);

/// Makes the C allocator keep a batch's worth of freed memory, as it does
/// when batches are its own. glibc's malloc hands the free top of a heap
/// back to the system once more than its trim threshold lies there, and
/// raises that threshold (to twice a block's size, up to 64 MiB) only when
/// it frees a block it had mapped on its own. torch's collate allocates
/// each batch with malloc, so its loaders raise it to twice a batch; a
/// batch written into the arena never does, so the samples a worker frees
/// after each batch (about a batch's bytes) were handed back and faulted in
/// again on the next one: 18 page faults per 256x256 JPEG and about a tenth
/// of the rate with thread workers. One block of the batch's size,
/// allocated and freed, raises the threshold as torch's batches would
/// (elsewhere it is one allocation, freed).
fn raise_malloc_trim(len: usize) {
    // (black_box: an allocation never used may be optimised away)
    drop(std::hint::black_box(Vec::<u8>::with_capacity(len)));
}

/// A worker's arena with its allocation budget.
pub struct Records {
    arena: ArenaWriter,
    budget: RecordBudget,
    /// The arena's first segment: always kept resident.
    initial: usize,
    /// The most bytes live since the last trim.
    peak_live: usize,
    next_trim: Instant,
    /// The largest record so far (see [`raise_malloc_trim`]).
    largest: usize,
}

impl Records {
    pub fn new(initial: usize, limit: usize, prefetch_factor: usize) -> Result<Records> {
        let arena = ArenaWriter::new(initial, limit).map_err(|source| Error::SharedMemory {
            what: "the worker's arena".into(),
            source,
        })?;
        Ok(Records {
            initial: arena.total_len(),
            arena,
            budget: RecordBudget::new(prefetch_factor),
            peak_live: 0,
            next_trim: Instant::now() + TRIM_EVERY,
            largest: 0,
        })
    }

    /// A record of `len` payload bytes in state WRITING (may wait for the
    /// main process to release records; see [`RecordBudget::alloc`]).
    pub fn alloc(&mut self, len: usize) -> Result<RecordRef> {
        if len > self.largest {
            self.largest = len;
            raise_malloc_trim(len);
        }
        let r = self.budget.alloc(&mut self.arena, len)?;
        self.peak_live = self.peak_live.max(self.arena.live_bytes());
        Ok(r)
    }

    /// Gives memory back after a burst of held batches was released: at
    /// most every [`TRIM_EVERY`], when more was live since the last trim
    /// than the arena keeps, the free pages above the kept part are punched
    /// out. The arena keeps its first segment and four times what is live
    /// now (first-fit allocation keeps the steady state low in the arena),
    /// so steady-state batches stay fault-free.
    pub fn maybe_trim(&mut self, now: Instant) -> Result<()> {
        if now < self.next_trim {
            return Ok(());
        }
        self.next_trim = now + TRIM_EVERY;
        self.arena.reclaim();
        let keep = self.initial.max(4 * self.arena.live_bytes());
        if self.peak_live > keep {
            self.arena
                .trim(keep)
                .map_err(|source| Error::SharedMemory {
                    what: "the worker's arena (giving pages back)".into(),
                    source,
                })?;
            self.peak_live = self.arena.live_bytes();
        }
        Ok(())
    }

    pub fn payload_mut(&mut self, r: RecordRef) -> &mut [u8] {
        self.arena.payload_mut(r)
    }

    pub fn publish(&mut self, r: RecordRef) {
        self.arena.publish(r)
    }

    pub fn abandon(&mut self, r: RecordRef) {
        self.arena.abandon(r)
    }

    /// Segments made since the last call, with their own fds (for a reader
    /// in this process: a remote actor reads its own records).
    pub fn take_new_segments(&mut self) -> Result<Vec<(u32, std::os::fd::OwnedFd)>> {
        self.arena
            .take_new_segments()
            .into_iter()
            .map(|(id, fd)| {
                fd.try_clone_to_owned()
                    .map(|fd| (id, fd))
                    .map_err(|source| Error::SharedMemory {
                        what: "the arena's segment".into(),
                        source,
                    })
            })
            .collect()
    }
}

/// Arena and budget settings handed to the worker by the main process.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub main_pid: i32,
    pub shm_initial: usize,
    pub shm_limit: usize,
    pub prefetch_factor: usize,
    /// Whether free pages may be given back (hole punching). Off when the
    /// main process registers the arena with the GPU runtime: a punched
    /// page would be replaced by a new one that the registration (and so
    /// the GPU's copies) does not see.
    pub trim: bool,
}

/// Serves tasks until the main process says stop or goes away (the state
/// machine above). `Ok` on every clean stop.
pub fn serve<H: Host>(host: &mut H, fd: OwnedFd, config: Config) -> Result<(), H::Error> {
    start_watchdog(config.main_pid);
    let Some(mut chan) = Channel::open(fd, host)? else {
        return Ok(());
    };
    let mut records = Records::new(config.shm_initial, config.shm_limit, config.prefetch_factor)?;
    host.start_epoch();
    let started = FromWorker::Started {
        error: host.setup_error(),
    };
    match chan.send(&mut records.arena, &started) {
        Ok(()) => {}
        Err(e) if e.is_peer_gone() => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let mut drained = false;
    // Per lane, its tasks sent back (answered with NeedWork or Retry) and
    // not yet run: a lane's task runs only when none before it is
    // outstanding, else it is sent back too, so a later task never takes
    // items before an earlier one (however the main process's copies
    // interleave with the originals).
    let mut sent_back: std::collections::HashMap<u32, std::collections::BTreeSet<u64>> =
        std::collections::HashMap::new();
    // Stage timings of tasks that made no batch and sent no answer yet (a
    // lane's task sent back for work): they go with the next answer.
    let mut unreported = crate::stats::StageTimes::default();
    loop {
        if config.trim {
            records.maybe_trim(Instant::now())?;
        }
        let msg = match chan.recv_or_idle(host, Some(TRIM_EVERY))? {
            Received::Message(msg) => msg,
            Received::Idle => continue,
            Received::Closed => return Ok(()),
        };
        let sent = match msg {
            ToWorker::Task { seq, indices } => {
                if drained {
                    continue;
                }
                let lane = match indices {
                    TaskIndices::Lane(l) => Some(l),
                    _ => None,
                };
                let lane_task = lane.is_some();
                if let Some(l) = lane {
                    let back = sent_back.entry(l).or_default();
                    if back.first().is_some_and(|&k| k < seq) {
                        back.insert(seq);
                        match chan.send(&mut records.arena, &FromWorker::Retry { seq }) {
                            Ok(()) => continue,
                            Err(e) if e.is_peer_gone() => return Ok(()),
                            Err(e) => return Err(e.into()),
                        }
                    }
                    back.remove(&seq);
                }
                // what goes ahead of the answer: the replica's state, the
                // lane's position; the stage timings come with a batch, or
                // ahead of an error or an end (none is left behind in the
                // worker when the main process stops reading it)
                let mut before = Vec::new();
                let reply = host.run(indices, &mut records)?;
                unreported.add(&host.take_times());
                let ends = matches!(
                    reply,
                    Reply::Failed(_) | Reply::Exhausted | Reply::Tail { .. }
                );
                if !unreported.is_empty() && ends {
                    before.push(FromWorker::Stats(std::mem::take(&mut unreported)));
                }
                let msg = match reply {
                    Reply::Batch(record) => {
                        if let Some(payload) = host.state_after_batch()? {
                            before.push(FromWorker::State { seq, payload });
                        }
                        if let Some((lane, pos)) = host.lane_after_batch() {
                            before.push(FromWorker::LanePos { seq, lane, pos });
                        }
                        FromWorker::Batch {
                            seq,
                            record,
                            times: std::mem::take(&mut unreported),
                        }
                    }
                    Reply::Failed(payload) => FromWorker::Error { seq, payload },
                    Reply::NeedWork { lane, given } => {
                        sent_back.entry(lane).or_default().insert(seq);
                        FromWorker::NeedWork { seq, lane, given }
                    }
                    // A lane's end is not the worker's: its other lanes go on.
                    Reply::Exhausted if lane_task => FromWorker::Exhausted { seq },
                    Reply::Tail { lane, works } => {
                        before.push(FromWorker::Tail { seq, lane, works });
                        FromWorker::Exhausted { seq }
                    }
                    Reply::Exhausted => {
                        drained = true;
                        // the replica's state at its end (a snapshot taken
                        // between epochs carries it)
                        if let Some(payload) = host.state_after_batch()? {
                            before.push(FromWorker::State { seq, payload });
                        }
                        FromWorker::Exhausted { seq }
                    }
                };
                for m in &before {
                    if let Err(e) = chan.send(&mut records.arena, m) {
                        if e.is_peer_gone() {
                            return Ok(());
                        }
                        return Err(e.into());
                    }
                }
                chan.send(&mut records.arena, &msg)
            }
            ToWorker::Resume => chan
                .send(&mut records.arena, &FromWorker::Resumed)
                .and_then(|()| {
                    drained = false;
                    sent_back.clear();
                    host.start_epoch();
                    let started = FromWorker::Started {
                        error: host.setup_error(),
                    };
                    chan.send(&mut records.arena, &started)
                }),
            ToWorker::Shutdown => return Ok(()),
            ToWorker::Mailbox => Err(DecodeError("a second mailbox").into()),
            ToWorker::Lanes {
                lanes,
                shuffle,
                block,
                root,
            } => {
                host.lanes(lanes, shuffle, block, root);
                Ok(())
            }
            ToWorker::Assign { lane, works, last } => {
                host.assign(lane, works, last);
                Ok(())
            }
            ToWorker::HandBack { lane } => {
                host.hand_back(lane);
                Ok(())
            }
        };
        match sent {
            Ok(()) => {}
            Err(e) if e.is_peer_gone() => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}
