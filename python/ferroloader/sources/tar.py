"""Webdataset-style tar files as shards, read by byte ranges.

A tar in webdataset layout holds samples as consecutive members that share a
key (``0001.jpg``, ``0001.cls``, then ``0002.jpg`` ...). ``TarShards`` reads
each tar's index (where each member's bytes lie) once, then reads a shard's
samples from one contiguous byte range: on local files by seeking, at a URL
by one ranged request into the shard cache. A tar split into shards of
``samples_per_shard`` samples is then fetched only as far as the epoch reads
it (one rank of two fetches about half of each tar).

The index of a tar at a URL comes from its sidecar ``<url>.idx.json``
(``TarShards.write_index`` writes it beside a local tar; upload both); a tar
at a URL without one is downloaded whole once, into the cache, and scanned.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from typing import Any, Iterator, Optional, Sequence, Union

from ferroloader.errors import ConfigError
from ferroloader.sources.remote import ShardCache, cache_for, is_url
from ferroloader.sources.shards import ShardedDataset

# (key, [(extension, data offset, size), ...]): one sample of a tar
_Sample = tuple[str, list[tuple[str, int, int]]]

_INDEX_FORMAT = "ferroloader-tar-index"

# webdataset's split of a member name: the key is everything up to the first
# dot of the file name (directories included), the extension the rest
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)\.([^/]*)$")
# members webdataset skips as metadata (``__meta__``, ``__x__/...``)
_META = re.compile(r"__[^/]*__($|/)")


def _scan(path: str, name: str) -> list[_Sample]:
    """The samples of the uncompressed tar at local ``path`` (``name``: what
    errors call it)."""
    samples: list[_Sample] = []
    try:
        with tarfile.open(path, mode="r:") as tar:
            for m in tar:
                if not m.isfile() or _META.match(m.name):
                    continue
                match = _KEY_EXT.match(m.name)
                if match is None:
                    continue  # no extension: not part of a sample (webdataset skips it too)
                key, ext = match.group(1), match.group(2).lower()
                if not samples or samples[-1][0] != key:
                    samples.append((key, []))
                if any(e == ext for e, _, _ in samples[-1][1]):
                    raise ConfigError(
                        f"TarShards: {name} has two {ext!r} members for the sample {key!r}"
                    )
                samples[-1][1].append((ext, m.offset_data, m.size))
    except tarfile.ReadError as e:
        raise ConfigError(
            f"TarShards: {name} is not an uncompressed tar file ({e}); ranged reads need the "
            "members' offsets, so compressed tars (.tar.gz) are not read"
        ) from None
    return samples


def _parse_index(text: str, name: str) -> list[_Sample]:
    try:
        doc = json.loads(text)
        if doc.get("format") != _INDEX_FORMAT or doc.get("version") != 1:
            raise ValueError("not a ferroloader tar index, version 1")
        return [(str(k), [(str(e), int(o), int(n)) for e, o, n in members])
                for k, members in doc["samples"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"TarShards: the index {name} cannot be read: {e}") from None


class TarShards(ShardedDataset[dict[str, Any]]):
    """Tar files in webdataset layout as shards: each sample a dict of its
    members' bytes by extension (lowercased), with its ``"__key__"`` and
    the tar's path or URL as ``"__url__"``: webdataset's samples (members
    are grouped and named as ``webdataset.WebDataset`` groups them).

    ``tars``: paths or URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://``,
    ``file://``) of uncompressed tars. ``samples_per_shard``: split each tar
    into shards of that many consecutive samples (the last one shorter);
    by default each tar is one shard. ``cache``: the ``ShardCache`` URLs are
    read through (a default one when a URL is given).

    Each shard is read from one byte range of its tar: the samples'
    members, without the headers before the first one. At a URL that range
    is one request, kept in the cache as a piece of its own and fetched
    ahead of the readers in the epoch's order.

    >>> import io, os, tarfile, tempfile, ferroloader
    >>> path = os.path.join(tempfile.mkdtemp(), "shard-0.tar")
    >>> with tarfile.open(path, "w") as tar:
    ...     for k in range(6):
    ...         for ext, data in (("txt", f"sample {k}"), ("cls", str(k % 2))):
    ...             info = tarfile.TarInfo(f"{k:04d}.{ext}")
    ...             info.size = len(data)
    ...             tar.addfile(info, io.BytesIO(data.encode()))
    >>> ds = ferroloader.TarShards([path], samples_per_shard=4)
    >>> [(s[0][-11:], s[1], s[2]) for s in ds.shards()]
    [('shard-0.tar', 0, 4), ('shard-0.tar', 4, 2)]
    >>> sample = next(iter(ds))
    >>> sample["__key__"], sample["txt"], sample["cls"]
    ('0000', b'sample 0', b'0')

    A custom ``collate_fn`` decodes a batch of these (the default collate
    gives lists of bytes).
    """

    def __init__(
        self,
        tars: Sequence[Union[str, os.PathLike[str]]],
        *,
        samples_per_shard: Optional[int] = None,
        cache: Optional[ShardCache] = None,
    ) -> None:
        if isinstance(tars, (str, os.PathLike)):
            raise ConfigError("TarShards: tars should be a list of paths or URLs, not one path")
        self.tars = [os.fspath(t) for t in tars]
        if samples_per_shard is not None and (
            isinstance(samples_per_shard, bool)
            or not isinstance(samples_per_shard, int)
            or samples_per_shard <= 0
        ):
            raise ConfigError(
                f"TarShards: samples_per_shard should be a positive integer or None, got "
                f"{samples_per_shard!r}"
            )
        self.samples_per_shard = samples_per_shard
        self.cache = cache_for(self.tars, cache)
        # each tar's samples, read once (in the main process; workers get
        # them with the dataset)
        self._index: dict[str, list[_Sample]] = {}
        # remote tars with no index: downloaded whole, and read whole
        self._whole: set[str] = set()

    @staticmethod
    def write_index(path: Union[str, os.PathLike[str]]) -> str:
        """Writes the index of the local tar at ``path`` beside it, as
        ``<path>.idx.json``, and returns that path. Upload it with the tar:
        ``TarShards`` then reads a remote tar by ranges from the start."""
        path = os.fspath(path)
        samples = _scan(path, path)
        out = path + ".idx.json"
        with open(out, "w") as f:
            json.dump({"format": _INDEX_FORMAT, "version": 1, "samples": samples}, f,
                      separators=(",", ":"))
        return out

    def _samples(self, tar: str) -> list[_Sample]:
        got = self._index.get(tar)
        if got is not None:
            return got
        if self.cache is not None and is_url(tar):
            try:
                with self.cache.open(tar + ".idx.json") as local, open(local) as f:
                    got = _parse_index(f.read(), tar + ".idx.json")
            except FileNotFoundError:
                # no index: the whole tar, once, scanned where it lies in the cache
                with self.cache.open(tar) as local:
                    got = _scan(local, tar)
                self._whole.add(tar)
        else:
            got = _scan(tar, tar)
        self._index[tar] = got
        return got

    def shards(self) -> list[tuple[str, int, int]]:
        if self.cache is not None:  # remote indexes read side by side
            self.cache.each(self._samples, [t for t in self.tars if t not in self._index])
        out = []
        for tar in self.tars:
            n = len(self._samples(tar))
            step = self.samples_per_shard or max(n, 1)
            out += [(tar, first, min(step, n - first)) for first in range(0, n, step)]
        return out

    def shard_len(self, shard: Any) -> Optional[int]:
        return int(shard[2])

    def _span(self, shard: Any) -> tuple[int, int]:
        """The byte range of ``shard``'s members in its tar."""
        tar, first, count = shard
        samples = self._samples(tar)[first : first + count]
        if not samples:
            return (0, 0)
        lo = samples[0][1][0][1]
        last = samples[-1][1][-1]
        return (lo, last[1] + last[2])

    def iter_shard(self, shard: Any, start: int = 0) -> Iterator[dict[str, Any]]:
        tar, first, count = shard
        samples = self._samples(tar)[first + start : first + count]
        if not samples:
            return
        if self.cache is not None and is_url(tar):
            if tar in self._whole:
                lo, hi = 0, None
            else:
                lo, hi = self._span(shard)  # the whole shard's piece, as prefetched
            with self.cache.open(tar, lo if hi else None, hi) as local, open(local, "rb") as f:
                yield from _read(f, tar, samples, lo)
        else:
            with open(tar, "rb") as f:
                yield from _read(f, tar, samples, 0)

    def _remote(self, shards: Sequence[Any]) -> Optional[tuple[Any, list[Any]]]:
        if self.cache is None:
            return None
        pieces: list[Any] = []
        for s in shards:
            if not is_url(s[0]) or s[2] == 0:
                pieces.append(None)
            elif s[0] in self._whole:
                pieces.append(s[0])
            else:
                pieces.append((s[0], self._span(s)))
        return self.cache, pieces


def _read(f: Any, tar: str, samples: list[_Sample], base: int) -> Iterator[dict[str, Any]]:
    """The samples' members from ``f``, which holds the bytes of ``tar``
    from offset ``base`` on."""
    for key, members in samples:
        sample: dict[str, Any] = {"__key__": key, "__url__": tar}
        for ext, offset, size in members:
            f.seek(offset - base)
            data = f.read(size)
            if len(data) != size:
                raise OSError(f"TarShards: sample {key!r} ends before its {ext!r} member does")
            sample[ext] = data
        yield sample


__all__ = ["TarShards"]
