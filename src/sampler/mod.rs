//! Samplers and the batch sampler, reproducing `torch.utils.data`'s index
//! sequences and its generator consumption exactly.
//!
//! Every random sampler draws through an [`RngSource`]: either an engine owned
//! here (a private generator torch would have created inside the sampler), or
//! a handle that reads a user's `torch.Generator`, draws, and writes it back.
//! Draws happen in the same *segments* torch uses (one `randperm` per pass,
//! one `randint` per 32 samples) and at the same moment of iteration, so a
//! shared generator is left where torch leaves it even mid-epoch.

mod batch;
mod distributed;
pub mod mixture;
mod mt19937;
mod ops;
mod random;
pub mod seeds;
mod sequential;
pub mod shards;
mod subset_random;
#[cfg(test)]
mod vectors_test;

pub use batch::BatchIter;
pub use distributed::{distributed_indices, Distributed, DistributedError};
pub use mt19937::{Mt19937, StateError, STATE_BYTES};
pub use ops::{randint_into, random_int64, randperm, randperm_compact, IndexVec};
pub use random::RandomIter;
pub use sequential::SequentialIter;
pub use subset_random::SubsetRandomIter;

use std::convert::Infallible;

/// Access to a torch-compatible generator for the duration of one draw.
pub trait RngSource {
    type Error;
    /// Runs `f` against the generator's current state; the state `f` leaves
    /// behind is the generator's new state.
    fn with_rng<R>(&mut self, f: impl FnOnce(&mut Mt19937) -> R) -> Result<R, Self::Error>;
}

impl RngSource for Mt19937 {
    type Error = Infallible;
    fn with_rng<R>(&mut self, f: impl FnOnce(&mut Mt19937) -> R) -> Result<R, Infallible> {
        Ok(f(self))
    }
}

/// torch's `RandomSampler` with `generator=None`: on first use it draws a seed
/// from the global generator and seeds a private one with it.
pub enum SeededOnFirstUse<G> {
    Pending(G),
    Ready(Box<Mt19937>),
}

impl<G: RngSource> RngSource for SeededOnFirstUse<G> {
    type Error = G::Error;
    fn with_rng<R>(&mut self, f: impl FnOnce(&mut Mt19937) -> R) -> Result<R, G::Error> {
        if let SeededOnFirstUse::Pending(global) = self {
            let seed = global.with_rng(random_int64)?;
            *self = SeededOnFirstUse::Ready(Box::new(Mt19937::new(seed as u64)));
        }
        match self {
            SeededOnFirstUse::Ready(rng) => Ok(f(rng)),
            SeededOnFirstUse::Pending(_) => unreachable!("seeded above"),
        }
    }
}

/// A stream of indices, pulled one at a time like a Python iterator.
pub trait IndexSource {
    type Index;
    type Error;
    fn next_index(&mut self) -> Result<Option<Self::Index>, Self::Error>;
}
