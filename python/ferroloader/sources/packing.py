"""Sequence packing as a batch stage, resumable.

``Packing(seq_len=2048, rows=8, method="best_fit")`` packs variable-length
token sequences into batches of ``rows`` rows of ``seq_len`` tokens::

    packing = ferroloader.Packing(seq_len=2048, rows=8)
    loader = ferroloader.DataLoader(ds, batch_size=64, collate_fn=packing.collate,
                                    num_workers=2)
    packed = packing.wrap(loader)
    for batch in packed:  # {"tokens", "segment_ids", "positions"}, each (rows, seq_len)
        ...
    state = packed.state_dict()  # the loader's state and the sequences carried over

``packing.collate`` turns a batch of samples (1-D integer tensors, arrays
or lists) into one ragged batch (flat tokens and lengths) in the workers;
the packer, in the training process, places each sequence (cut into pieces
of ``seq_len`` where longer) into the first row with room (``first_fit``)
or the row with the least room that fits (``best_fit``); a piece that fits
no row closes the batch. ``segment_ids`` numbers the segments of each row
from 1 (0 is padding, ``tokens`` there is ``pad_id``); ``positions`` counts
tokens within each segment from 0: the layout of Grain's packed batches and
of attention masks built from segment ids. Both steps are Rust loops.

The state holds the pieces placed since the last batch handed over; a
resume pushes them again (each placement depends only on the pieces since
its batch opened), so no token is lost or repeated across a resume.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import ferroloader._core as _core
from ferroloader.errors import ConfigError

METHODS = ("first_fit", "best_fit")


class Packing:
    """How token sequences are packed into batches of ``rows`` rows of
    ``seq_len`` tokens: a sequence longer than ``seq_len`` is cut into
    pieces, and each piece goes, in arrival order, into the first row with
    room (``method="first_fit"``) or the row with the least room that fits
    (``"best_fit"``); a piece no row takes closes the batch. Empty places
    hold ``pad_id``. Use :meth:`collate` as the loader's ``collate_fn`` and
    :meth:`wrap` the loader.

    Each packed batch has ``tokens`` (int64), ``segment_ids`` (int32; 1, 2,
    ... per row, 0 for padding) and ``positions`` (int32, from 0 in each
    segment), each ``(rows, seq_len)``.

    >>> import torch, ferroloader
    >>> seqs = [torch.arange(1, 4), torch.arange(1, 3), torch.arange(1, 6)]
    >>> packing = ferroloader.Packing(seq_len=6, rows=2)
    >>> loader = ferroloader.DataLoader(seqs, batch_size=3, collate_fn=packing.collate)
    >>> batch = next(iter(packing.wrap(loader)))
    >>> batch["tokens"]
    tensor([[1, 2, 3, 1, 2, 0],
            [1, 2, 3, 4, 5, 0]])
    >>> batch["segment_ids"]
    tensor([[1, 1, 1, 2, 2, 0],
            [1, 1, 1, 1, 1, 0]], dtype=torch.int32)
    """

    def __init__(
        self, seq_len: int, rows: int = 1, method: str = "first_fit", pad_id: int = 0
    ) -> None:
        for name, v in (("seq_len", seq_len), ("rows", rows)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"Packing {name} should be a positive integer, got {v!r}")
        # positions are int32 (torch's position ids), and a batch of rows is
        # one allocation of rows * seq_len tokens
        if seq_len > 2**31 - 1:
            raise ConfigError(f"Packing seq_len should be at most 2**31 - 1, got {seq_len}")
        if rows * seq_len > 2**40:
            raise ConfigError(
                f"Packing rows * seq_len should be at most 2**40 tokens a batch, got "
                f"{rows} * {seq_len}"
            )
        if method not in METHODS:
            raise ConfigError(f"Packing method should be one of {METHODS}, got {method!r}")
        if isinstance(pad_id, bool) or not isinstance(pad_id, int):
            raise ConfigError(f"Packing pad_id should be an int, got {pad_id!r}")
        self.seq_len = seq_len
        self.rows = rows
        self.method = method
        self.pad_id = pad_id

    @staticmethod
    def collate(samples: Any) -> dict[str, Any]:
        """A loader's ``collate_fn``: the batch's sequences as one ragged
        batch, ``{"tokens": flat int64, "lengths": int64}``."""
        out: dict[str, Any] = _core.ragged(samples)
        return out

    def packer(self) -> _core.Packer:
        return _core.Packer(self.seq_len, self.rows, self.method, self.pad_id)

    def wrap(self, loader: Any) -> PackedLoader:
        """The packed batches of ``loader`` (whose ``collate_fn`` is
        :meth:`collate`)."""
        return PackedLoader(loader, self)


class PackedLoader:
    """Iterates the packed batches of a loader of ragged batches (what
    :meth:`Packing.wrap` returns); its state is the loader's plus the pieces
    carried over, so a resume gives the same packed batches.

    >>> import torch, ferroloader
    >>> seqs = [torch.arange(n) for n in (5, 3, 4, 2, 6, 1)]
    >>> packing = ferroloader.Packing(seq_len=8, rows=1)
    >>> make = lambda: packing.wrap(
    ...     ferroloader.DataLoader(seqs, batch_size=2, collate_fn=packing.collate))
    >>> packed = make()
    >>> it = iter(packed)
    >>> first = next(it)
    >>> state = packed.state_dict()
    >>> resumed = make()
    >>> resumed.load_state_dict(state)
    >>> [b["tokens"].tolist() for b in resumed] == [b["tokens"].tolist() for b in it]
    True
    """

    def __init__(self, loader: Any, packing: Packing) -> None:
        self.loader = loader
        self.packing = packing
        self._packer: Optional[_core.Packer] = None
        # the pieces a loaded state carried over, pushed first by iter()
        self._restore: list[list[int]] = []
        # the loader's epoch has ended and only the packer's last batches
        # are left (the loader's own state then starts the next epoch)
        self._loader_done = False
        self._resume_done = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        packer = self.packing.packer()
        if self._restore:
            packer.push(Packing.collate(self._restore))
            self._restore = []
        skip, self._resume_done = self._resume_done, False
        self._packer, self._loader_done = packer, skip
        try:
            if not skip:
                for batch in self.loader:
                    packer.push(batch)
                    while (out := packer.pop()) is not None:
                        yield out
                self._loader_done = True
            while (out := packer.flush()) is not None:
                yield out
        finally:
            self._packer = None
            self._loader_done = False

    def __len__(self) -> int:
        raise TypeError(
            "a PackedLoader has no len(): how many packed batches an epoch makes depends on "
            "its sequences' lengths"
        )

    def state_dict(self) -> dict[str, Any]:
        """The loader's position after the last batch the packer took, the
        pieces placed since the last packed batch handed over (as token
        lists), and whether the loader's epoch had ended (only the packer's
        last batches left)."""
        carried = _split(self._packer.pending()) if self._packer is not None else self._restore
        done = self._loader_done if self._packer is not None else self._resume_done
        return {
            "loader": self.loader.state_dict(),
            "packing": {
                "seq_len": self.packing.seq_len,
                "rows": self.packing.rows,
                "method": self.packing.method,
                "carried": [list(c) for c in carried],
                "loader_done": done,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        p = state.get("packing") if isinstance(state, dict) else None
        if not isinstance(p, dict) or "loader" not in state:
            raise ConfigError("load_state_dict(): not a PackedLoader state")
        mine = (self.packing.seq_len, self.packing.rows, self.packing.method)
        saved = (p.get("seq_len"), p.get("rows"), p.get("method"))
        if saved != mine:
            raise ConfigError(
                f"load_state_dict(): the state was packed with (seq_len, rows, method) "
                f"{saved}, this packing is {mine}"
            )
        carried = p.get("carried")
        if not isinstance(carried, list) or not all(
            isinstance(s, list) and all(isinstance(t, int) for t in s) for s in carried
        ):
            raise ConfigError("load_state_dict(): packing.carried is not lists of token ids")
        self.loader.load_state_dict(state["loader"])
        self._restore = [list(c) for c in carried]
        self._resume_done = bool(p.get("loader_done", False))


def _split(ragged: dict[str, Any]) -> list[list[int]]:
    tokens = ragged["tokens"].tolist()
    out, at = [], 0
    for n in ragged["lengths"].tolist():
        out.append(tokens[at : at + n])
        at += n
    return out


__all__ = ["PackedLoader", "Packing"]
