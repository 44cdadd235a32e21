use super::{randperm, Mt19937};

/// torch's `DistributedSampler.__iter__` asserts; reported so the caller can
/// let torch raise its own error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedError(pub String);

/// A `DistributedSampler`'s attributes at `__iter__`, as torch reads them.
/// `seed` is `sampler.seed + sampler.epoch` as torch passes it to
/// `manual_seed`.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(feature = "python", derive(pyo3::FromPyObject), pyo3(from_item_all))]
pub struct Distributed {
    pub n: usize,
    pub num_replicas: usize,
    pub rank: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub drop_last: bool,
    pub num_samples: usize,
    pub total_size: usize,
}

/// `DistributedSampler.__iter__`: the whole (padded or truncated) index list,
/// then every `num_replicas`-th element starting at `rank`.
pub fn distributed_indices(d: &Distributed) -> Result<Vec<i64>, DistributedError> {
    let &Distributed {
        n,
        num_replicas,
        rank,
        ..
    } = d;
    let (shuffle, seed, drop_last) = (d.shuffle, d.seed, d.drop_last);
    let (num_samples, total_size) = (d.num_samples, d.total_size);
    let mut indices: Vec<i64> = if shuffle {
        randperm(n, &mut Mt19937::new(seed))
    } else {
        (0..n as i64).collect()
    };
    if !drop_last {
        let padding = total_size.saturating_sub(indices.len());
        if padding > 0 {
            if indices.is_empty() {
                return Err(DistributedError(
                    "integer division or modulo by zero".into(),
                ));
            }
            // indices + (indices repeated)[:padding], as torch's two branches both do.
            // A padding that does not fit in memory is torch's to refuse
            // (its MemoryError), not an abort here.
            indices
                .try_reserve_exact(padding)
                .map_err(|_| DistributedError(format!("cannot pad {padding} indices")))?;
            let head: Vec<i64> = indices.iter().copied().cycle().take(padding).collect();
            indices.extend(head);
        }
    } else {
        indices.truncate(total_size);
    }
    if indices.len() != total_size {
        return Err(DistributedError(format!(
            "Number of indices ({}) does not match total_size ({total_size})",
            indices.len()
        )));
    }
    if num_replicas == 0 {
        return Err(DistributedError("slice step cannot be zero".into()));
    }
    let mine: Vec<i64> = indices
        .iter()
        .skip(rank)
        .step_by(num_replicas)
        .copied()
        .collect();
    if mine.len() != num_samples {
        return Err(DistributedError(format!(
            "Number of subsampled indices ({}) does not match num_samples ({num_samples})",
            mine.len()
        )));
    }
    Ok(mine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn spec(
        n: usize,
        num_replicas: usize,
        rank: usize,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
        num_samples: usize,
        total_size: usize,
    ) -> Distributed {
        Distributed {
            n,
            num_replicas,
            rank,
            shuffle,
            seed,
            drop_last,
            num_samples,
            total_size,
        }
    }

    fn sizes(n: usize, r: usize, drop_last: bool) -> (usize, usize) {
        let ns = if drop_last && n % r != 0 {
            (n - r).div_ceil(r)
        } else {
            n.div_ceil(r)
        };
        (ns, ns * r)
    }

    #[test]
    fn pads_by_wrapping_around() {
        let (ns, ts) = sizes(5, 4, false);
        let all: Vec<Vec<i64>> = (0..4)
            .map(|rank| distributed_indices(&spec(5, 4, rank, false, 0, false, ns, ts)).unwrap())
            .collect();
        assert_eq!(all, vec![vec![0, 4], vec![1, 0], vec![2, 1], vec![3, 2]]);
    }

    #[test]
    fn drop_last_truncates() {
        let (ns, ts) = sizes(10, 3, true);
        let got = distributed_indices(&spec(10, 3, 2, false, 0, true, ns, ts)).unwrap();
        assert_eq!(got, vec![2, 5, 8]);
    }
}
