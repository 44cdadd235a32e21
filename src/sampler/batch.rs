use super::IndexSource;

/// `BatchSampler.__iter__` over any index stream. With `drop_last` a short
/// final batch is discarded; either way the source is pulled until it is
/// exhausted, so generator draws made at exhaustion happen as in torch.
pub struct BatchIter<S> {
    source: S,
    batch_size: usize,
    drop_last: bool,
    done: bool,
}

impl<S: IndexSource> BatchIter<S> {
    pub fn new(source: S, batch_size: usize, drop_last: bool) -> Self {
        assert!(batch_size > 0, "batch_size must be positive");
        BatchIter {
            source,
            batch_size,
            drop_last,
            done: false,
        }
    }

    /// The index stream batches are drawn from.
    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Fills `out` (cleared first) with the next batch; `Ok(false)` at the end.
    pub fn next_batch(&mut self, out: &mut Vec<S::Index>) -> Result<bool, S::Error> {
        out.clear();
        if self.done {
            return Ok(false);
        }
        while out.len() < self.batch_size {
            match self.source.next_index() {
                Ok(Some(i)) => out.push(i),
                Ok(None) => {
                    self.done = true;
                    break;
                }
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            }
        }
        if out.is_empty() || (self.drop_last && out.len() < self.batch_size) {
            self.done = true;
            out.clear();
            return Ok(false);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SequentialIter;
    use proptest::prelude::*;

    fn batches(n: usize, bs: usize, drop_last: bool) -> Vec<Vec<i64>> {
        let mut b = BatchIter::new(SequentialIter::new(n), bs, drop_last);
        let mut out = Vec::new();
        let mut all = Vec::new();
        while b.next_batch(&mut out).unwrap() {
            all.push(out.clone());
        }
        all
    }

    #[test]
    fn torch_docstring_examples() {
        assert_eq!(
            batches(10, 3, false),
            vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]]
        );
        assert_eq!(
            batches(10, 3, true),
            vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]
        );
    }

    proptest! {
        #[test]
        fn batch_count_matches_len(n in 0usize..300, bs in 1usize..40, drop_last in any::<bool>()) {
            let got = batches(n, bs, drop_last);
            let want = if drop_last { n / bs } else { n.div_ceil(bs) };
            prop_assert_eq!(got.len(), want);
            let flat: Vec<i64> = got.concat();
            let covered = if drop_last { want * bs } else { n };
            prop_assert_eq!(flat, (0..covered as i64).collect::<Vec<_>>());
        }
    }
}
