//! The record layout: a header that places the tree and each leaf, written
//! before allocation and parsed (bounds-checked) by the main process.

use super::reader::{DecodeError, Reader};

const MAGIC: u32 = u32::from_le_bytes(*b"FLB1");
/// Every leaf starts on this boundary (payloads themselves are 64-aligned).
pub const LEAF_ALIGN: usize = 64;
/// Bytes of the fixed header before the leaf table.
const HEADER_LEN: usize = 24;
/// Bytes of one leaf-table entry before its shape.
const LEAF_ENTRY_LEN: usize = 24;

/// A DLPack `DLDataType` (type code, bits, lanes): the dtype of a leaf in a
/// record, and, laid out as C's struct, of every tensor crossing DLPack.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DlDtype {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

impl DlDtype {
    pub fn itemsize(&self) -> usize {
        (self.bits as usize * self.lanes as usize).div_ceil(8)
    }
}

/// What the main process builds over a leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafKind {
    Tensor = 0,
    Ndarray = 1,
}

/// One contiguous array in a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    pub offset: u64,
    pub dtype: DlDtype,
    pub kind: LeafKind,
    pub shape: Vec<i64>,
}

impl Leaf {
    /// Bytes of the leaf (`usize::MAX` when that overflows: such a leaf
    /// never passes [`ParsedRecord::parse`]).
    pub fn nbytes(&self) -> usize {
        self.shape
            .iter()
            .try_fold(self.dtype.itemsize(), |acc, &d| {
                acc.checked_mul(d.max(0) as usize)
            })
            .unwrap_or(usize::MAX)
    }

    pub fn range(&self) -> std::ops::Range<usize> {
        let start = self.offset as usize;
        start..start.saturating_add(self.nbytes())
    }
}

fn align(n: usize) -> usize {
    n.div_ceil(LEAF_ALIGN) * LEAF_ALIGN
}

/// A record's header and where its parts go, computed before allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLayout {
    pub header: Vec<u8>,
    pub tree_offset: usize,
    pub tree_len: usize,
    pub leaves: Vec<Leaf>,
    /// The payload length to allocate.
    pub total: usize,
}

impl RecordLayout {
    /// Lays out a record for a tree of `tree_len` bytes and leaves of the
    /// given dtype, kind and shape; fills in each leaf's offset.
    pub fn new(tree_len: usize, leaves: Vec<(DlDtype, LeafKind, Vec<i64>)>) -> RecordLayout {
        let header_len: usize = HEADER_LEN
            + leaves
                .iter()
                .map(|(_, _, s)| LEAF_ENTRY_LEN + 8 * s.len())
                .sum::<usize>();
        let tree_offset = header_len;
        let mut cursor = align(tree_offset + tree_len);
        let mut placed = Vec::with_capacity(leaves.len());
        for (dtype, kind, shape) in leaves {
            let leaf = Leaf {
                offset: cursor as u64,
                dtype,
                kind,
                shape,
            };
            cursor = align(cursor + leaf.nbytes());
            placed.push(leaf);
        }
        let mut header = Vec::with_capacity(header_len);
        header.extend_from_slice(&MAGIC.to_le_bytes());
        header.extend_from_slice(&(placed.len() as u32).to_le_bytes());
        header.extend_from_slice(&(tree_offset as u64).to_le_bytes());
        header.extend_from_slice(&(tree_len as u64).to_le_bytes());
        for l in &placed {
            header.extend_from_slice(&l.offset.to_le_bytes());
            header.extend_from_slice(&(l.nbytes() as u64).to_le_bytes());
            header.push(l.dtype.code);
            header.push(l.dtype.bits);
            header.extend_from_slice(&l.dtype.lanes.to_le_bytes());
            header.push(l.kind as u8);
            header.push(l.shape.len() as u8);
            header.extend_from_slice(&[0, 0]);
            for d in &l.shape {
                header.extend_from_slice(&d.to_le_bytes());
            }
        }
        debug_assert_eq!(header.len(), header_len);
        RecordLayout {
            header,
            tree_offset,
            tree_len,
            leaves: placed,
            total: cursor.max(tree_offset + tree_len),
        }
    }

    /// Writes the header and the tree into `payload` (at least `total` long).
    pub fn write_head(&self, payload: &mut [u8], tree: &[u8]) {
        debug_assert_eq!(tree.len(), self.tree_len);
        payload[..self.header.len()].copy_from_slice(&self.header);
        payload[self.tree_offset..self.tree_offset + tree.len()].copy_from_slice(tree);
    }
}

/// A record's parts as read back by the main process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRecord {
    pub tree: std::ops::Range<usize>,
    pub leaves: Vec<Leaf>,
}

impl ParsedRecord {
    /// Parses and bounds-checks a record written with [`RecordLayout`]:
    /// every leaf and the tree lie inside `record`.
    pub fn parse(record: &[u8]) -> Result<ParsedRecord, DecodeError> {
        let mut r = Reader::new(record);
        if r.u32()? != MAGIC {
            return Err(DecodeError("record magic"));
        }
        let n = r.u32()? as usize;
        let tree_offset = r.u64()? as usize;
        let tree_len = r.u64()? as usize;
        let mut leaves = Vec::with_capacity(n.min(record.len() / LEAF_ENTRY_LEN));
        for _ in 0..n {
            let offset = r.u64()?;
            let nbytes = r.u64()? as usize;
            let dtype = DlDtype {
                code: r.u8()?,
                bits: r.u8()?,
                lanes: r.u16()?,
            };
            if dtype.itemsize() == 0 {
                // a zero-byte element would let any shape pass the size check
                return Err(DecodeError("leaf dtype"));
            }
            let kind = match r.u8()? {
                0 => LeafKind::Tensor,
                1 => LeafKind::Ndarray,
                _ => return Err(DecodeError("leaf kind")),
            };
            let ndim = r.u8()? as usize;
            r.take(2)?;
            let shape = (0..ndim).map(|_| r.i64()).collect::<Result<Vec<_>, _>>()?;
            if shape.iter().any(|&d| d < 0) {
                return Err(DecodeError("negative dimension"));
            }
            let computed = shape
                .iter()
                .try_fold(dtype.itemsize(), |acc, &d| acc.checked_mul(d as usize));
            let end = (offset as usize).checked_add(nbytes);
            if computed != Some(nbytes) || end.is_none_or(|e| e > record.len()) {
                return Err(DecodeError("leaf bounds"));
            }
            leaves.push(Leaf {
                offset,
                dtype,
                kind,
                shape,
            });
        }
        let tree_end = tree_offset
            .checked_add(tree_len)
            .ok_or(DecodeError("tree bounds"))?;
        if tree_end > record.len() {
            return Err(DecodeError("tree bounds"));
        }
        Ok(ParsedRecord {
            tree: tree_offset..tree_end,
            leaves,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_round_trip(tree_len in 0usize..300, shapes in proptest::collection::vec(proptest::collection::vec(0i64..6, 0..4), 0..6)) {
            let leaves: Vec<_> = shapes.into_iter().enumerate().map(|(i, s)| {
                let dtype = DlDtype { code: 2, bits: [8, 16, 32, 64][i % 4], lanes: 1 };
                (dtype, if i % 2 == 0 { LeafKind::Tensor } else { LeafKind::Ndarray }, s)
            }).collect();
            let lay = RecordLayout::new(tree_len, leaves);
            let mut rec = vec![0u8; lay.total];
            lay.write_head(&mut rec, &vec![7u8; tree_len]);
            let parsed = ParsedRecord::parse(&rec).unwrap();
            prop_assert_eq!(parsed.tree, lay.tree_offset..lay.tree_offset + tree_len);
            prop_assert_eq!(&parsed.leaves, &lay.leaves);
            for l in &lay.leaves {
                prop_assert_eq!(l.offset as usize % LEAF_ALIGN, 0);
                prop_assert!(l.offset as usize >= lay.tree_offset + tree_len);
            }
            for w in lay.leaves.windows(2) {
                prop_assert!(w[0].range().end <= w[1].offset as usize);
            }
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = ParsedRecord::parse(&b);
        }

        #[test]
        fn a_truncated_record_is_refused(cut in 1usize..64) {
            let lay = RecordLayout::new(10, vec![(DlDtype { code: 2, bits: 32, lanes: 1 }, LeafKind::Tensor, vec![4, 4])]);
            let mut rec = vec![0u8; lay.total];
            lay.write_head(&mut rec, &[0u8; 10]);
            prop_assert!(ParsedRecord::parse(&rec[..rec.len() - cut]).is_err());
        }
    }

    #[test]
    fn a_leaf_whose_size_overflows_is_refused() {
        let lay = RecordLayout::new(
            0,
            vec![(
                DlDtype {
                    code: 2,
                    bits: 64,
                    lanes: 1,
                },
                LeafKind::Tensor,
                vec![1],
            )],
        );
        let mut rec = vec![0u8; lay.total];
        lay.write_head(&mut rec, &[]);
        // Shape [2^62] of 8-byte items: its byte size overflows usize.
        let shape_at = HEADER_LEN + LEAF_ENTRY_LEN;
        rec[shape_at..shape_at + 8].copy_from_slice(&(1i64 << 62).to_le_bytes());
        assert_eq!(ParsedRecord::parse(&rec), Err(DecodeError("leaf bounds")));
    }
}
