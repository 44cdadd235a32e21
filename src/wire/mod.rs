//! The wire between the training process and its workers: what both sides
//! of multi-process loading share, and nothing either side keeps for
//! itself.
//!
//! - [`protocol`]: the messages each way ([`protocol::ToWorker`],
//!   [`protocol::FromWorker`]), their one-byte tags and field encoding,
//!   the payloads a sharded dataset's lanes exchange ([`protocol::Work`],
//!   [`protocol::LanePos`]), and the frames they travel in.
//! - [`transport`]: one Unix stream socket per worker: framing, file
//!   descriptors handed over with `SCM_RIGHTS`, waiting on descriptors,
//!   and process liveness through pidfds (or probing the pid where pidfds
//!   are missing).
//!
//! Both sides import this room: the training process's side is
//! `src/scheduler/` (the worker pool), the worker's is `src/worker/`, which
//! takes nothing from the training process's. Batch data does not travel
//! here: a message names a record in the worker's arena (`crate::ring`).

pub mod protocol;
pub mod transport;
