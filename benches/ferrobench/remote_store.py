"""The remote scenario's object store, in a process of its own: moto's S3
server on 127.0.0.1 behind a proxy that adds a delay to every request and
caps the bandwidth all connections share (a token bucket).

``python -m ferrobench.remote_store LATENCY_S BYTES_PER_S`` prints
``<moto port> <proxy port>`` on its first line, then serves until killed.
"""

from __future__ import annotations

import http.client
import http.server
import socket
import sys
import threading
import time
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bucket:
    """The shared bandwidth: ``take(n)`` returns once ``n`` bytes may go."""

    def __init__(self, rate: float) -> None:
        self.rate, self.lock, self.next_free = rate, threading.Lock(), time.monotonic()

    def take(self, n: int) -> None:
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + n / self.rate
            wait = self.next_free - now
        if wait > 0:
            time.sleep(wait)


def serve(latency: float, rate: float) -> None:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto_port = _free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
    moto.start()
    bucket = Bucket(rate)
    upstream = f"127.0.0.1:{moto_port}"

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _forward(self) -> None:
            time.sleep(latency)
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else None
            conn = http.client.HTTPConnection("127.0.0.1", moto_port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            headers["Host"] = upstream
            conn.request(self.command, self.path, body=body, headers=headers)
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
            if self.command == "HEAD":
                return
            try:
                for k in range(0, len(payload), 1 << 16):
                    piece = payload[k : k + (1 << 16)]
                    bucket.take(len(piece))
                    self.wfile.write(piece)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the reader went away (an epoch ended)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(moto_port, proxy.server_address[1], flush=True)
    proxy.serve_forever()


if __name__ == "__main__":
    serve(float(sys.argv[1]), float(sys.argv[2]))
