//! `ferroloader.seeds`' functions: the engine's one definition of each
//! seed (`crate::sampler::seeds`), for Python. Arguments are 64-bit
//! (`ferroloader.seeds` masks Python integers to 64 bits first).

use pyo3::prelude::*;

use crate::sampler::seeds;

/// The seed of a seeded loader's generator for `epoch` (0-based).
#[pyfunction]
pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    seeds::epoch_seed(seed, epoch)
}

/// The seed set before `dataset[index]` in `epoch` with `per_sample_seed`.
#[pyfunction]
pub fn sample_seed(seed: u64, epoch: u64, index: u64) -> u64 {
    seeds::sample_seed(seed, epoch, index)
}

/// Folds each part into `root`.
#[pyfunction]
pub fn derive(root: u64, parts: Vec<u64>) -> u64 {
    seeds::derive(root, &parts)
}

/// The seed of a sharded epoch's shard order, from the epoch's root.
#[pyfunction]
pub fn shard_order_seed(root: u64) -> u64 {
    seeds::shard_order_seed(root)
}

/// The seed of the order of block `block` of shard `shard`.
#[pyfunction]
pub fn block_seed(root: u64, shard: u32, block: u64) -> u64 {
    seeds::block_seed(root, shard, block)
}

/// The index that stands for item `offset` of shard `shard`.
#[pyfunction]
pub fn shard_item_index(shard: u64, offset: u64) -> u64 {
    seeds::shard_item_index(shard, offset)
}
