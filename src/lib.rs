//! ferroloader's engine: samplers, batching and collate layouts in pure Rust,
//! with PyO3 bindings behind the `python` feature.
//!
//! `unsafe` is denied crate-wide (see `[lints.rust]` in Cargo.toml); the only
//! module that opens it is the FFI edge `python::dlpack`, where raw tensor
//! memory crosses into and out of torch. Each block there carries a
//! `// SAFETY:` comment.

pub mod collate;
pub mod ring;
pub mod sampler;
pub mod scheduler;

#[cfg(feature = "python")]
mod python;
