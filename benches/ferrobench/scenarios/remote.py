"""Shards in object storage (remote): moto's S3 server behind a proxy that
adds 20 ms to every request and caps the bandwidth, in a process of its own
(``ferrobench.remote_store``). 3x64x64 uint8 images with a label, in shards
of 256 (about 3 MB), batch 32, shuffled, 2 workers.

- streamed (a cold cache each round): ferroloader's ``FileShards`` over
  ``s3://`` URLs (one ``.npz`` per shard) against litdata's
  ``StreamingDataset`` over its own chunks (``litdata.optimize``, chunks of
  the same size) and MosaicML Streaming's ``StreamingDataset`` over its own
  MDS shards (``MDSWriter``, shards of the same size), on the same server
  through the same proxy; whole epochs, each loader new each round, each
  epoch in a fresh interpreter;
- a warm cache against the same job from local disk (persistent workers);
- two ranks on one machine sharing one cache (elastic sharding, read one
  after the other): the objects the ranks download, against the shards.

MosaicML Streaming pins ``transformers<5`` and ``numpy<2.2``, which the
test and bench extras outgrow, so it is not an extra: ``scripts/bench``
installs it without its dependencies into a folder of its own
(``.venv/peers/streaming``, or ``$FERROBENCH_STREAMING_PATH``), and only its
epochs' interpreters put that folder on their path. What it imports to read
MDS shards from S3 (numpy, torch, boto3) is in the venv. litdata reads
through boto3 here: its obstore path cannot reach a plain-HTTP endpoint
(below).
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..harness import Check, Settings, Skip, epoch_step, probe_workers, timed_rate

LATENCY = 0.020
BANDWIDTH = 200 * 2**20  # bytes/s, shared by every connection
SHAPE = (3, 64, 64)
PER_SHARD = 256
BATCH = 32


def read_shard(path: str, start: int = 0) -> Iterator[Dict[str, Any]]:
    """One shard: an ``.npz`` of images and their labels."""
    with np.load(path) as z:
        images, labels = z["images"], z["labels"]
    for i in range(start, len(images)):
        yield {"image": images[i], "label": int(labels[i])}


class _Store:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ferrobench.remote_store", str(LATENCY), str(BANDWIDTH)],
            cwd=_BENCHES, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2:
            self.close()
            raise Skip("skipped: the S3 server did not start (moto[server] installed?)")
        self.moto = f"http://127.0.0.1:{line[0]}"
        self.proxy = f"http://127.0.0.1:{line[1]}"
        for k, v in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                     "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                     "AWS_ENDPOINT_URL": self.proxy}.items():
            os.environ[k] = v
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=self.moto)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _litdata_item(i: int) -> Dict[str, Any]:
    rng = np.random.default_rng(i)
    return {"image": rng.integers(0, 256, SHAPE, dtype=np.uint8), "label": i}


def sc_remote(st: Settings, fl: Any) -> List[Check]:
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as e:
        raise Skip(f"skipped: needs moto[server] and boto3 (the test extra): {e}") from None
    probe_workers(fl)
    n_shards = 4 if st.quick else 16
    root = tempfile.mkdtemp(prefix="ferroloader-remote-")
    store = _Store()
    try:
        return _run(st, fl, store, root, n_shards)
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)


def _run(st: Settings, fl: Any, store: _Store, root: str, n_shards: int) -> List[Check]:
    bucket = f"bench{uuid.uuid4().hex[:10]}"
    store.s3.create_bucket(Bucket=bucket)
    local, urls = [], []
    os.makedirs(os.path.join(root, "local"))
    for s in range(n_shards):
        ids = range(s * PER_SHARD, (s + 1) * PER_SHARD)
        images = np.stack([_litdata_item(i)["image"] for i in ids])
        path = os.path.join(root, "local", f"shard-{s:04d}.npz")
        np.savez(path, images=images, labels=np.array(ids, dtype=np.int64))
        store.s3.upload_file(path, bucket, f"npz/shard-{s:04d}.npz")
        local.append(path)
        urls.append(f"s3://{bucket}/npz/shard-{s:04d}.npz")
    n = n_shards * PER_SHARD
    lens = [PER_SHARD] * n_shards
    shard_bytes = os.path.getsize(local[0])

    def cache(name: str) -> Any:
        budget = n_shards * shard_bytes * 2
        return fl.ShardCache(dir=os.path.join(root, "cache", name), budget=budget)

    def ferro(paths: List[str], c: Any = None, persistent: bool = False) -> Any:
        return fl.DataLoader(fl.FileShards(paths, read_shard, lengths=lens, cache=c),
                             batch_size=BATCH, shuffle=True, seed=0, num_workers=2,
                             persistent_workers=persistent)

    checks = []
    measure = "samples/s streamed from S3 (20 ms a request, 200 MiB/s), cold cache"
    streamed = {"litdata": Check(measure, "samples/s", "litdata StreamingDataset", target=2.0),
                "streaming": Check(measure, "samples/s", "MosaicML Streaming StreamingDataset",
                                   target=2.0)}
    def epoch(loader: Any) -> float:
        for _ in loader:
            pass
        return float(n)

    rounds = 0

    def cold(kind: str) -> float:
        """One cold epoch in a fresh interpreter (its start and imports not
        timed): no loader meets what another left running (litdata's
        threads and processes slowed ferroloader's epochs 5x when they
        shared this process)."""
        nonlocal rounds
        rounds += 1
        args = [kind, bucket, str(n_shards), os.path.join(root, "cache", f"cold-{rounds}"),
                store.proxy, str(shard_bytes)]
        whole, seconds = _child(args, streaming if kind == "streaming" else None)
        if whole != "1":  # every loader reads each sample once, or its rate means nothing
            for check in streamed.values():
                check.note = f"MISMATCH: {kind}'s epoch did not read each sample once"
        return n / float(seconds)

    peers = []
    if _LitOverHttp is None:
        streamed["litdata"].note = "litdata not installed: no baseline"
    else:
        _litdata(root, store, bucket, n, shard_bytes)  # writes and uploads its chunks
        peers.append("litdata")
    streaming = _streaming_path()
    if streaming is None:
        streamed["streaming"].note = ("mosaicml-streaming not found (scripts/bench installs it "
                                      "into .venv/peers/streaming): no baseline")
    else:  # its MDS shards, written and uploaded where it can be imported
        _child(["write-mds", bucket, str(n), root, store.moto, str(shard_bytes)], streaming)
        peers.append("streaming")
    for _ in range(st.repeats):
        theirs = {kind: cold(kind) for kind in peers}
        ours = cold("ferroloader")
        for kind in peers:
            streamed[kind].add(theirs[kind], ours)
    checks.extend(streamed[kind] for kind in peers)

    warm = Check("samples/s, warm cache", "samples/s", "the same job from local disk", target=0.8)
    warm_loader = ferro(urls, cache("warm"), persistent=True)
    disk_loader = ferro(local, persistent=True)
    warm_step, disk_step = epoch_step(warm_loader, n), epoch_step(disk_loader, n)
    warm_step(), disk_step()
    for _ in range(st.repeats):
        warm.add(timed_rate(disk_step, st.min_time), timed_rate(warm_step, st.min_time))
    checks.append(warm)
    del warm_loader, disk_loader, warm_step, disk_step

    once = Check("objects the ranks downloaded", "objects", "shards", target=1.0,
                 higher_is_better=False)
    for k in range(st.repeats):
        downloads = 0
        for rank in range(2):
            # each rank its own cache object on the one directory, as two
            # processes would have
            loader = fl.DataLoader(
                fl.FileShards(urls, read_shard, lengths=lens, cache=cache(f"ranks-{k}")),
                batch_size=BATCH,
                shuffle=True, seed=k, num_workers=2,
                sharding=fl.Sharding(mode="elastic", rank=rank, world_size=2))
            epoch(loader)
            downloads += loader.stats().remote.downloads
        once.add(float(n_shards), float(downloads))
    checks.append(once)
    gc.collect()
    return checks


def _litdata(root: str, store: _Store, bucket: str, n: int, chunk_bytes: int) -> None:
    """litdata's chunks of the same samples (``litdata.optimize``, chunks of
    the shards' size), uploaded beside the shards."""
    import litdata

    _boto3_only()
    out = os.path.join(root, "litdata")
    litdata.optimize(fn=_litdata_item, inputs=list(range(n)), output_dir=out,
                     chunk_bytes=chunk_bytes, num_workers=1, verbose=False)
    for name in os.listdir(out):
        store.s3.upload_file(os.path.join(out, name), bucket, f"lit/{name}")


def _streaming_path() -> Optional[str]:
    """The folder MosaicML Streaming was installed into, if it was."""
    path = os.environ.get("FERROBENCH_STREAMING_PATH") or os.path.join(
        sys.prefix, "peers", "streaming")
    return path if os.path.isdir(os.path.join(path, "streaming")) else None


def _child(args: List[str], path: Optional[str]) -> List[str]:
    """Runs this module in a fresh interpreter, ``path`` first on its
    ``sys.path``; returns the words of its last line."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-m", "ferrobench.scenarios.remote", *args],
                         cwd=_BENCHES, capture_output=True, text=True, timeout=600, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{args[0]} failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1].split()


def _write_mds(bucket: str, n: int, root: str, endpoint: str, shard_bytes: int) -> None:
    """Streaming's MDS shards of the same samples (``MDSWriter``, shards of
    the ``.npz`` shards' size), uploaded beside them."""
    import boto3
    from streaming import MDSWriter

    out = os.path.join(root, "mds")
    columns = {"image": f"ndarray:uint8:{','.join(map(str, SHAPE))}", "label": "int"}
    with MDSWriter(out=out, columns=columns, size_limit=shard_bytes) as writer:
        for i in range(n):
            writer.write(_litdata_item(i))
    s3 = boto3.client("s3", endpoint_url=endpoint)
    for name in os.listdir(out):
        s3.upload_file(os.path.join(out, name), bucket, f"mds/{name}")


def _cold_epoch(kind: str, bucket: str, n_shards: int, cache_dir: str, proxy: str,
                shard_bytes: int) -> Tuple[float, bool]:
    """Seconds of one cold epoch of ``kind`` (a fresh cache), loader built
    and iterated; run in a child interpreter (``__main__`` below)."""
    import time

    if kind == "litdata":
        import litdata

        _boto3_only()
        ds = _LitOverHttp(f"s3://{bucket}/lit", cache_dir=cache_dir, shuffle=True, seed=0,
                          storage_options={"endpoint_url": proxy})
        t0 = time.perf_counter()
        loader: Any = litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=2)
    elif kind == "streaming":
        import streaming

        os.environ["S3_ENDPOINT_URL"] = proxy
        # built before the clock starts, as litdata's is (it reads the index)
        sds = streaming.StreamingDataset(remote=f"s3://{bucket}/mds", local=cache_dir,
                                         shuffle=True, shuffle_seed=0, batch_size=BATCH)
        # Its S3 client read the index here, and forked workers would share
        # that client's open connection: their GETs crossed (a worker read
        # another's shard, or stalled 60 s until its retry made a new
        # client). Dropped, each worker makes its own.
        for stream in sds.streams:
            stream._downloader.clean_up()
        t0 = time.perf_counter()
        loader = streaming.StreamingDataLoader(sds, batch_size=BATCH, num_workers=2)
    else:
        import ferroloader as fl

        urls = [f"s3://{bucket}/npz/shard-{s:04d}.npz" for s in range(n_shards)]
        cache = fl.ShardCache(dir=cache_dir, budget=n_shards * shard_bytes * 2)
        t0 = time.perf_counter()
        loader = fl.DataLoader(
            fl.FileShards(urls, read_shard, lengths=[PER_SHARD] * n_shards, cache=cache),
            batch_size=BATCH, shuffle=True, seed=0, num_workers=2)
    labels = []
    for batch in loader:
        labels.append(batch["label"])
    seconds = time.perf_counter() - t0
    import torch

    read = sorted(torch.cat([torch.as_tensor(x) for x in labels]).tolist())
    return seconds, read == list(range(n_shards * PER_SHARD))


_BENCHES = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def _boto3_only() -> None:
    """litdata's obstore path builds its store without ``allow_http``, so a
    plain-HTTP endpoint (this server) fails there ("BadScheme"); its boto3
    path reaches it."""
    import litdata.streaming.downloader as lit_downloader

    lit_downloader._OBSTORE_AVAILABLE = False  # type: ignore[assignment]


try:
    import litdata as _litdata_mod

    class _LitOverHttp(_litdata_mod.StreamingDataset):  # type: ignore[misc]
        """litdata's dataset, on its boto3 path in every process it is
        unpickled in (its workers may be spawned)."""

        def __setstate__(self, state: Dict[str, Any]) -> None:
            _boto3_only()
            self.__dict__.update(state)

except ImportError:  # litdata is a bench extra; the scenario notes its absence
    _LitOverHttp = None  # type: ignore[assignment,misc]


if __name__ == "__main__":
    if sys.argv[1] == "write-mds":
        bucket_, n_, root_, endpoint_, bytes_ = sys.argv[2:]
        _write_mds(bucket_, int(n_), root_, endpoint_, int(bytes_))
        print("done")
    else:
        kind_, bucket_, shards_, cache_, proxy_, bytes_ = sys.argv[1:]
        seconds_, whole_ = _cold_epoch(kind_, bucket_, int(shards_), cache_, proxy_, int(bytes_))
        print(int(whole_), seconds_)
