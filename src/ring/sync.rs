//! The atomics the ring's protocol code uses: `std`'s in every normal build,
//! `loom`'s under `--cfg loom`, so that the model checker runs the real
//! protocol functions of [`super::arena`] and [`super::mailbox`] (see
//! `src/ring/loom_models.rs`). `Ordering` is the same type in both.

#[cfg(not(loom))]
pub(super) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub(super) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
