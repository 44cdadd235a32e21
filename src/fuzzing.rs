//! Entry points for the fuzz targets in `fuzz/` (cargo fuzz, libFuzzer):
//! every decoder that reads bytes another process wrote. Each must return
//! an error for any input, never panic, read out of bounds or loop without
//! end. `cargo test` replays the seed corpus (`fuzz/corpus/<target>/`)
//! through the same functions.

use crate::record::{ParsedRecord, Token, TreeReader};
use crate::ring::{Dir, Mailbox};
use crate::wire::protocol::{take_frame, FromWorker, ToWorker};

/// A batch record as the main process reads it: the layout, every leaf
/// range, then the tree, token by token.
pub fn record(data: &[u8]) {
    let Ok(parsed) = ParsedRecord::parse(data) else {
        return;
    };
    for leaf in &parsed.leaves {
        let range = leaf.range();
        assert!(
            range.end <= data.len(),
            "a parsed leaf lies outside the record"
        );
    }
    let mut tree = TreeReader::new(&data[parsed.tree.clone()]);
    // every token takes at least one byte: the walk ends
    for _ in 0..=parsed.tree.len() {
        match tree.next_token() {
            Ok(Token::Leaf(_) | Token::None) | Ok(_) => {}
            Err(_) => return,
        }
    }
}

/// A message body in either direction; what decodes re-encodes to itself.
pub fn messages(data: &[u8]) {
    if let Ok(m) = ToWorker::decode(data) {
        let mut again = Vec::new();
        m.encode(&mut again);
        assert_eq!(ToWorker::decode(&again).ok(), Some(m));
    }
    if let Ok(m) = FromWorker::decode(data) {
        let mut again = Vec::new();
        m.encode(&mut again);
        assert_eq!(FromWorker::decode(&again).ok(), Some(m));
    }
}

/// A socket receive buffer split into frames.
pub fn frames(data: &[u8]) {
    let mut rest = data;
    while let Some((body, used)) = take_frame(rest) {
        assert!(body.end <= rest.len() && used <= rest.len() && used > 0);
        rest = &rest[used..];
    }
}

/// A mailbox whose bytes (counters, length prefixes, messages) a peer
/// scribbled: popping from either ring gives messages or an error.
pub fn mailbox(data: &[u8]) {
    let Ok(m) = Mailbox::create(64) else {
        return;
    };
    m.scribble(data);
    let mut out = Vec::new();
    for dir in [Dir::Tasks, Dir::Results] {
        for _ in 0..64 {
            match m.pop(dir, &mut out) {
                Ok(true) => assert!(out.len() <= m.max_message().max(64)),
                Ok(false) | Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// A fuzz target's entry point.
    type Target = fn(&[u8]);

    const TARGETS: [(&str, Target); 4] = [
        ("record", super::record),
        ("messages", super::messages),
        ("frames", super::frames),
        ("mailbox", super::mailbox),
    ];

    #[test]
    fn seed_corpus_replays() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        for (name, target) in TARGETS {
            let dir = root.join(name);
            let mut n = 0;
            for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
                let data = std::fs::read(entry.unwrap().path()).unwrap();
                target(&data);
                n += 1;
            }
            assert!(n > 0, "no corpus for {name}");
        }
    }

    /// Writes valid encodings as seeds: `FERROLOADER_WRITE_CORPUS=1 cargo
    /// test write_seed_corpus` (the files are committed).
    #[test]
    fn write_seed_corpus() {
        if std::env::var_os("FERROLOADER_WRITE_CORPUS").is_none() {
            return;
        }
        use crate::record::{DlDtype, LeafKind, RecordLayout, Token, TreeWriter};
        use crate::ring::RecordRef;
        use crate::wire::protocol::{put_frame, FromWorker, LanePos, TaskIndices, ToWorker, Work};
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        let write = |target: &str, name: &str, data: &[u8]| {
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), data).unwrap();
        };
        // records: a dict of two leaves and a string
        let mut tree = TreeWriter::new();
        tree.put(Token::Dict(2));
        tree.put(Token::Str("x"));
        tree.put(Token::Leaf(0));
        tree.put(Token::Str("y"));
        tree.put(Token::List(2));
        tree.put(Token::Leaf(1));
        tree.put(Token::Int(7));
        let tree = tree.into_bytes();
        let f32s = DlDtype {
            code: 2,
            bits: 32,
            lanes: 1,
        };
        let i64s = DlDtype {
            code: 0,
            bits: 64,
            lanes: 1,
        };
        let layout = RecordLayout::new(
            tree.len(),
            vec![
                (f32s, LeafKind::Tensor, vec![2, 3]),
                (i64s, LeafKind::Ndarray, vec![4]),
            ],
        );
        let mut record = vec![0u8; layout.total];
        layout.write_head(&mut record, &tree);
        write("record", "dict_two_leaves", &record);
        write("record", "truncated", &record[..record.len() / 2]);
        // messages
        let msgs_to = [
            ToWorker::Task {
                seq: 3,
                indices: TaskIndices::Ints(vec![1, 2, 3]),
            },
            ToWorker::Task {
                seq: 4,
                indices: TaskIndices::Pickled(b"\x80\x04K\x01.".to_vec()),
            },
            ToWorker::Task {
                seq: 5,
                indices: TaskIndices::Iterable(Some(8)),
            },
            ToWorker::Resume,
            ToWorker::Shutdown,
            ToWorker::Task {
                seq: 6,
                indices: TaskIndices::Lane(2),
            },
            ToWorker::Task {
                seq: 7,
                indices: TaskIndices::Addresses(vec![(3, 17), (0, 4)]),
            },
            ToWorker::Lanes {
                lanes: vec![0, 2, 4],
                shuffle: true,
                block: 256,
                root: 12345,
            },
            ToWorker::Assign {
                lane: 1,
                works: vec![
                    Work::from(5, 0),
                    Work {
                        shard: 9,
                        emitted: 300,
                        end: 310,
                    },
                ],
                last: false,
            },
            ToWorker::HandBack { lane: 1 },
        ];
        let record_ref = RecordRef {
            segment: 1,
            offset: 4096,
            len: 512,
        };
        let msgs_from = [
            FromWorker::Batch {
                seq: 3,
                record: record_ref,
                times: crate::stats::StageTimes {
                    fetch: 5,
                    collate: 6,
                    transfer: 7,
                    batches: 1,
                },
            },
            FromWorker::Error {
                seq: 4,
                payload: b"wrapped".to_vec(),
            },
            FromWorker::Exhausted { seq: 5 },
            FromWorker::Started {
                error: Some(b"init".to_vec()),
            },
            FromWorker::State {
                seq: 6,
                payload: b"state".to_vec(),
            },
            FromWorker::Segment { id: 2 },
            FromWorker::NeedWork {
                seq: 11,
                lane: 1,
                given: 3,
            },
            FromWorker::LanePos {
                seq: 11,
                lane: 1,
                pos: LanePos {
                    started: 2,
                    shard: 9,
                    emitted: 77,
                },
            },
            FromWorker::Retry { seq: 12 },
            FromWorker::Tail {
                seq: 13,
                lane: 1,
                works: vec![Work {
                    shard: 9,
                    emitted: 306,
                    end: 310,
                }],
            },
        ];
        let mut stream = Vec::new();
        for (i, m) in msgs_to.iter().enumerate() {
            let mut b = Vec::new();
            m.encode(&mut b);
            write("messages", &format!("to_worker_{i}"), &b);
            put_frame(&mut stream, &b);
        }
        for (i, m) in msgs_from.iter().enumerate() {
            let mut b = Vec::new();
            m.encode(&mut b);
            write("messages", &format!("from_worker_{i}"), &b);
            put_frame(&mut stream, &b);
        }
        write("frames", "stream", &stream);
        // mailbox (cap 64): two messages in the results ring. Layout: task
        // control block at 0, results control at 128 (tail +0, head +64),
        // task ring at 256, results ring at 256 + 64.
        let mut image = vec![0u8; 256 + 2 * 64];
        let mut ring = Vec::new();
        for body in [&b"hello"[..], &b"world!"[..]] {
            ring.extend_from_slice(&(body.len() as u32).to_le_bytes());
            ring.extend_from_slice(body);
        }
        image[128..136].copy_from_slice(&(ring.len() as u64).to_le_bytes());
        image[320..320 + ring.len()].copy_from_slice(&ring);
        write("mailbox", "two_results", &image);
    }
}
