//! The main process's side of the worker processes: one link per worker
//! (socket, mailbox, pidfd, arena reader), polling them all at once, and
//! turning what arrives into [`Event`]s. It knows nothing of batch order or
//! Python: the [`Scheduler`](super::Scheduler) decides what to send, the
//! bindings what a batch becomes. The lifecycle it drives is drawn in
//! `crate::worker`.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};

use crate::error::{Error, Result};
use crate::record::DecodeError;
use crate::ring::{ArenaReader, Dir, Mailbox, RecordHandle, RecordRef, Segment};
use crate::wire::protocol::{FromWorker, LanePos, ToWorker, ON_SOCKET};
use crate::wire::transport::{poll_fds, spin_wait, Blocking, Conn, Exit, ReadState, Watched};

/// Bytes per mailbox ring.
pub const MAILBOX_BYTES: usize = 256 << 10;

/// Something a worker did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Task `seq`'s batch is in `record` of the worker's arena; `times`:
    /// the worker's stage timings that came with it.
    Batch {
        worker: usize,
        seq: u64,
        record: RecordRef,
        times: crate::stats::StageTimes,
    },
    /// Task `seq` raised in user code (a serialised exception).
    Failed {
        worker: usize,
        seq: u64,
        payload: Vec<u8>,
    },
    /// The worker's iterable replica ran out on task `seq`.
    Exhausted { worker: usize, seq: u64 },
    /// The worker acknowledged `Resume`.
    Resumed { worker: usize },
    /// The worker set up for an epoch (`error`: its setup raised).
    Started {
        worker: usize,
        error: Option<Vec<u8>>,
    },
    /// The worker's iterable replica's state after task `seq`'s batch.
    State {
        worker: usize,
        seq: u64,
        payload: Vec<u8>,
    },
    /// Task `seq` found `lane` out of shards after the `given` it had.
    NeedWork {
        worker: usize,
        seq: u64,
        lane: u32,
        given: u32,
    },
    /// Where `lane` stands after task `seq`'s batch.
    LanePos {
        worker: usize,
        seq: u64,
        lane: u32,
        pos: LanePos,
    },
    /// Task `seq` is to be sent again as it was.
    Retry { worker: usize, seq: u64 },
    /// `lane`, told to hand back, gave back `works` on task `seq`.
    Tail {
        worker: usize,
        seq: u64,
        lane: u32,
        works: Vec<crate::wire::protocol::Work>,
    },
    /// The worker's stage timings since its last report.
    Stats {
        worker: usize,
        times: crate::stats::StageTimes,
    },
    /// The worker ended while still expected to answer (reported once).
    Died { worker: usize, pid: i32, exit: Exit },
}

struct Link {
    conn: Option<Conn>,
    mailbox: Mailbox,
    /// Messages for the worker not yet in its mailbox (it was full).
    outbox: VecDeque<Vec<u8>>,
    process: Watched,
    arena: ArenaReader,
    /// Still expected to answer (not stopped, not dead).
    running: bool,
}

pub struct WorkerPool {
    links: Vec<Link>,
    events: VecDeque<Event>,
    /// The process that started the workers: a copy of the pool in a
    /// process forked from it (garbage collected there) must not stop them.
    owner: u32,
}

/// Ends worker processes after [`WorkerPool::close`] told them to stop:
/// `grace` for them to exit, then SIGTERM and a second, then SIGKILL
/// (which a stopped or signal-ignoring worker cannot refuse) and up to
/// five seconds for the kernel to end them. They are not reaped: their
/// `multiprocessing` handles join them. The one place a worker's end is
/// decided once the engine has its socket.
pub fn end_processes(processes: &[&Watched], grace: Duration) {
    use rustix::process::Signal;
    let stages = [
        (None, grace),
        (Some(Signal::TERM), Duration::from_secs(1)),
        (Some(Signal::KILL), Duration::from_secs(5)),
    ];
    let mut left = processes.to_vec();
    for (signal, within) in stages {
        if left.is_empty() {
            return;
        }
        if let Some(sig) = signal {
            for p in &left {
                p.signal(sig);
            }
        }
        let deadline = std::time::Instant::now() + within;
        left.retain(|p| !p.wait_exit(deadline));
    }
}

impl WorkerPool {
    /// Takes over each worker's socket (`fd`, its `pid`): a mailbox is
    /// created for it and sent as the first frame.
    pub fn new(workers: Vec<(OwnedFd, i32)>) -> Result<WorkerPool> {
        let mut links = Vec::with_capacity(workers.len());
        for (fd, pid) in workers {
            let mut conn = Conn::new(fd);
            conn.set_nonblocking(true).map_err(Error::Disconnected)?;
            let mailbox = Mailbox::create(MAILBOX_BYTES).map_err(|source| Error::SharedMemory {
                what: format!("worker {}", links.len()),
                source,
            })?;
            let mut body = Vec::new();
            ToWorker::Mailbox.encode(&mut body);
            conn.send_frame_blocking(&body, Some(mailbox.fd()))
                .map_err(Error::Disconnected)?;
            links.push(Link {
                conn: Some(conn),
                mailbox,
                outbox: VecDeque::new(),
                process: Watched::new(pid),
                arena: ArenaReader::new(),
                running: true,
            });
        }
        Ok(WorkerPool {
            links,
            events: VecDeque::new(),
            owner: std::process::id(),
        })
    }

    pub fn len(&self) -> usize {
        self.links.len()
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    pub fn pid(&self, worker: usize) -> i32 {
        self.links[worker].process.pid()
    }

    /// Whether `worker` is still expected to answer.
    pub fn is_running(&self, worker: usize) -> bool {
        self.links[worker].running
    }

    /// Queues `msg` for `worker` and moves what fits into its mailbox.
    /// A worker whose link is closed drops it.
    pub fn send(&mut self, worker: usize, msg: &ToWorker) -> Result<()> {
        if self.links[worker].conn.is_none() {
            return Ok(());
        }
        let mut body = Vec::new();
        msg.encode(&mut body);
        self.links[worker].outbox.push_back(body);
        self.flush_outbox(worker)
    }

    /// Tells `worker` to exit; it is no longer expected to answer.
    pub fn stop(&mut self, worker: usize) -> Result<()> {
        self.send(worker, &ToWorker::Shutdown)?;
        self.links[worker].running = false;
        Ok(())
    }

    /// Stops every worker: a `Shutdown` frame, then the socket is closed so
    /// a worker that misses the frame still sees EOF. Idempotent.
    /// The worker processes this pool's process started (none in a copy
    /// of the pool in a forked process, nor for worker threads), for
    /// [`end_processes`] once the pool is closed.
    pub fn processes(&self) -> Vec<&Watched> {
        if std::process::id() != self.owner {
            return Vec::new();
        }
        self.links
            .iter()
            .map(|l| &l.process)
            .filter(|p| !p.is_thread())
            .collect()
    }

    pub fn close(&mut self) {
        let owner = std::process::id() == self.owner;
        for w in 0..self.links.len() {
            if owner {
                // tasks still queued are not run (a worker thread would
                // otherwise call the dataset for each)
                self.links[w].mailbox.close(Dir::Tasks);
                let _ = self.send(w, &ToWorker::Shutdown);
            }
            let link = &mut self.links[w];
            if let Some(conn) = link.conn.as_mut().filter(|_| owner) {
                let _ = conn.flush();
            }
            link.conn = None;
            link.running = false;
        }
        self.events.clear();
    }

    /// Moves queued messages into the worker's mailbox, in order; one too
    /// large for it goes on the socket behind a marker. Wakes the worker if
    /// it was asleep.
    fn flush_outbox(&mut self, worker: usize) -> Result<()> {
        let link = &mut self.links[worker];
        let Some(conn) = link.conn.as_mut() else {
            link.outbox.clear();
            return Ok(());
        };
        let mut pushed = false;
        while let Some(body) = link.outbox.front() {
            if body.len() > link.mailbox.max_message() {
                if !link.mailbox.push(Dir::Tasks, ON_SOCKET) {
                    break;
                }
                conn.queue_frame(body);
            } else if !link.mailbox.push(Dir::Tasks, body) {
                break;
            }
            link.outbox.pop_front();
            pushed = true;
        }
        if pushed && link.mailbox.consumer_was_sleeping(Dir::Tasks) {
            conn.queue_frame(&[]);
        }
        if conn.has_unflushed() {
            conn.flush().map_err(Error::Disconnected)?;
        }
        Ok(())
    }

    /// The oldest event not yet taken.
    pub fn next_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Whether a result waits in some mailbox (cheap: shared-memory reads).
    pub fn result_waiting(&self) -> bool {
        self.links
            .iter()
            .any(|w| w.conn.is_some() && w.mailbox.has_message(Dir::Results))
    }

    /// Checks the mailboxes, yielding the CPU, for up to `budget`.
    pub fn spin(&self, budget: Duration) -> bool {
        spin_wait(budget, || self.result_waiting())
    }

    /// Retries queued messages and turns everything waiting in the
    /// mailboxes into events. A message left on the socket is read inside
    /// `host.blocking`.
    pub fn poll(&mut self, host: &mut impl Blocking) -> Result<()> {
        for w in 0..self.links.len() {
            if !self.links[w].outbox.is_empty() {
                self.flush_outbox(w)?;
            }
            self.drain(w, host)?;
        }
        Ok(())
    }

    /// `w`'s socket closed. A process's end is then seen on its pidfd; a
    /// thread has none, so a running thread's closed socket is its end.
    fn lost(&mut self, w: usize) {
        let link = &mut self.links[w];
        link.conn = None;
        if link.running && link.process.is_thread() {
            link.running = false;
            self.events.push_back(Event::Died {
                worker: w,
                pid: 0,
                exit: Exit::Thread,
            });
        }
    }

    fn drain(&mut self, w: usize, host: &mut impl Blocking) -> Result<()> {
        let mut buf = Vec::new();
        loop {
            let link = &mut self.links[w];
            let popped = link.mailbox.pop(Dir::Results, &mut buf);
            let popped = popped.map_err(|what| Error::Corrupt { worker: w, what })?;
            if link.conn.is_none() || !popped {
                return Ok(());
            }
            let frame = if buf == ON_SOCKET {
                let conn = link.conn.as_mut().expect("checked above");
                match host
                    .blocking(|| conn.recv_message_blocking())
                    .map_err(Error::Disconnected)?
                {
                    Some(f) => f,
                    None => {
                        self.lost(w);
                        return Ok(());
                    }
                }
            } else {
                std::mem::take(&mut buf)
            };
            let msg =
                FromWorker::decode(&frame).map_err(|what| Error::Corrupt { worker: w, what })?;
            let event = match msg {
                FromWorker::Segment { id } => {
                    let fd = link
                        .conn
                        .as_mut()
                        .and_then(Conn::take_fd)
                        .ok_or(DecodeError("segment without its descriptor"))?;
                    let seg = Segment::from_fd(fd).map_err(|source| Error::SharedMemory {
                        what: format!("worker {w}'s arena"),
                        source,
                    })?;
                    link.arena.add_segment(id, seg);
                    continue;
                }
                FromWorker::Batch { seq, record, times } => Event::Batch {
                    worker: w,
                    seq,
                    record,
                    times,
                },
                FromWorker::Error { seq, payload } => Event::Failed {
                    worker: w,
                    seq,
                    payload,
                },
                FromWorker::Exhausted { seq } => Event::Exhausted { worker: w, seq },
                FromWorker::Resumed => Event::Resumed { worker: w },
                FromWorker::Started { error } => Event::Started { worker: w, error },
                FromWorker::State { seq, payload } => Event::State {
                    worker: w,
                    seq,
                    payload,
                },
                FromWorker::NeedWork { seq, lane, given } => Event::NeedWork {
                    worker: w,
                    seq,
                    lane,
                    given,
                },
                FromWorker::LanePos { seq, lane, pos } => Event::LanePos {
                    worker: w,
                    seq,
                    lane,
                    pos,
                },
                FromWorker::Retry { seq } => Event::Retry { worker: w, seq },
                FromWorker::Stats(times) => Event::Stats { worker: w, times },
                FromWorker::Tail { seq, lane, works } => Event::Tail {
                    worker: w,
                    seq,
                    lane,
                    works,
                },
            };
            self.events.push_back(event);
        }
    }

    /// Sleeps on every worker's socket and pidfd for up to `slice`, unless a
    /// result arrives while announcing the sleep; then reads what `poll(2)`
    /// reported: wake-ups are dropped, a closed socket's mailbox is drained
    /// before the link is dropped, and a worker that ended while running
    /// becomes [`Event::Died`]. Holds no host resources: call it inside
    /// `Blocking::blocking`.
    pub fn sleep(&mut self, slice: Duration) -> Result<()> {
        for (i, w) in self.links.iter().enumerate() {
            if w.conn.is_some() && !w.mailbox.prepare_sleep(Dir::Results) {
                for v in &self.links[..i] {
                    v.mailbox.end_sleep(Dir::Results);
                }
                return Ok(());
            }
        }
        let ready = self.poll_ready(slice);
        for w in &self.links {
            w.mailbox.end_sleep(Dir::Results);
        }
        for w in ready? {
            let Some(conn) = self.links[w].conn.as_mut() else {
                continue;
            };
            if conn.has_unflushed() {
                conn.flush().map_err(Error::Disconnected)?;
            }
            if conn.read_some().map_err(Error::Disconnected)? == ReadState::Closed {
                // Results still in the mailbox come before the loss.
                self.drain(w, &mut crate::wire::transport::NoHost)?;
                self.lost(w);
            } else {
                conn.skip_wakeups();
            }
        }
        self.check_deaths()
    }

    /// Which workers' sockets or pidfds are ready within `slice`.
    fn poll_ready(&self, slice: Duration) -> Result<Vec<usize>> {
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(2 * self.links.len());
        let mut owner = Vec::with_capacity(2 * self.links.len());
        for (i, w) in self.links.iter().enumerate() {
            if let Some(c) = &w.conn {
                let mut ev = PollFlags::IN;
                if c.has_unflushed() {
                    ev |= PollFlags::OUT;
                }
                fds.push(PollFd::from_borrowed_fd(c.as_fd(), ev));
                owner.push(i);
            }
            if let (true, Some(p)) = (w.running, w.process.pidfd()) {
                fds.push(PollFd::from_borrowed_fd(p, PollFlags::IN));
                owner.push(i);
            }
        }
        poll_fds(&mut fds, Some(slice)).map_err(Error::Disconnected)?;
        let mut ready: Vec<usize> = fds
            .iter()
            .zip(&owner)
            .filter(|(f, _)| !f.revents().is_empty())
            .map(|(_, &i)| i)
            .collect();
        ready.dedup();
        Ok(ready)
    }

    /// Queues [`Event::Died`] for each running worker that has ended,
    /// after what it sent before it ended (it may end between `poll(2)`
    /// and this check, its results unread).
    fn check_deaths(&mut self) -> Result<()> {
        for w in 0..self.links.len() {
            if !self.links[w].running {
                continue;
            }
            if let Some(exit) = self.links[w].process.exit_status() {
                if self.links[w].conn.is_some() {
                    self.drain(w, &mut crate::wire::transport::NoHost)?;
                }
                let link = &mut self.links[w];
                link.running = false;
                self.events.push_back(Event::Died {
                    worker: w,
                    pid: link.process.pid(),
                    exit,
                });
            }
        }
        Ok(())
    }

    /// Opens a batch record `worker` announced; it is released when the
    /// handle (and every tensor sharing it) is dropped.
    pub fn open(&self, worker: usize, record: RecordRef) -> Result<RecordHandle> {
        self.links[worker].arena.open(record).ok_or(Error::Corrupt {
            worker,
            what: DecodeError("batch record outside the worker's arena"),
        })
    }

    /// Releases a record that will not be used (a batch of an abandoned epoch).
    pub fn discard(&self, worker: usize, record: RecordRef) {
        self.links[worker].arena.discard(record);
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod end_tests {
    use super::*;
    use crate::wire::transport::Exit;
    use std::process::Command;
    use std::time::Instant;

    fn spawn(script: &str) -> std::process::Child {
        Command::new("sh").arg("-c").arg(script).spawn().unwrap()
    }

    #[test]
    // Spawns processes and signals them: not emulated by Miri.
    #[cfg_attr(miri, ignore)]
    fn a_worker_that_exits_is_not_signalled_and_one_that_does_not_is_terminated() {
        let mut quick = spawn("exit 3");
        let mut slow = spawn("exec sleep 30");
        let (q, s) = (
            Watched::new(quick.id() as i32),
            Watched::new(slow.id() as i32),
        );
        let t = Instant::now();
        end_processes(&[&q, &s], Duration::from_millis(300));
        assert_eq!(q.exit_status(), Some(Exit::Code(3)));
        assert_eq!(
            s.exit_status(),
            Some(Exit::Signal(15)),
            "SIGTERM after the grace"
        );
        assert!(t.elapsed() < Duration::from_secs(5));
        // not reaped by the engine: the owner of the handle reaps it
        assert!(quick.wait().is_ok() && slow.wait().is_ok());
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn ending_a_worker_already_reaped_returns_at_once() {
        // (a second shutdown, after multiprocessing joined the process: its
        // pidfd stays readable and waitid says ECHILD)
        let mut gone = spawn("exit 0");
        let w = Watched::new(gone.id() as i32);
        assert!(gone.wait().is_ok());
        let t = Instant::now();
        end_processes(&[&w], Duration::from_secs(3));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_worker_that_ignores_sigterm_is_killed() {
        // it says when its trap is set, so the signal cannot come first
        let mut stubborn = Command::new("sh")
            .arg("-c")
            .arg("trap '' TERM; echo ready; while :; do sleep 0.05; done")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(stubborn.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "ready\n");
        let w = Watched::new(stubborn.id() as i32);
        end_processes(&[&w], Duration::ZERO);
        assert_eq!(w.exit_status(), Some(Exit::Signal(9)));
        assert!(stubborn.wait().is_ok());
    }
}
