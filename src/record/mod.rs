//! The batch record: how a collated batch is laid out in an arena record,
//! in one place for both sides (the worker writes it, the main process
//! parses it; another process wrote what the main process reads, so every
//! read is bounds-checked).
//!
//! A record's payload (all integers little-endian, leaves 64-byte aligned):
//! ```text
//! 0   u32 magic "FLB1" | u32 leaf count n | u64 tree offset | u64 tree length
//! 24  n x leaf: u64 offset | u64 nbytes | u8 dtype code | u8 bits | u16 lanes
//!               | u8 kind (0 tensor, 1 ndarray) | u8 ndim | u16 pad | ndim x i64 shape
//! ..  the tree: the batch's structure, leaves replaced by their numbers (see [`tree`])
//! ..  leaf bytes, each at its offset
//! ```
//! The arena (`crate::ring`) owns the record's memory and its life; this
//! module owns only the bytes inside it.

mod layout;
mod reader;
pub mod tree;

pub use layout::{DlDtype, Leaf, LeafKind, ParsedRecord, RecordLayout, LEAF_ALIGN};
pub use reader::{put_bytes, DecodeError, Reader};
pub use tree::{Token, TreeReader, TreeWriter};
