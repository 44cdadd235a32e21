use super::{IndexSource, IndexVec, RngSource};

/// `SubsetRandomSampler.__iter__`: one `randperm(len(indices))` on first use,
/// then `indices[i]` for each drawn position.
pub struct SubsetRandomIter<G> {
    indices: Vec<i64>,
    rng: G,
    perm: Option<IndexVec>,
    pos: usize,
}

impl<G: RngSource> SubsetRandomIter<G> {
    pub fn new(indices: Vec<i64>, rng: G) -> Self {
        SubsetRandomIter {
            indices,
            rng,
            perm: None,
            pos: 0,
        }
    }
}

impl<G> SubsetRandomIter<G> {
    /// The generator this sampler draws from.
    pub fn rng(&self) -> &G {
        &self.rng
    }
}

impl<G: RngSource> IndexSource for SubsetRandomIter<G> {
    type Index = i64;
    type Error = G::Error;
    fn next_index(&mut self) -> Result<Option<i64>, G::Error> {
        if self.perm.is_none() {
            let n = self.indices.len();
            self.perm = Some(self.rng.randperm(n)?);
        }
        let perm = self.perm.as_ref().expect("drawn above");
        match perm.get(self.pos) {
            Some(p) => {
                self.pos += 1;
                Ok(Some(self.indices[p as usize]))
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{randperm, Mt19937};

    #[test]
    fn maps_a_permutation_through_indices() {
        let idx = vec![10, 20, 30, 40];
        let mut it = SubsetRandomIter::new(idx.clone(), Mt19937::new(1));
        let mut got = Vec::new();
        while let Some(i) = it.next_index().unwrap() {
            got.push(i);
        }
        let perm = randperm(4, &mut Mt19937::new(1));
        let want: Vec<i64> = perm.iter().map(|&p| idx[p as usize]).collect();
        assert_eq!(got, want);
    }
}
