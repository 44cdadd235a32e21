//! Messages between the main process and a worker.
//!
//! Messages travel as frames (`u32` little-endian length, then the body):
//! in the shared-memory mailbox when they fit, else on the worker's Unix
//! stream socket behind an [`ON_SOCKET`] marker in the mailbox (so order is
//! kept). A `Segment` or `Mailbox` frame carries a file descriptor as
//! `SCM_RIGHTS` on its first byte, so it always goes by socket. An empty
//! frame on the socket is a wake-up for a side that sleeps. Batch data never
//! travels in a message: a `Batch` names a record in the worker's arena
//! (its layout: `crate::record`).
//!
//! A body is a one-byte tag (the constants in [`to_worker`] and
//! [`from_worker`]) and its fields, integers little-endian. The worker
//! lifecycle these messages drive is drawn in `crate::worker`.

use crate::record::{put_bytes, DecodeError, Reader};
use crate::ring::RecordRef;

/// Tags of [`ToWorker`] bodies.
pub mod to_worker {
    /// `u64` seq, `u8` index kind, the indices.
    pub const TASK: u8 = 1;
    pub const RESUME: u8 = 2;
    pub const SHUTDOWN: u8 = 3;
    pub const MAILBOX: u8 = 4;
    /// `u8` shuffle, `u64` block, `u64` root, `u64` n, n `u32` lane ids.
    pub const LANES: u8 = 5;
    /// `u32` lane, `u8` last, `u64` n, n works (`u32` shard, `u64` emitted,
    /// `u64` end).
    pub const ASSIGN: u8 = 6;
    /// `u32` lane: no shards are left for it; it gives back the items it
    /// has not made a batch of (a `TAIL`).
    pub const HAND_BACK: u8 = 7;

    /// Index kinds of a `TASK`.
    pub const INDICES_INTS: u8 = 0;
    pub const INDICES_INT: u8 = 1;
    pub const INDICES_PICKLED: u8 = 2;
    pub const INDICES_ITERABLE: u8 = 3;
    /// `u32` lane: that lane's next batch.
    pub const INDICES_LANE: u8 = 4;
    /// `u64` n, n (`u32` shard, `u64` offset): a batch of shard items.
    pub const INDICES_ADDRESSES: u8 = 5;
    /// `INDICES_ITERABLE` without batching (`batch_size=None`).
    pub const UNBATCHED: u64 = u64::MAX;
}

/// Tags of [`FromWorker`] bodies.
pub mod from_worker {
    /// `u64` seq, `u32` segment, `u64` offset, `u64` length, then the
    /// stage timings not reported before (as in `STATS`).
    pub const BATCH: u8 = 1;
    /// `u64` seq, `u64` n, n bytes (a pickled `ExceptionWrapper`).
    pub const ERROR: u8 = 2;
    /// `u64` seq.
    pub const EXHAUSTED: u8 = 3;
    pub const RESUMED: u8 = 4;
    /// `u32` segment id (its fd rides with the frame).
    pub const SEGMENT: u8 = 5;
    /// `u64` seq, `u64` n, n bytes: the replica's state after the batch of
    /// task `seq` (sent just before that `BATCH`, for snapshots).
    pub const STATE: u8 = 6;
    /// `u64` seq, `u32` lane, `u32` given: the lane ran out of shards.
    pub const NEED_WORK: u8 = 7;
    /// `u64` seq, `u32` lane, `u32` started, `u32` shard, `u64` emitted:
    /// where the lane stands after task `seq`'s batch (sent just before it).
    pub const LANE_POS: u8 = 8;
    /// `u64` seq: send task `seq` again, unchanged (its lane waits for an
    /// earlier task it sent back with `NEED_WORK`).
    pub const RETRY: u8 = 9;
    /// `u64` fetch ns, `u64` collate ns, `u64` transfer ns, `u64` batches:
    /// the worker's stage timings since its last report (sent before an
    /// `ERROR` or `EXHAUSTED`; a `BATCH` carries its own).
    pub const STATS: u8 = 10;
    /// `u8` flag, then (flag 1) `u64` n, n bytes: the worker has set up
    /// for an epoch, and the error its setup raised, when one did.
    pub const STARTED: u8 = 11;
    /// `u64` seq, `u32` lane, `u64` n, n works (as in `ASSIGN`): the items
    /// a lane told `HAND_BACK` had not made a batch of (sent just before
    /// the `EXHAUSTED` that ends it).
    pub const TAIL: u8 = 12;
}

/// A shard for a lane to read, from position `emitted` of its shard order
/// (`crate::sampler::shards`) up to position `end` (not included;
/// [`Work::OPEN`]: to the shard's end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    pub shard: u32,
    pub emitted: u64,
    pub end: u64,
}

impl Work {
    /// An `end` past any shard's end.
    pub const OPEN: u64 = u64::MAX;

    /// `shard` from position `emitted` to its end.
    pub fn from(shard: u32, emitted: u64) -> Self {
        Work {
            shard,
            emitted,
            end: Work::OPEN,
        }
    }
}

/// Where a lane stands after a batch: it had begun `started` works, and has
/// read `emitted` items of the last one, `shard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LanePos {
    pub started: u32,
    pub shard: u32,
    pub emitted: u64,
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
    /// A sharded dataset: the next batch of this lane.
    Lane(u32),
    /// A sharded dataset read by address: these `(shard, offset)` items.
    Addresses(Vec<(u32, u64)>),
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
    /// A sharded epoch begins: the lanes this worker runs, and how shards
    /// are read (`block`-item blocks, permuted from `root` when `shuffle`).
    Lanes {
        lanes: Vec<u32>,
        shuffle: bool,
        block: u64,
        root: u64,
    },
    /// Shards for `lane` to read next; `last`: no more will come.
    Assign {
        lane: u32,
        works: Vec<Work>,
        last: bool,
    },
    /// No more shards will come for `lane` (a dynamic lane that ran out
    /// while others read on): it makes no short batch but gives its items
    /// not yet in a batch back (`FromWorker::Tail`), for the epoch's last
    /// lane to read, so the rank's batch count does not depend on which
    /// lane read which shard.
    HandBack {
        lane: u32,
    },
}

/// A mailbox message standing for "the next message is on the socket"
/// (it carries a file descriptor or is too large for the ring). No body
/// starts with this byte.
pub const ON_SOCKET: &[u8] = &[0xFF];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromWorker {
    /// Task `seq`'s batch, and the worker's stage timings since its last
    /// report (this batch's and those of tasks that made none): they travel
    /// with the batch, so every batch the main process reads is counted.
    Batch {
        seq: u64,
        record: RecordRef,
        times: crate::stats::StageTimes,
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
    /// The worker set up for an epoch (after its start, and after each
    /// `Resume`); `error`: what its setup raised (`worker_init_fn`, the
    /// replica's state, `iter(dataset)`), which its first task re-raises.
    Started {
        error: Option<Vec<u8>>,
    },
    /// A new arena segment; its fd rides with the frame.
    Segment {
        id: u32,
    },
    /// The iterable replica's serialised state after task `seq`'s batch.
    State {
        seq: u64,
        payload: Vec<u8>,
    },
    /// Task `seq` found `lane` out of shards after the `given` it had.
    NeedWork {
        seq: u64,
        lane: u32,
        given: u32,
    },
    /// Where `lane` stands after task `seq`'s batch.
    LanePos {
        seq: u64,
        lane: u32,
        pos: LanePos,
    },
    /// Send task `seq` again: its lane is waiting for an earlier task it
    /// answered with `NeedWork`, so its batches keep their order.
    Retry {
        seq: u64,
    },
    /// The worker's stage timings since its last report.
    Stats(crate::stats::StageTimes),
    /// `lane`, told to hand back, ends on task `seq` (an `Exhausted`
    /// follows): `works` hold the items it read but made no batch of.
    Tail {
        seq: u64,
        lane: u32,
        works: Vec<Work>,
    },
}

impl ToWorker {
    pub fn encode(&self, out: &mut Vec<u8>) {
        use to_worker::*;
        match self {
            ToWorker::Task { seq, indices } => {
                out.push(TASK);
                out.extend_from_slice(&seq.to_le_bytes());
                match indices {
                    TaskIndices::Ints(v) => {
                        out.push(INDICES_INTS);
                        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                        for i in v {
                            out.extend_from_slice(&i.to_le_bytes());
                        }
                    }
                    TaskIndices::Int(i) => {
                        out.push(INDICES_INT);
                        out.extend_from_slice(&i.to_le_bytes());
                    }
                    TaskIndices::Pickled(b) => {
                        out.push(INDICES_PICKLED);
                        put_bytes(out, b);
                    }
                    TaskIndices::Iterable(n) => {
                        out.push(INDICES_ITERABLE);
                        out.extend_from_slice(&n.map_or(UNBATCHED, u64::from).to_le_bytes());
                    }
                    TaskIndices::Lane(lane) => {
                        out.push(INDICES_LANE);
                        out.extend_from_slice(&lane.to_le_bytes());
                    }
                    TaskIndices::Addresses(v) => {
                        out.push(INDICES_ADDRESSES);
                        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                        for (shard, offset) in v {
                            out.extend_from_slice(&shard.to_le_bytes());
                            out.extend_from_slice(&offset.to_le_bytes());
                        }
                    }
                }
            }
            ToWorker::Resume => out.push(RESUME),
            ToWorker::Shutdown => out.push(SHUTDOWN),
            ToWorker::Mailbox => out.push(MAILBOX),
            ToWorker::Lanes {
                lanes,
                shuffle,
                block,
                root,
            } => {
                out.push(LANES);
                out.push(u8::from(*shuffle));
                out.extend_from_slice(&block.to_le_bytes());
                out.extend_from_slice(&root.to_le_bytes());
                out.extend_from_slice(&(lanes.len() as u64).to_le_bytes());
                for l in lanes {
                    out.extend_from_slice(&l.to_le_bytes());
                }
            }
            ToWorker::Assign { lane, works, last } => {
                out.push(ASSIGN);
                out.extend_from_slice(&lane.to_le_bytes());
                out.push(u8::from(*last));
                put_works(out, works);
            }
            ToWorker::HandBack { lane } => {
                out.push(HAND_BACK);
                out.extend_from_slice(&lane.to_le_bytes());
            }
        }
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        use to_worker::*;
        let mut r = Reader::new(b);
        let msg = match r.u8()? {
            TASK => {
                let seq = r.u64()?;
                let indices = match r.u8()? {
                    INDICES_INTS => {
                        let n = r.u64()? as usize;
                        if n > r.remaining() / 8 {
                            return Err(DecodeError("index count"));
                        }
                        TaskIndices::Ints((0..n).map(|_| r.i64()).collect::<Result<_, _>>()?)
                    }
                    INDICES_INT => TaskIndices::Int(r.i64()?),
                    INDICES_PICKLED => TaskIndices::Pickled(r.bytes()?.to_vec()),
                    INDICES_ITERABLE => {
                        let n = r.u64()?;
                        TaskIndices::Iterable(if n == UNBATCHED {
                            None
                        } else {
                            Some(u32::try_from(n).map_err(|_| DecodeError("batch size"))?)
                        })
                    }
                    INDICES_LANE => TaskIndices::Lane(r.u32()?),
                    INDICES_ADDRESSES => {
                        let n = r.u64()? as usize;
                        if n > r.remaining() / 12 {
                            return Err(DecodeError("address count"));
                        }
                        TaskIndices::Addresses(
                            (0..n)
                                .map(|_| Ok((r.u32()?, r.u64()?)))
                                .collect::<Result<_, DecodeError>>()?,
                        )
                    }
                    _ => return Err(DecodeError("index kind")),
                };
                ToWorker::Task { seq, indices }
            }
            RESUME => ToWorker::Resume,
            SHUTDOWN => ToWorker::Shutdown,
            MAILBOX => ToWorker::Mailbox,
            LANES => {
                let shuffle = flag(r.u8()?)?;
                let block = r.u64()?;
                let root = r.u64()?;
                let n = r.u64()? as usize;
                if n > r.remaining() / 4 {
                    return Err(DecodeError("lane count"));
                }
                ToWorker::Lanes {
                    lanes: (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?,
                    shuffle,
                    block,
                    root,
                }
            }
            ASSIGN => {
                let lane = r.u32()?;
                let last = flag(r.u8()?)?;
                let works = get_works(&mut r)?;
                ToWorker::Assign { lane, works, last }
            }
            HAND_BACK => ToWorker::HandBack { lane: r.u32()? },
            _ => return Err(DecodeError("message tag")),
        };
        r.end()?;
        Ok(msg)
    }
}

impl FromWorker {
    pub fn encode(&self, out: &mut Vec<u8>) {
        use from_worker::*;
        match self {
            FromWorker::Batch { seq, record, times } => {
                out.push(BATCH);
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&record.segment.to_le_bytes());
                out.extend_from_slice(&record.offset.to_le_bytes());
                out.extend_from_slice(&record.len.to_le_bytes());
                put_times(out, times);
            }
            FromWorker::Error { seq, payload } => {
                out.push(ERROR);
                out.extend_from_slice(&seq.to_le_bytes());
                put_bytes(out, payload);
            }
            FromWorker::Exhausted { seq } => {
                out.push(EXHAUSTED);
                out.extend_from_slice(&seq.to_le_bytes());
            }
            FromWorker::Resumed => out.push(RESUMED),
            FromWorker::Started { error } => {
                out.push(STARTED);
                out.push(u8::from(error.is_some()));
                if let Some(e) = error {
                    put_bytes(out, e);
                }
            }
            FromWorker::Segment { id } => {
                out.push(SEGMENT);
                out.extend_from_slice(&id.to_le_bytes());
            }
            FromWorker::State { seq, payload } => {
                out.push(STATE);
                out.extend_from_slice(&seq.to_le_bytes());
                put_bytes(out, payload);
            }
            FromWorker::NeedWork { seq, lane, given } => {
                out.push(NEED_WORK);
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&lane.to_le_bytes());
                out.extend_from_slice(&given.to_le_bytes());
            }
            FromWorker::LanePos { seq, lane, pos } => {
                out.push(LANE_POS);
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&lane.to_le_bytes());
                out.extend_from_slice(&pos.started.to_le_bytes());
                out.extend_from_slice(&pos.shard.to_le_bytes());
                out.extend_from_slice(&pos.emitted.to_le_bytes());
            }
            FromWorker::Retry { seq } => {
                out.push(RETRY);
                out.extend_from_slice(&seq.to_le_bytes());
            }
            FromWorker::Stats(t) => {
                out.push(STATS);
                put_times(out, t);
            }
            FromWorker::Tail { seq, lane, works } => {
                out.push(TAIL);
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&lane.to_le_bytes());
                put_works(out, works);
            }
        }
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        use from_worker::*;
        let mut r = Reader::new(b);
        let msg = match r.u8()? {
            BATCH => FromWorker::Batch {
                seq: r.u64()?,
                record: RecordRef {
                    segment: r.u32()?,
                    offset: r.u64()?,
                    len: r.u64()?,
                },
                times: get_times(&mut r)?,
            },
            ERROR => FromWorker::Error {
                seq: r.u64()?,
                payload: r.bytes()?.to_vec(),
            },
            EXHAUSTED => FromWorker::Exhausted { seq: r.u64()? },
            RESUMED => FromWorker::Resumed,
            STARTED => FromWorker::Started {
                error: if flag(r.u8()?)? {
                    Some(r.bytes()?.to_vec())
                } else {
                    None
                },
            },
            SEGMENT => FromWorker::Segment { id: r.u32()? },
            STATE => FromWorker::State {
                seq: r.u64()?,
                payload: r.bytes()?.to_vec(),
            },
            NEED_WORK => FromWorker::NeedWork {
                seq: r.u64()?,
                lane: r.u32()?,
                given: r.u32()?,
            },
            LANE_POS => FromWorker::LanePos {
                seq: r.u64()?,
                lane: r.u32()?,
                pos: LanePos {
                    started: r.u32()?,
                    shard: r.u32()?,
                    emitted: r.u64()?,
                },
            },
            RETRY => FromWorker::Retry { seq: r.u64()? },
            STATS => FromWorker::Stats(get_times(&mut r)?),
            TAIL => FromWorker::Tail {
                seq: r.u64()?,
                lane: r.u32()?,
                works: get_works(&mut r)?,
            },
            _ => return Err(DecodeError("message tag")),
        };
        r.end()?;
        Ok(msg)
    }
}

fn put_works(out: &mut Vec<u8>, works: &[Work]) {
    out.extend_from_slice(&(works.len() as u64).to_le_bytes());
    for w in works {
        out.extend_from_slice(&w.shard.to_le_bytes());
        out.extend_from_slice(&w.emitted.to_le_bytes());
        out.extend_from_slice(&w.end.to_le_bytes());
    }
}

fn get_works(r: &mut Reader<'_>) -> Result<Vec<Work>, DecodeError> {
    let n = r.u64()? as usize;
    if n > r.remaining() / 20 {
        return Err(DecodeError("work count"));
    }
    (0..n)
        .map(|_| {
            Ok(Work {
                shard: r.u32()?,
                emitted: r.u64()?,
                end: r.u64()?,
            })
        })
        .collect()
}

fn put_times(out: &mut Vec<u8>, t: &crate::stats::StageTimes) {
    for v in [t.fetch, t.collate, t.transfer, t.batches] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn get_times(r: &mut Reader<'_>) -> Result<crate::stats::StageTimes, DecodeError> {
    Ok(crate::stats::StageTimes {
        fetch: r.u64()?,
        collate: r.u64()?,
        transfer: r.u64()?,
        batches: r.u64()?,
    })
}

/// A one-byte boolean: 0 or 1, nothing else.
fn flag(b: u8) -> Result<bool, DecodeError> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(DecodeError("flag")),
    }
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

    fn to_worker_msg() -> impl Strategy<Value = ToWorker> {
        let indices = prop_oneof![
            proptest::collection::vec(any::<i64>(), 0..50).prop_map(TaskIndices::Ints),
            any::<i64>().prop_map(TaskIndices::Int),
            proptest::collection::vec(any::<u8>(), 0..50).prop_map(TaskIndices::Pickled),
            proptest::option::of(any::<u32>()).prop_map(TaskIndices::Iterable),
            any::<u32>().prop_map(TaskIndices::Lane),
            proptest::collection::vec((any::<u32>(), any::<u64>()), 0..20)
                .prop_map(TaskIndices::Addresses),
        ];
        let work =
            (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(shard, emitted, end)| Work {
                shard,
                emitted,
                end,
            });
        prop_oneof![
            (any::<u64>(), indices).prop_map(|(seq, indices)| ToWorker::Task { seq, indices }),
            Just(ToWorker::Resume),
            Just(ToWorker::Shutdown),
            Just(ToWorker::Mailbox),
            (
                proptest::collection::vec(any::<u32>(), 0..10),
                any::<bool>(),
                any::<u64>(),
                any::<u64>()
            )
                .prop_map(|(lanes, shuffle, block, root)| ToWorker::Lanes {
                    lanes,
                    shuffle,
                    block,
                    root
                }),
            (
                any::<u32>(),
                proptest::collection::vec(work, 0..10),
                any::<bool>()
            )
                .prop_map(|(lane, works, last)| ToWorker::Assign { lane, works, last }),
            any::<u32>().prop_map(|lane| ToWorker::HandBack { lane }),
        ]
    }

    fn from_worker_msg() -> impl Strategy<Value = FromWorker> {
        prop_oneof![
            (
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<[u64; 4]>()
            )
                .prop_map(|(seq, segment, offset, len, t)| FromWorker::Batch {
                    seq,
                    record: RecordRef {
                        segment,
                        offset,
                        len,
                    },
                    times: crate::stats::StageTimes {
                        fetch: t[0],
                        collate: t[1],
                        transfer: t[2],
                        batches: t[3],
                    },
                }),
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..50))
                .prop_map(|(seq, payload)| FromWorker::Error { seq, payload }),
            any::<u64>().prop_map(|seq| FromWorker::Exhausted { seq }),
            Just(FromWorker::Resumed),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..50))
                .prop_map(|error| FromWorker::Started { error }),
            any::<u32>().prop_map(|id| FromWorker::Segment { id }),
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..50))
                .prop_map(|(seq, payload)| FromWorker::State { seq, payload }),
            (any::<u64>(), any::<u32>(), any::<u32>())
                .prop_map(|(seq, lane, given)| FromWorker::NeedWork { seq, lane, given }),
            (
                any::<u64>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u64>()
            )
                .prop_map(|(seq, lane, started, shard, emitted)| FromWorker::LanePos {
                    seq,
                    lane,
                    pos: LanePos {
                        started,
                        shard,
                        emitted
                    }
                }),
            any::<[u64; 4]>().prop_map(|t| FromWorker::Stats(crate::stats::StageTimes {
                fetch: t[0],
                collate: t[1],
                transfer: t[2],
                batches: t[3],
            })),
            (
                any::<u64>(),
                any::<u32>(),
                proptest::collection::vec((any::<u32>(), any::<u64>(), any::<u64>()), 0..10)
            )
                .prop_map(|(seq, lane, works)| FromWorker::Tail {
                    seq,
                    lane,
                    works: works
                        .into_iter()
                        .map(|(shard, emitted, end)| Work {
                            shard,
                            emitted,
                            end
                        })
                        .collect(),
                }),
        ]
    }

    proptest! {
        #![proptest_config(crate::testing::miri_friendly(ProptestConfig::default()))]

        #[test]
        fn to_worker_round_trips(m in to_worker_msg()) {
            let mut b = Vec::new();
            m.encode(&mut b);
            prop_assert_ne!(&b[..1], ON_SOCKET);
            prop_assert_eq!(ToWorker::decode(&b).unwrap(), m);
        }

        #[test]
        fn from_worker_round_trips(m in from_worker_msg()) {
            let mut b = Vec::new();
            m.encode(&mut b);
            prop_assert_ne!(&b[..1], ON_SOCKET);
            prop_assert_eq!(FromWorker::decode(&b).unwrap(), m);
        }

        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = ToWorker::decode(&b);
            let _ = FromWorker::decode(&b);
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
