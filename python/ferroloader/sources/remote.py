"""Shards where they live: ``FileShards`` and ``TableShards`` take URLs
(``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``) beside local
paths, and read them through a local disk cache (:class:`ShardCache`).

The engine downloads (Rust's ``object_store``, without the GIL): credentials
and endpoints come from each store's standard environment (``AWS_*``,
``GOOGLE_*``, ``AZURE_*``) and from ``ShardCache(options=...)``. Each epoch
the main process fetches its rank's shards in the order the epoch reads
them, ahead of the workers and within the cache's byte budget; a worker
that reaches a shard first downloads it itself. Every process on the
machine (workers, ranks) shares the cache directory, so a shard is
downloaded once while it fits. See ``docs/guide/remote.md``.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
import weakref
from dataclasses import astuple, dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar

import ferroloader._core as _core
from ferroloader.errors import ConfigError
from ferroloader.sources.cache_settings import (
    _MAX_BYTES,
    _check_option,
    _check_options,
    _default_budget,
    _default_dir,
    _parse_bytes,
    _show_bytes,
)

_T = TypeVar("_T")



def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL the shard cache reads (rather than a local path)."""
    return isinstance(path, str) and _core.is_url(path)


@dataclass
class CacheStats:
    """What the shard cache did for one loader, summed over its processes:
    bytes downloaded, objects downloaded, opens that found the shard cached
    (``hits``) or waited for it (``misses``), the seconds readers waited on
    the network (``waited``), and downloads of objects the cache had
    evicted before (``redownloads``: a budget below what the readers keep
    open fetches shards again). ``DataLoader.stats().remote`` gives them
    for a loader over remote shards.

    >>> import ferroloader
    >>> stats = ferroloader.CacheStats(fetched_bytes=3 << 20, downloads=3, hits=9, misses=3)
    >>> print(stats)  # doctest: +NORMALIZE_WHITESPACE
    shard cache: 3.0 MiB fetched in 3 downloads (0 again after eviction); 9 hits,
    3 misses; readers waited 0.000 s
    """

    fetched_bytes: int = 0
    downloads: int = 0
    hits: int = 0
    misses: int = 0
    waited: float = 0.0
    redownloads: int = 0

    def __add__(self, other: CacheStats) -> CacheStats:
        return CacheStats(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def __str__(self) -> str:
        return (
            f"shard cache: {self.fetched_bytes / 2**20:.1f} MiB fetched in {self.downloads} "
            f"downloads ({self.redownloads} again after eviction); {self.hits} hits, "
            f"{self.misses} misses; readers waited {self.waited:.3f} s"
        )


class ShardCache:
    """The local disk cache remote shards are read through.

    ``dir``: where (default ``$FERROLOADER_CACHE_DIR``, else
    ``~/.cache/ferroloader/shards``); every process that names the same
    directory shares it. ``budget``: the most bytes it holds, as an int or a
    string like ``"20GiB"`` (default ``$FERROLOADER_CACHE_BUDGET``, else 16
    GiB; ``MB`` is 10**6 bytes, ``MiB`` and ``M`` 2**20); least recently
    read shards are evicted first, and never one that is being read. It
    must hold the largest shard; with room for as many shards as are read
    at once (the lanes of static sharding, the workers of dynamic) readers
    keep theirs open between batches, with less they let go of them after
    each batch (``short_of_room``), slower but never stuck. ``options``: settings
    for the stores, on top of their environment (``object_store``'s keys,
    such as ``aws_endpoint``, ``aws_region``, ``allow_http`` (every store;
    ``aws_allow_http`` is the same for S3),
    ``google_service_account``, ``azure_storage_account_name``).
    ``streams``: how many downloads the prefetcher runs at once (each takes
    the next shard in the epoch's order).

    >>> import os, tempfile, ferroloader
    >>> src = os.path.join(tempfile.mkdtemp(), "part-0.txt")
    >>> with open(src, "w") as f:
    ...     _ = f.write("a\\nb\\n")
    >>> cache = ferroloader.ShardCache(dir=tempfile.mkdtemp(), budget="1MiB")
    >>> with cache.open("file://" + src) as path:
    ...     open(path).read().split()
    ['a', 'b']
    """

    def __repr__(self) -> str:
        return (
            f"ShardCache(dir={self.dir!r}, budget={_show_bytes(self.budget)!r}, "
            f"streams={self.streams})"
        )

    def __init__(
        self,
        dir: Optional[str] = None,
        budget: Any = None,
        options: Optional[Mapping[str, str]] = None,
        streams: int = 8,
    ) -> None:
        if dir is not None and not isinstance(dir, (str, os.PathLike)):
            raise ConfigError(f"ShardCache dir should be a path (a str or os.PathLike), but got "
                              f"dir={dir!r}")
        self.dir = os.path.abspath(os.fspath(dir)) if dir is not None else _default_dir()
        if budget is None:
            self.budget = _default_budget()
        elif isinstance(budget, str):
            try:
                self.budget = _parse_bytes(budget)
            except ValueError as e:
                raise ConfigError(f"ShardCache budget: {e}") from None
        elif (isinstance(budget, bool) or not isinstance(budget, int)
              or not 1 <= budget <= _MAX_BYTES):
            raise ConfigError(f"ShardCache budget should be a positive int (at most 2**64 - 1) "
                              f"or a size string, but got {budget!r}")
        else:
            self.budget = budget
        self.options = _check_options(options)
        for key in ("retries", "retry_timeout"):
            if key in self.options:
                _check_option(key, self.options[key])
        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise ConfigError(f"ShardCache streams should be a positive int, but got {streams!r}")
        self.streams = streams
        # names this cache's per-process counters (see stats())
        self._token = uuid.uuid4().hex
        self._native_box: list[Any] = []
        # the counters' folder goes with the object that made it (copies in
        # workers do not own it)
        weakref.finalize(self, _remove_owned, os.getpid(), self._counters_dir())

    def _native(self) -> Any:
        if not self._native_box or self._native_box[0][0] != os.getpid():
            core = _core.ShardCacheCore(self.dir, self.budget, sorted(self.options.items()))
            self._native_box[:] = [(os.getpid(), core)]
        return self._native_box[0][1]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_native_box"] = []  # each process opens the directory itself
        return state

    def open(self, url: str, start: Optional[int] = None, end: Optional[int] = None) -> _Opened:
        """``with cache.open(url) as path:``: the object's local path, kept
        in the cache (pinned) until the block ends; downloaded first if it
        is not there. With ``start`` and ``end``, a file holding only bytes
        ``start:end`` of the object (a ranged read, kept apart). A missing
        object is ``FileNotFoundError``, a refused one ``PermissionError``,
        both naming the URL."""
        return _Opened(self, url, start, end)

    def each(self, fn: Callable[[Any], _T], items: Iterable[Any], threads: int = 16) -> list[_T]:
        """``[fn(x) for x in items]``, ``threads`` at a time: for reading
        many objects' footers or indexes through this cache, where each
        call waits on the network (without the GIL). The first error is
        raised."""
        items = list(items)
        if len(items) <= 1:
            return [fn(x) for x in items]
        self._publish()  # opened once here, not raced for by the threads
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(threads, len(items))) as pool:
            return list(pool.map(fn, items))

    def pin(self, url: str) -> Any:
        """The object at ``url`` pinned until the returned handle is
        collected (or its ``release()``): its ``path`` stays in the cache,
        for a file that is mapped rather than read (``TableDataset``)."""
        pin = self._native().open(url)
        self._publish()
        return pin

    def read(self, url: str, read: Callable[[str], Iterable[_T]]) -> Iterator[_T]:
        """The items of ``read(local_path)``, the object pinned while they
        are read (the object is fetched at the first item)."""
        pin = self._native().open(url)
        try:
            yield from read(pin.path)
        finally:
            pin.release()
            self._publish()

    def short_of_room(self) -> bool:
        """Whether the loaders reading through this cache's directory claim
        more room for the shards their readers keep open between batches
        than the budget holds (each loader claims it at ``iter()``: its
        lanes times its largest shards). Readers then let go of their
        shards after each batch and reopen them where they stood, so a
        budget of one shard still finishes the epoch, only slower."""
        return bool(self._native().short_of_room())

    def prefetch(self, urls: Iterable[str]) -> Prefetch:
        """Starts fetching ``urls`` in order, ahead of their readers and
        within the budget; the handle's ``stop()`` (or its collection) ends it."""
        return self.prefetch_pieces([(u, None) for u in urls if is_url(u)])

    def prefetch_pieces(
        self, pieces: Iterable[tuple[str, Optional[tuple[int, int]]]], hold: int = 0,
        streams: Optional[int] = None, readers: int = 0,
    ) -> Prefetch:
        """``prefetch`` of ``(url, (start, end) or None)`` pieces: parts of
        objects (Parquet row groups) or whole ones. ``hold``: the bytes the
        loader's ``readers`` may keep open between batches, claimed as a
        lease on the cache's room while the handle lives (``lease``)."""
        native = self._native()
        items = [(u, r, native.known_size(u)) for u, r in pieces]
        lease = native.lease(hold, readers)
        return Prefetch(native.prefetch(items, streams or self.streams), lease)

    def lease(self, hold: int, readers: int) -> Any:
        """Claims ``hold`` bytes of room for what a loader's ``readers``
        keep open between batches, while the returned handle lives (see
        ``short_of_room``); ``None`` for nothing. A budget below ``hold``
        warns once (``CacheBudgetWarning``): every reader then opens its
        shard again after each batch, and downloads it again if evicted."""
        return self._native().lease(hold, readers)

    def sizes(self, urls: list[str]) -> list[int]:
        """The objects' sizes in bytes (asked 32 at a time), remembered by
        this process's handle on the cache."""
        return list(self._native().sizes(urls))

    def check(self, urls: list[str], ranges: Optional[list[Optional[tuple[int, int]]]] = None
              ) -> list[int]:
        """A clear error now, rather than at the first read, when the cache
        cannot hold one of the objects at ``urls`` (or the byte ranges of
        them given by ``ranges``): larger than the budget, or than the disk
        has free. Returns their sizes."""
        return list(self._native().check(list(zip(urls, ranges or [None] * len(urls)))))

    def _counters_dir(self) -> str:
        return os.path.join(self.dir, ".stats", self._token)

    def _publish(self) -> None:
        """Writes this process's counters where ``stats()`` reads them (a
        file per process, written in place after every shard)."""
        self._native().publish(self._counters_dir())

    def stats(self) -> CacheStats:
        """The counters of every process that used this cache object (the
        main process's prefetcher, the workers), summed."""
        self._publish()
        return CacheStats(*_core.ShardCacheCore.published(self._counters_dir()))


def _remove_owned(owner: int, path: str) -> None:
    """Removes ``path`` in the process ``owner`` only (a forked worker's
    copy of the cache object is collected in the worker)."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def cache_for(paths: Iterable[Any], cache: Optional[ShardCache]) -> Optional[ShardCache]:
    """The cache a dataset over ``paths`` reads URLs through: ``cache``, or
    a default ``ShardCache`` when one of them is a URL (``None`` when all
    are local). A URL of a scheme no store reads is an error, not a path."""
    if cache is not None and not isinstance(cache, ShardCache):
        hint = (f" (for a folder: cache=ferroloader.ShardCache(dir={cache!r}))"
                if isinstance(cache, (str, os.PathLike)) else "")
        raise ConfigError(f"cache should be a ferroloader.ShardCache or None, but got "
                          f"cache={cache!r}{hint}")
    paths = list(paths)
    for p in paths:
        m = _SCHEME.match(p) if isinstance(p, str) else None
        if m is not None and not is_url(p):
            raise ConfigError(
                f"{p!r}: no store reads {m.group(1)}:// URLs (s3://, gs://, az://, abfs(s)://, "
                "http(s):// and file:// are read through the shard cache; a local path has no "
                "scheme)"
            )
    if cache is not None or not any(is_url(p) for p in paths):
        return cache
    return ShardCache()


class Prefetch:
    """A prefetch under way (``ShardCache.prefetch``), and the loader's
    lease on the cache's room, both ended when it is collected; ``stop()``
    ends the downloads only."""

    def __init__(self, native: Any, lease: Any = None) -> None:
        self._native = native
        self._lease = lease

    def stop(self) -> None:
        self._native.stop()


class _Opened:
    def __init__(self, cache: ShardCache, url: str, start: Optional[int],
                 end: Optional[int]) -> None:
        self._cache, self._url, self._range = cache, url, (start, end)
        self._pin: Optional[Any] = None

    def __enter__(self) -> str:
        pin = self._cache._native().open(self._url, *self._range)
        self._pin = pin
        return str(pin.path)

    def __exit__(self, *exc: Any) -> None:
        if self._pin is not None:
            self._pin.release()
        self._cache._publish()


__all__ = ["CacheStats", "Prefetch", "ShardCache", "is_url"]


def fetch_ahead(cache: ShardCache, pieces: Sequence[Any], holders: int = 0) -> Optional[Any]:
    """Starts fetching ``pieces`` into ``cache`` in the order given (each a
    URL, ``(url, (start, end))``, or ``None`` for a local shard; repeats
    are fetched once), after checking the cache can hold each: the
    prefetch handle, or ``None`` when nothing is remote. ``holders``
    readers may each keep one piece open between batches: the handle holds
    a lease on the room the largest of them take (``ShardCache.short_of_room``)."""
    return cache._native().fetch_ahead(list(pieces), holders, cache.streams)
