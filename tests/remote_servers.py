"""Local object stores for the remote-shard tests: an S3-API server (moto,
in server mode, on a thread of the test process) and an HTTP server that
answers range requests, both on 127.0.0.1."""

from __future__ import annotations

import http.server
import os
import re
import socket
import threading
from typing import Any, Iterator

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files under its directory, with ``Range: bytes=a-b``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def send_head(self) -> Any:
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        size = os.path.getsize(path)
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        f = open(path, "rb")
        if m is None:
            self.send_response(200)
            start, end = 0, size
        else:
            start = int(m.group(1))
            end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            if start >= size:
                f.close()
                self.send_error(416)
                return None
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", self.date_time_string(int(os.path.getmtime(path))))
        self.end_headers()
        f.seek(start)
        self._remaining = end - start
        return f

    def copyfile(self, source: Any, outputfile: Any) -> None:
        left = self._remaining
        while left > 0:
            chunk = source.read(min(left, 1 << 16))
            if not chunk:
                break
            outputfile.write(chunk)
            left -= len(chunk)


class HttpServer:
    def __init__(self, root: str) -> None:
        handler = lambda *a, **k: RangeHandler(*a, directory=root, **k)  # noqa: E731
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class S3Server:
    """moto's S3 on a thread; ``put(bucket, key, bytes)`` stores an object."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        # object_store reads these (and so would boto3 or the AWS CLI)
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self) -> Any:
        import boto3  # moto's own dependency

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def delete(self, bucket: str, key: str) -> None:
        self.client().delete_object(Bucket=bucket, Key=key)

    def close(self) -> None:
        self.server.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (a test extra)")
    server = S3Server()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.close()


class FaultProxy:
    """An HTTP proxy in front of ``upstream`` (``host:port``) that injects
    faults into GETs: ``drop`` (the next n bodies are cut off halfway and
    the connection closed), ``errors`` (the next n requests answered 500),
    ``latency`` (seconds added to every request). Counts the GETs it sees."""

    def __init__(self, upstream: str) -> None:
        import http.client

        self.upstream = upstream
        self.drop = 0
        self.errors = 0
        self.latency = 0.0
        self.gets = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                import time

                if proxy.latency:
                    time.sleep(proxy.latency)
                with proxy.lock:
                    if self.command == "GET":
                        proxy.gets += 1
                    fail = proxy.errors > 0
                    proxy.errors -= int(fail)
                    cut = self.command == "GET" and not fail and proxy.drop > 0
                    proxy.drop -= int(cut)
                if fail:
                    body = b"injected"
                    self.send_response(500)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                n = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(n) if n else None
                host, port = proxy.upstream.split(":")
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = proxy.upstream
                conn.request(self.command, self.path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(payload)))
                self.end_headers()
                if cut and len(payload) > 1:
                    self.wfile.write(payload[: len(payload) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_HEAD = do_PUT = do_DELETE = do_POST = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def read_ints(path: str, start: int = 0) -> Iterator[int]:
    """A shard file of the remote tests: int64 items."""
    import numpy as np

    yield from (int(v) for v in np.fromfile(path, dtype=np.int64)[start:])


def gloo_rank(rank: int, world: int, port: int, out_dir: str, urls: list[str],
              lens: list[int], cache_dir: str) -> None:
    """One rank of the two-rank remote test (gloo over loopback): each mode's
    epoch over ``urls`` through one cache directory shared by the ranks,
    its batches and its cache counters written to ``out_dir/rank<r>.json``."""
    import json

    import ferroloader as fl
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    out: dict[str, Any] = {}
    try:
        for mode in ("static", "elastic"):
            cache = fl.ShardCache(dir=os.path.join(cache_dir, mode), budget="1MiB")
            loader = fl.DataLoader(
                fl.FileShards(urls, read_ints, lengths=lens, cache=cache), batch_size=4,
                shuffle=True, seed=3, num_workers=2, multiprocessing_context="fork",
                sharding=fl.Sharding(mode=mode))
            batches = [b.tolist() for b in loader]
            out[mode] = {"batches": batches, "downloads": loader.stats().remote.downloads}
            dist.barrier()  # the test's own: both ranks read their epoch at once
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
