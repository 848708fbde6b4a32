"""Helpers for the S3 tests: credentials, fast retries, deterministic payloads, a fault-injecting proxy."""

from __future__ import annotations

import hashlib
import http.client
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from manyfiles.s3 import RetryPolicy

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
         "AWS_DEFAULT_REGION": "us-east-1"}

# Fast retries: the tests exercise the retry paths, not the sleeping.
FAST_RETRY = RetryPolicy(attempts=4, base=0.01, cap=0.05)


def blob(n: int, seed: str = "") -> bytes:
    """``n`` deterministic, non-repeating bytes (so a misplaced part changes the content)."""
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{i}".encode()).digest()
        i += 1
    return bytes(out[:n])


# --- fault-injecting proxy ------------------------------------------------------------------------

class FaultProxy:
    """An HTTP/1.1 proxy to moto that misbehaves on request.

    ``faults`` is a list of ``(predicate, kind)``; the first entry whose predicate matches a
    request (``method``, ``path``, ``headers``) is consumed and applied.  Kinds: "503" (SlowDown),
    "reset" (RST after half the body), "truncate" (close after half the body), "200" (answer a
    ranged GET with the whole object and status 200), "corrupt" (flip the first body byte),
    "500-always" and "403-always" (not consumed).
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.faults: list[tuple] = []
        self.delay = 0.0          # seconds added to every object GET
        self.applied: list[str] = []
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = proxy._take(self.command, self.path, self.headers)
                if proxy.delay and self.command == "GET" and "list-type" not in self.path:
                    time.sleep(proxy.delay)
                with proxy.lock:
                    proxy.requests.append((self.command, self.path, self.headers.get("Range")))
                if fault in ("503", "500-always", "403-always"):
                    code, err = {"503": (503, b"SlowDown"), "500-always": (500, b"InternalError"),
                                 "403-always": (403, b"AccessDenied")}[fault]
                    msg = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>' + err
                           + b"</Code><Message>injected by the test proxy</Message></Error>")
                    self.send_response(code)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host",)}
                if fault == "200":
                    headers.pop("Range", None)
                    headers.pop("range", None)
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        continue
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault == "corrupt" and data:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                if fault in ("reset", "truncate") and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    if fault == "reset":
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                   struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _take(self, method, path, headers) -> str | None:
        with self.lock:
            for i, (pred, kind) in enumerate(self.faults):
                if pred(method, path, headers):
                    if not kind.endswith("-always"):
                        del self.faults[i]
                    self.applied.append(kind)
                    return kind
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
