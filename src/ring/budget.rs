//! How a worker allocates records: a budget that keeps its resident arena
//! at what torch keeps in flight, and a short grace at the memory limit.

use std::time::{Duration, Instant};

use super::{ArenaError, ArenaWriter, RecordRef};

/// How long a worker at its memory limit waits for the main process to
/// release records (batches in flight, tensors being freed) before failing.
const LIMIT_GRACE: Duration = Duration::from_secs(1);

/// Records at least this large count against the budget; smaller ones cost
/// too little memory to be worth any wait.
const BUDGETED_RECORD: usize = 1 << 20;

/// How long a worker over its record budget waits for the main process to
/// release its oldest batch before concluding the training loop keeps
/// batches, and growing instead.
const BUDGET_GRACE: Duration = Duration::from_millis(100);

/// Keeps a worker's resident arena at what torch keeps in flight.
///
/// Without it a worker's arena settles at `prefetch_factor + 1` large
/// records (its queued batches plus the one the training loop still holds)
/// and, summed over workers, that is one batch more than torch's peak. A
/// worker with `cap` large records live waits briefly for the loop to drop
/// its oldest batch, which happens as soon as it takes the next one. If the
/// loop keeps batches (`list(loader)`, gradient accumulation) the wait times
/// out once and the worker never waits again: its arena has grown, and
/// waiting would save no memory, only time.
#[derive(Debug)]
pub struct RecordBudget {
    cap: usize,
    holding: bool,
}

impl RecordBudget {
    /// `prefetch_factor` records, but never fewer than two: with one, a
    /// worker could not write its next batch while the loop holds the last.
    pub fn new(prefetch_factor: usize) -> Self {
        RecordBudget {
            cap: prefetch_factor.max(2),
            holding: false,
        }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Whether the budget gave up waiting (the training loop keeps batches).
    pub fn holding(&self) -> bool {
        self.holding
    }

    fn wait_for_room(&mut self, arena: &mut ArenaWriter, len: usize) {
        if len < BUDGETED_RECORD || self.holding {
            return;
        }
        arena.reclaim();
        let deadline = Instant::now() + BUDGET_GRACE;
        while arena.live_records() >= self.cap {
            if Instant::now() >= deadline {
                self.holding = true;
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
            arena.reclaim();
        }
    }

    /// A record of `len` payload bytes: within the budget if the main
    /// process releases in time, and at the arena's limit after a grace for
    /// releases in flight. Blocks for at most about a second.
    pub fn alloc(&mut self, arena: &mut ArenaWriter, len: usize) -> Result<RecordRef, ArenaError> {
        self.wait_for_room(arena, len);
        let deadline = Instant::now() + LIMIT_GRACE;
        loop {
            match arena.alloc(len) {
                Err(ArenaError::LimitExceeded { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_records_never_wait() {
        let mut arena = ArenaWriter::new(1 << 20, 64 << 20).unwrap();
        let mut budget = RecordBudget::new(2);
        let start = Instant::now();
        for _ in 0..10 {
            let r = budget.alloc(&mut arena, 1024).unwrap();
            arena.publish(r);
        }
        assert!(!budget.holding());
        assert!(start.elapsed() < BUDGET_GRACE * 5);
    }

    #[test]
    fn a_loop_that_keeps_batches_stops_the_waiting_once() {
        let mut arena = ArenaWriter::new(4 << 20, 64 << 20).unwrap();
        let mut budget = RecordBudget::new(2);
        for _ in 0..2 {
            let r = budget.alloc(&mut arena, BUDGETED_RECORD).unwrap();
            arena.publish(r);
        }
        assert!(!budget.holding());
        // Nobody releases the two live records: the third waits once, then grows.
        let r = budget.alloc(&mut arena, BUDGETED_RECORD).unwrap();
        arena.publish(r);
        assert!(budget.holding());
        assert_eq!(arena.live_records(), 3);
    }

    #[test]
    fn the_limit_is_reported_after_the_grace() {
        let mut arena = ArenaWriter::new(1 << 20, 2 << 20).unwrap();
        let mut budget = RecordBudget::new(2);
        let started = Instant::now();
        let err = budget.alloc(&mut arena, 8 << 20).unwrap_err();
        assert!(matches!(err, ArenaError::LimitExceeded { .. }));
        assert!(started.elapsed() >= LIMIT_GRACE);
    }

    #[test]
    fn the_cap_is_at_least_two() {
        assert_eq!(RecordBudget::new(1).cap(), 2);
        assert_eq!(RecordBudget::new(4).cap(), 4);
    }
}
