"""Helpers for the cache tests: deterministic payloads, subprocess runners."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap


def blob(n: int, seed: str = "") -> bytes:
    """``n`` deterministic pseudo-random bytes (a block in the wrong place changes the content)."""
    return random.Random(f"blob:{seed}").randbytes(n)


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> dict:
    """Run ``code`` in a new interpreter; it must print one JSON object last.  Returns it."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cli(*args: str, env: dict | None = None, input: bytes | None = None, timeout: float = 120):
    """``manyfiles ARGS`` as a subprocess; returns the CompletedProcess (text)."""
    exe = os.path.join(os.path.dirname(sys.executable), "manyfiles")
    return subprocess.run([exe, *args], capture_output=True, env={**os.environ, **(env or {})},
                          input=input, timeout=timeout)


_HOP_HEADERS = ("content-length", "transfer-encoding", "connection", "server", "date")


class CountingProxy:
    """An HTTP/1.1 forwarder to an S3 endpoint that records every request ``(method, path, Range)``.

    ``faults`` holds ``(predicate(method, path), kind)`` pairs, each used once: "corrupt" flips
    the first byte of the response body, "flip@N" the byte at offset N of the body.  ``delay``
    (seconds) is added before each object GET.
    (HEAD answers keep the upstream Content-Length, which a body-length proxy would zero.)
    """

    def __init__(self, upstream: str) -> None:
        import http.client
        import threading
        import time
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        up = urlsplit(upstream)
        self.requests: list[tuple[str, str, str | None]] = []
        self.faults: list[tuple] = []
        self.applied: list[str] = []
        self.delay = 0.0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy._lock:
                    proxy.requests.append((self.command, self.path, self.headers.get("Range")))
                    fault = next((f for f in proxy.faults if f[0](self.command, self.path)), None)
                    if fault is not None:
                        proxy.faults.remove(fault)
                        proxy.applied.append(fault[1])
                if proxy.delay and self.command == "GET" and "list-type" not in self.path:
                    time.sleep(proxy.delay)
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                if fault is not None and fault[1] == "corrupt" and data:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                if fault is not None and fault[1].startswith("flip@") and data:
                    at = int(fault[1][5:]) % len(data)
                    data = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP_HEADERS:
                        self.send_header(k, v)
                upstream_length = resp.getheader("Content-Length")
                self.send_header("Content-Length", upstream_length if self.command == "HEAD" and
                                 upstream_length else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:
                pass        # a client killed mid-response (the kill -9 tests) is expected

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
