//! ferroloader's engine: samplers, scheduling, the worker protocol, shared
//! memory, the record format and collate layouts in pure Rust, with PyO3
//! bindings behind the `python` feature.
//!
//! The batch path (DESIGN.md), stage by stage:
//!
//! | stage | module |
//! | --- | --- |
//! | sampler, batch sampler | [`sampler`] |
//! | scheduler: dispatch, reorder, the worker pool (links, polling, liveness) | [`scheduler`] |
//! | worker loop: channel, watchdog, receive loop | [`worker`] |
//! | collate layouts (stack, gather) | [`collate`] |
//! | shared-memory arena and mailboxes, the record budget | [`ring`] |
//! | record format: layout, dtypes, the tree | [`record`] |
//! | errors | [`error`] |
//!
//! `unsafe` is denied crate-wide (see `[lints.rust]` in Cargo.toml) and
//! opened in two places only: [`ring`] (shared memory) and the bindings'
//! FFI edge (`python::ffi`, DLPack and file descriptors). Every block there
//! carries a `// SAFETY:` comment (clippy's `undocumented_unsafe_blocks`).

pub mod collate;
pub mod error;
pub mod record;
pub mod ring;
pub mod sampler;
pub mod scheduler;
pub mod worker;

pub use error::{Error, Result};

#[cfg(feature = "python")]
mod python;
