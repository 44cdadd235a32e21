"""TarShards: webdataset-style tars read by byte ranges, from local files and
from object storage (with and without an index beside the tar), against
tarfile's own reading of the same tars."""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from typing import Any, Iterator

import ferroloader as fl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from remote_servers import HttpServer

pytestmark = pytest.mark.timeout(120)

COUNTS = [13, 1, 20, 7]


def write_tar(path: str, samples: list[tuple[str, list[tuple[str, bytes]]]]) -> str:
    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for ext, data in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _samples(s: int, n: int) -> list[tuple[str, list[tuple[str, bytes]]]]:
    # sizes vary so that members straddle the tar's 512-byte blocks
    return [(f"s{s}/{k:04d}", [("txt", f"sample {s}-{k}".encode() * (k % 5 + 1)),
                               ("cls", str(k % 10).encode())]) for k in range(n)]


def reference(path: str, url: str = "") -> list[dict[str, Any]]:
    """The tar's samples as tarfile reads them (members grouped by key)."""
    out: list[dict[str, Any]] = []
    with tarfile.open(path) as tar:
        for m in tar:
            key, ext = m.name.split(".", 1)
            if not out or out[-1]["__key__"] != key:
                out.append({"__key__": key, "__url__": url or path})
            f = tar.extractfile(m)
            assert f is not None
            out[-1][ext] = f.read()
    return out


@pytest.fixture(scope="module")
def tars(tmp_path_factory: Any) -> list[str]:
    folder = tmp_path_factory.mktemp("tars")
    paths = [write_tar(str(folder / f"shard-{s}.tar"), _samples(s, n))
             for s, n in enumerate(COUNTS)]
    for p in paths:
        fl.TarShards.write_index(p)
    return paths


def _upload(s3_server: Any, paths: list[str], index: bool = True) -> list[str]:
    bucket = f"t{uuid.uuid4().hex[:12]}"
    s3_server.bucket(bucket)
    for p in paths:
        names = [p, p + ".idx.json"] if index else [p]
        for name in names:
            with open(name, "rb") as f:
                s3_server.put(bucket, os.path.basename(name), f.read())
    return [f"s3://{bucket}/{os.path.basename(p)}" for p in paths]


@pytest.fixture(scope="module")
def s3_tars(s3_server: Any, tars: list[str]) -> list[str]:
    return _upload(s3_server, tars)


@pytest.fixture(scope="module")
def http_tars(tars: list[str]) -> Iterator[list[str]]:
    server = HttpServer(os.path.dirname(tars[0]))
    yield [f"{server.url}/{os.path.basename(p)}" for p in tars]
    server.close()


def keys(batch: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in batch]


def _loader(ds: Any, mode: str = "static", nw: int = 0, **kw: Any) -> Any:
    return fl.DataLoader(ds, batch_size=5, shuffle=True, seed=7, num_workers=nw,
                         collate_fn=lambda b: b, sharding=fl.Sharding(mode=mode), **kw)


def test_samples_are_tarfiles_members_grouped_by_key(tars):
    for p in tars:
        assert list(fl.TarShards([p])) == reference(p)
        split = fl.TarShards([p], samples_per_shard=3)
        assert [s[1:] for s in split.shards()] == [
            (f, min(3, len(reference(p)) - f)) for f in range(0, len(reference(p)), 3)]
        assert [x for sh in split.shards() for x in split.iter_shard(sh)] == reference(p)
        assert len(split) == len(reference(p))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    samples=st.lists(
        st.tuples(st.sampled_from(["", "a/", "a/b/"]),
                  st.lists(st.tuples(st.sampled_from(["jpg", "cls", "json", "seg.png"]),
                                     st.binary(max_size=1200)),
                           min_size=1, max_size=3, unique_by=lambda m: m[0])),
        max_size=12),
    per_shard=st.one_of(st.none(), st.integers(1, 5)),
    start=st.integers(0, 4),
)
def test_any_tar_reads_as_tarfile_reads_it_in_any_split(tmp_path, samples, per_shard, start):
    path = str(tmp_path / f"{uuid.uuid4().hex}.tar")
    write_tar(path, [(f"{d}{k:03d}", m) for k, (d, m) in enumerate(samples)])
    want = reference(path)
    ds = fl.TarShards([path], samples_per_shard=per_shard)
    assert [x for sh in ds.shards() for x in ds.iter_shard(sh)] == want
    assert sum(ds.shard_len(sh) for sh in ds.shards()) == len(want)
    for sh in ds.shards():  # a resume in a shard skips exactly its first items
        assert list(ds.iter_shard(sh, start)) == list(ds.iter_shard(sh))[start:]


@pytest.mark.parametrize("mode,nw", [("static", 2), ("dynamic", 2), ("elastic", 0)])
def test_the_same_batches_as_a_tarfile_reader_through_file_shards(tars, mode, nw):
    def read_tar(path: str, start: int = 0) -> Iterator[dict[str, Any]]:
        yield from reference(path)[start:]

    got = [keys(b) for b in _loader(fl.TarShards(tars), mode, nw)]
    want = [keys(b) for b in _loader(fl.FileShards(tars, read_tar, lengths=COUNTS), mode, nw)]
    if mode == "dynamic":  # the batch order depends on timing; the items do not
        assert sorted(k for b in got for k in b) == sorted(k for b in want for k in b)
    else:
        assert got == want


@pytest.mark.parametrize("store", ["s3", "http"])
@pytest.mark.parametrize("mode,nw", [("static", 0), ("static", 2), ("elastic", 2)])
def test_remote_tars_give_the_local_batches(request, tmp_path, tars, store, mode, nw):
    urls = request.getfixturevalue(f"{store}_tars")
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    remote = _loader(fl.TarShards(urls, samples_per_shard=4, cache=cache), mode, nw)
    local = _loader(fl.TarShards(tars, samples_per_shard=4), mode, nw)
    assert [keys(b) for b in remote] == [keys(b) for b in local]
    got = [s for b in _loader(fl.TarShards(urls, samples_per_shard=4, cache=cache), mode, nw)
           for s in b]
    # every sample's bytes are tarfile's (elastic sharding pads the tail
    # with repeats, so keys are compared as a set)
    every = {s["__key__"]: s for p, u in zip(tars, urls) for s in reference(p, u)}
    assert all(every[s["__key__"]] == s for s in got)
    assert {s["__key__"] for s in got} == set(every)


def test_one_rank_of_two_fetches_only_its_shards_bytes(tmp_path, s3_tars, tars):
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    ds = fl.TarShards(s3_tars, samples_per_shard=2, cache=cache)
    loader = fl.DataLoader(ds, batch_size=5, num_workers=2, collate_fn=lambda b: b,
                           sharding=fl.Sharding(mode="static", rank=0, world_size=2))
    got = [s for b in loader for s in b]
    stats = loader.stats().remote
    total = sum(os.path.getsize(p) for p in tars)
    index = sum(os.path.getsize(p + ".idx.json") for p in tars)
    # its half of the shards' members, and the indexes; not the tars
    members = sum(len(v) for s in got for k, v in s.items() if not k.startswith("__"))
    assert members <= stats.fetched_bytes - index < 0.5 * total
    every = {s["__key__"]: s for p, u in zip(tars, s3_tars) for s in reference(p, u)}
    assert all(every[s["__key__"]] == s for s in got)


def test_a_remote_tar_without_an_index_is_downloaded_whole_once(tmp_path, s3_server, tars):
    urls = _upload(s3_server, tars, index=False)
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    loader = _loader(fl.TarShards(urls, samples_per_shard=4, cache=cache), "static", 2)
    local = _loader(fl.TarShards(tars, samples_per_shard=4), "static", 2)
    assert [keys(b) for b in loader] == [keys(b) for b in local]
    # shards() read each tar whole, once; the epoch found them in the cache
    stats = loader.stats().remote
    assert stats.downloads == len(tars)
    assert stats.fetched_bytes == sum(os.path.getsize(p) for p in tars)


def test_resume_mid_epoch_on_another_worker_count(tmp_path, s3_tars, tars):
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")

    def loader(paths: list[str], nw: int) -> Any:
        return fl.StatefulDataLoader(fl.TarShards(paths, samples_per_shard=4, cache=cache),
                                     batch_size=5, shuffle=True, seed=7, num_workers=nw,
                                     collate_fn=keys, sharding=fl.Sharding(mode="elastic"))

    want = list(loader(tars, 2))
    first = loader(s3_tars, 2)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    sd = first.state_dict()
    del it
    again = loader(s3_tars, 1)
    again.load_state_dict(sd)
    assert head + list(again) == want


def test_samples_are_webdatasets_samples(tmp_path):
    """The same tars through webdataset's own reader: the same samples, in
    the same order (keys with directories and dots, uppercase extensions,
    members webdataset skips)."""
    wds = pytest.importorskip("webdataset", reason="webdataset is a test extra")
    path = str(tmp_path / "w.tar")
    members = [("a/000.JPG", b"x"), ("a/000.seg.png", b"y"), ("__meta__", b"m"),
               ("b.c/001.txt", b"z"), ("noext", b"q"), ("b.c/001.cls", b"3"),
               ("__info__/x.txt", b"i"), ("002.txt", b"w" * 700)]
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    theirs = [{k: v for k, v in s.items() if k != "__local_path__"}
              for s in wds.WebDataset([path], shardshuffle=False, empty_check=False)]
    assert len(theirs) == 3
    assert list(fl.TarShards([path])) == theirs
    split = fl.TarShards([path], samples_per_shard=2)
    assert [x for sh in split.shards() for x in split.iter_shard(sh)] == theirs


def test_bad_input_is_a_clear_error(tmp_path, tars):
    gz = str(tmp_path / "a.tar.gz")
    with tarfile.open(gz, "w:gz") as tar:
        tar.add(tars[0], arcname="x.bin")
    with pytest.raises(fl.ConfigError, match="not an uncompressed tar"):
        fl.TarShards([gz]).shards()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(fl.ConfigError, match="samples_per_shard"):
            fl.TarShards(tars, samples_per_shard=bad)
    with pytest.raises(fl.ConfigError, match="a list of paths"):
        fl.TarShards(tars[0])
    twice = write_tar(str(tmp_path / "twice.tar"), [("k", [("txt", b"a"), ("TXT", b"b")])])
    with pytest.raises(fl.ConfigError, match="two 'txt' members"):
        fl.TarShards([twice]).shards()


def test_a_broken_index_is_a_clear_error(tmp_path, s3_server, tars):
    urls = _upload(s3_server, tars[:1], index=False)
    bucket = urls[0].split("/")[2]
    s3_server.put(bucket, os.path.basename(tars[0]) + ".idx.json", b'{"samples": 3}')
    cache = fl.ShardCache(dir=str(tmp_path / "cache"), budget="1MiB")
    with pytest.raises(fl.ConfigError, match=r"idx\.json cannot be read"):
        fl.TarShards(urls, cache=cache).shards()
