//! Sequence packing: variable-length token sequences placed into batches of
//! `rows` rows of `seq_len` tokens, with the segment ids and positions a
//! packed batch needs.
//!
//! A sequence longer than `seq_len` is cut into pieces of `seq_len` (the
//! last shorter); each piece is one segment. Pieces go, in arrival order,
//! into the open batch: the first row with room (first fit) or the row
//! with the least room that still fits (best fit). A piece that fits no row
//! closes the batch, which becomes ready, and opens the next with it.
//!
//! What a packer holds between batches is the pieces placed since the last
//! batch taken ([`Packer::pending`]): pushing them, in order, into a new
//! packer places them exactly as before (each decision depends only on the
//! pieces since its batch opened), which is how a resumed loader continues.

use std::collections::VecDeque;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    First,
    Best,
}

impl Fit {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "first_fit" => Some(Fit::First),
            "best_fit" => Some(Fit::Best),
            _ => None,
        }
    }
}

/// One packed batch: `rows * seq_len` tokens (padding `pad`), the segment
/// of each token (1, 2, ... per row in placement order; 0 for padding) and
/// its position within its segment (0 for padding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    pub tokens: Vec<i64>,
    pub segment_ids: Vec<i32>,
    pub positions: Vec<i32>,
}

/// A batch being filled: its pieces in arrival order (what a resume
/// replays), and each row's pieces as indices into them.
struct Open {
    pieces: Vec<Vec<i64>>,
    rows: Vec<Vec<usize>>,
    used: Vec<usize>,
}

impl Open {
    fn new(rows: usize) -> Self {
        Open {
            pieces: Vec::new(),
            rows: vec![Vec::new(); rows],
            used: vec![0; rows],
        }
    }
}

pub struct Packer {
    seq_len: usize,
    fit: Fit,
    pad: i64,
    open: Open,
    /// Closed batches not taken yet.
    ready: VecDeque<Open>,
}

impl Packer {
    /// `seq_len >= 1`, `rows >= 1` (checked by the caller).
    pub fn new(seq_len: usize, rows: usize, fit: Fit, pad: i64) -> Self {
        assert!(seq_len > 0 && rows > 0);
        Packer {
            seq_len,
            fit,
            pad,
            open: Open::new(rows),
            ready: VecDeque::new(),
        }
    }

    /// Adds one sequence (cut into pieces of at most `seq_len`).
    pub fn push(&mut self, seq: &[i64]) {
        for piece in seq.chunks(self.seq_len) {
            self.place(piece);
        }
    }

    fn row_for(&self, len: usize) -> Option<usize> {
        let room = |r: usize| self.seq_len - self.open.used[r];
        let fits = (0..self.open.used.len()).filter(|&r| room(r) >= len);
        match self.fit {
            Fit::First => fits.into_iter().next(),
            // the least room left; the first such row on a tie
            Fit::Best => fits.min_by_key(|&r| (room(r), r)),
        }
    }

    fn place(&mut self, piece: &[i64]) {
        let row = self.row_for(piece.len()).unwrap_or_else(|| {
            let rows = self.open.rows.len();
            let closed = std::mem::replace(&mut self.open, Open::new(rows));
            self.ready.push_back(closed);
            0
        });
        self.open.used[row] += piece.len();
        self.open.rows[row].push(self.open.pieces.len());
        self.open.pieces.push(piece.to_vec());
    }

    /// The oldest closed batch, if any.
    pub fn pop(&mut self) -> Option<Packed> {
        self.ready.pop_front().map(|batch| self.render(&batch))
    }

    /// The open batch, if it holds anything (the end of the stream).
    pub fn flush(&mut self) -> Option<Packed> {
        if let Some(p) = self.pop() {
            return Some(p);
        }
        if self.open.pieces.is_empty() {
            return None;
        }
        let rows = self.open.rows.len();
        let batch = std::mem::replace(&mut self.open, Open::new(rows));
        Some(self.render(&batch))
    }

    /// The pieces placed since the last batch taken, in arrival order.
    pub fn pending(&self) -> Vec<&[i64]> {
        self.ready
            .iter()
            .chain(std::iter::once(&self.open))
            .flat_map(|b| b.pieces.iter().map(Vec::as_slice))
            .collect()
    }

    fn render(&self, batch: &Open) -> Packed {
        let n = batch.rows.len() * self.seq_len;
        let mut out = Packed {
            tokens: vec![self.pad; n],
            segment_ids: vec![0; n],
            positions: vec![0; n],
        };
        for (r, pieces) in batch.rows.iter().enumerate() {
            let mut at = r * self.seq_len;
            for (s, &p) in pieces.iter().enumerate() {
                let piece = &batch.pieces[p];
                out.tokens[at..at + piece.len()].copy_from_slice(piece);
                for (k, i) in (at..at + piece.len()).enumerate() {
                    out.segment_ids[i] = s as i32 + 1;
                    out.positions[i] = k as i32;
                }
                at += piece.len();
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seqs(lens: &[usize]) -> Vec<Vec<i64>> {
        let mut next = 1;
        lens.iter()
            .map(|&l| {
                let s: Vec<i64> = (next..next + l as i64).collect();
                next += l as i64;
                s
            })
            .collect()
    }

    fn run(lens: &[usize], seq_len: usize, rows: usize, fit: Fit) -> Vec<Packed> {
        let mut p = Packer::new(seq_len, rows, fit, 0);
        let mut out = Vec::new();
        for s in seqs(lens) {
            p.push(&s);
            while let Some(b) = p.pop() {
                out.push(b);
            }
        }
        while let Some(b) = p.flush() {
            out.push(b);
        }
        out
    }

    #[test]
    fn first_and_best_fit_place_as_described() {
        // rows of 10: 6 and 5 take rows 0 and 1; a 4 goes to row 0 (first
        // fit: room 4 there) under both; a 3 then goes to row 1 (room 5)
        let first = run(&[6, 5, 4, 3], 10, 2, Fit::First);
        assert_eq!(first.len(), 1);
        let seg = &first[0].segment_ids;
        assert_eq!(&seg[..10], &[1, 1, 1, 1, 1, 1, 2, 2, 2, 2]);
        assert_eq!(&seg[10..], &[1, 1, 1, 1, 1, 2, 2, 2, 0, 0]);
        // 5 and 6 take rows 0 and 1 (room 5 and 4): best fit puts a 2 in
        // row 1, the least room that fits, first fit in row 0
        let best = run(&[5, 6, 2], 10, 2, Fit::Best);
        assert_eq!(&best[0].segment_ids[10..], &[1, 1, 1, 1, 1, 1, 2, 2, 0, 0]);
        let first = run(&[5, 6, 2], 10, 2, Fit::First);
        assert_eq!(&first[0].segment_ids[..10], &[1, 1, 1, 1, 1, 2, 2, 0, 0, 0]);
    }

    #[test]
    fn long_sequences_are_cut_and_positions_restart() {
        let out = run(&[25], 10, 1, Fit::First);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].positions, (0..10).collect::<Vec<i32>>());
        assert_eq!(&out[2].tokens[..5], &[21, 22, 23, 24, 25]);
        assert_eq!(&out[2].segment_ids[5..], &[0; 5]);
    }

    proptest! {
        #[test]
        fn no_token_is_lost_or_repeated(
            lens in proptest::collection::vec(1usize..40, 0..60),
            seq_len in 1usize..24,
            rows in 1usize..5,
            best in any::<bool>(),
        ) {
            let fit = if best { Fit::Best } else { Fit::First };
            let out = run(&lens, seq_len, rows, fit);
            let mut got: Vec<i64> = out.iter()
                .flat_map(|b| b.tokens.iter().zip(&b.segment_ids))
                .filter(|(_, s)| **s != 0)
                .map(|(t, _)| *t)
                .collect();
            got.sort_unstable();
            let total: usize = lens.iter().sum();
            prop_assert_eq!(got, (1..=total as i64).collect::<Vec<_>>());
        }

        #[test]
        fn pending_pieces_replay_to_the_same_batches(
            lens in proptest::collection::vec(1usize..30, 1..40),
            cut in 0usize..40,
            best in any::<bool>(),
        ) {
            let fit = if best { Fit::Best } else { Fit::First };
            let all = seqs(&lens);
            let cut = cut.min(all.len());
            let mut a = Packer::new(12, 3, fit, 0);
            let mut taken = Vec::new();
            for s in &all[..cut] {
                a.push(s);
            }
            if let Some(b) = a.pop() {
                taken.push(b);
            }
            // a new packer given the pending pieces continues identically
            let mut b = Packer::new(12, 3, fit, 0);
            for piece in a.pending() {
                b.push(piece);
            }
            let mut rest_a = Vec::new();
            let mut rest_b = Vec::new();
            for s in &all[cut..] {
                a.push(s);
                b.push(s);
            }
            while let Some(x) = a.flush() { rest_a.push(x); }
            while let Some(x) = b.flush() { rest_b.push(x); }
            prop_assert_eq!(rest_a, rest_b);
        }
    }
}
