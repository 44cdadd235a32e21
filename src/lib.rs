//! ferroloader's engine: samplers, scheduling, the worker protocol, shared
//! memory, the record format and collate layouts in pure Rust, with PyO3
//! bindings behind the `python` feature.
//!
//! The batch path (docs/architecture.md), stage by stage:
//!
//! | stage | module |
//! | --- | --- |
//! | sampler, batch sampler | [`sampler`] |
//! | scheduler: dispatch, reorder, shard assignment, the worker pool (links, polling, liveness) | [`scheduler`] |
//! | wire format: messages, their tags and encoding, socket framing, fd handover, pidfds | [`wire`] |
//! | worker loop: channel, watchdog, receive loop, lanes | [`worker`] |
//! | collate layouts (stack, gather) | [`collate`] |
//! | shared-memory arena and mailboxes, the record budget | [`ring`] |
//! | record format: layout, dtypes, the tree | [`record`] |
//! | DLPack C ABI: tensors out of and into records | [`dlpack`] |
//! | pinned arenas: registration with the GPU runtime, the reuse guard | [`pin`] |
//! | `num_workers="auto"`: the model of a layout's rate, the policy | [`tuning`] |
//! | errors | [`error`] |
//!
//! `unsafe` is denied crate-wide (see `[lints.rust]` in Cargo.toml) and
//! opened only in [`ring`] (shared memory) and the FFI edges: [`dlpack`]
//! (the C ABI), [`pin::cuda`] (the CUDA runtime) and the bindings'
//! `python::ffi` (capsules, file descriptors), and, in test builds only,
//! `doubles::fake_cuda` (the model of the CUDA runtime the pinning tests
//! run against). [`wire`]
//! opens none: its sockets, `SCM_RIGHTS` and pidfds go through rustix's
//! safe calls. Every block carries a `// SAFETY:` comment (clippy's
//! `undocumented_unsafe_blocks`).

pub mod collate;
pub mod dlpack;
pub mod error;
pub mod facilities;
#[doc(hidden)]
pub mod fuzzing;
pub mod pin;
pub mod record;
pub mod remote;
pub mod ring;
pub mod sampler;
pub mod scheduler;
pub mod settings;
pub mod stats;
pub mod tuning;
pub mod wire;
pub mod worker;

pub use error::{Error, Result};

#[cfg(test)]
mod testing;

#[cfg(feature = "python")]
mod python;

#[cfg(feature = "test-doubles")]
mod doubles;

/// The extension module `ferroloader._core`: the bindings, and in test
/// builds the test doubles (which use the bindings; the bindings know
/// nothing of them).
#[cfg(feature = "python")]
#[pyo3::pymodule]
fn _core(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
    python::register(m)?;
    #[cfg(feature = "test-doubles")]
    doubles::register(m)?;
    Ok(())
}
