//! One Unix stream socket per worker: frames of [`protocol`](super::protocol)
//! messages, file descriptors passed with `SCM_RIGHTS`, and process liveness
//! through pidfds.
//!
//! The main process never blocks on a write (its frames are queued and
//! flushed as the socket drains), so a worker blocked writing a result can
//! never deadlock against a main process blocked writing a task.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use rustix::process::{Pid, PidfdFlags, WaitIdOptions};

use super::protocol::{put_frame, take_frame};

/// Result of reading from a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadState {
    /// Bytes may have arrived; the peer is still there.
    Open,
    /// The peer closed its end (it exited or shut down).
    Closed,
}

pub struct Conn {
    fd: OwnedFd,
    rbuf: Vec<u8>,
    rpos: usize,
    fds: VecDeque<OwnedFd>,
    wbuf: Vec<u8>,
    wpos: usize,
}

impl Conn {
    pub fn new(fd: OwnedFd) -> Self {
        Conn {
            fd,
            rbuf: Vec::new(),
            rpos: 0,
            fds: VecDeque::new(),
            wbuf: Vec::new(),
            wpos: 0,
        }
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        rustix::io::ioctl_fionbio(&self.fd, on)?;
        Ok(())
    }

    /// Queues one frame (non-blocking side); call [`Conn::flush`] after.
    pub fn queue_frame(&mut self, body: &[u8]) {
        put_frame(&mut self.wbuf, body);
    }

    /// Writes queued bytes until done or the socket is full. `Ok(true)` when
    /// nothing is left queued.
    pub fn flush(&mut self) -> io::Result<bool> {
        while self.wpos < self.wbuf.len() {
            match rustix::io::write(&self.fd, &self.wbuf[self.wpos..]) {
                Ok(n) => self.wpos += n,
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    pub fn has_unflushed(&self) -> bool {
        self.wpos < self.wbuf.len()
    }

    /// Writes one frame, blocking until sent; `fd` rides on its first byte.
    pub fn send_frame_blocking(
        &mut self,
        body: &[u8],
        fd: Option<BorrowedFd<'_>>,
    ) -> io::Result<()> {
        if u32::try_from(body.len()).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a message of {} bytes: messages between a worker and the training process \
                     are under 4 GiB (a pickled batch element, exception or dataset state)",
                    body.len()
                ),
            ));
        }
        let mut frame = Vec::with_capacity(body.len() + 4);
        put_frame(&mut frame, body);
        let mut sent = 0;
        if let Some(fd) = fd {
            let fds = [fd];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            control.push(SendAncillaryMessage::ScmRights(&fds));
            loop {
                match sendmsg(
                    &self.fd,
                    &[IoSlice::new(&frame)],
                    &mut control,
                    SendFlags::NOSIGNAL,
                ) {
                    Ok(n) => {
                        sent = n;
                        break;
                    }
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        while sent < frame.len() {
            match rustix::net::send(&self.fd, &frame[sent..], SendFlags::NOSIGNAL) {
                Ok(n) => sent += n,
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => {
                    wait_fd(self.fd.as_fd(), PollFlags::OUT, None)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads whatever is available (one `recvmsg`), collecting passed fds.
    /// On a blocking socket this waits for at least one byte.
    pub fn read_some(&mut self) -> io::Result<ReadState> {
        if self.rpos > 0 && self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
        }
        let mut chunk = [0u8; 64 * 1024];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let n = loop {
            match recvmsg(
                &self.fd,
                &mut [IoSliceMut::new(&mut chunk)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(r) => break r.bytes,
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => return Ok(ReadState::Open),
                Err(Errno::CONNRESET) => return Ok(ReadState::Closed),
                Err(e) => return Err(e.into()),
            }
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                self.fds.extend(fds);
            }
        }
        if n == 0 {
            return Ok(ReadState::Closed);
        }
        self.rbuf.extend_from_slice(&chunk[..n]);
        Ok(ReadState::Open)
    }

    /// Pops the next complete frame's body, if one has arrived.
    pub fn next_frame(&mut self) -> Option<Vec<u8>> {
        let (body, used) = take_frame(&self.rbuf[self.rpos..])?;
        let out = self.rbuf[self.rpos + body.start..self.rpos + body.end].to_vec();
        self.rpos += used;
        Some(out)
    }

    /// Blocks until a whole frame is in (worker side). `None`: peer closed.
    pub fn recv_frame_blocking(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(f) = self.next_frame() {
                return Ok(Some(f));
            }
            if self.read_some()? == ReadState::Closed {
                return Ok(None);
            }
        }
    }

    /// Blocks until the next non-empty frame (empty frames are wake-ups).
    /// `None`: the peer closed.
    pub fn recv_message_blocking(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            while let Some(f) = self.next_frame() {
                if !f.is_empty() {
                    return Ok(Some(f));
                }
            }
            if self.read_some()? == ReadState::Closed {
                return Ok(None);
            }
            if self.rpos == self.rbuf.len() {
                // Non-blocking socket with nothing yet: wait for it.
                wait_fd(self.fd.as_fd(), PollFlags::IN, None)?;
            }
        }
    }

    /// Drops wake-up frames at the front of what has been read.
    pub fn skip_wakeups(&mut self) {
        while let Some((body, used)) = take_frame(&self.rbuf[self.rpos..]) {
            if !body.is_empty() {
                break;
            }
            self.rpos += used;
        }
    }

    /// The oldest file descriptor received and not yet taken.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }
}

impl Conn {
    pub fn as_fd_ref(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// How the host lets others run while the engine blocks on another process
/// (the Python bindings release the GIL). The default runs `f` as it is.
pub trait Blocking {
    fn blocking<R: Send>(&mut self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }
}

/// A host with nothing to let run (tests, pure-Rust callers).
pub struct NoHost;

impl Blocking for NoHost {}

/// Waits up to `budget` for `ready()`, yielding the CPU between checks:
/// on a machine with more busy processes than cores the peer we wait for
/// may need this very core (a busy spin measured ~5x slower there), and a
/// yield is still far cheaper than sleeping and being woken.
///
/// Where far more tasks are runnable than there are cores (other work
/// beside the loader), the spin is skipped: a spinning task keeps its turn
/// while doing nothing, where a sleeping one is woken ahead of the busy
/// ones (records beside two busy processes: about 3x the rate without
/// spins; on an idle machine the spins double the rate of small batches).
///
/// The spin also stands down where it keeps running out: a waiter whose
/// spins ended empty twice in a row (its peer takes longer than the
/// budget: large batches) skips the next 1, 2, 4, ... up to
/// [`MAX_SKIPPED_SPINS`] waits, and any spin that finds its message ends
/// that. A spin that runs out is a core taken from the workers for
/// nothing (images of 150 KiB, batch 32, 2 workers on 2 cores: about 1.2x
/// the rate without the spins).
pub fn spin_wait(budget: std::time::Duration, mut ready: impl FnMut() -> bool) -> bool {
    let budget = spin_override().unwrap_or(budget);
    if !budget.is_zero() && (!cores_to_spare() || SPIN_RECORD.with(SpinRecord::skip)) {
        return ready();
    }
    let start = std::time::Instant::now();
    loop {
        if ready() {
            SPIN_RECORD.with(SpinRecord::found);
            return true;
        }
        if start.elapsed() >= budget {
            SPIN_RECORD.with(SpinRecord::ran_out);
            return false;
        }
        std::thread::yield_now();
    }
}

/// The most waits a spin that keeps running out is skipped for in a row.
const MAX_SKIPPED_SPINS: u32 = 64;

/// How this thread's recent spins went (each waiter is a thread: the
/// training loop's, a worker's).
#[derive(Default)]
struct SpinRecord {
    /// Spins in a row that ran out.
    empty: std::cell::Cell<u32>,
    /// Waits left before the next spin.
    skips: std::cell::Cell<u32>,
}

impl SpinRecord {
    /// Whether this wait skips its spin.
    fn skip(&self) -> bool {
        let left = self.skips.get();
        if left == 0 {
            return false;
        }
        self.skips.set(left - 1);
        true
    }

    fn found(&self) {
        self.empty.set(0);
    }

    fn ran_out(&self) {
        let empty = self.empty.get().saturating_add(1);
        self.empty.set(empty);
        if empty >= 2 {
            self.skips
                .set((1u32 << (empty - 2).min(6)).min(MAX_SKIPPED_SPINS));
        }
    }
}

thread_local! {
    static SPIN_RECORD: SpinRecord = SpinRecord::default();
}

/// Whether the machine has a core to spare for spinning: at most twice as
/// many runnable tasks as this process may run on (on an idle machine the
/// loader's own spinner and workers fit that; beside as many busy
/// processes as cores they do not). Read from `/proc/loadavg` (its count
/// of runnable tasks) at most every [`LOAD_CHECK`], process-wide; `true`
/// where it cannot be read.
fn cores_to_spare() -> bool {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    static NEXT_CHECK_US: AtomicU64 = AtomicU64::new(0);
    static SPARE: AtomicBool = AtomicBool::new(true);
    let now = EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as u64;
    let next = NEXT_CHECK_US.load(Ordering::Relaxed);
    if now < next
        || NEXT_CHECK_US
            .compare_exchange(
                next,
                now + LOAD_CHECK.as_micros() as u64,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
    {
        return SPARE.load(Ordering::Relaxed);
    }
    let spare = runnable_tasks().is_none_or(|running| running <= 2 * usable_cores());
    SPARE.store(spare, Ordering::Relaxed);
    spare
}

/// How often [`cores_to_spare`] looks at the machine again.
const LOAD_CHECK: std::time::Duration = std::time::Duration::from_millis(10);

/// Runnable tasks right now (the fourth field of `/proc/loadavg`,
/// `running/total`; the reader is one of them).
fn runnable_tasks() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let field = text.split_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// The cores this process may run on (its affinity mask), read once.
fn usable_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `FERROLOADER_SPIN_US`: how long a side waits (yielding) before sleeping.
fn spin_override() -> Option<std::time::Duration> {
    static SPIN: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        crate::settings::spin_us_env()
            .ok()
            .flatten()
            .map(std::time::Duration::from_micros)
    })
}

/// Waits until `fd` is ready for `events`; `Ok(false)` on timeout.
pub fn wait_fd(
    fd: BorrowedFd<'_>,
    events: PollFlags,
    timeout: Option<std::time::Duration>,
) -> io::Result<bool> {
    let mut fds = [PollFd::from_borrowed_fd(fd, events)];
    let n = poll_fds(&mut fds, timeout)?;
    Ok(n > 0)
}

/// `poll(2)` retried on `EINTR` with the time that is left.
pub fn poll_fds(fds: &mut [PollFd<'_>], timeout: Option<std::time::Duration>) -> io::Result<usize> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
        let ts = left.map(|d| Timespec {
            tv_sec: d.as_secs() as i64,
            tv_nsec: d.subsec_nanos() as i64,
        });
        match poll(fds, ts.as_ref()) {
            Ok(n) => return Ok(n),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// A process watched through a pidfd (Linux 5.3+), or, where pidfds are
/// missing, by probing the pid.
pub struct Watched {
    pid: i32,
    pidfd: Option<OwnedFd>,
}

/// How a worker process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// A worker thread (no process of its own) closed its end: it ended
    /// without a clean stop.
    Thread,
    /// A process that is not this one's child (a fork server started it)
    /// ended, and how was no longer to be read: its parent reaped it.
    Unknown,
}

impl Watched {
    /// `pid` 0: a worker thread in this process, watched through its
    /// socket alone (see `WorkerPool::sleep`).
    pub fn new(pid: i32) -> Self {
        let pidfd = Pid::from_raw(pid)
            .filter(|_| !crate::facilities::disabled(crate::facilities::Facility::Pidfd))
            .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
        Watched { pid, pidfd }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn is_thread(&self) -> bool {
        self.pid == 0
    }

    pub fn pidfd(&self) -> Option<BorrowedFd<'_>> {
        self.pidfd.as_ref().map(|f| f.as_fd())
    }

    /// Sends `sig` to the process (not reaped yet, so its pid cannot have
    /// been reused). False if it could not be sent.
    pub fn signal(&self, sig: rustix::process::Signal) -> bool {
        match &self.pidfd {
            Some(fd) => rustix::process::pidfd_send_signal(fd, sig).is_ok(),
            None => Pid::from_raw(self.pid)
                .is_some_and(|p| rustix::process::kill_process(p, sig).is_ok()),
        }
    }

    /// Waits until the process has ended (without reaping it) or
    /// `deadline` passes; true if it has ended.
    pub fn wait_exit(&self, deadline: std::time::Instant) -> bool {
        loop {
            // (a process reaped already, by its multiprocessing handle or
            // by the fork server that started it, counts as ended too)
            if self.exit_status().is_some() {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            match &self.pidfd {
                // readable once the process has ended
                Some(fd) => {
                    let _ = wait_fd(fd.as_fd(), PollFlags::IN, Some(left));
                }
                None => std::thread::sleep(left.min(std::time::Duration::from_millis(10))),
            }
        }
    }

    /// How the process ended, without reaping it (the `multiprocessing`
    /// `Process` object still joins it). `None` while it runs.
    ///
    /// A worker started by a fork server (`forkserver`, Python 3.14's
    /// default) is the server's child, not ours: `waitid` answers ECHILD
    /// whether it runs or not. It has ended once its pidfd is readable (or
    /// its `/proc` entry is gone or a zombie); its zombie's `/proc` entry
    /// still says how, until the server reaps it.
    pub fn exit_status(&self) -> Option<Exit> {
        let status = match &self.pidfd {
            Some(fd) => rustix::process::waitid(
                rustix::process::WaitId::PidFd(fd.as_fd()),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
            ),
            None => rustix::process::waitid(
                rustix::process::WaitId::Pid(Pid::from_raw(self.pid)?),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
            ),
        };
        let status = match status {
            Ok(status) => status?,
            Err(rustix::io::Errno::CHILD) => return self.ended_elsewhere(),
            Err(_) => return None,
        };
        if let Some(sig) = status.terminating_signal() {
            return Some(Exit::Signal(sig));
        }
        status.exit_status().map(Exit::Code)
    }

    /// [`Watched::exit_status`] for a process that is not our child (or was
    /// reaped already). Its pidfd answers whether it ended without a read of
    /// `/proc` (this runs at every wait for each running worker); the zombie's
    /// stat line is read once it has.
    fn ended_elsewhere(&self) -> Option<Exit> {
        let stat = || std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok();
        match &self.pidfd {
            Some(fd) => {
                let ended = wait_fd(fd.as_fd(), PollFlags::IN, Some(std::time::Duration::ZERO))
                    .unwrap_or(false);
                ended.then(|| {
                    stat()
                        .as_deref()
                        .and_then(zombie_status)
                        .unwrap_or(Exit::Unknown)
                })
            }
            // no pidfd: gone from /proc, or a zombie
            None => match stat() {
                None => Some(Exit::Unknown),
                Some(line) => zombie_status(&line),
            },
        }
    }
}

/// How a zombie ended, from its `/proc/PID/stat` line (state `Z`; field 52,
/// `exit_code`, holds the status as `waitpid` reports it); `None` for a
/// process that is not a zombie.
fn zombie_status(stat: &str) -> Option<Exit> {
    // (the command name, field 2, may hold spaces and parentheses)
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if fields.first() != Some(&"Z") {
        return None;
    }
    // fields[0] is field 3 (the state): field 52 is fields[49]
    let code: i32 = fields.get(49)?.parse().ok()?;
    Some(if code & 0x7f != 0 {
        Exit::Signal(code & 0x7f)
    } else {
        Exit::Code((code >> 8) & 0xff)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};

    fn pair() -> (Conn, Conn) {
        let (a, b) = socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        (Conn::new(a), Conn::new(b))
    }

    #[test]
    fn a_zombies_stat_line_says_how_it_ended() {
        // 52 fields; the command name holds a space and a parenthesis
        let line = |state: &str, code: i32| {
            let mut f = vec!["0"; 49];
            f[0] = state;
            let tail = f.join(" ");
            format!("1234 (pt (x) 1) {tail} {code}\n")
        };
        assert_eq!(zombie_status(&line("Z", 9)), Some(Exit::Signal(9)));
        assert_eq!(zombie_status(&line("Z", 3 << 8)), Some(Exit::Code(3)));
        assert_eq!(zombie_status(&line("R", 0)), None);
        assert_eq!(zombie_status("garbage"), None);
    }

    #[test]
    // Unix sockets and SCM_RIGHTS: not emulated by Miri.
    #[cfg_attr(miri, ignore)]
    fn frames_and_fds_arrive_in_order() {
        let (mut a, mut b) = pair();
        let (x, _y) = pair();
        a.send_frame_blocking(b"one", None).unwrap();
        a.send_frame_blocking(b"two", Some(x.as_fd())).unwrap();
        assert_eq!(b.recv_frame_blocking().unwrap().unwrap(), b"one");
        assert_eq!(b.recv_frame_blocking().unwrap().unwrap(), b"two");
        assert!(b.take_fd().is_some());
        assert!(b.take_fd().is_none());
        drop(a);
        assert_eq!(b.recv_frame_blocking().unwrap(), None);
    }

    #[test]
    // Unix sockets, non-blocking I/O and poll: not emulated by Miri.
    #[cfg_attr(miri, ignore)]
    fn nonblocking_writer_queues_when_full() {
        let (mut a, mut b) = pair();
        a.set_nonblocking(true).unwrap();
        let big = vec![7u8; 1 << 20];
        a.queue_frame(&big);
        let done = a.flush().unwrap();
        assert!(!done, "a 1 MiB frame cannot fit a socket buffer");
        let reader = std::thread::spawn(move || b.recv_frame_blocking().unwrap().unwrap().len());
        while a.has_unflushed() {
            wait_fd(a.as_fd(), PollFlags::OUT, None).unwrap();
            a.flush().unwrap();
        }
        assert_eq!(reader.join().unwrap(), 1 << 20);
    }

    #[test]
    fn a_spin_that_keeps_running_out_is_skipped_more_often() {
        let r = SpinRecord::default();
        r.ran_out();
        assert!(!r.skip(), "one empty spin: the next wait still spins");
        r.ran_out();
        assert!(r.skip() && !r.skip(), "two in a row: one wait skips");
        r.ran_out();
        assert!(r.skip() && r.skip() && !r.skip(), "three: two waits skip");
        for _ in 0..40 {
            r.ran_out();
        }
        let skipped = (0..1000).take_while(|_| r.skip()).count();
        assert_eq!(skipped, MAX_SKIPPED_SPINS as usize, "the skips are bounded");
        r.found();
        r.ran_out();
        assert!(
            !r.skip(),
            "a spin that found its message starts the count over"
        );
    }

    #[test]
    // Spawns a process and waits on its pidfd: not emulated by Miri.
    #[cfg_attr(miri, ignore)]
    fn exit_status_of_a_finished_child() {
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .unwrap();
        let w = Watched::new(child.id() as i32);
        if let Some(fd) = w.pidfd() {
            assert!(wait_fd(fd, PollFlags::IN, Some(std::time::Duration::from_secs(5))).unwrap());
        } else {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        assert_eq!(w.exit_status(), Some(Exit::Code(3)));
        // NOWAIT left it for its owner to reap.
        let mut child = child;
        assert_eq!(child.wait().unwrap().code(), Some(3));
    }
}
