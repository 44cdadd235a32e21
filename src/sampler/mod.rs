//! Samplers and the batch sampler, reproducing `torch.utils.data`'s index
//! sequences and its generator consumption exactly.
//!
//! Every random sampler draws through an [`RngSource`]: either an engine owned
//! here (a private generator torch would have created inside the sampler), or
//! a handle on a user's `torch.Generator` that has torch make each draw.
//! Draws happen in the same *segments* torch uses (one `randperm` per pass,
//! one `randint` per 32 samples) and at the same moment of iteration, so a
//! shared generator is left where torch leaves it even mid-epoch.

mod batch;
mod distributed;
pub mod mixture;
mod mt19937;
mod ops;
mod random;
mod recent;
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
pub use recent::randperm_recent;
pub use sequential::SequentialIter;
pub use subset_random::SubsetRandomIter;

use std::convert::Infallible;
use std::sync::Arc;

/// A torch-compatible generator, as the three draws samplers make of it.
///
/// A draw is one call, so a generator shared with other code (a user's
/// `torch.Generator`, torch's default one) can make each draw atomic: torch
/// holds the generator's own lock for the length of one of its ops, which a
/// read-advance-write of its state from outside could not.
pub trait RngSource {
    type Error;
    /// `torch.randperm(n, generator=g)`.
    fn randperm(&mut self, n: usize) -> Result<IndexVec, Self::Error>;
    /// The same draw, where a sampler holds it: a private generator hands
    /// over a live iterator's copy of the same draw (see `recent`).
    fn randperm_shared(&mut self, n: usize) -> Result<Arc<IndexVec>, Self::Error> {
        self.randperm(n).map(Arc::new)
    }
    /// Whether only the sampler ever reads this generator (torch's private
    /// one): then a draw whose values go unused need not be made.
    fn private(&self) -> bool {
        false
    }
    /// `torch.randint(high=high, size=(count,), dtype=torch.int64,
    /// generator=g)`, appended to `out`.
    fn randint(&mut self, high: i64, count: usize, out: &mut Vec<i64>) -> Result<(), Self::Error>;
    /// `torch.empty((), dtype=torch.int64).random_(generator=g)`.
    fn random_int64(&mut self) -> Result<i64, Self::Error>;
}

impl RngSource for Mt19937 {
    type Error = Infallible;
    fn randperm(&mut self, n: usize) -> Result<IndexVec, Infallible> {
        Ok(randperm_compact(n, self))
    }
    fn randint(&mut self, high: i64, count: usize, out: &mut Vec<i64>) -> Result<(), Infallible> {
        randint_into(high, count, self, out);
        Ok(())
    }
    fn random_int64(&mut self) -> Result<i64, Infallible> {
        Ok(random_int64(self))
    }
}

/// torch's `RandomSampler` with `generator=None`: on first use it draws a seed
/// from the global generator and seeds a private one with it.
pub enum SeededOnFirstUse<G> {
    Pending(G),
    Ready(Box<Mt19937>),
}

impl<G: RngSource> SeededOnFirstUse<G> {
    fn ready(&mut self) -> Result<&mut Mt19937, G::Error> {
        if let SeededOnFirstUse::Pending(global) = self {
            let seed = global.random_int64()?;
            *self = SeededOnFirstUse::Ready(Box::new(Mt19937::new(seed as u64)));
        }
        match self {
            SeededOnFirstUse::Ready(rng) => Ok(rng),
            SeededOnFirstUse::Pending(_) => unreachable!("seeded above"),
        }
    }
}

impl<G: RngSource> RngSource for SeededOnFirstUse<G> {
    type Error = G::Error;
    fn randperm(&mut self, n: usize) -> Result<IndexVec, G::Error> {
        Ok(randperm_compact(n, self.ready()?))
    }
    fn randperm_shared(&mut self, n: usize) -> Result<Arc<IndexVec>, G::Error> {
        Ok(randperm_recent(n, self.ready()?))
    }
    fn private(&self) -> bool {
        true
    }
    fn randint(&mut self, high: i64, count: usize, out: &mut Vec<i64>) -> Result<(), G::Error> {
        randint_into(high, count, self.ready()?, out);
        Ok(())
    }
    fn random_int64(&mut self) -> Result<i64, G::Error> {
        Ok(random_int64(self.ready()?))
    }
}

/// A stream of indices, pulled one at a time like a Python iterator.
pub trait IndexSource {
    type Index;
    type Error;
    fn next_index(&mut self) -> Result<Option<Self::Index>, Self::Error>;
}
