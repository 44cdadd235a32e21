"""Sequences packed into rows, against Grain's packers (packing)."""

from __future__ import annotations

from typing import Any, List

import numpy as np

from ..harness import Check, Settings, Skip, timed_rate

# --- packing: sequences into rows, against Grain's packers --------------------


def sc_packing(st: Settings, fl: Any) -> List[Check]:
    """Token sequences (geometric lengths, mean 150, at most 2048) packed
    into batches of 8 rows of 2048, in one process: ferroloader's
    ``Packing`` through a loader (ragged collate, then the packer) against
    Grain's ``FirstFitPackIterDataset`` / ``BestFitPackIterDataset`` (bins
    unshuffled), which place the same rows. Tokens per second."""
    try:
        import grain
        from grain import experimental
    except ImportError as e:
        raise Skip(f"skipped: grain is not installed ({e})") from None
    rng = np.random.default_rng(0)
    lens = np.minimum(rng.geometric(1 / 150, 2_000 if st.quick else 20_000), 2048)
    seqs = [rng.integers(0, 50_000, n).astype(np.int64) for n in lens]
    tokens = float(lens.sum())
    checks = []
    for method, cls in (("first_fit", experimental.FirstFitPackIterDataset),
                        ("best_fit", experimental.BestFitPackIterDataset)):
        packing = fl.Packing(seq_len=2048, rows=8, method=method)

        def ours(packing: Any = packing) -> float:
            loader = fl.DataLoader(seqs, batch_size=256, collate_fn=packing.collate)
            for _ in packing.wrap(loader):
                pass
            return tokens

        def theirs(cls: Any = cls) -> float:
            source = grain.MapDataset.source([{"tokens": s} for s in seqs]).to_iter_dataset()
            for _ in cls(source, length_struct={"tokens": 2048}, num_packing_bins=8,
                         shuffle_bins=False):
                pass
            return tokens

        c = Check(f"{method}, 8 x 2048 rows", "tokens/s", "Grain", 1.0)
        for _ in range(st.repeats):
            c.add(timed_rate(theirs, st.min_time), timed_rate(ours, st.min_time))
        checks.append(c)
    return checks
