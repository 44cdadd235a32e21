"""Shards read from object storage through the shard cache: the same
batches as from local files in every sharding mode, with processes and
threads, across a resume; the cache's budget, sharing and errors."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from typing import Any, Iterator

import ferroloader as fl
import numpy as np
import pytest
from remote_servers import HttpServer, free_port, gloo_rank, read_ints
from shard_cases import write_int_shards

pytestmark = pytest.mark.timeout(120)

LENS = [7, 1, 23, 3, 0, 5, 9, 2, 12, 4, 6, 1, 8]


def write_shards(folder: str, lens: list[int] = LENS) -> list[str]:
    return write_int_shards(folder, lens)


@pytest.fixture(scope="module")
def local_shards(tmp_path_factory: Any) -> list[str]:
    return write_shards(str(tmp_path_factory.mktemp("shards")))


@pytest.fixture(scope="module")
def s3_urls(s3_server: Any, local_shards: list[str]) -> list[str]:
    bucket = f"b{uuid.uuid4().hex[:12]}"
    s3_server.bucket(bucket)
    urls = []
    for p in local_shards:
        with open(p, "rb") as f:
            s3_server.put(bucket, f"data/{os.path.basename(p)}", f.read())
        urls.append(f"s3://{bucket}/data/{os.path.basename(p)}")
    return urls


@pytest.fixture(scope="module")
def http_urls(local_shards: list[str]) -> Iterator[list[str]]:
    server = HttpServer(os.path.dirname(local_shards[0]))
    yield [f"{server.url}/{os.path.basename(p)}" for p in local_shards]
    server.close()


def _loader(paths: list[str], cache: Any = None, mode: str = "static", nw: int = 0,
            method: str = "multiprocessing", **kw: Any) -> Any:
    ds = fl.FileShards(paths, read_ints, lengths=LENS, cache=cache)
    extra = {} if nw == 0 else {"worker_method": method}
    return fl.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=nw,
                         sharding=fl.Sharding(mode=mode), **extra, **kw)


def _batches(loader: Any) -> list[list[int]]:
    return [b.tolist() for b in loader]


CASES = [
    ("static", 0, "multiprocessing"),
    ("static", 2, "multiprocessing"),
    ("static", 2, "thread"),
    ("elastic", 2, "multiprocessing"),
    ("dynamic", 2, "multiprocessing"),
    ("dynamic", 2, "thread"),
]


@pytest.mark.parametrize("mode,nw,method", CASES)
@pytest.mark.parametrize("store", ["s3", "http"])
def test_the_same_batches_as_from_local_files(request, tmp_path, local_shards, store, mode, nw,
                                              method):
    urls = request.getfixturevalue(f"{store}_urls")
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    want = [_batches(_loader(local_shards, mode=mode, nw=nw, method=method)) for _ in range(1)]
    remote = _loader(urls, cache, mode=mode, nw=nw, method=method)
    got = _batches(remote)
    if mode == "dynamic":  # the batch order depends on timing; the items do not
        assert sorted(v for b in got for v in b) == sorted(v for b in want[0] for v in b)
        assert len(got) == len(want[0])
    else:
        assert got == want[0]
    stats = remote.stats().remote
    # every shard was downloaded once, by the prefetcher or a reader (an
    # empty one need not be: elastic sharding reads items by address)
    assert sum(n > 0 for n in LENS) <= stats.downloads <= len(urls)
    assert stats.fetched_bytes == sum(LENS) * 8


def test_a_second_epoch_reads_from_the_cache(tmp_path, s3_urls, local_shards):
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    loader = _loader(s3_urls, cache, nw=2)
    local = _loader(local_shards, nw=2)
    assert _batches(loader) == _batches(local)
    first = loader.stats().remote
    assert _batches(loader) == _batches(local)  # the next epoch's order, the same
    second = loader.stats().remote
    assert second.downloads == first.downloads == len(s3_urls)
    assert second.hits > first.hits


@pytest.mark.parametrize("mode", ["static", "elastic"])
def test_resume_mid_epoch_reads_exactly_the_rest(tmp_path, s3_urls, local_shards, mode):
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    want = _batches(_loader(local_shards, mode=mode, nw=2))
    first = fl.StatefulDataLoader(
        fl.FileShards(s3_urls, read_ints, lengths=LENS, cache=cache), batch_size=4,
        shuffle=True, seed=3, num_workers=2, sharding=fl.Sharding(mode=mode))
    it = iter(first)
    head = [next(it).tolist() for _ in range(5)]
    sd = first.state_dict()
    del it
    again = fl.StatefulDataLoader(
        fl.FileShards(s3_urls, read_ints, lengths=LENS, cache=cache), batch_size=4,
        shuffle=True, seed=3, num_workers=1, sharding=fl.Sharding(mode=mode))
    again.load_state_dict(sd)
    assert head + _batches(again) == want


def test_two_ranks_on_one_machine_fetch_each_shard_once(tmp_path, s3_urls, local_shards):
    cache_dir = str(tmp_path / "cache")
    got, want = [], []
    for rank in range(2):
        sharding = fl.Sharding(mode="elastic", rank=rank, world_size=2)
        cache = fl.ShardCache(dir=cache_dir, budget="1MiB")
        remote = fl.DataLoader(fl.FileShards(s3_urls, read_ints, lengths=LENS, cache=cache),
                               batch_size=4, shuffle=True, seed=3, num_workers=2,
                               sharding=sharding)
        local = fl.DataLoader(fl.FileShards(local_shards, read_ints, lengths=LENS),
                              batch_size=4, shuffle=True, seed=3, num_workers=2,
                              sharding=sharding)
        got.append(_batches(remote))
        want.append(_batches(local))
        downloads = remote.stats().remote.downloads
        # rank 0 downloads every shard with items; rank 1 finds them all in
        # the shared cache
        assert downloads == (sum(n > 0 for n in LENS) if rank == 0 else 0)
    assert got == want


def test_two_gloo_ranks_read_their_shares_and_fetch_each_shard_once(tmp_path, s3_urls,
                                                                  local_shards):
    """Two ranks from torch.distributed (gloo over loopback, spawned), 2
    workers each, one cache directory: each rank's batches are those of the
    same rank over local files, and the ranks together download each shard
    once (elastic ranks read every shard; static ranks their own)."""
    import json

    import torch.multiprocessing as tmp

    tmp.start_processes(
        gloo_rank,
        args=(2, free_port(), str(tmp_path), s3_urls, LENS, str(tmp_path / "cache")),
        nprocs=2, join=True, start_method="spawn",
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for mode in ("static", "elastic"):
        for r in range(2):
            local = fl.DataLoader(
                fl.FileShards(local_shards, read_ints, lengths=LENS), batch_size=4,
                shuffle=True, seed=3, sharding=fl.Sharding(mode=mode, rank=r, world_size=2))
            assert ranks[r][mode]["batches"] == _batches(local), (mode, r)
        downloads = sum(ranks[r][mode]["downloads"] for r in range(2))
        assert sum(n > 0 for n in LENS) <= downloads <= len(s3_urls), mode
        if mode == "elastic":
            assert downloads == sum(n > 0 for n in LENS)


def _cache_bytes(d: str) -> int:
    total = 0
    for name in os.listdir(d):
        if name.startswith(".") or name.endswith(".lock"):
            continue
        try:
            total += os.stat(os.path.join(d, name)).st_size
        except FileNotFoundError:
            pass
    return total


def _uploaded(s3_server: Any, folder: str, lens: list[int]) -> tuple[str, list[str], list[str]]:
    """Shards written under ``folder`` and put in a new bucket: ``(bucket,
    paths, urls)``."""
    bucket = f"b{uuid.uuid4().hex[:12]}"
    s3_server.bucket(bucket)
    local = write_shards(folder, lens)
    for p in local:
        with open(p, "rb") as f:
            s3_server.put(bucket, os.path.basename(p), f.read())
    return bucket, local, [f"s3://{bucket}/{os.path.basename(p)}" for p in local]


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_the_cache_never_exceeds_its_budget(tmp_path, s3_server, mode):
    lens = [400] * 12  # 3,200 bytes a shard
    _, _, urls = _uploaded(s3_server, str(tmp_path / "src"), lens)
    cache_dir = str(tmp_path / "cache")
    budget = 3200 * 4  # 2 lanes read at once, 2 more ahead
    cache = fl.ShardCache(dir=cache_dir, budget=budget)
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if os.path.isdir(cache_dir):
                peak[0] = max(peak[0], _cache_bytes(cache_dir))
            time.sleep(0.001)

    w = threading.Thread(target=watch)
    w.start()
    try:
        ds = fl.FileShards(urls, read_ints, lengths=lens, cache=cache)
        loader = fl.DataLoader(ds, batch_size=50, num_workers=2,
                               sharding=fl.Sharding(mode=mode, lanes=2))
        got = sorted(v for b in loader for v in b.tolist())
    finally:
        stop.set()
        w.join()
    assert got == sorted(1000 * s + o for s in range(12) for o in range(400))
    assert 0 < peak[0] <= budget
    assert loader.stats().remote.downloads >= len(urls)


def test_a_budget_below_one_shard_is_an_error_at_iter(tmp_path, s3_urls):
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget=16)
    loader = _loader(s3_urls, cache, nw=2)
    with pytest.raises(fl.ConfigError, match=r"below one shard.*budget=") as info:
        iter(loader)
    assert "s3://" in str(info.value)


@pytest.mark.parametrize("mode", ["static", "dynamic", "elastic"])
def test_a_missing_object_is_an_error_naming_it_at_iter(tmp_path, s3_server, s3_urls, mode):
    """The remote page's promise: the sizes of a rank's shards are read at
    iter(), so a missing one is named there, before any worker starts."""
    bucket = s3_urls[0].split("/")[2]
    missing = f"s3://{bucket}/data/not-there.bin"
    urls = [*s3_urls[:3], missing]
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    ds = fl.FileShards(urls, read_ints, lengths=[*LENS[:3], 4], cache=cache)
    loader = fl.DataLoader(ds, batch_size=4, num_workers=2, sharding=fl.Sharding(mode=mode))
    with pytest.raises(FileNotFoundError, match=r"not-there\.bin"):
        iter(loader)


def test_an_object_deleted_mid_epoch_is_named_and_nothing_is_read_twice(tmp_path, s3_server):
    lens = [6] * 6
    bucket, local, urls = _uploaded(s3_server, str(tmp_path / "src"), lens)
    # a budget of one shard: the prefetcher cannot run ahead, so the last
    # shard is fetched only when it is read
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget=48)
    ds = fl.FileShards(urls, read_ints, lengths=lens, cache=cache)
    loader = fl.DataLoader(ds, batch_size=3, sharding=fl.Sharding(lanes=1))
    seen: list[int] = []
    it = iter(loader)
    seen += next(it).tolist()
    s3_server.delete(bucket, os.path.basename(local[-1]))
    with pytest.raises(FileNotFoundError, match=re.escape(os.path.basename(local[-1]))):
        for b in it:
            seen += b.tolist()
    assert len(seen) == len(set(seen)) == 30  # every item before the missing shard, once


def test_bad_urls_and_budgets_are_clear_errors(tmp_path):
    with pytest.raises(fl.ConfigError, match="budget"):
        fl.ShardCache(dir=str(tmp_path), budget="lots")
    with pytest.raises(fl.ConfigError, match="budget"):
        fl.ShardCache(dir=str(tmp_path), budget=0)
    cache = fl.ShardCache(dir=str(tmp_path), budget="1MiB")
    with pytest.raises(ValueError, match="cannot read"):
        with cache.open("s3://"):
            pass


@pytest.mark.parametrize("budget", ["-1", "-5GiB", "0", "0.1", "nan", "inf", "1e30", "10 XB",
                                    -1, 0, 2**64, 1.5, True])
def test_budgets_that_are_not_positive_sizes_are_refused(tmp_path, budget):
    with pytest.raises(fl.ConfigError, match="budget"):
        fl.ShardCache(dir=str(tmp_path), budget=budget)


@pytest.mark.parametrize("text,size,shown", [
    ("10 MB", 10**7, "10000000B"), ("10MiB", 10 << 20, "10MiB"), ("10M", 10 << 20, "10MiB"),
    ("1.5GB", 15 * 10**8, "1500000000B"), ("2 gib", 2 << 30, "2GiB"), ("4096", 4096, "4KiB"),
    ("1kB", 1000, "1000B"), ("1KiB", 1024, "1KiB")])
def test_budget_units_are_si_or_iec_as_written(tmp_path, text, size, shown):
    cache = fl.ShardCache(dir=str(tmp_path), budget=text)
    assert cache.budget == size
    assert f"budget={shown!r}" in repr(cache)


def test_file_urls_read_like_paths(tmp_path, local_shards):
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    urls = ["file://" + p for p in local_shards]
    assert _batches(_loader(urls, cache, nw=2)) == _batches(_loader(local_shards, nw=2))


def test_table_shards_from_s3_match_local_parquet(tmp_path, s3_server):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    bucket = f"b{uuid.uuid4().hex[:12]}"
    s3_server.bucket(bucket)
    paths = []
    for k in range(3):
        p = str(tmp_path / f"part-{k}.parquet")
        pq.write_table(pa.table({"x": np.arange(k * 100, k * 100 + 37, dtype=np.float32),
                                 "y": np.arange(37) + k}), p, row_group_size=10)
        with open(p, "rb") as f:
            s3_server.put(bucket, os.path.basename(p), f.read())
        paths.append(p)
    urls = [f"s3://{bucket}/{os.path.basename(p)}" for p in paths]
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")

    def epoch(ds: Any) -> list[Any]:
        loader = fl.DataLoader(ds, batch_size=8, shuffle=True, seed=1, num_workers=2)
        return [(b["x"].tolist(), b["y"].tolist()) for b in loader]

    assert epoch(fl.TableShards(urls, cache=cache)) == epoch(fl.TableShards(paths))


@pytest.fixture
def proxy(s3_server: Any) -> Iterator[Any]:
    from remote_servers import FaultProxy

    p = FaultProxy(f"127.0.0.1:{s3_server.port}")
    yield p
    p.close()


def _through(proxy: Any, tmp_path: Any, **options: str) -> Any:
    return fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB",
                         options={"aws_endpoint": proxy.url, **options})


@pytest.mark.parametrize("nw", [0, 2])
def test_dropped_connections_and_500s_are_retried_and_nothing_is_lost(tmp_path, s3_urls,
                                                                      local_shards, proxy, nw):
    proxy.drop, proxy.errors = 4, 5
    cache = _through(proxy, tmp_path)
    got = _batches(_loader(s3_urls, cache, nw=nw))
    assert got == _batches(_loader(local_shards, nw=nw))
    assert proxy.drop == 0 and proxy.errors <= 0  # every fault was met
    stats = _loader(s3_urls, cache, nw=nw).stats()  # a fresh loader: its own counters
    assert stats.remote is not None
    # each object in the cache whole: the cut transfers were resumed, not kept short
    for url, path in zip(s3_urls, local_shards):
        with cache.open(url) as cached, open(path, "rb") as f:
            assert open(cached, "rb").read() == f.read()


def test_added_latency_costs_time_not_batches(tmp_path, s3_urls, local_shards, proxy):
    proxy.latency = 0.02
    cache = _through(proxy, tmp_path)
    loader = _loader(s3_urls, cache, nw=2)
    assert _batches(loader) == _batches(_loader(local_shards, nw=2))
    assert loader.stats().remote.downloads >= sum(n > 0 for n in LENS)


def test_a_store_that_keeps_failing_is_an_error_naming_the_url_not_a_hang(tmp_path, s3_urls,
                                                                          proxy):
    proxy.errors = 10**6
    cache = _through(proxy, tmp_path, retries="2", retry_timeout="5")
    loader = _loader(s3_urls, cache, nw=2)
    t0 = time.monotonic()
    with pytest.raises(OSError, match=r"s3://.*(500|Internal|Server)") as info:
        list(loader)
    assert time.monotonic() - t0 < 60
    assert not isinstance(info.value, FileNotFoundError)


def test_denied_is_a_permission_error_naming_the_url(tmp_path, s3_urls):
    # moto checks no credentials, so an HTTP server's 403 stands in for a
    # refused request
    import http.server

    class Deny(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Deny)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/secret.bin"
        cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
        with pytest.raises(PermissionError, match=r"secret\.bin"):
            with cache.open(url):
                pass
    finally:
        server.shutdown()
        server.server_close()


def test_a_remote_parquet_file_is_read_by_ranges(tmp_path, s3_server):
    """Of a remote Parquet file only the footer and the shards' row groups
    (their selected columns) are fetched, and the rows are those of the
    local file."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(0)
    n = 40_000
    table = pa.table({"x": rng.standard_normal(n).astype(np.float32),
                      "y": np.arange(n), "z": rng.standard_normal((n,)).astype(np.float64)})
    path = str(tmp_path / "data.parquet")
    pq.write_table(table, path, row_group_size=5000, compression="none")
    bucket = f"b{uuid.uuid4().hex[:12]}"
    s3_server.bucket(bucket)
    with open(path, "rb") as f:
        s3_server.put(bucket, "data.parquet", f.read())
    url = f"s3://{bucket}/data.parquet"
    size = os.path.getsize(path)

    def epoch(ds: Any) -> list[Any]:
        loader = fl.DataLoader(ds, batch_size=512, shuffle=True, seed=2, num_workers=2)
        return [{k: v.tolist() for k, v in b.items()} for b in loader]

    for columns in (None, ["x"]):
        cache = fl.ShardCache(dir=str(tmp_path / f"cache-{columns}"), budget="2MiB")
        remote = fl.TableShards(url, columns=columns, cache=cache)
        assert len(remote.shards()) == 8
        loader = fl.DataLoader(remote, batch_size=512, shuffle=True, seed=2, num_workers=2)
        got = [{k: v.tolist() for k, v in b.items()} for b in loader]
        assert got == epoch(fl.TableShards(path, columns=columns))
        fetched = loader.stats().remote.fetched_bytes
        files = [f for f in os.listdir(cache.dir) if not f.startswith(".") and
                 not f.endswith(".lock")]
        held = sum(os.path.getsize(os.path.join(cache.dir, f)) for f in files)
        if columns is None:
            assert held <= size + (64 << 10)  # the row groups and the footer, once
        else:
            assert held < size / 2  # one column of three, and the footer
        assert fetched == held  # each piece downloaded once


def test_streams_must_be_a_positive_int(tmp_path):
    for bad in (0, -1, 2.5, True):
        with pytest.raises(fl.ConfigError, match="streams"):
            fl.ShardCache(dir=str(tmp_path), streams=bad)
    assert fl.ShardCache(dir=str(tmp_path)).streams == 8


def test_a_process_forked_while_the_prefetcher_downloads_holds_no_lock(tmp_path, s3_server,
                                                                        proxy):
    """Workers may be forked while the prefetcher holds a lock on the cache:
    the forked copy of the descriptor must not keep it (another process
    would wait on it for as long as the child lives)."""
    import signal
    import warnings

    lens = [400] * 10  # 3,200 bytes a shard
    _, local, urls = _uploaded(s3_server, str(tmp_path / "src"), lens)
    proxy.latency = 0.05  # each download holds its object's lock that long
    options = {"aws_endpoint": proxy.url}
    cache_dir = str(tmp_path / "cache")
    cache = fl.ShardCache(dir=cache_dir, budget=3200 * 3, options=options, streams=2)
    children = []
    try:
        prefetch = cache.prefetch(urls)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork beside threads
            for _ in range(12):
                pid = os.fork()
                if pid == 0:  # the child only sleeps, holding what it inherited
                    time.sleep(120)
                    os._exit(0)
                children.append(pid)
                time.sleep(0.02)
        prefetch.stop()
        # the children still live: every object can be downloaded, evicted
        # and pinned again, by another cache on the same directory
        reader = fl.ShardCache(dir=cache_dir, budget=3200 * 3, options=options)
        got: list[bytes] = []

        def read_all() -> None:
            for url in reversed(urls):
                with reader.open(url) as path, open(path, "rb") as f:
                    got.append(f.read())

        t = threading.Thread(target=read_all, daemon=True)
        t.start()
        t.join(60)
        assert not t.is_alive(), "a lock of the cache was still held by a forked child"
        want = []
        for p in reversed(local):
            with open(p, "rb") as f:
                want.append(f.read())
        assert got == want
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_table_dataset_maps_an_arrow_file_at_a_url_from_the_cache(tmp_path, s3_server):
    import pyarrow as pa
    import pyarrow.ipc as ipc

    table = pa.table({"x": np.arange(100, dtype=np.int64), "y": np.arange(100) * 0.5})
    path = str(tmp_path / "t.arrow")
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table, max_chunksize=30)
    bucket = f"b{uuid.uuid4().hex[:12]}"
    s3_server.bucket(bucket)
    with open(path, "rb") as f:
        s3_server.put(bucket, "t.arrow", f.read())
    s3_server.put(bucket, "t.parquet", b"PAR1 not arrow PAR1")
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    remote = fl.TableDataset(f"s3://{bucket}/t.arrow", cache=cache)
    local = fl.TableDataset(path)
    assert len(remote) == 100 and remote.columns == ["x", "y"]

    def batches(ds: Any) -> list[list[float]]:
        loader = fl.DataLoader(ds, batch_size=16, shuffle=True, seed=1, num_workers=2)
        return [b["x"].tolist() + b["y"].tolist() for b in loader]

    assert batches(remote) == batches(local)
    assert cache.stats().downloads == 1  # the workers mapped the main process's copy
    with pytest.raises(FileNotFoundError, match=r"missing\.arrow"):
        fl.TableDataset(f"s3://{bucket}/missing.arrow", cache=cache)
    with pytest.raises(fl.ConfigError, match=re.escape(f"s3://{bucket}/t.parquet")):
        fl.TableDataset(f"s3://{bucket}/t.parquet", cache=cache)


def test_a_mixture_fetches_its_remote_shards_ahead_in_draw_order(tmp_path, s3_urls, local_shards,
                                                                   monkeypatch):
    import bisect

    import ferroloader.epoch.mixture as mixture_mod

    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")

    def mix(paths: list[str], c: Any = None) -> Any:
        return fl.Mixture({"a": fl.FileShards(paths[:6], read_ints, lengths=LENS[:6], cache=c),
                           "m": list(range(-20, 0)),
                           "b": fl.FileShards(paths[6:], read_ints, lengths=LENS[6:], cache=c)},
                          weights={"a": 1, "m": 1, "b": 2}, seed=5)

    def batches(m: Any) -> list[list[int]]:
        return [b.tolist() for b in fl.DataLoader(m, batch_size=4, num_workers=2)]

    real, seen = mixture_mod.fetch_ahead, []

    def recorded(c: Any, pieces: Any) -> Any:
        seen.append(list(pieces))
        return real(c, pieces)

    monkeypatch.setattr(mixture_mod, "fetch_ahead", recorded)
    remote = mix(s3_urls, cache)
    loader = fl.DataLoader(remote, batch_size=4, num_workers=2)
    assert [b.tolist() for b in loader] == batches(mix(local_shards))
    stats = loader.stats().remote
    assert stats.downloads == sum(n > 0 for n in LENS)  # each shard once
    # one prefetch at iter(), of the shards in the order the epoch's draws
    # first reach them
    idx = fl.MixtureBatchSampler(mix(s3_urls, cache), 4).indices()
    want: list[str] = []
    for i in idx:
        name, j = remote.locate(i)
        if name == "m":
            continue
        lens, urls = (LENS[:6], s3_urls[:6]) if name == "a" else (LENS[6:], s3_urls[6:])
        starts = np.cumsum([0, *lens]).tolist()
        url = urls[bisect.bisect_right(starts, j) - 1]
        if url not in want:
            want.append(url)
    assert len(seen) == 2 and seen[0] == want  # the loader's epoch, then the sampler above


def test_footers_and_indexes_are_read_side_by_side(tmp_path):
    """shards() of many remote files reads their footers (indexes) through
    ShardCache.each: calls at once, not one round trip after another."""
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    barrier = threading.Barrier(4, timeout=30)  # broken unless 4 calls overlap
    assert cache.each(lambda x: (barrier.wait(), 2 * x)[1], range(4)) == [0, 2, 4, 6]
    with pytest.raises(ZeroDivisionError):
        cache.each(lambda x: 1 // x, [1, 0, 2])


def test_a_forked_child_drops_its_copy_of_a_prefetch_safely(tmp_path, s3_urls):
    """A worker forked while a prefetch handle lives holds a copy of it;
    collecting that copy must not touch the parent's threads (it did:
    SIGSEGV in pthread_detach)."""
    import signal
    import warnings

    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    handles = [cache.prefetch(s3_urls) for _ in range(3)]
    for url in s3_urls:  # the prefetch done: its threads have ended
        with cache.open(url):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork beside threads
        pid = os.fork()
    if pid == 0:
        try:
            handles.clear()
            import gc

            gc.collect()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"the child died of {signal.Signals(os.WTERMSIG(status))}"
    assert os.WEXITSTATUS(status) == 0
