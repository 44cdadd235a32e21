"""``ferroloader.Packing``: sequences packed into rows in Rust, resumable.

The engine's packed batches equal a plain Python packer written here from
the documented rule; no token is dropped or repeated (hypothesis over length
distributions); the batches are the same with workers (processes, threads)
as without; a snapshot after every packed batch resumes exactly, with the
sequences carried over a batch boundary neither lost nor repeated.
"""

from __future__ import annotations

import ferroloader
import numpy as np
import pytest
import torch
import torch.utils.data as tud
from helpers import time_limit
from hypothesis import given, settings
from hypothesis import strategies as st


def reference_pack(seqs, seq_len, rows, method, pad_id=0):
    """The rule, plainly: pieces of at most seq_len in arrival order, each
    into the first row with room (first fit) or the row with the least room
    that fits (best fit, first such row on a tie); a piece no row takes
    closes the batch. Returns (tokens, segment_ids, positions) per batch."""
    batches, cur = [], [[] for _ in range(rows)]

    def room(r):
        return seq_len - sum(len(p) for p in cur[r])

    for s in seqs:
        for k in range(0, len(s), seq_len):
            piece = list(s[k : k + seq_len])
            fits = [r for r in range(rows) if room(r) >= len(piece)]
            if not fits:
                batches.append(cur)
                cur = [[] for _ in range(rows)]
                fits = [0]
            r = fits[0] if method == "first_fit" else min(fits, key=lambda r: (room(r), r))
            cur[r].append(piece)
    if any(cur):
        batches.append(cur)
    out = []
    for b in batches:
        tok = [[pad_id] * seq_len for _ in range(rows)]
        seg = [[0] * seq_len for _ in range(rows)]
        pos = [[0] * seq_len for _ in range(rows)]
        for r, pieces in enumerate(b):
            at = 0
            for j, piece in enumerate(pieces):
                for k, t in enumerate(piece):
                    tok[r][at], seg[r][at], pos[r][at] = t, j + 1, k
                    at += 1
        out.append((tok, seg, pos))
    return out


def as_lists(batches):
    return [(b["tokens"].tolist(), b["segment_ids"].tolist(), b["positions"].tolist())
            for b in batches]


class Sequences(tud.Dataset):
    """Sequence i: ``lens[i]`` consecutive token ids, distinct across the
    dataset (so a lost or repeated token shows)."""

    def __init__(self, lens, kind="tensor"):
        self.lens, self.kind = list(lens), kind
        self.starts = np.cumsum([0, *self.lens])

    def __len__(self):
        return len(self.lens)

    def __getitem__(self, i):
        s = np.arange(self.starts[i], self.starts[i + 1]) + 1
        if self.kind == "numpy16":
            return s.astype(np.uint16)
        if self.kind == "list":
            return s.tolist()
        return torch.from_numpy(s.astype(np.int32))

    def all_tokens(self):
        return list(range(1, int(self.starts[-1]) + 1))


def lengths(draw_kind: str, n: int, seed: int):
    rng = np.random.default_rng(seed)
    if draw_kind == "uniform":
        x = rng.integers(1, 40, n)
    elif draw_kind == "geometric":
        x = rng.geometric(0.08, n)
    else:  # heavy tail: mostly short, a few longer than a row
        x = np.where(rng.random(n) < 0.1, rng.integers(30, 90, n), rng.integers(1, 8, n))
    return [int(v) for v in x]


# --------------------------------------------------------------------------- #
# the packer
# --------------------------------------------------------------------------- #


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["uniform", "geometric", "heavy"]),
    n=st.integers(0, 60),
    seed=st.integers(0, 10_000),
    seq_len=st.integers(1, 32),
    rows=st.integers(1, 4),
    method=st.sampled_from(["first_fit", "best_fit"]),
    batch=st.integers(1, 9),
)
def test_packed_batches_equal_the_reference_and_keep_every_token(
        kind, n, seed, seq_len, rows, method, batch):
    ds = Sequences(lengths(kind, n, seed))
    packing = ferroloader.Packing(seq_len=seq_len, rows=rows, method=method, pad_id=-1)
    loader = ferroloader.DataLoader(ds, batch_size=batch, collate_fn=packing.collate)
    got = as_lists(packing.wrap(loader))
    expected = reference_pack([ds[i].tolist() for i in range(len(ds))], seq_len, rows, method,
                              pad_id=-1)
    assert got == expected
    kept = sorted(t for tok, seg, _ in got for rt, rs in zip(tok, seg)
                  for t, s in zip(rt, rs) if s)
    assert kept == ds.all_tokens()


@pytest.mark.parametrize("kind", ["tensor", "numpy16", "list"])
def test_samples_of_any_integer_kind(kind):
    ds = Sequences([3, 5, 2], kind)
    packing = ferroloader.Packing(seq_len=6, rows=2)
    out = list(packing.wrap(ferroloader.DataLoader(ds, batch_size=3, collate_fn=packing.collate)))
    assert len(out) == 1
    assert out[0]["tokens"].dtype == torch.int64 and out[0]["segment_ids"].dtype == torch.int32
    assert out[0]["tokens"].tolist() == [[1, 2, 3, 9, 10, 0], [4, 5, 6, 7, 8, 0]]
    assert out[0]["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 0]]
    assert out[0]["positions"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 0]]


@time_limit(90)
@pytest.mark.parametrize("layout", [dict(num_workers=2),
                                    dict(num_workers=2, worker_method="thread"),
                                    dict(num_workers=1, worker_threads=2)])
def test_workers_pack_the_same_batches(layout):
    ds = Sequences(lengths("geometric", 80, 3))
    packing = ferroloader.Packing(seq_len=24, rows=3, method="best_fit")
    base = as_lists(packing.wrap(ferroloader.DataLoader(ds, batch_size=7, shuffle=True, seed=2,
                                                        collate_fn=packing.collate)))
    other = packing.wrap(ferroloader.DataLoader(ds, batch_size=7, shuffle=True, seed=2,
                                                collate_fn=packing.collate, **layout))
    assert as_lists(other) == base


def _grain():
    try:
        import grain
        from grain import experimental
    except ImportError:
        return None
    return grain, experimental


@pytest.mark.skipif(_grain() is None,
                    reason="grain is not installed (the test extra brings it on Python >= 3.10)")
@pytest.mark.parametrize("method", ["first_fit", "best_fit"])
def test_rows_equal_grains_packers(method):
    """Grain's FirstFit/BestFitPackIterDataset (bins unshuffled) on the same
    sequences give the same rows, segment ids and positions, in order. At
    the stream's end Grain hands over only its non-empty bins; ferroloader's
    last batch keeps its ``rows`` rows (empty ones all padding)."""
    grain, experimental = _grain()
    cls = {"first_fit": experimental.FirstFitPackIterDataset,
           "best_fit": experimental.BestFitPackIterDataset}[method]
    lens = lengths("uniform", 80, 5)
    seqs = []
    nxt = 1
    for n in lens:
        seqs.append(np.arange(nxt, nxt + min(n, 16), dtype=np.int64))
        nxt += n
    source = grain.MapDataset.source([{"tokens": s} for s in seqs]).to_iter_dataset()
    theirs = [(x["tokens"].tolist(), x["tokens_segment_ids"].tolist(),
               x["tokens_positions"].tolist())
              for x in cls(source, length_struct={"tokens": 16}, num_packing_bins=3,
                           shuffle_bins=False)]
    packing = ferroloader.Packing(seq_len=16, rows=3, method=method)
    ours = [(b["tokens"][r].tolist(), b["segment_ids"][r].tolist(), b["positions"][r].tolist())
            for b in packing.wrap(ferroloader.DataLoader(seqs, batch_size=7,
                                                         collate_fn=packing.collate))
            for r in range(3)]
    assert ours[: len(theirs)] == theirs
    assert all(not any(seg) for _, seg, _ in ours[len(theirs):])


# --------------------------------------------------------------------------- #
# resume
# --------------------------------------------------------------------------- #


@time_limit(120)
@pytest.mark.parametrize("method", ["first_fit", "best_fit"])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_after_every_packed_batch_is_exact(method, workers):
    ds = Sequences(lengths("heavy", 40, 8))
    packing = ferroloader.Packing(seq_len=16, rows=2, method=method)

    def packed(nw):
        return packing.wrap(ferroloader.DataLoader(ds, batch_size=5, shuffle=True, seed=4,
                                                   collate_fn=packing.collate, num_workers=nw))

    whole = as_lists(packed(0))
    for k in range(len(whole) + 1):
        first = packed(workers)
        it = iter(first)
        head = [next(it) for _ in range(k)]
        sd = first.state_dict()
        del it
        resumed = packed(2 - workers)
        resumed.load_state_dict(sd)
        assert as_lists(head) + as_lists(resumed) == whole, k


def test_the_state_carries_the_pieces_of_the_open_batch():
    ds = Sequences([5, 5, 5, 5])
    packing = ferroloader.Packing(seq_len=10, rows=1)
    p = packing.wrap(ferroloader.DataLoader(ds, batch_size=3, collate_fn=packing.collate))
    it = iter(p)
    first = next(it)
    sd = p.state_dict()
    assert first["tokens"].tolist() == [list(range(1, 11))]
    # the third sequence closed the first batch and waits; the loader has
    # handed over its first batch (3 sequences)
    assert sd["packing"]["carried"] == [list(range(11, 16))]
    del it
    other = ferroloader.Packing(seq_len=12, rows=1).wrap(
        ferroloader.DataLoader(ds, batch_size=3, collate_fn=packing.collate))
    with pytest.raises(ferroloader.ConfigError, match="packed with"):
        other.load_state_dict(sd)


# --------------------------------------------------------------------------- #
# arguments
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(seq_len=0), "seq_len should be a positive integer"),
    (dict(seq_len=8, rows=0), "rows should be a positive integer"),
    (dict(seq_len=8, method="next_fit"), "method should be one of"),
    (dict(seq_len=8, pad_id=1.5), "pad_id should be an int"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ferroloader.ConfigError, match=match):
        ferroloader.Packing(**kwargs)


@pytest.mark.parametrize(("sample", "match"), [
    (torch.zeros(2, 3, dtype=torch.int64), "not a 1-D integer sequence"),
    (torch.zeros(3), "not a 1-D integer sequence"),
    ("text", "not a sequence of token ids"),
])
def test_samples_that_are_not_token_sequences_are_refused(sample, match):
    with pytest.raises(ferroloader.ConfigError, match=match):
        ferroloader.Packing.collate([torch.arange(3), sample])


def test_wrapping_a_loader_without_packing_collate_is_an_error_alone():
    """A loader built without collate_fn=packing.collate hands the packer tensors: the
    ConfigError says what to build the loader with, with no warning before it (a tensor was
    indexed by a key, which torch deprecates, before the error)."""
    import warnings

    packing = ferroloader.Packing(seq_len=8)
    loader = ferroloader.DataLoader([torch.arange(3)] * 4, batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ferroloader.ConfigError) as e:
            list(packing.wrap(loader))
    assert str(e.value) == (
        "Packer.push takes a ragged batch: {'tokens': 1-D int64, 'lengths': 1-D int64} (what "
        "Packing.collate returns: build the loader with collate_fn=packing.collate), got a Tensor"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.bool])
def test_a_non_integer_sample_names_its_dtype_and_what_packing_needs(dtype):
    """A sample of floats (or bools) is refused naming its dtype as torch does (float32),
    not by DLPack's type code and bits, and saying packing needs integer token ids."""
    with pytest.raises(ferroloader.ConfigError) as e:
        ferroloader.Packing.collate([torch.arange(3), torch.zeros(3, dtype=dtype)])
    name = str(dtype).removeprefix("torch.")
    assert str(e.value) == (
        f"Packing: sample 1 is not a 1-D integer sequence on the CPU (shape [3], dtype {name}); "
        "packing needs integer token ids: a 1-D CPU tensor or array of an integer dtype "
        "(e.g. torch.int64), or a list of ints"
    )
