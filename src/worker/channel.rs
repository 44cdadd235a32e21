//! The worker's end of its link to the main process: the mailbox for
//! messages that fit, the socket for descriptors, large messages and
//! wake-ups.

use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::event::PollFlags;

use crate::error::{Error, Result};
use crate::record::DecodeError;
use crate::ring::{ArenaWriter, Dir, Mailbox};
use crate::wire::protocol::{FromWorker, ToWorker, ON_SOCKET};
use crate::wire::transport::{spin_wait, wait_fd, Blocking, Conn, ReadState};

/// How long an idle worker keeps checking its mailbox before it sleeps on
/// its socket (a wake-up costs far more than this on a busy machine).
const SPIN: Duration = Duration::from_micros(100);
/// How long a worker whose results ring is full waits on the socket
/// between checks for room.
const FULL_WAIT: Duration = Duration::from_millis(1);

pub struct Channel {
    conn: Conn,
    mailbox: Mailbox,
    buf: Vec<u8>,
}

/// The main process closed its end (it stopped this iterator): not an
/// error, the worker just leaves.
fn main_gone(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
    )
}

impl Error {
    /// Whether this is the other side closing its connection.
    pub fn is_peer_gone(&self) -> bool {
        matches!(self, Error::Disconnected(e) if main_gone(e))
    }
}

impl Channel {
    /// Waits for the main process's first frame, the mailbox. `None`: the
    /// main process closed the connection first.
    pub fn open(fd: OwnedFd, host: &mut impl Blocking) -> Result<Option<Channel>> {
        let mut conn = Conn::new(fd);
        let Some(frame) = host
            .blocking(|| conn.recv_message_blocking())
            .map_err(Error::Disconnected)?
        else {
            return Ok(None);
        };
        if ToWorker::decode(&frame)? != ToWorker::Mailbox {
            return Err(DecodeError("expected the mailbox first").into());
        }
        let fd = conn
            .take_fd()
            .ok_or(DecodeError("mailbox frame without its descriptor"))?;
        let mailbox = Mailbox::from_fd(fd).map_err(|source| Error::SharedMemory {
            what: "the worker's mailbox".into(),
            source,
        })?;
        Ok(Some(Channel {
            conn,
            mailbox,
            buf: Vec::new(),
        }))
    }

    /// A message to the main process, in order: through the mailbox, or on
    /// the socket behind a marker when it carries an fd or is too large.
    /// New arena segments go first, so the main process can map a record
    /// before it reads the message naming it.
    pub fn send(&mut self, arena: &mut ArenaWriter, msg: &FromWorker) -> Result<()> {
        let new: Vec<u32> = arena
            .take_new_segments()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        for id in new {
            let mut body = Vec::new();
            FromWorker::Segment { id }.encode(&mut body);
            let fd = arena.segment_fd(id).expect("segment just created");
            self.conn
                .send_frame_blocking(&body, Some(fd))
                .map_err(Error::Disconnected)?;
            self.push(ON_SOCKET)?;
        }
        let mut body = Vec::new();
        msg.encode(&mut body);
        if body.len() > self.mailbox.max_message() {
            self.conn
                .send_frame_blocking(&body, None)
                .map_err(Error::Disconnected)?;
            return self.push(ON_SOCKET);
        }
        self.push(&body)
    }

    /// Puts one body in the results ring, waiting for room (back-pressure:
    /// the main process is behind), and wakes the main process if it sleeps.
    fn push(&mut self, body: &[u8]) -> Result<()> {
        while !self.mailbox.push(Dir::Results, body) {
            let ready = wait_fd(self.conn.as_fd_ref(), PollFlags::IN, Some(FULL_WAIT))
                .map_err(Error::Disconnected)?;
            if ready && self.conn.read_some().map_err(Error::Disconnected)? == ReadState::Closed {
                return Err(Error::Disconnected(std::io::ErrorKind::BrokenPipe.into()));
            }
        }
        if self.mailbox.consumer_was_sleeping(Dir::Results) {
            self.conn
                .send_frame_blocking(&[], None)
                .map_err(Error::Disconnected)?;
        }
        Ok(())
    }

    /// The next message from the main process; `None` once it has closed
    /// the connection. Spins briefly on the mailbox, then sleeps on the
    /// socket inside `host.blocking`.
    pub fn recv(&mut self, host: &mut impl Blocking) -> Result<Option<ToWorker>> {
        match self.recv_or_idle(host, None)? {
            Received::Message(m) => Ok(Some(m)),
            Received::Closed | Received::Idle => Ok(None),
        }
    }

    /// As [`Channel::recv`], but a sleep longer than `idle` returns
    /// [`Received::Idle`] (the worker then tidies its arena).
    pub fn recv_or_idle(
        &mut self,
        host: &mut impl Blocking,
        idle: Option<Duration>,
    ) -> Result<Received> {
        let recv = |m: Option<ToWorker>| m.map_or(Received::Closed, Received::Message);
        loop {
            // the main process stopped this worker: what is still queued
            // (tasks a worker thread, which nothing kills, would run) is
            // not wanted
            if self.mailbox.is_closed(Dir::Tasks) {
                return Ok(Received::Closed);
            }
            if self.mailbox.pop(Dir::Tasks, &mut self.buf)? {
                let frame = if self.buf == ON_SOCKET {
                    match self.conn.recv_message_blocking() {
                        Ok(Some(f)) => f,
                        Ok(None) => return Ok(recv(None)),
                        Err(e) if main_gone(&e) => return Ok(recv(None)),
                        Err(e) => return Err(Error::Disconnected(e)),
                    }
                } else {
                    std::mem::take(&mut self.buf)
                };
                return Ok(recv(Some(ToWorker::decode(&frame)?)));
            }
            let mailbox = &self.mailbox;
            // without the GIL: a worker thread shares it with the others
            if host.blocking(|| spin_wait(SPIN, || mailbox.has_message(Dir::Tasks)))
                || !self.mailbox.prepare_sleep(Dir::Tasks)
            {
                continue;
            }
            let conn = &mut self.conn;
            let state = host.blocking(|| {
                if !wait_fd(conn.as_fd_ref(), PollFlags::IN, idle)? {
                    return Ok(None);
                }
                conn.read_some().map(Some)
            });
            self.mailbox.end_sleep(Dir::Tasks);
            match state {
                Ok(None) => return Ok(Received::Idle),
                Ok(Some(ReadState::Closed)) => return Ok(Received::Closed),
                Ok(Some(ReadState::Open)) => self.conn.skip_wakeups(),
                Err(e) if main_gone(&e) => return Ok(Received::Closed),
                Err(e) => return Err(Error::Disconnected(e)),
            }
        }
    }
}

/// What [`Channel::recv_or_idle`] got.
#[derive(Debug)]
pub enum Received {
    Message(ToWorker),
    /// The main process closed the connection.
    Closed,
    /// Nothing came for the idle period.
    Idle,
}
