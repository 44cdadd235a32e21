//! A real multi-process pool without Python: the worker is this test binary
//! run again (`child_worker_entry`) with its socket as stdin, serving tasks
//! through `crate::worker::serve` with a plain Rust host.
//!
//! All ignored under Miri, which cannot spawn processes, pass fds over
//! sockets or map memfds.
//!
//! A task's indices are the batch; negative indices are commands to the
//! test worker: -1 exit with code 3, -2 SIGKILL itself, -3 sleep 150 ms
//! first, -4 raise (answer `Failed`), -5 sleep 1 s first. A batch record holds the non-negative
//! indices as little-endian `i64`s.

use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};

use super::loader::Waiter;
use super::shards::{rank_shards, resume_static, static_lanes, LanePlan, Mode, ShardSpec};
use super::{LaneSet, Loader, Next, Payload, WorkerPool};
use crate::error::Error;
use crate::sampler::shards::{shard_order, Blocks};
use crate::wire::protocol::{LanePos, TaskIndices, Work};
use crate::wire::transport::Exit;
use crate::worker::lanes::{Lane, LaneConfig, Pull, ShardSource};
use crate::worker::{serve, Blocking, Config, Host, Records, Reply};

const CHILD_ENV: &str = "FERROLOADER_POOL_TEST_CHILD";
/// How many batches an iterable replica of worker `w` yields: `w + 1`.
const ITERABLE_BASE: usize = 1;

struct TestHost {
    worker: usize,
    produced: usize,
    /// The last task was an iterable's: its state follows the batch.
    iterable: bool,
    /// Sharded epochs: this worker's lanes, and the last batch's lane.
    lanes: std::collections::HashMap<u32, Lane<TestShards>>,
    last_lane: Option<(u32, LanePos)>,
    /// Its setup "raised": `Started` carries this, and the first task
    /// answers it (as a failed `worker_init_fn`).
    setup_error: Option<Vec<u8>>,
}

/// Items of the test's sharded dataset: shard `s` holds `SHARD_LENS[s]`
/// items, item `o` being `1000 * s + o`.
const SHARD_LENS: [u64; 8] = [7, 1, 12, 3, 0, 5, 9, 2];
const LANE_BATCH: usize = 3;
/// A shard beyond `SHARD_LENS` whose items each take 100 ms: its lane
/// falls behind the others.
const SLOW_SHARD: u32 = 8;
const SLOW_LEN: u64 = 4;

struct TestShards;

impl ShardSource for TestShards {
    type Item = i64;
    type Iter = ();
    type Error = Error;
    fn open(&mut self, _shard: u32, _start: u64) -> Result<(), Error> {
        Ok(())
    }
    fn next(&mut self, _: &mut (), shard: u32, offset: u64) -> Result<Option<i64>, Error> {
        let len = if shard == SLOW_SHARD {
            std::thread::sleep(Duration::from_millis(100));
            SLOW_LEN
        } else {
            SHARD_LENS[shard as usize]
        };
        Ok((offset < len).then(|| 1000 * shard as i64 + offset as i64))
    }
    fn share(&mut self, item: &i64) -> i64 {
        *item
    }
}

impl Blocking for TestHost {}

impl Host for TestHost {
    type Error = Error;

    fn start_epoch(&mut self) {
        self.produced = 0;
    }

    fn setup_error(&self) -> Option<Vec<u8>> {
        self.setup_error.clone()
    }

    fn lanes(&mut self, lanes: Vec<u32>, shuffle: bool, block: u64, root: u64) {
        let config = LaneConfig {
            batch: Some(LANE_BATCH),
            drop_last: false,
            blocks: shuffle.then_some(Blocks { root, size: block }),
        };
        self.lanes = lanes.into_iter().map(|l| (l, Lane::new(config))).collect();
    }

    fn assign(&mut self, lane: u32, works: Vec<Work>, last: bool) {
        self.lanes
            .get_mut(&lane)
            .expect("a lane of this worker")
            .assign(works, last);
    }

    fn hand_back(&mut self, lane: u32) {
        self.lanes
            .get_mut(&lane)
            .expect("a lane of this worker")
            .hand_back();
    }

    fn lane_after_batch(&mut self) -> Option<(u32, LanePos)> {
        self.last_lane.take()
    }

    fn state_after_batch(&mut self) -> Result<Option<Vec<u8>>, Error> {
        // an iterable replica's state: how many batches it has made
        Ok(self
            .iterable
            .then(|| (self.produced as u64).to_le_bytes().to_vec()))
    }

    fn run(&mut self, indices: TaskIndices, records: &mut Records) -> Result<Reply, Error> {
        if let Some(e) = self.setup_error.take() {
            return Ok(Reply::Failed(e));
        }
        self.iterable = matches!(indices, TaskIndices::Iterable(_));
        let v = match indices {
            TaskIndices::Ints(v) => v,
            TaskIndices::Lane(l) => {
                let lane = self.lanes.get_mut(&l).expect("a lane of this worker");
                match lane.pull(&mut TestShards)? {
                    Pull::Batch(items) => {
                        self.last_lane = lane.pos().map(|p| (l, p));
                        items
                    }
                    Pull::NeedWork => {
                        return Ok(Reply::NeedWork {
                            lane: l,
                            given: lane.given(),
                        })
                    }
                    Pull::HandedBack(works) => return Ok(Reply::Tail { lane: l, works }),
                    Pull::Exhausted => return Ok(Reply::Exhausted),
                }
            }
            TaskIndices::Iterable(_) => {
                if self.produced == self.worker + ITERABLE_BASE {
                    return Ok(Reply::Exhausted);
                }
                self.produced += 1;
                vec![(self.worker * 100 + self.produced) as i64]
            }
            other => panic!("unexpected task {other:?}"),
        };
        if v.contains(&-1) {
            std::process::exit(3);
        }
        if v.contains(&-2) {
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
        }
        if v.contains(&-3) {
            std::thread::sleep(Duration::from_millis(150));
        }
        if v.contains(&-5) {
            std::thread::sleep(Duration::from_secs(1));
        }
        if v.contains(&-4) {
            return Ok(Reply::Failed(b"raised".to_vec()));
        }
        let data: Vec<u8> = v
            .iter()
            .filter(|&&i| i >= 0)
            .flat_map(|i| i.to_le_bytes())
            .collect();
        let r = records.alloc(data.len().max(1))?;
        records.payload_mut(r)[..data.len()].copy_from_slice(&data);
        records.publish(r);
        Ok(Reply::Batch(r))
    }
}

/// Not a test of its own: the worker process's entry when run as a child.
#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn child_worker_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    // "worker,pid", or "worker,pid,setup-fails"
    let mut parts = spec.split(',');
    let (worker, main_pid) = (parts.next().unwrap(), parts.next().expect("worker,pid"));
    let setup_error = (parts.next() == Some("setup-fails")).then(|| b"setup failed".to_vec());
    let fd = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
    let mut host = TestHost {
        worker: worker.parse().unwrap(),
        produced: 0,
        iterable: false,
        lanes: Default::default(),
        last_lane: None,
        setup_error,
    };
    let config = Config {
        main_pid: main_pid.parse().unwrap(),
        shm_initial: 1 << 20,
        shm_limit: 64 << 20,
        prefetch_factor: 2,
        trim: true,
    };
    serve(&mut host, fd, config).unwrap();
}

struct Pool {
    loader: Loader,
    children: Vec<Child>,
}

/// The test's host: nothing to let run, and an interrupt 30 s after the
/// wait began, so a hang fails the test instead of blocking it.
struct Deadline(Instant);

impl Deadline {
    fn in_30s() -> Self {
        Deadline(Instant::now() + Duration::from_secs(30))
    }
}

impl Blocking for Deadline {}

impl Waiter for Deadline {
    type Error = Error;
    fn check_interrupts(&mut self) -> Result<(), Error> {
        assert!(Instant::now() < self.0, "no answer within 30 s");
        Ok(())
    }
}

fn start(n: usize, prefetch: usize, in_order: bool, persistent: bool) -> Pool {
    start_failing(n, prefetch, in_order, persistent, None)
}

/// [`start`], with worker `failing`'s setup raising.
fn start_failing(
    n: usize,
    prefetch: usize,
    in_order: bool,
    persistent: bool,
    failing: Option<usize>,
) -> Pool {
    let exe = std::env::current_exe().unwrap();
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let mut links = Vec::new();
    let mut children = Vec::new();
    for w in 0..n {
        let (main_end, child_end) = socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let child = Command::new(&exe)
            .args([
                "--exact",
                "scheduler::pool_tests::child_worker_entry",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(
                CHILD_ENV,
                if failing == Some(w) {
                    format!("{w},{me},setup-fails")
                } else {
                    format!("{w},{me}")
                },
            )
            .stdin(Stdio::from(child_end))
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        links.push((main_end, child.id() as i32));
        children.push(child);
    }
    let pool = WorkerPool::new(links).unwrap();
    Pool {
        loader: Loader::new(pool, prefetch, in_order, persistent),
        children,
    }
}

impl Pool {
    /// The next answer, waiting as the bindings do (without a GIL).
    fn next(
        &mut self,
        draw: &mut impl FnMut() -> Result<Option<TaskIndices>, Error>,
    ) -> Result<Option<(usize, Payload)>, Error> {
        let mut host = Deadline::in_30s();
        loop {
            match self.loader.step() {
                Next::Yield { worker, data } => {
                    self.loader.put_task(draw)?;
                    return Ok(Some((worker, data)));
                }
                Next::Stop => return Ok(None),
                Next::Wait => self.loader.wait(&mut host, draw, None)?,
            }
        }
    }

    fn indices(&self, worker: usize, payload: Payload) -> Vec<i64> {
        let Payload::Batch(record) = payload else {
            panic!("expected a batch, got {payload:?}");
        };
        let handle = self.loader.open(worker, record).unwrap();
        handle
            .bytes()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Every child has exited, and how.
    fn reap(mut self) -> Vec<Option<i32>> {
        self.loader.close();
        let deadline = Instant::now() + Duration::from_secs(30);
        self.children
            .iter_mut()
            .map(|c| loop {
                if let Some(status) = c.try_wait().unwrap() {
                    break status.code();
                }
                assert!(Instant::now() < deadline, "worker did not exit");
                std::thread::sleep(Duration::from_millis(10));
            })
            .collect()
    }
}

/// Batches of 4 indices from `tasks`; a batch also carries `extra(i)`.
fn batches(
    tasks: usize,
    extra: impl Fn(usize) -> Vec<i64>,
) -> impl FnMut() -> Result<Option<TaskIndices>, Error> {
    let mut i = 0;
    move || {
        if i == tasks {
            return Ok(None);
        }
        let mut v: Vec<i64> = (4 * i as i64..4 * i as i64 + 4).collect();
        v.extend(extra(i));
        i += 1;
        Ok(Some(TaskIndices::Ints(v)))
    }
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn batches_come_back_in_sequence_order_whatever_the_finish_order() {
    let mut pool = start(2, 2, true, false);
    // Every third batch is slow, so later batches finish first.
    let mut draw = batches(12, |i| if i % 3 == 0 { vec![-3] } else { vec![] });
    pool.loader.prime(&mut draw).unwrap();
    let mut got = Vec::new();
    while let Some((w, payload)) = pool.next(&mut draw).unwrap() {
        got.extend(pool.indices(w, payload));
    }
    assert_eq!(got, (0..48).collect::<Vec<i64>>());
    assert_eq!(pool.reap(), vec![Some(0), Some(0)]);
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn out_of_order_mode_hands_over_every_batch_once() {
    let mut pool = start(2, 2, false, false);
    // A second is far longer than the other nine batches take, even on a
    // loaded machine.
    let mut draw = batches(10, |i| if i == 0 { vec![-5] } else { vec![] });
    pool.loader.prime(&mut draw).unwrap();
    let mut got = Vec::new();
    while let Some((w, payload)) = pool.next(&mut draw).unwrap() {
        got.push(pool.indices(w, payload)[0]);
    }
    assert_ne!(
        got[0], 0,
        "the slow first batch must not hold the others back"
    );
    got.sort_unstable();
    assert_eq!(got, (0..10).map(|i| 4 * i).collect::<Vec<i64>>());
    pool.reap();
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn a_killed_worker_is_reported_with_its_signal() {
    let mut pool = start(2, 1, true, false);
    let mut draw = batches(6, |i| if i == 3 { vec![-2] } else { vec![] });
    pool.loader.prime(&mut draw).unwrap();
    let err = loop {
        match pool.next(&mut draw) {
            Ok(Some((w, p))) => drop(pool.indices(w, p)),
            Ok(None) => panic!("the epoch ended without the death"),
            Err(e) => break e,
        }
    };
    let killed = pool.loader.pool().pid(1);
    match err {
        Error::WorkerDied { worker, pid, exit } => {
            assert_eq!((worker, pid), (1, killed));
            assert_eq!(exit, Exit::Signal(rustix::process::Signal::KILL.as_raw()));
        }
        other => panic!("expected WorkerDied, got {other:?}"),
    }
    assert!(pool.loader.is_closed());
    assert_eq!(
        pool.reap()[0],
        Some(0),
        "the other worker shuts down cleanly"
    );
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn a_worker_that_exits_is_reported_with_its_code() {
    let mut pool = start(1, 2, true, false);
    let mut draw = batches(3, |i| if i == 1 { vec![-1] } else { vec![] });
    pool.loader.prime(&mut draw).unwrap();
    let (w, p) = pool.next(&mut draw).unwrap().unwrap();
    assert_eq!(pool.indices(w, p), vec![0, 1, 2, 3]);
    match pool.next(&mut draw) {
        Err(Error::WorkerDied { exit, .. }) => assert_eq!(exit, Exit::Code(3)),
        other => panic!("expected WorkerDied, got {other:?}"),
    }
    pool.reap();
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn a_failed_task_keeps_its_place_and_the_epoch_goes_on() {
    let mut pool = start(2, 2, true, false);
    let mut draw = batches(5, |i| if i == 2 { vec![-4] } else { vec![] });
    pool.loader.prime(&mut draw).unwrap();
    let mut got = Vec::new();
    while let Some((w, payload)) = pool.next(&mut draw).unwrap() {
        match payload {
            Payload::Error(b) => got.push(Err(b)),
            p => got.push(Ok(pool.indices(w, p)[0])),
        }
    }
    assert_eq!(
        got,
        vec![Ok(0), Ok(4), Err(b"raised".to_vec()), Ok(12), Ok(16)]
    );
    pool.reap();
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn iterable_replicas_round_robin_until_each_is_exhausted() {
    let mut pool = start(3, 2, true, false);
    let mut draw = || Ok(Some(TaskIndices::Iterable(Some(1))));
    pool.loader.prime(&mut draw).unwrap();
    let mut got = Vec::new();
    while let Some((w, payload)) = pool.next(&mut draw).unwrap() {
        got.push(pool.indices(w, payload)[0]);
    }
    // Worker w yields w + 1 batches (100 w + k), torch's order over the
    // replicas still alive.
    assert_eq!(got, vec![1, 101, 201, 102, 202, 203]);
    assert_eq!(pool.reap(), vec![Some(0); 3]);
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn iterable_position_pairs_each_replica_with_the_state_of_its_last_handed_over_batch() {
    let mut pool = start(3, 2, true, false);
    let mut draw = || Ok(Some(TaskIndices::Iterable(Some(1))));
    pool.loader.prime(&mut draw).unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        let (w, payload) = pool.next(&mut draw).unwrap().expect("a batch");
        got.push(pool.indices(w, payload)[0]);
    }
    assert_eq!(got, vec![1, 101, 201, 102]);
    // workers prefetch past what was handed over; the position does not
    let p = pool.loader.iterable_position();
    assert_eq!(p.delivered, vec![1, 2, 1]);
    let made = |n: u64| Some(n.to_le_bytes().to_vec());
    assert_eq!(p.states, vec![made(1), made(2), made(1)]);
    assert_eq!(p.next_worker, 2, "202 comes next");
    assert_eq!(pool.reap(), vec![Some(0); 3]);
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn persistent_workers_serve_a_second_epoch_after_resume() {
    let mut pool = start(2, 2, true, true);
    for epoch in 0..2 {
        let mut draw = batches(4, |_| vec![]);
        if epoch > 0 {
            let mut host = Deadline::in_30s();
            pool.loader.restart_epoch(&mut host, &mut draw).unwrap();
        }
        pool.loader.prime(&mut draw).unwrap();
        let mut got = Vec::new();
        while let Some((w, payload)) = pool.next(&mut draw).unwrap() {
            got.extend(pool.indices(w, payload));
        }
        assert_eq!(got, (0..16).collect::<Vec<i64>>(), "epoch {epoch}");
        assert!(!pool.loader.is_closed(), "persistent workers stay up");
    }
    assert_eq!(pool.reap(), vec![Some(0), Some(0)]);
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn workers_leave_quietly_when_the_main_side_closes_mid_epoch() {
    let mut pool = start(2, 2, true, false);
    let mut draw = batches(100, |_| vec![]);
    pool.loader.prime(&mut draw).unwrap();
    let (w, p) = pool.next(&mut draw).unwrap().unwrap();
    assert_eq!(pool.indices(w, p), vec![0, 1, 2, 3]);
    assert_eq!(pool.reap(), vec![Some(0), Some(0)]);
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn a_wait_past_its_timeout_is_a_timeout_error_and_the_epoch_can_go_on() {
    let mut pool = start(1, 1, true, false);
    // The first batch takes a second; the wait allows 100 ms.
    let mut draw = batches(2, |i| if i == 0 { vec![-5] } else { vec![] });
    pool.loader.prime(&mut draw).unwrap();
    assert_eq!(pool.loader.step(), Next::Wait);
    let t0 = Instant::now();
    let err = pool
        .loader
        .wait(
            &mut Deadline::in_30s(),
            &mut draw,
            Some((Duration::from_millis(100), "0.1")),
        )
        .unwrap_err();
    assert!(
        matches!(&err, Error::Timeout { after } if after == "0.1"),
        "{err:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "the wait ended at its limit"
    );
    let mut got = Vec::new();
    while let Some((w, payload)) = pool.next(&mut draw).unwrap() {
        got.extend(pool.indices(w, payload));
    }
    assert_eq!(
        got,
        (0..8).collect::<Vec<i64>>(),
        "the slow batch still arrives"
    );
    assert_eq!(pool.reap(), vec![Some(0)]);
}

/// Runs one sharded epoch to its end; the batches' items.
fn lane_epoch(pool: &mut Pool, plan: LanePlan) -> Vec<Vec<i64>> {
    pool.loader.start_lanes(plan).unwrap();
    let mut draw = batches(0, |_| vec![]);
    pool.loader.prime(&mut draw).unwrap();
    let mut got = Vec::new();
    while let Some((w, payload)) = pool.next(&mut draw).unwrap() {
        got.push(pool.indices(w, payload));
    }
    got
}

fn static_plan(order: &[u32], lanes: usize) -> LanePlan {
    LanePlan {
        lanes,
        shuffle: true,
        block: 4,
        root: 99,
        works: Some(static_lanes(order, lanes)),
        queue: Vec::new(),
        next_lane: 0,
        handed: 0,
        budget: None,
        bases: vec![0; lanes],
        positions: vec![None; lanes],
    }
}

fn all_items() -> Vec<i64> {
    let mut v: Vec<i64> = (0..SHARD_LENS.len())
        .flat_map(|s| (0..SHARD_LENS[s] as i64).map(move |o| 1000 * s as i64 + o))
        .collect();
    v.sort_unstable();
    v
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn static_lanes_give_the_same_batches_for_any_number_of_workers() {
    let order = shard_order(SHARD_LENS.len(), Some(5));
    let mut seqs = Vec::new();
    for workers in [1, 2, 3] {
        let mut pool = start(workers, 2, true, false);
        seqs.push(lane_epoch(&mut pool, static_plan(&order, 4)));
        pool.reap();
    }
    assert_eq!(seqs[0], seqs[1]);
    assert_eq!(seqs[0], seqs[2]);
    let mut items = seqs[0].concat();
    items.sort_unstable();
    assert_eq!(items, all_items(), "every item exactly once");
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn dynamic_lanes_read_every_item_once_asking_for_shards() {
    for workers in [1, 2, 3] {
        let mut pool = start(workers, 2, true, true);
        let queue = (0..SHARD_LENS.len() as u32)
            .map(|shard| Work::from(shard, 0))
            .collect();
        let plan = LanePlan {
            lanes: workers,
            shuffle: false,
            block: 4,
            root: 0,
            works: None,
            queue,
            next_lane: 0,
            handed: 0,
            budget: None,
            bases: vec![0; workers],
            positions: vec![None; workers],
        };
        let got = lane_epoch(&mut pool, plan);
        // the lanes' tails are read by the last lane: one lane's batches
        let total = all_items().len();
        assert_eq!(got.len(), total.div_ceil(LANE_BATCH), "{workers} workers");
        assert!(got.iter().rev().skip(1).all(|b| b.len() == LANE_BATCH));
        let mut items = got.concat();
        items.sort_unstable();
        assert_eq!(items, all_items(), "{workers} workers");
        pool.loader.close();
        pool.reap();
    }
}

/// A dynamic rank of `SHARD_LENS` read by `lanes` lanes, batches of
/// `batch`, shuffled in blocks of 2.
fn dynamic_spec(lanes: usize, batch: usize) -> ShardSpec {
    ShardSpec {
        n_shards: SHARD_LENS.len(),
        lens: Some(SHARD_LENS.to_vec()),
        order_seed: Some(3),
        blocks: Some(Blocks { root: 5, size: 2 }),
        rank: 0,
        world: 1,
        mode: Mode::Dynamic(lanes),
        batch: Some(batch as u64),
        drop_last: false,
        even: false,
        largest_first: true,
    }
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn a_dynamic_epoch_resumes_from_any_snapshot_with_every_item_once() {
    // tails handed back while batches are still in flight: a snapshot
    // taken then holds those batches' items, once
    let mut pool = start(3, 2, true, false);
    let whole = lane_epoch(&mut pool, dynamic_spec(3, LANE_BATCH).plan(None).unwrap());
    pool.reap();
    assert_eq!(
        Some(whole.len() as u64),
        dynamic_spec(3, LANE_BATCH).batches()
    );
    for stop in 0..=whole.len() {
        let mut pool = start(3, 2, true, false);
        let plan = dynamic_spec(3, LANE_BATCH).plan(None).unwrap();
        pool.loader.start_lanes(plan).unwrap();
        let mut draw = batches(0, |_| vec![]);
        pool.loader.prime(&mut draw).unwrap();
        let mut got = Vec::new();
        for _ in 0..stop {
            let (w, p) = pool.next(&mut draw).unwrap().unwrap();
            got.extend(pool.indices(w, p));
        }
        let snap = pool.loader.lane_snapshot().unwrap();
        pool.loader.close();
        pool.reap();
        // the rest, in one process with 2 lanes
        let plan = dynamic_spec(2, LANE_BATCH).plan(Some(&snap)).unwrap();
        let mut set: LaneSet<TestShards> = LaneSet::new(plan, Some(LANE_BATCH), false);
        while let Some(b) = set.next_batch(&mut TestShards).unwrap() {
            got.extend(b);
        }
        got.sort_unstable();
        assert_eq!(got, all_items(), "stop {stop}");
    }
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn a_budget_ends_the_epoch_after_that_many_batches() {
    let order = shard_order(SHARD_LENS.len(), None);
    let mut pool = start(2, 2, true, false);
    let mut plan = static_plan(&order, 3);
    plan.budget = Some(4);
    assert_eq!(lane_epoch(&mut pool, plan).len(), 4);
    pool.reap();
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn a_static_epoch_resumes_from_its_snapshot_on_other_workers() {
    let order = shard_order(SHARD_LENS.len(), Some(11));
    let mine = rank_shards(&order, 0, 1);
    let mut pool = start(2, 2, true, false);
    let whole = lane_epoch(&mut pool, static_plan(&mine, 3));
    pool.reap();
    for stop in [0, 1, 4, whole.len() - 1] {
        let mut pool = start(2, 2, true, false);
        pool.loader.start_lanes(static_plan(&mine, 3)).unwrap();
        let mut draw = batches(0, |_| vec![]);
        pool.loader.prime(&mut draw).unwrap();
        for b in &whole[..stop] {
            let (w, p) = pool.next(&mut draw).unwrap().unwrap();
            assert_eq!(&pool.indices(w, p), b);
        }
        let snap = pool.loader.lane_snapshot().unwrap();
        assert_eq!(snap.handed, stop as u64);
        pool.loader.close();
        pool.reap();
        let spec = ShardSpec {
            n_shards: SHARD_LENS.len(),
            lens: None,
            order_seed: Some(11),
            blocks: Some(Blocks { root: 99, size: 4 }),
            rank: 0,
            world: 1,
            mode: Mode::Static(3),
            batch: Some(LANE_BATCH as u64),
            drop_last: false,
            even: false,
            largest_first: false,
        };
        let plan = spec.plan(Some(&snap)).unwrap();
        let by_hand = resume_static(&static_lanes(&mine, 3), &snap.positions);
        assert_eq!(plan.works.as_ref(), Some(&by_hand));
        let mut resumed = start(3, 1, true, false);
        assert_eq!(
            lane_epoch(&mut resumed, plan),
            whole[stop..].to_vec(),
            "stop {stop}"
        );
        resumed.reap();
    }
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn lanes_in_one_process_give_the_pools_sequence() {
    let order = shard_order(SHARD_LENS.len(), Some(23));
    let mut pool = start(2, 2, true, false);
    let pooled = lane_epoch(&mut pool, static_plan(&order, 3));
    pool.reap();
    let mut set: LaneSet<TestShards> =
        LaneSet::new(static_plan(&order, 3), Some(LANE_BATCH), false);
    let mut local = Vec::new();
    while let Some(b) = set.next_batch(&mut TestShards).unwrap() {
        local.push(b);
    }
    assert_eq!(local, pooled);
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn a_dynamic_lanes_batches_keep_the_order_of_its_tasks() {
    // One lane reads the queue's shards in order, however they are handed
    // out; a task sent back (NeedWork) must not be overtaken by a later
    // one that finds a newly assigned shard.
    let queue: Vec<Work> = (0..SHARD_LENS.len() as u32)
        .map(|shard| Work::from(shard, 0))
        .collect();
    let plan = LanePlan {
        lanes: 1,
        shuffle: true,
        block: 2,
        root: 7,
        works: None,
        queue,
        next_lane: 0,
        handed: 0,
        budget: None,
        bases: vec![0],
        positions: vec![None],
    };
    let mut set: LaneSet<TestShards> = LaneSet::new(plan.clone(), Some(LANE_BATCH), false);
    let mut want = Vec::new();
    while let Some(b) = set.next_batch(&mut TestShards).unwrap() {
        want.push(b);
    }
    let mut pool = start(1, 3, true, true);
    for epoch in 0..40 {
        if epoch > 0 {
            let mut draw = batches(0, |_| vec![]);
            pool.loader
                .restart_epoch(&mut Deadline::in_30s(), &mut draw)
                .unwrap();
        }
        assert_eq!(lane_epoch(&mut pool, plan.clone()), want, "epoch {epoch}");
    }
    pool.loader.close();
    pool.reap();
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn a_dynamic_epochs_short_batch_is_handed_over_last() {
    // Lane 0 reads the slow shard (4 items), lane 1 shard 0 (7 items) and
    // runs ahead: its full batches take tasks 1 and 3, then it hands back
    // its last item. Lane 0 collects it with its own last item on task 2,
    // a short batch with a lower sequence number than lane 1's second
    // batch: it must still come last (only the last batch is short), and
    // a budget of 3 batches then leaves it out, not a full one.
    for (in_order, budget) in [(true, None), (false, None), (true, Some(3))] {
        let mut pool = start(2, 2, in_order, false);
        let plan = LanePlan {
            lanes: 2,
            shuffle: false,
            block: 4,
            root: 0,
            works: None,
            queue: vec![Work::from(SLOW_SHARD, 0), Work::from(0, 0)],
            next_lane: 0,
            handed: 0,
            budget,
            bases: vec![0; 2],
            positions: vec![None; 2],
        };
        let got = lane_epoch(&mut pool, plan);
        let case = format!("in_order={in_order} budget={budget:?}: {got:?}");
        assert!(
            got.iter().all(|b| b.len() == LANE_BATCH || b.len() == 2),
            "{case}"
        );
        if budget.is_some() {
            assert_eq!(got.len(), 3, "{case}");
            assert!(got.iter().all(|b| b.len() == LANE_BATCH), "{case}");
        } else {
            assert_eq!(got.len(), 4, "{case}");
            assert!(got[..3].iter().all(|b| b.len() == LANE_BATCH), "{case}");
            let mut items = got.concat();
            items.sort_unstable();
            let mut want: Vec<i64> = (0..7).chain(8000..8000 + SLOW_LEN as i64).collect();
            want.sort_unstable();
            assert_eq!(items, want, "{case}");
        }
        pool.loader.close();
        pool.reap();
    }
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn await_setup_returns_once_workers_set_up_without_waiting_for_batches() {
    let mut pool = start(2, 1, true, false);
    // every first batch takes a second: the setup is over long before
    let mut draw = batches(4, |i| if i < 2 { vec![-5] } else { vec![] });
    pool.loader.prime(&mut draw).unwrap();
    let got = pool
        .loader
        .await_setup(&mut Deadline::in_30s(), &mut draw, None)
        .unwrap();
    assert_eq!(got, None);
    assert_eq!(pool.loader.step(), Next::Wait, "no batch was waited for");
    let mut seen = Vec::new();
    while let Some((w, p)) = pool.next(&mut draw).unwrap() {
        seen.extend(pool.indices(w, p));
    }
    assert_eq!(seen, (0..16).collect::<Vec<i64>>());
    assert_eq!(pool.reap(), vec![Some(0), Some(0)]);
}

#[test]
#[cfg_attr(miri, ignore)] // see the module docs
fn a_failed_setup_is_returned_by_await_setup_and_by_the_first_task() {
    let mut pool = start_failing(2, 1, true, false, Some(1));
    let mut draw = batches(4, |_| vec![]);
    pool.loader.prime(&mut draw).unwrap();
    let got = pool
        .loader
        .await_setup(&mut Deadline::in_30s(), &mut draw, None)
        .unwrap();
    assert_eq!(got.as_deref(), Some(&b"setup failed"[..]));
    // torch's loader reports it at the failed worker's first task instead
    let (w, p) = pool.next(&mut draw).unwrap().unwrap();
    assert_eq!(pool.indices(w, p), vec![0, 1, 2, 3]);
    let (w, p) = pool.next(&mut draw).unwrap().unwrap();
    assert_eq!((w, p), (1, Payload::Error(b"setup failed".to_vec())));
    assert_eq!(pool.reap(), vec![Some(0), Some(0)]);
}
