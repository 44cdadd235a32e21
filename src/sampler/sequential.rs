use super::IndexSource;
use std::convert::Infallible;

/// `SequentialSampler`: `iter(range(n))`.
#[derive(Debug, Clone)]
pub struct SequentialIter {
    next: i64,
    end: i64,
}

impl SequentialIter {
    pub fn new(n: usize) -> Self {
        SequentialIter {
            next: 0,
            end: n as i64,
        }
    }
}

impl IndexSource for SequentialIter {
    type Index = i64;
    type Error = Infallible;
    fn next_index(&mut self) -> Result<Option<i64>, Infallible> {
        if self.next < self.end {
            self.next += 1;
            Ok(Some(self.next - 1))
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yields_range() {
        let mut it = SequentialIter::new(3);
        let mut v = Vec::new();
        while let Some(i) = it.next_index().unwrap() {
            v.push(i);
        }
        assert_eq!(v, vec![0, 1, 2]);
        assert_eq!(it.next_index().unwrap(), None);
    }
}
