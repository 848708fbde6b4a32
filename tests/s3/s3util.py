"""Helpers for the S3 tests: credentials, fast retries, deterministic payloads, a fault-injecting proxy."""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from manyfiles.s3 import RetryPolicy
from manyfiles.s3.keys import STATE_DIR

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


def files_under(root) -> dict[str, bytes]:
    """Every file under ``root`` but s3pull's state folder: relative path -> content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != STATE_DIR]
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def put_multipart(client, bucket: str, key: str, parts: list[bytes]) -> bytes:
    """Upload ``parts`` as one multipart object (ETag ``md5-N``); returns the whole body."""
    up = client.create_multipart_upload(Bucket=bucket, Key=key)
    done = []
    for i, body in enumerate(parts, 1):
        r = client.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=i, Body=body)
        done.append({"ETag": r["ETag"], "PartNumber": i})
    client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": done})
    return b"".join(parts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- fault-injecting proxy ------------------------------------------------------------------------

# What each fault kind does to one request (the proxy stays a real HTTP/1.1 server in front of moto).
CONTENT_FAULTS = ("flip", "wrong-range", "wrong-range-honest", "other-body")
TRANSPORT_FAULTS = ("503", "reset", "truncate", "ignore-range")


class FaultProxy:
    """An HTTP/1.1 proxy to moto that misbehaves on request.

    ``faults`` is a list of ``(predicate, kind)``; the first entry whose predicate matches a
    request (``method``, ``path``, ``headers``) is consumed and applied.  ``random_faults =
    (p, kinds, predicate)`` applies one of ``kinds`` to each matching request with probability
    ``p`` (seeded, never consumed).  Kinds:

    * "503" (SlowDown), "reset" (RST after half the body), "truncate" (close after half the body);
    * "ignore-range" (alias "200"): answer a ranged GET with the whole object and status 200;
    * "flip" (alias "corrupt"): one byte flipped at a random offset, same length/status/headers;
    * "wrong-range": a ranged GET answered with the bytes of another offset, the Content-Range
      still naming the range asked for (a lying server); a whole GET gets its body rotated;
    * "wrong-range-honest": the bytes of another offset with a Content-Range saying so;
    * "other-body": status 200 with the body of ``decoy_path`` (another object);
    * "500-always" and "403-always" (not consumed).

    ``sse_kms = True`` makes every object look KMS-encrypted, as S3 shows it: the
    ``x-amz-server-side-encryption: aws:kms`` header and an ETag that is not the MD5 of the body,
    consistently in listings, HEAD and GET (If-Match is translated back for moto).
    """

    def __init__(self, upstream: str, seed: int = 1234) -> None:
        import random

        self.upstream = urlsplit(upstream)
        self.faults: list[tuple] = []
        self.random_faults: tuple | None = None
        self.rng = random.Random(seed)
        self.decoy_path: str | None = None
        self.sse_kms = False
        self.delay = 0.0          # seconds added to every object GET
        self.applied: list[str] = []
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _upstream(self, method, path, body, headers):
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                return resp.status, resp.getheaders(), data

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
                if proxy.sse_kms:
                    for k in [k for k in headers if k.lower() == "if-match"]:
                        headers[k] = proxy._real_etag(headers[k])
                rng_hdr = next((v for k, v in headers.items() if k.lower() == "range"), None)
                headers = {("Range" if k.lower() == "range" else k): v for k, v in headers.items()}
                shift = 0
                if fault in ("200", "ignore-range"):
                    headers.pop("Range", None)
                elif fault in ("wrong-range", "wrong-range-honest") and rng_hdr:
                    a, b = (int(x) for x in rng_hdr.split("=")[1].split("-"))
                    shift = (b - a + 1) // 2 + 1 if a == 0 else -min(a, (b - a + 1) // 2 + 1)
                    headers["Range"] = f"bytes={a + shift}-{b + shift}"
                status, resp_headers, data = self._upstream(self.command, self.path, body, headers)
                if fault == "other-body" and proxy.decoy_path and status in (200, 206):
                    dh = {k: v for k, v in headers.items() if k.lower() not in ("range", "if-match")}
                    _, _, data = self._upstream("GET", proxy.decoy_path, None, dh)
                    status = 200
                if fault in ("wrong-range", "wrong-range-honest") and not rng_hdr and len(data) > 1:
                    k = len(data) // 3 + 1
                    data = data[k:] + data[:k]
                self.send_response(status)
                for k, v in resp_headers:
                    lk = k.lower()
                    if lk == "content-length" and self.command == "HEAD":
                        self.send_header(k, v)
                        continue
                    if lk in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        continue
                    if lk == "content-range" and fault in ("other-body", "ignore-range", "200"):
                        continue
                    if lk == "content-range" and fault == "wrong-range" and rng_hdr:
                        v = v.replace(headers["Range"].split("=")[1], rng_hdr.split("=")[1])
                    if lk == "etag" and proxy.sse_kms:
                        v = proxy._fake_etag(v)
                    self.send_header(k, v)
                if proxy.sse_kms and self.command in ("GET", "HEAD") and "list-type" not in self.path:
                    self.send_header("x-amz-server-side-encryption", "aws:kms")
                    self.send_header("x-amz-server-side-encryption-aws-kms-key-id", "arn:aws:kms:test")
                if proxy.sse_kms and b"<ETag>" in data:
                    data = re.sub(rb"<ETag>([^<]*)</ETag>",
                                  lambda m: b"<ETag>" + proxy._fake_etag(m.group(1).decode()).encode()
                                  + b"</ETag>", data)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault in ("corrupt", "flip") and data:
                    i = proxy.rng.randrange(len(data))
                    data = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]
                if fault in ("reset", "truncate") and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    if fault == "reset":
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                   struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    # ETags as S3 shows them for SSE-KMS objects: 32 hex digits that are not the body's MD5
    def _fake_etag(self, etag: str) -> str:
        quoted = etag.startswith('"') or etag.startswith("&quot;")
        raw = etag.replace("&quot;", "").strip('"')
        suffix = raw[raw.index("-"):] if "-" in raw else ""
        fake = hashlib.md5(b"kms:" + raw.encode()).hexdigest() + suffix
        with self.lock:
            self._etags = getattr(self, "_etags", {})
            self._etags[fake] = raw
        if etag.startswith("&quot;"):
            return f"&quot;{fake}&quot;"
        return f'"{fake}"' if quoted else fake

    def _real_etag(self, etag: str) -> str:
        raw = etag.strip('"')
        return f'"{getattr(self, "_etags", {}).get(raw, raw)}"'

    def _take(self, method, path, headers) -> str | None:
        with self.lock:
            for i, (pred, kind) in enumerate(self.faults):
                if pred(method, path, headers):
                    if not kind.endswith("-always"):
                        del self.faults[i]
                    self.applied.append(kind)
                    return kind
            if self.random_faults is not None:
                p, kinds, pred = self.random_faults
                if pred(method, path, headers) and self.rng.random() < p:
                    kind = kinds[self.rng.randrange(len(kinds))] if isinstance(kinds, tuple) else kinds
                    self.applied.append(kind)
                    return kind
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
