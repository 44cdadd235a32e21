//! Per-stage timings, counted cheaply enough to stay on: a worker's fetch
//! (the dataset), collate and transfer (writing the record), sent to the
//! main process with each batch (in its `Batch` message: a batch read is a
//! batch counted, whenever the workers stop), or ahead of an error or an
//! end; the main process adds its own waits, decoding and pinning (in the
//! bindings). A clock read costs ~20 ns; a batch takes a few of them.

use std::time::Instant;

/// Nanoseconds spent per stage, and the batches they are for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTimes {
    pub fetch: u64,
    pub collate: u64,
    pub transfer: u64,
    pub batches: u64,
}

impl StageTimes {
    pub fn add(&mut self, other: &StageTimes) {
        self.fetch += other.fetch;
        self.collate += other.collate;
        self.transfer += other.transfer;
        self.batches += other.batches;
    }

    pub fn is_empty(&self) -> bool {
        *self == StageTimes::default()
    }
}

/// Nanoseconds since `t`, saturating.
pub fn since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_add_up() {
        let mut a = StageTimes {
            fetch: 1,
            collate: 2,
            transfer: 3,
            batches: 1,
        };
        a.add(&a.clone());
        assert_eq!(
            a,
            StageTimes {
                fetch: 2,
                collate: 4,
                transfer: 6,
                batches: 2
            }
        );
        assert!(StageTimes::default().is_empty());
        assert!(since(Instant::now()) < 1_000_000_000);
    }
}
