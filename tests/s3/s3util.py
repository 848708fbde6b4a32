"""Helpers for the S3 tests: credentials, fast retries, deterministic payloads, a fault-injecting proxy."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from manyfiles.s3 import RetryPolicy
from manyfiles.s3.keys import STATE_DIR

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
         "AWS_DEFAULT_REGION": "us-east-1"}
SECRETS = {CREDS["AWS_ACCESS_KEY_ID"]: CREDS["AWS_SECRET_ACCESS_KEY"]}   # what the test edges accept

# Fast retries: the tests exercise the retry paths, not the sleeping.
FAST_RETRY = RetryPolicy(attempts=4, base=0.01, cap=0.05)


@contextmanager
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1 (the URL), with the tests' credentials in the
    environment while it runs.  One per test session: tests/conftest.py's ``moto_direct``."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    old = {k: os.environ.get(k) for k in CREDS}
    os.environ.update(CREDS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Bucket:
    """A fresh bucket on moto behind its own fault proxy (which checks every SigV4 signature and
    records every request): seed it with ``put``, point the code under test at ``settings`` or
    ``env``, misbehave with ``fault``, count what reached the store with ``gets``/``heads``/``lists``."""

    retry = FAST_RETRY          # what the tests' clients retry with (fast: the tests exercise retries)

    def __init__(self, moto: str, prefix: str = "t") -> None:
        import boto3

        from manyfiles.s3 import ClientSettings

        self.admin = boto3.client("s3", endpoint_url=moto, region_name="us-east-1",
                                  aws_access_key_id="testing", aws_secret_access_key="testing")
        self.bucket = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.admin.create_bucket(Bucket=self.bucket)
        self.proxy = FaultProxy(moto, secrets=SECRETS)
        self.endpoint = self.proxy.url
        self.settings = ClientSettings(endpoint_url=self.proxy.url, region="us-east-1")

    def close(self) -> None:
        self.proxy.close()

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> bytes:
        self.admin.put_object(Bucket=self.bucket, Key=key, Body=data)
        return data

    def fault(self, kind: str, *, method: str = "GET", key: str = "", ranged: bool | None = None) -> None:
        """Apply ``kind`` once to the next ``method`` request on an object whose key ends with
        ``key`` (``ranged``: only to a ranged GET / only to a whole one)."""
        def pred(m, path, headers) -> bool:
            if m != method or "list-type" in path or not path.partition("?")[0].endswith(key):
                return False
            return ranged is None or ranged == bool(headers.get("Range"))
        self.proxy.faults.append((pred, kind))

    def gets(self) -> list[tuple[str, str, str | None]]:
        """Object GETs the proxy saw (listings excluded)."""
        return [r for r in self.proxy.requests if r[0] == "GET" and "list-type" not in r[1]]

    def heads(self) -> list[tuple[str, str, str | None]]:
        return [r for r in self.proxy.requests if r[0] == "HEAD"]

    def lists(self) -> list[tuple[str, str, str | None]]:
        return [r for r in self.proxy.requests if r[0] == "GET" and "list-type" in r[1]]

    @property
    def env(self) -> dict[str, str]:
        """Environment for CLI subprocesses: the proxy as endpoint, fast retries."""
        return {**CREDS, "AWS_ENDPOINT_URL": self.proxy.url, "MANYFILES_RETRY_BASE": "0.01"}


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


def put_composite(client, bucket: str, key: str, parts: list[bytes], alg: str) -> bytes:
    """A multipart object with a COMPOSITE flexible checksum (``<checksum of part checksums>-N``)."""
    up = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm=alg)
    done = []
    for i, body in enumerate(parts, 1):
        r = client.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=i, Body=body,
                               ChecksumAlgorithm=alg)
        done.append({"ETag": r["ETag"], "PartNumber": i, f"Checksum{alg}": r[f"Checksum{alg}"]})
    client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": done})
    return b"".join(parts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- fault-injecting proxy ------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def read_body(self) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None


def _relay(host: str, port: int, method: str, target: str, body, headers: dict):
    """One request to ``host:port``: (status, headers, body)."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheaders(), resp.read()
    finally:
        conn.close()


Refusal = tuple[int, str, dict[str, str], bytes]    # status, S3 error code, headers, extra XML


def _body_refusal(method: str, path: str, headers, body: bytes) -> Refusal | None:
    """400 BadDigest for a body that does not match its ``Content-MD5`` (PUT, POST) or its
    ``x-amz-checksum-<algorithm>`` (PUT of an object or a part), as S3 checks them (moto does not)."""
    import base64

    from manyfiles.s3.integrity import new_hash

    if method not in ("PUT", "POST"):
        return None
    md5 = headers.get("Content-MD5")
    if md5 and base64.b64encode(hashlib.md5(body).digest()).decode() != md5:
        return 400, "BadDigest", {}, b""
    if method == "PUT":
        for alg in ("crc64nvme", "crc32c", "crc32", "sha256", "sha1"):
            want = headers.get(f"x-amz-checksum-{alg}")
            if want:
                h = new_hash(alg)
                h.update(body)
                if base64.b64encode(h.digest()).decode() != want:
                    return 400, "BadDigest", {}, b""
    return None

def _lie(value: str) -> str:
    """Another value of the same form: an ETag's hex digits or a base64 checksum changed."""
    quoted = value.startswith('"')
    core = value.strip('"')
    head, dash, tail = core.partition("-")
    if re.fullmatch(r"[0-9a-f]{32}", head):
        head = hashlib.md5(b"lie:" + head.encode()).hexdigest()
    else:
        import base64

        raw = bytearray(base64.b64decode(head))
        raw[0] ^= 0x01
        head = base64.b64encode(bytes(raw)).decode()
    out = head + dash + tail
    return f'"{out}"' if quoted else out


# What each fault kind does to one request (the proxy stays a real HTTP/1.1 server in front of moto).
CONTENT_FAULTS = ("flip", "wrong-range", "wrong-range-honest", "other-body")
TRANSPORT_FAULTS = ("503", "reset", "truncate", "ignore-range")
HEAD_FAULTS = ("head-zero", "head-size", "head-parts-count")


class FaultProxy:
    """An HTTP/1.1 proxy to moto that misbehaves on request.

    ``faults`` is a list of ``(predicate, kind)``; the first entry whose predicate matches a
    request (``method``, ``path``, ``headers``) is consumed and applied.  ``random_faults =
    (p, kinds, predicate)`` applies one of ``kinds`` to each matching request with probability
    ``p`` (seeded, never consumed); a list of such rules applies the first whose predicate
    matches the request (e.g. lying HEADs and flipped GETs at once).  Kinds:

    * "503" (SlowDown), "reset" (RST after half the body), "truncate" (close after half the body);
    * "ignore-range" (alias "200"): answer a ranged GET with the whole object and status 200;
    * "flip" (alias "corrupt"): one byte flipped at a random offset, same length/status/headers;
    * "wrong-range": a ranged GET answered with the bytes of another offset, the Content-Range
      still naming the range asked for (a lying server); a whole GET gets its body rotated;
    * "wrong-range-honest": the bytes of another offset with a Content-Range saying so;
    * "other-body": status 200 with the body of ``decoy_path`` (another object);
    * "500-always" and "403-always" (not consumed);
    * lying HEADs, as a broken gateway answers them (``HEAD_FAULTS``): "head-zero" (``Content-Length:
      0``), "head-size" (``Content-Length`` 1 MiB more than the truth: a wrong object size, or a
      plausible but wrong part size for ``?partNumber=N``), "head-parts-count"
      (``x-amz-mp-parts-count`` one more than the truth).

    ``sse_kms = True`` makes every object look KMS-encrypted, as S3 shows it: the
    ``x-amz-server-side-encryption: aws:kms`` header and an ETag that is not the MD5 of the body,
    consistently in listings, HEAD and GET (If-Match is translated back for moto);
    ``sse_kms = "sse-c"`` the same with SSE-C's customer-key headers.

    Behaving like a real S3 edge: ``tls`` (an ``ssl.SSLContext``) serves HTTPS;
    ``clock_offset`` (seconds) gives the server a clock that far from ours and answers any
    request whose ``x-amz-date`` is more than 15 minutes from it with 403 RequestTimeTooSkewed
    (and its ``Date``), as S3 does; ``bucket_region`` answers requests signed for another region
    with a region redirect (``redirect = "301"``: PermanentRedirect, ``"400"``:
    AuthorizationHeaderMalformed), with ``x-amz-bucket-region``.  ``refused`` counts those answers.
    ``secrets`` (access key -> secret) makes it check every signed request's SigV4 signature,
    as received and before any fault touches it (botocore's S3SigV4Auth recomputes it), and
    answer 403 SignatureDoesNotMatch / InvalidAccessKeyId otherwise, as S3 would.  A request body
    that does not match its ``Content-MD5`` or ``x-amz-checksum-*`` header is refused with 400
    BadDigest, as S3 checks them (moto checks neither).

    More kinds: "flip@N" flips the byte at offset N of the body (a fault at a known place);
    "head-etag" answers a HEAD with another ETag (a gateway that lies about the version);
    "stall" holds the answer back until the proxy closes (a request that never ends; the server never
    gets it); "stall-after" sends the request on, then holds the server's answer the same way (a
    request the server did, whose answer never comes).  ``stalled`` is set when either begins.
    "drop-after" sends the request on, then closes the connection without a byte of the answer (the
    server did it; a client that takes the close for an idle keep-alive sends it again unaware).

    Outages (the network between the client and the store): :meth:`outage` ("refuse": nothing
    listens, so connections are refused, and every request on an established connection is
    reset; "hang": connections are accepted and no request is answered, then reset once the
    outage ends), for ``seconds`` or until :meth:`come_back`; the fault kinds "refuse-for:N" and
    "hang-for:N" start one at that request (which is its first victim).  ``outage_hits`` counts
    the requests it reset or held.
    ``parts_as_s3 = True`` answers ``GET ?partNumber=N`` as S3 does (moto answers it with the
    whole object): 206 with that part's bytes, its Content-Range, ``x-amz-mp-parts-count`` and,
    for an object uploaded with checksums, the part's own checksum (computed here from moto's
    bytes, before any fault touches them).  ``list_part_checksums = True`` lists each part in a
    ListParts answer with the checksum it was uploaded with, as S3 does (moto lists none): the
    checksum header of the UploadPart that made the part's ETag (the proxy checked its body).
    """

    def __init__(self, upstream: str, seed: int = 1234, tls=None,
                 secrets: dict[str, str] | None = None) -> None:
        import random

        self.upstream = urlsplit(upstream)
        self.faults: list[tuple] = []
        self.request_faults: list[tuple] = []    # see _take_request_fault
        self.random_faults: tuple | None = None
        self.rng = random.Random(seed)
        self.decoy_path: str | None = None
        self.sse_kms = False
        self.head_as_s3 = False   # HEAD names a composite checksum with the "-N" S3 gives it
        self.parts_as_s3 = False  # GET ?partNumber=N answered with that part (see above)
        self.list_part_checksums = False    # ListParts names each part's checksum (see above)
        self.part_checksums: dict[tuple[str, str], tuple[str, str, str]] = {}    # (uid, n) -> etag, alg, sum
        self.closing = threading.Event()
        self.stalled = threading.Event()      # a "stall" / "stall-after" began
        self.delay = 0.0          # seconds added to every object GET
        self.clock_offset: float | None = None
        self.bucket_region: str | None = None
        self.redirect = "301"
        self.redirect_always = False    # a server that redirects every request (to test "once")
        self.secrets = secrets
        self.signed = 0                 # requests whose signature was checked and right
        self.checksum_mode_asked = 0    # requests with x-amz-checksum-mode
        self.refused: list[tuple[str, str, str]] = []    # (method, path, error code)
        self.applied: list[str] = []
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            def _upstream(self, method, path, body, headers):
                return _relay(proxy.upstream.hostname, proxy.upstream.port, method, path, body, headers)

            def _handle(self) -> None:
                body = self.read_body()
                if proxy.down is not None:
                    self._outage()
                    return
                lie = None
                request_fault = proxy._take_request_fault(self.command, self.path, self.headers)
                if request_fault == "flip-request" and body:
                    # the wire changed one byte of what the client sent (the body check must catch it)
                    i = proxy.rng.randrange(len(body))
                    body = body[:i] + bytes([body[i] ^ 0x01]) + body[i + 1:]
                elif request_fault in ("lie-etag", "lie-checksum"):
                    lie = request_fault
                refusal = proxy._refusal(self.command, self.path, self.headers) \
                    or _body_refusal(self.command, self.path, self.headers, body or b"")
                if refusal is not None:
                    with proxy.lock:
                        proxy.refused.append((self.command, self.path, refusal[1]))
                    self._refuse(*refusal)
                    return
                if self.headers.get("x-amz-checksum-mode"):
                    with proxy.lock:
                        proxy.checksum_mode_asked += 1
                fault = proxy._take(self.command, self.path, self.headers)
                if fault and fault.startswith(("refuse-for:", "hang-for:")):
                    kind, _, seconds = fault.partition("-for:")
                    proxy.outage(kind, float(seconds))
                    self._outage()
                    return
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
                if fault == "stall":
                    proxy.stalled.set()
                    proxy.closing.wait()
                    self.close_connection = True
                    return
                if proxy.parts_as_s3 and self.command == "GET" and "partNumber=" in self.path:
                    status, resp_headers, data = proxy._s3_part(self._upstream, self.path, headers)
                else:
                    status, resp_headers, data = self._upstream(self.command, self.path, body, headers)
                if fault == "stall-after":
                    proxy.stalled.set()
                    proxy.closing.wait()
                    self.close_connection = True
                    return
                if proxy.list_part_checksums and status == 200:
                    data = proxy._part_checksums(self.command, self.path, self.headers, resp_headers, data)
                if fault == "drop-after":
                    self.close_connection = True      # the server did it; not a byte of its answer comes
                    return
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
                        if fault == "head-zero":
                            v = "0"
                        elif fault == "head-size":
                            v = str(int(v) + (1 << 20))
                        self.send_header(k, v)
                        continue
                    if lk == "x-amz-mp-parts-count" and fault == "head-parts-count":
                        v = str(int(v) + 1)
                    if lk in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        continue
                    if lk == "content-range" and fault in ("other-body", "ignore-range", "200"):
                        continue
                    if lk == "content-range" and fault == "wrong-range" and rng_hdr:
                        v = v.replace(headers["Range"].split("=")[1], rng_hdr.split("=")[1])
                    if lk == "etag" and proxy.sse_kms:
                        v = proxy._fake_etag(v)
                    if lk.startswith("x-amz-checksum-") and proxy.head_as_s3 and self.command == "HEAD":
                        v = proxy._as_s3(v, resp_headers)
                    if lk == "etag" and fault == "head-etag" and self.command == "HEAD":
                        v = '"' + hashlib.md5(b"lie:" + v.encode()).hexdigest() + '"'
                    a_checksum = lk.startswith("x-amz-checksum-") and lk not in ("x-amz-checksum-type",
                                                                                "x-amz-checksum-algorithm")
                    if (lk == "etag" and lie == "lie-etag") or (a_checksum and lie == "lie-checksum"):
                        v = _lie(v)
                    self.send_header(k, v)
                an_object = self.command in ("GET", "HEAD") and "list-type" not in self.path
                if proxy.sse_kms == "sse-c" and an_object:
                    self.send_header("x-amz-server-side-encryption-customer-algorithm", "AES256")
                    self.send_header("x-amz-server-side-encryption-customer-key-MD5", "a2V5IG1kNQ==")
                elif proxy.sse_kms and an_object:
                    self.send_header("x-amz-server-side-encryption", "aws:kms")
                    self.send_header("x-amz-server-side-encryption-aws-kms-key-id", "arn:aws:kms:test")
                if lie is not None and data:
                    tag = b"ETag" if lie == "lie-etag" else b"Checksum[A-Z0-9]+"
                    data = re.sub(rb"<(" + tag + rb")>([^<]*)</",
                                  lambda m: (b"<" + m.group(1) + b">" + _lie(m.group(2).decode()).encode()
                                             + b"</"),
                                  data)
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
                if fault and fault.startswith("flip@") and data:
                    i = int(fault[5:]) % len(data)
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

            def _outage(self) -> None:
                """This request meets the outage: held while it hangs, then reset (no answer)."""
                with proxy.lock:
                    proxy.outage_hits += 1
                if proxy.down == "hang":
                    proxy.back.wait()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()

            def _refuse(self, status: int, code: str, headers: dict[str, str], extra: bytes) -> None:
                msg = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>' + code.encode()
                       + b"</Code><Message>refused by the test edge</Message>" + extra + b"</Error>")
                body = msg if self.command != "HEAD" else b""
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass        # a client that went away (a reset it made, an outage): not the test's concern

            def finish_request(self, request, client_address):
                if tls is not None:     # the handshake in the request's thread, not the accept loop
                    try:
                        request = tls.wrap_socket(request, server_side=True)
                    except OSError:     # a client that refused our certificate
                        with proxy.lock:
                            proxy.handshakes_refused += 1
                        return
                super().finish_request(request, client_address)

        self.handshakes_refused = 0
        self.down: str | None = None        # the outage under way: "refuse", "hang" or None
        self.back = threading.Event()
        self.outage_hits = 0
        self._server_type = (Server, Handler)
        self.server = Server(("127.0.0.1", 0), Handler)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def outage(self, kind: str, seconds: float | None = None) -> None:
        """Start an outage ("refuse" or "hang", see the class docstring), ended after ``seconds``
        (None: by :meth:`come_back`)."""
        with self.lock:
            if self.down is not None:
                return
            self.down = kind
            self.back.clear()
        if kind == "refuse":
            self.server.shutdown()          # nothing listens now: connections are refused
            self.server.socket.close()
        if seconds is not None:
            timer = threading.Timer(seconds, self.come_back)
            timer.daemon = True
            timer.start()

    def come_back(self) -> None:
        """End the outage: the same address answers again."""
        with self.lock:
            kind, self.down = self.down, None
        if kind == "refuse" and not self.closing.is_set():
            server_type, handler = self._server_type
            self.server = server_type(self.server.server_address, handler)
            self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
            self.thread.start()
        self.back.set()

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

    @staticmethod
    def _as_s3(value: str, resp_headers) -> str:
        """moto's HEAD gives a multipart object's composite checksum without the ``-N`` S3 adds."""
        etag = next((v for k, v in resp_headers if k.lower() == "etag"), "").strip('"')
        n = etag.rpartition("-")[2] if "-" in etag else ""
        return f"{value}-{n}" if n and "-" not in value else value

    def _real_etag(self, etag: str) -> str:
        raw = etag.strip('"')
        return f'"{getattr(self, "_etags", {}).get(raw, raw)}"'

    def _refusal(self, method: str, path: str, headers) -> tuple[int, str, dict[str, str], bytes] | None:
        """(status, code, headers, extra XML) for a request S3 would refuse here, or None."""
        import calendar
        import email.utils

        auth = headers.get("Authorization") or ""
        if self.secrets is not None and auth:
            code = self._signature_error(method, path, headers, auth)
            if code:
                return 403, code, {}, b""
            with self.lock:
                self.signed += 1
        if self.clock_offset is not None and headers.get("X-Amz-Date"):
            server_now = time.time() + self.clock_offset
            sent = calendar.timegm(time.strptime(headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
            if abs(sent - server_now) > 900:
                date = {"Date": email.utils.formatdate(server_now, usegmt=True)}
                return 403, "RequestTimeTooSkewed", date, b"<MaxAllowedSkewMilliseconds>900000" \
                    b"</MaxAllowedSkewMilliseconds>"
        m = re.search(r"Credential=[^/]+/\d{8}/([^/]+)/s3/", auth)
        if self.bucket_region and m and (m.group(1) != self.bucket_region or self.redirect_always):
            where = {"x-amz-bucket-region": self.bucket_region}
            if self.redirect == "301":
                return 301, "PermanentRedirect", where, b"<Endpoint>s3.amazonaws.com</Endpoint>"
            region = f"<Region>{self.bucket_region}</Region>".encode()
            return 400, "AuthorizationHeaderMalformed", where, region
        return None

    def _signature_error(self, method: str, path: str, headers, auth: str) -> str | None:
        import hmac

        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        m = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=([^/]+)/\d{8}/([^/]+)/s3/aws4_request, ?"
                         r"SignedHeaders=([^,]+), ?Signature=([0-9a-f]{64})", auth)
        if m is None:
            return "AuthorizationHeaderMalformed"
        key, region, signed, signature = m.groups()
        secret = self.secrets.get(key)
        if secret is None:
            return "InvalidAccessKeyId"
        names = signed.split(";")
        if "host" not in names or any(headers.get(n) is None for n in names):
            return "SignatureDoesNotMatch"
        req = AWSRequest(method=method, url=f"http://{headers['Host']}{path}",
                         headers={n: headers[n] for n in names})
        req.context["timestamp"] = headers.get("X-Amz-Date", "")
        signer = S3SigV4Auth(Credentials(key, secret, headers.get("X-Amz-Security-Token")), "s3", region)
        want = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
        return None if hmac.compare_digest(want, signature) else "SignatureDoesNotMatch"

    def _part_checksums(self, method: str, path: str, headers, resp_headers, data: bytes) -> bytes:
        """Remember an UploadPart's checksum under its ETag; name it in ListParts (as S3 does)."""
        query = parse_qs(urlsplit(path).query, keep_blank_values=True)
        uid = (query.get("uploadId") or [""])[0]
        if not uid:
            return data
        if method == "PUT" and "partNumber" in query:
            etag = next((v for k, v in resp_headers if k.lower() == "etag"), "").strip('"')
            for k, v in headers.items():
                alg = k.lower()[len("x-amz-checksum-"):]
                if k.lower().startswith("x-amz-checksum-") and alg not in ("type", "algorithm"):
                    with self.lock:
                        self.part_checksums[uid, query["partNumber"][0]] = (etag, alg.upper(), v)
        elif method == "GET" and "partNumber" not in query:
            def named(m: re.Match) -> bytes:
                part = m.group(0)
                n = re.search(rb"<PartNumber>(\d+)</PartNumber>", part)
                tag = re.search(rb"<ETag>(?:&quot;|&#34;|\")?([0-9a-f]+)", part)
                known = self.part_checksums.get((uid, n.group(1).decode())) if n else None
                if known is None or tag is None or tag.group(1).decode() != known[0]:
                    return part
                return part.replace(b"</Part>", f"<Checksum{known[1]}>{known[2]}</Checksum{known[1]}></Part>"
                                    .encode())
            data = re.sub(rb"<Part>.*?</Part>", named, data, flags=re.S)
        return data

    def _s3_part(self, upstream, path: str, headers: dict):
        """``GET ?partNumber=N`` as S3 answers it: (status, headers, body) of that part."""
        import base64
        import zlib

        base, _, query = path.partition("?")
        n = int(parse_qs(query)["partNumber"][0])
        status, head, _ = upstream("HEAD", base, None, {"x-amz-checksum-mode": "ENABLED"})
        if status != 200:
            return upstream("GET", path, None, headers)
        head = {k.lower(): v for k, v in head}
        sizes = []
        for i in range(1, n + 1):
            _, part_head, _ = upstream("HEAD", f"{base}?partNumber={i}", None, {})
            part_head = {k.lower(): v for k, v in part_head}
            sizes.append(int(part_head["content-length"]))
        total, start = int(head["content-length"]), sum(sizes[:-1])
        end = start + sizes[-1] - 1
        ranged = {k: v for k, v in headers.items() if k.lower() != "x-amz-checksum-mode"}
        ranged["Range"] = f"bytes={start}-{end}"
        status, resp_headers, data = upstream("GET", base, None, ranged)
        if status != 206:
            return status, resp_headers, data
        out = [(k, v) for k, v in resp_headers if not k.lower().startswith("x-amz-checksum")
               and k.lower() != "content-range"]
        out += [("Content-Range", f"bytes {start}-{end}/{total}"),
                ("x-amz-mp-parts-count", part_head.get("x-amz-mp-parts-count", "1"))]
        alg = head.get("x-amz-checksum-algorithm", "").lower()
        if alg and any(k.lower() == "x-amz-checksum-mode" for k in headers):
            if alg == "crc32":
                digest = zlib.crc32(data).to_bytes(4, "big")
            elif alg == "crc32c":
                import crc32c

                digest = crc32c.crc32c(data).to_bytes(4, "big")
            else:
                digest = hashlib.new(alg, data).digest()
            out += [(f"x-amz-checksum-{alg}", base64.b64encode(digest).decode()),
                    ("x-amz-checksum-type", "COMPOSITE")]
        return 206, out, data

    def _take_request_fault(self, method, path, headers) -> str | None:
        """The first of ``request_faults`` whose predicate matches (consumed): "flip-request" (one
        byte of the request body flipped on its way to the server), "lie-etag" / "lie-checksum"
        (the answer's ETag / x-amz-checksum-* replaced by another value of the same form)."""
        with self.lock:
            for i, (pred, kind) in enumerate(self.request_faults):
                if pred(method, path, headers):
                    del self.request_faults[i]
                    self.applied.append(kind)
                    return kind
        return None

    def _take(self, method, path, headers) -> str | None:
        with self.lock:
            for i, (pred, kind) in enumerate(self.faults):
                if pred(method, path, headers):
                    if not kind.endswith("-always"):
                        del self.faults[i]
                    self.applied.append(kind)
                    return kind
            rules = self.random_faults
            for p, kinds, pred in (rules if isinstance(rules, list) else [rules] if rules else []):
                if not pred(method, path, headers):
                    continue
                if self.rng.random() >= p:
                    return None
                kind = kinds[self.rng.randrange(len(kinds))] if isinstance(kinds, tuple) else kinds
                self.applied.append(kind)
                return kind
        return None

    def close(self) -> None:
        self.closing.set()
        self.back.set()
        if self.down != "refuse":
            self.server.shutdown()
        self.server.server_close()


# --- TLS and a forward proxy ------------------------------------------------------------------------

def make_ca(folder) -> tuple[str, ssl.SSLContext]:
    """A fresh CA (its PEM written to ``folder/ca.pem``) and a server context for 127.0.0.1 signed by it."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool):
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(hours=1))
             .not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            b = b.add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                critical=True)
        else:
            names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = cert("manyfiles test CA", ca_key, "manyfiles test CA", ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    server_cert = cert("127.0.0.1", key, "manyfiles test CA", ca_key, False)
    pem = lambda c: c.public_bytes(serialization.Encoding.PEM)  # noqa: E731
    ca_path = os.path.join(folder, "ca.pem")
    with open(ca_path, "wb") as f:
        f.write(pem(ca_cert))
    chain = os.path.join(folder, "server.pem")
    with open(chain, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
        f.write(pem(server_cert))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(chain)
    return ca_path, ctx


class ForwardProxy:
    """An HTTP proxy (what HTTP_PROXY / HTTPS_PROXY point at): absolute-form requests are
    forwarded and recorded in ``requests`` (method, URL); CONNECT opens a tunnel, recorded in
    ``tunnels`` (host:port)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.tunnels: list[str] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            def do_CONNECT(self) -> None:
                host, _, port = self.path.rpartition(":")
                with proxy.lock:
                    proxy.tunnels.append(self.path)
                upstream = socket.create_connection((host, int(port)), timeout=30)
                self.send_response(200, "Connection established")
                self.end_headers()
                self.wfile.flush()
                self.close_connection = True
                _pump(self.connection, upstream)

            def _forward(self) -> None:
                u = urlsplit(self.path)
                with proxy.lock:
                    proxy.requests.append((self.command, self.path))
                target = u.path + (f"?{u.query}" if u.query else "")
                status, headers, data = _relay(u.hostname, u.port, self.command, target, self.read_body(),
                                               dict(self.headers.items()))
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until one side closes."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    try:
        while True:
            for key, _ in sel.select(timeout=60):
                data = key.fileobj.recv(1 << 16)
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        return
    finally:
        sel.close()
        b.close()


# --- endpoints that are not there ------------------------------------------------------------------

class SilentServer:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers (a black hole
    behind a proxy that still accepts, a server wedged after accept).  ``reset``: it reads the
    request, then resets the connection (RST), still without an answer."""

    def __init__(self, *, reset: bool = False) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = never_answered(f"http://127.0.0.1:{self.sock.getsockname()[1]}")
        self.reset = reset
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.reset:
                conn.recv(65536)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            else:
                self.accepted.append(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)     # wakes the accept (closing alone does not)
        self.sock.close()
        self.thread.join()
        for conn in self.accepted:
            conn.close()


def nth_get(n: int):
    """A fault predicate (``proxy.faults``) true for the ``n``-th object GET only (listings aside)."""
    seen = []

    def pred(method, path, headers) -> bool:
        if method != "GET" or "list-type" in path:
            return False
        seen.append(path)
        return len(seen) == n
    return pred


def refused_url() -> str:
    """An http:// URL on 127.0.0.1 where nothing listens (connections are refused)."""
    return never_answered(f"http://127.0.0.1:{free_port()}")


def never_answered(url: str) -> str:
    """``url``, a new endpoint on a port the kernel gave: forgotten by this process's record of the
    endpoints that answered (``manyfiles.s3.retry``), where an earlier test's server on the same
    port may have left it (ports are reused in a long run); its errors are then a first contact's,
    as for any endpoint a process never heard from."""
    from manyfiles.s3 import retry

    retry._answered.discard(retry.endpoint_name(url))
    return url
