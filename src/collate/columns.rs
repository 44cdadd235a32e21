//! Gathers from columns split into chunks (an Arrow chunked array's value
//! buffers): rows picked by index straight into a batch leaf, one pass over
//! their bytes. Pure byte movement; the bindings find the buffers.

/// A column of fixed-width rows (`row_bytes` each) in chunks; chunk `k`
/// holds rows `starts[k]..starts[k + 1]` of the column.
pub struct Chunked<'a> {
    chunks: Vec<&'a [u8]>,
    /// Row where each chunk starts, and the column's length last.
    starts: Vec<usize>,
    row_bytes: usize,
}

/// Bit-packed booleans in chunks (Arrow's layout: bit `offset + r` of a
/// chunk's bytes is row `r`, least significant bit first).
pub struct ChunkedBits<'a> {
    chunks: Vec<(&'a [u8], usize)>,
    starts: Vec<usize>,
}

fn starts_of(lens: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut starts = vec![0];
    for n in lens {
        let last = *starts.last().expect("one entry");
        starts.push(last + n);
    }
    starts
}

/// The chunk holding `row` and the row's place in it, or `None` past the
/// end (or for a negative index).
fn locate(starts: &[usize], row: i64) -> Option<(usize, usize)> {
    let row = usize::try_from(row).ok()?;
    if row >= *starts.last()? {
        return None;
    }
    if starts.len() == 2 {
        return Some((0, row));
    }
    let k = starts.partition_point(|&s| s <= row) - 1;
    Some((k, row - starts[k]))
}

impl<'a> Chunked<'a> {
    /// `chunks[k]` must hold a whole number of rows; `None` if one does not.
    pub fn new(chunks: Vec<&'a [u8]>, row_bytes: usize) -> Option<Self> {
        if row_bytes == 0 || chunks.iter().any(|c| c.len() % row_bytes != 0) {
            return None;
        }
        let starts = starts_of(chunks.iter().map(|c| c.len() / row_bytes));
        Some(Chunked {
            chunks,
            starts,
            row_bytes,
        })
    }

    pub fn rows(&self) -> usize {
        *self.starts.last().expect("one entry")
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Row `row`'s bytes.
    pub fn row(&self, row: i64) -> Option<&'a [u8]> {
        let (k, r) = locate(&self.starts, row)?;
        Some(&self.chunks[k][r * self.row_bytes..(r + 1) * self.row_bytes])
    }

    /// Rows `indices`, back to back, into `dst`. `false`, with `dst` not
    /// fully written, if an index is out of range.
    pub fn gather(&self, dst: &mut [u8], indices: &[i64]) -> bool {
        assert_eq!(
            dst.len(),
            self.row_bytes * indices.len(),
            "gather: size mismatch"
        );
        for (out, &i) in dst.chunks_exact_mut(self.row_bytes).zip(indices) {
            match self.row(i) {
                Some(src) => out.copy_from_slice(src),
                None => return false,
            }
        }
        true
    }
}

impl<'a> ChunkedBits<'a> {
    /// `(bytes, bit offset, rows)` per chunk; `None` if a chunk's bytes do
    /// not cover its rows.
    pub fn new(chunks: Vec<(&'a [u8], usize, usize)>) -> Option<Self> {
        if chunks
            .iter()
            .any(|&(b, off, n)| (off + n).div_ceil(8) > b.len())
        {
            return None;
        }
        let starts = starts_of(chunks.iter().map(|&(_, _, n)| n));
        Some(ChunkedBits {
            chunks: chunks.into_iter().map(|(b, off, _)| (b, off)).collect(),
            starts,
        })
    }

    pub fn rows(&self) -> usize {
        *self.starts.last().expect("one entry")
    }

    pub fn get(&self, row: i64) -> Option<bool> {
        let (k, r) = locate(&self.starts, row)?;
        let (bytes, off) = self.chunks[k];
        let bit = off + r;
        Some(bytes[bit / 8] >> (bit % 8) & 1 == 1)
    }

    /// Rows `indices` as one byte each (0 or 1, torch's `bool`) into `dst`.
    pub fn gather(&self, dst: &mut [u8], indices: &[i64]) -> bool {
        assert_eq!(dst.len(), indices.len(), "gather: size mismatch");
        for (out, &i) in dst.iter_mut().zip(indices) {
            match self.get(i) {
                Some(b) => *out = u8::from(b),
                None => return false,
            }
        }
        true
    }
}

/// Integer keys of `row_bytes` bytes (1, 2, 4 or 8, signed unless
/// `unsigned`) read as `i64` in native byte order.
pub fn read_key(bytes: &[u8], unsigned: bool) -> Option<i64> {
    Some(match (bytes.len(), unsigned) {
        (1, false) => i64::from(i8::from_ne_bytes(bytes.try_into().ok()?)),
        (1, true) => i64::from(bytes[0]),
        (2, false) => i64::from(i16::from_ne_bytes(bytes.try_into().ok()?)),
        (2, true) => i64::from(u16::from_ne_bytes(bytes.try_into().ok()?)),
        (4, false) => i64::from(i32::from_ne_bytes(bytes.try_into().ok()?)),
        (4, true) => i64::from(u32::from_ne_bytes(bytes.try_into().ok()?)),
        (8, false) => i64::from_ne_bytes(bytes.try_into().ok()?),
        (8, true) => i64::try_from(u64::from_ne_bytes(bytes.try_into().ok()?)).ok()?,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rows_span_chunks_and_ranges_are_checked() {
        let a = [1u8, 2, 3, 4];
        let b = [5u8, 6];
        let c = Chunked::new(vec![&a, &[], &b], 2).unwrap();
        assert_eq!(c.rows(), 3);
        let mut dst = [0u8; 6];
        assert!(c.gather(&mut dst, &[2, 0, 1]));
        assert_eq!(dst, [5, 6, 1, 2, 3, 4]);
        assert!(!c.gather(&mut dst, &[3, 0, 0]));
        assert!(!c.gather(&mut dst, &[-1, 0, 0]));
        assert!(Chunked::new(vec![&[1u8, 2, 3]], 2).is_none());
    }

    #[test]
    fn bits_honour_their_offset() {
        // rows 0..4 of a chunk starting at bit 3 of 0b1010_1000: 1, 0, 1, 0
        let bytes = [0b1010_1000u8, 0b0000_0001];
        let bits = ChunkedBits::new(vec![(&bytes, 3, 4), (&bytes, 8, 1)]).unwrap();
        let mut dst = [9u8; 5];
        assert!(bits.gather(&mut dst, &[0, 1, 2, 3, 4]));
        assert_eq!(dst, [1, 0, 1, 0, 1]);
        assert!(ChunkedBits::new(vec![(&bytes, 10, 7)]).is_none());
    }

    #[test]
    fn keys_of_every_width() {
        assert_eq!(read_key(&(-3i8).to_ne_bytes(), false), Some(-3));
        assert_eq!(read_key(&[200], true), Some(200));
        assert_eq!(read_key(&7u32.to_ne_bytes(), true), Some(7));
        assert_eq!(read_key(&u64::MAX.to_ne_bytes(), true), None);
        assert_eq!(read_key(&[0, 0, 0], false), None);
    }

    proptest! {
        #![proptest_config(crate::testing::miri_friendly(ProptestConfig::default()))]
        /// A chunked gather equals indexing the concatenated column.
        #[test]
        fn chunked_gather_equals_indexing(lens in proptest::collection::vec(0usize..9, 1..6), row_bytes in 1usize..5, picks in proptest::collection::vec(any::<u16>(), 0..40)) {
            let data: Vec<Vec<u8>> = lens.iter().enumerate()
                .map(|(k, &n)| (0..n * row_bytes).map(|i| (k * 31 + i) as u8).collect())
                .collect();
            let whole: Vec<u8> = data.concat();
            let rows = whole.len() / row_bytes;
            let c = Chunked::new(data.iter().map(|d| d.as_slice()).collect(), row_bytes).unwrap();
            prop_assume!(rows > 0);
            let idx: Vec<i64> = picks.iter().map(|&p| (p as usize % rows) as i64).collect();
            let mut dst = vec![0u8; idx.len() * row_bytes];
            prop_assert!(c.gather(&mut dst, &idx));
            for (k, &i) in idx.iter().enumerate() {
                let i = i as usize;
                prop_assert_eq!(&dst[k * row_bytes..(k + 1) * row_bytes], &whole[i * row_bytes..(i + 1) * row_bytes]);
            }
        }

        /// Bit gathers read Arrow's bit order at any offset.
        #[test]
        fn bit_gather_equals_unpacking(bytes in proptest::collection::vec(any::<u8>(), 1..8), off in 0usize..8, picks in proptest::collection::vec(any::<u16>(), 0..30)) {
            let rows = bytes.len() * 8 - off;
            let bits = ChunkedBits::new(vec![(&bytes, off, rows)]).unwrap();
            let idx: Vec<i64> = picks.iter().map(|&p| (p as usize % rows) as i64).collect();
            let mut dst = vec![0u8; idx.len()];
            prop_assert!(bits.gather(&mut dst, &idx));
            for (k, &i) in idx.iter().enumerate() {
                let bit = off + i as usize;
                prop_assert_eq!(dst[k], (bytes[bit / 8] >> (bit % 8)) & 1);
            }
        }
    }
}
