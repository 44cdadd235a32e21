//! Collate layouts: how a batch's leaves are laid out in one output buffer.
//! Pure byte movement, free of Python, so it is tested and benched alone.

pub mod columns;
pub mod packing;

/// Copies equally sized samples back to back into `dst` (a stacked leaf).
///
/// Panics if `dst` is not exactly the samples' total length, which would be
/// a layout bug in the caller.
pub fn stack_into(dst: &mut [u8], parts: &[&[u8]]) {
    let each = parts.first().map_or(0, |p| p.len());
    assert_eq!(dst.len(), each * parts.len(), "stack_into: size mismatch");
    if each == 0 {
        return;
    }
    for (chunk, part) in dst.chunks_exact_mut(each).zip(parts) {
        chunk.copy_from_slice(part);
    }
}

/// Gathers rows `indices` of a row-major `src` (`rows` rows of `row_bytes`)
/// into `dst`. Returns `false`, writing nothing, if an index is out of range.
pub fn gather_rows(
    dst: &mut [u8],
    src: &[u8],
    rows: usize,
    row_bytes: usize,
    indices: &[i64],
) -> bool {
    assert_eq!(
        dst.len(),
        row_bytes * indices.len(),
        "gather_rows: size mismatch"
    );
    assert_eq!(
        src.len(),
        rows * row_bytes,
        "gather_rows: source size mismatch"
    );
    if indices.iter().any(|&i| i < 0 || i as usize >= rows) {
        return false;
    }
    if row_bytes == 0 {
        return true;
    }
    for (chunk, &i) in dst.chunks_exact_mut(row_bytes).zip(indices) {
        let start = i as usize * row_bytes;
        chunk.copy_from_slice(&src[start..start + row_bytes]);
    }
    true
}

/// Writes scalars in native byte order (a 1-d tensor's storage).
pub fn write_scalars<T: bytemuck::Pod>(dst: &mut [u8], vals: &[T]) {
    dst.copy_from_slice(bytemuck::cast_slice(vals));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stacks_in_order() {
        let mut dst = [0u8; 6];
        stack_into(&mut dst, &[&[1, 2], &[3, 4], &[5, 6]]);
        assert_eq!(dst, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn gather_rejects_out_of_range_without_writing() {
        let src = [1u8, 2, 3, 4];
        let mut dst = [9u8; 4];
        assert!(!gather_rows(&mut dst, &src, 2, 2, &[0, 2]));
        assert!(!gather_rows(&mut dst, &src, 2, 2, &[-1, 0]));
        assert_eq!(dst, [9; 4]);
    }

    #[test]
    fn scalars_are_native_endian() {
        let mut dst = [0u8; 16];
        write_scalars(&mut dst, &[1i64, -2]);
        assert_eq!(&dst[..8], &1i64.to_ne_bytes());
        assert_eq!(&dst[8..], &(-2i64).to_ne_bytes());
    }

    proptest! {
        #[test]
        fn gather_equals_indexing(rows in 1usize..40, row_bytes in 0usize..24, idx in proptest::collection::vec(0usize..40, 0..60)) {
            let src: Vec<u8> = (0..rows * row_bytes).map(|i| (i * 7 + 3) as u8).collect();
            let idx: Vec<i64> = idx.into_iter().filter(|&i| i < rows).map(|i| i as i64).collect();
            let mut dst = vec![0u8; idx.len() * row_bytes];
            prop_assert!(gather_rows(&mut dst, &src, rows, row_bytes, &idx));
            for (k, &i) in idx.iter().enumerate() {
                let i = i as usize;
                prop_assert_eq!(&dst[k * row_bytes..(k + 1) * row_bytes], &src[i * row_bytes..(i + 1) * row_bytes]);
            }
        }

        #[test]
        fn stack_then_split_round_trips(parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 5), 0..20)) {
            let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            let mut dst = vec![0u8; 5 * parts.len()];
            stack_into(&mut dst, &refs);
            let back: Vec<Vec<u8>> = dst.chunks(5).map(|c| c.to_vec()).collect();
            prop_assert_eq!(back, parts);
        }
    }
}
