//! Messages between the main process and a worker, and the layout of a
//! batch record in the worker's arena.
//!
//! Messages travel as frames (`u32` little-endian length, then the body) on
//! one Unix stream socket per worker; a `Segment` frame carries the new
//! arena segment's file descriptor as `SCM_RIGHTS` on its first byte. Batch
//! data never travels in a message: a `Batch` names a record in the arena.
//!
//! Record layout (all integers little-endian, leaves 64-byte aligned):
//! ```text
//! 0   u32 magic "FLB1" | u32 leaf count n | u64 pickle offset | u64 pickle length
//! 24  n x leaf: u64 offset | u64 nbytes | u8 dtype code | u8 bits | u16 lanes
//!               | u8 kind (0 tensor, 1 ndarray) | u8 ndim | u16 pad | ndim x i64 shape
//! ..  pickle bytes: the batch's structure, leaves replaced by persistent ids
//! ..  leaf bytes, each at its offset
//! ```

use std::fmt;

const MAGIC: u32 = u32::from_le_bytes(*b"FLB1");
pub const LEAF_ALIGN: usize = 64;

/// Where a record lies in a worker's arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLoc {
    pub segment: u32,
    pub offset: u64,
    pub len: u64,
}

/// The indices of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskIndices {
    /// A batch of integer indices from a native sampler.
    Ints(Vec<i64>),
    /// A single integer index (`batch_size=None`).
    Int(i64),
    /// Any other index object, pickled by the main process.
    Pickled(Vec<u8>),
    /// An `IterableDataset` task: `Some(n)` samples batched, `None` one sample.
    Iterable(Option<u32>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToWorker {
    Task {
        seq: u64,
        indices: TaskIndices,
    },
    /// Persistent workers: a new epoch starts (recreate the replica iterator).
    Resume,
    Shutdown,
    /// The mailbox segment (its fd rides with the frame); the first frame.
    Mailbox,
}

/// A mailbox message standing for "the next message is on the socket"
/// (it carries a file descriptor or is too large for the ring).
pub const ON_SOCKET: &[u8] = &[0xFF];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromWorker {
    Batch {
        seq: u64,
        record: RecordLoc,
    },
    /// A pickled `ExceptionWrapper` for task `seq`.
    Error {
        seq: u64,
        payload: Vec<u8>,
    },
    /// The replica raised `StopIteration` on task `seq`.
    Exhausted {
        seq: u64,
    },
    Resumed,
    /// A new arena segment; its fd rides with the frame.
    Segment {
        id: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed ferroloader message: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(self.u64()? as i64)
    }
    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let n = self.u64()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn end(&self) -> Result<(), DecodeError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(DecodeError("trailing bytes"))
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

impl ToWorker {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ToWorker::Task { seq, indices } => {
                out.push(1);
                out.extend_from_slice(&seq.to_le_bytes());
                match indices {
                    TaskIndices::Ints(v) => {
                        out.push(0);
                        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                        for i in v {
                            out.extend_from_slice(&i.to_le_bytes());
                        }
                    }
                    TaskIndices::Int(i) => {
                        out.push(1);
                        out.extend_from_slice(&i.to_le_bytes());
                    }
                    TaskIndices::Pickled(b) => {
                        out.push(2);
                        put_bytes(out, b);
                    }
                    TaskIndices::Iterable(n) => {
                        out.push(3);
                        out.extend_from_slice(&n.map_or(u64::MAX, u64::from).to_le_bytes());
                    }
                }
            }
            ToWorker::Resume => out.push(2),
            ToWorker::Shutdown => out.push(3),
            ToWorker::Mailbox => out.push(4),
        }
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { b };
        let msg = match r.u8()? {
            1 => {
                let seq = r.u64()?;
                let indices = match r.u8()? {
                    0 => {
                        let n = r.u64()? as usize;
                        if n > r.b.len() / 8 {
                            return Err(DecodeError("index count"));
                        }
                        TaskIndices::Ints((0..n).map(|_| r.i64()).collect::<Result<_, _>>()?)
                    }
                    1 => TaskIndices::Int(r.i64()?),
                    2 => TaskIndices::Pickled(r.bytes()?),
                    3 => {
                        let n = r.u64()?;
                        TaskIndices::Iterable(if n == u64::MAX {
                            None
                        } else {
                            Some(u32::try_from(n).map_err(|_| DecodeError("batch size"))?)
                        })
                    }
                    _ => return Err(DecodeError("index kind")),
                };
                ToWorker::Task { seq, indices }
            }
            2 => ToWorker::Resume,
            3 => ToWorker::Shutdown,
            4 => ToWorker::Mailbox,
            _ => return Err(DecodeError("message tag")),
        };
        r.end()?;
        Ok(msg)
    }
}

impl FromWorker {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            FromWorker::Batch { seq, record } => {
                out.push(1);
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&record.segment.to_le_bytes());
                out.extend_from_slice(&record.offset.to_le_bytes());
                out.extend_from_slice(&record.len.to_le_bytes());
            }
            FromWorker::Error { seq, payload } => {
                out.push(2);
                out.extend_from_slice(&seq.to_le_bytes());
                put_bytes(out, payload);
            }
            FromWorker::Exhausted { seq } => {
                out.push(3);
                out.extend_from_slice(&seq.to_le_bytes());
            }
            FromWorker::Resumed => out.push(4),
            FromWorker::Segment { id } => {
                out.push(5);
                out.extend_from_slice(&id.to_le_bytes());
            }
        }
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { b };
        let msg = match r.u8()? {
            1 => FromWorker::Batch {
                seq: r.u64()?,
                record: RecordLoc {
                    segment: r.u32()?,
                    offset: r.u64()?,
                    len: r.u64()?,
                },
            },
            2 => FromWorker::Error {
                seq: r.u64()?,
                payload: r.bytes()?,
            },
            3 => FromWorker::Exhausted { seq: r.u64()? },
            4 => FromWorker::Resumed,
            5 => FromWorker::Segment { id: r.u32()? },
            _ => return Err(DecodeError("message tag")),
        };
        r.end()?;
        Ok(msg)
    }
}

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
    pub fn nbytes(&self) -> usize {
        self.shape
            .iter()
            .map(|&d| d.max(0) as usize)
            .product::<usize>()
            * self.dtype.itemsize()
    }
}

fn align(n: usize) -> usize {
    n.div_ceil(LEAF_ALIGN) * LEAF_ALIGN
}

/// A record's header and where its parts go, computed before allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLayout {
    pub header: Vec<u8>,
    pub pickle_offset: usize,
    pub leaves: Vec<Leaf>,
    pub total: usize,
}

/// Lays out a record for a pickle of `pickle_len` bytes and leaves of the
/// given dtype, kind and shape; fills in each leaf's offset.
pub fn layout_record(
    pickle_len: usize,
    leaves: Vec<(DlDtype, LeafKind, Vec<i64>)>,
) -> RecordLayout {
    let header_len: usize = 24
        + leaves
            .iter()
            .map(|(_, _, s)| 24 + 8 * s.len())
            .sum::<usize>();
    let pickle_offset = header_len;
    let mut cursor = align(pickle_offset + pickle_len);
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
    header.extend_from_slice(&(pickle_offset as u64).to_le_bytes());
    header.extend_from_slice(&(pickle_len as u64).to_le_bytes());
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
        pickle_offset,
        leaves: placed,
        total: cursor.max(pickle_offset + pickle_len),
    }
}

/// A record's parts as read back by the main process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRecord {
    pub pickle: std::ops::Range<usize>,
    pub leaves: Vec<Leaf>,
}

/// Parses and bounds-checks a record written by [`layout_record`].
pub fn parse_record(record: &[u8]) -> Result<ParsedRecord, DecodeError> {
    let mut r = Reader { b: record };
    if r.u32()? != MAGIC {
        return Err(DecodeError("record magic"));
    }
    let n = r.u32()? as usize;
    let pickle_offset = r.u64()? as usize;
    let pickle_len = r.u64()? as usize;
    let mut leaves = Vec::with_capacity(n.min(record.len() / 24));
    for _ in 0..n {
        let offset = r.u64()?;
        let nbytes = r.u64()? as usize;
        let dtype = DlDtype {
            code: r.u8()?,
            bits: r.u8()?,
            lanes: r.u16()?,
        };
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
        let leaf = Leaf {
            offset,
            dtype,
            kind,
            shape,
        };
        let end = (offset as usize).checked_add(nbytes);
        if leaf.nbytes() != nbytes || end.is_none_or(|e| e > record.len()) {
            return Err(DecodeError("leaf bounds"));
        }
        leaves.push(leaf);
    }
    let pickle_end = pickle_offset
        .checked_add(pickle_len)
        .ok_or(DecodeError("pickle bounds"))?;
    if pickle_end > record.len() {
        return Err(DecodeError("pickle bounds"));
    }
    Ok(ParsedRecord {
        pickle: pickle_offset..pickle_end,
        leaves,
    })
}

/// Splits complete frames off the front of a receive buffer.
pub fn take_frame(buf: &[u8]) -> Option<(std::ops::Range<usize>, usize)> {
    if buf.len() < 4 {
        return None;
    }
    let n = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
    (buf.len() >= 4 + n).then_some((4..4 + n, 4 + n))
}

/// Appends `body` to `out` as one frame.
pub fn put_frame(out: &mut Vec<u8>, body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn to_worker() -> impl Strategy<Value = ToWorker> {
        let indices = prop_oneof![
            proptest::collection::vec(any::<i64>(), 0..50).prop_map(TaskIndices::Ints),
            any::<i64>().prop_map(TaskIndices::Int),
            proptest::collection::vec(any::<u8>(), 0..50).prop_map(TaskIndices::Pickled),
            proptest::option::of(any::<u32>()).prop_map(TaskIndices::Iterable),
        ];
        prop_oneof![
            (any::<u64>(), indices).prop_map(|(seq, indices)| ToWorker::Task { seq, indices }),
            Just(ToWorker::Resume),
            Just(ToWorker::Shutdown),
            Just(ToWorker::Mailbox),
        ]
    }

    fn from_worker() -> impl Strategy<Value = FromWorker> {
        prop_oneof![
            (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
                |(seq, segment, offset, len)| {
                    FromWorker::Batch {
                        seq,
                        record: RecordLoc {
                            segment,
                            offset,
                            len,
                        },
                    }
                }
            ),
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..50))
                .prop_map(|(seq, payload)| FromWorker::Error { seq, payload }),
            any::<u64>().prop_map(|seq| FromWorker::Exhausted { seq }),
            Just(FromWorker::Resumed),
            any::<u32>().prop_map(|id| FromWorker::Segment { id }),
        ]
    }

    proptest! {
        #[test]
        fn to_worker_round_trips(m in to_worker()) {
            let mut b = Vec::new();
            m.encode(&mut b);
            prop_assert_eq!(ToWorker::decode(&b).unwrap(), m);
        }

        #[test]
        fn from_worker_round_trips(m in from_worker()) {
            let mut b = Vec::new();
            m.encode(&mut b);
            prop_assert_eq!(FromWorker::decode(&b).unwrap(), m);
        }

        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = ToWorker::decode(&b);
            let _ = FromWorker::decode(&b);
            let _ = parse_record(&b);
        }

        #[test]
        fn records_round_trip(pickle_len in 0usize..300, shapes in proptest::collection::vec(proptest::collection::vec(0i64..6, 0..4), 0..6)) {
            let leaves: Vec<_> = shapes.into_iter().enumerate().map(|(i, s)| {
                let dtype = DlDtype { code: 2, bits: [8, 16, 32, 64][i % 4], lanes: 1 };
                (dtype, if i % 2 == 0 { LeafKind::Tensor } else { LeafKind::Ndarray }, s)
            }).collect();
            let lay = layout_record(pickle_len, leaves);
            let mut rec = vec![0u8; lay.total];
            rec[..lay.header.len()].copy_from_slice(&lay.header);
            let parsed = parse_record(&rec).unwrap();
            prop_assert_eq!(parsed.pickle, lay.pickle_offset..lay.pickle_offset + pickle_len);
            prop_assert_eq!(&parsed.leaves, &lay.leaves);
            for l in &lay.leaves {
                prop_assert_eq!(l.offset as usize % LEAF_ALIGN, 0);
                prop_assert!(l.offset as usize >= lay.pickle_offset + pickle_len);
            }
            for w in lay.leaves.windows(2) {
                prop_assert!(w[0].offset as usize + w[0].nbytes() <= w[1].offset as usize);
            }
        }

        #[test]
        fn frames_split_where_they_were_joined(bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..8)) {
            let mut buf = Vec::new();
            for b in &bodies { put_frame(&mut buf, b); }
            let mut got = Vec::new();
            let mut rest = &buf[..];
            while let Some((body, used)) = take_frame(rest) {
                got.push(rest[body].to_vec());
                rest = &rest[used..];
            }
            prop_assert!(rest.is_empty());
            prop_assert_eq!(got, bodies);
        }
    }
}
