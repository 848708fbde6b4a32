"""The S3 store (manyfiles.s3.store): one bucket's reads and writes, through the fault proxy in front of
moto (which checks every signature, and relays what the store sends)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import zlib

import pytest
from s3util import blob

from manyfiles.errors import IntegrityError, ObjectChanged
from manyfiles.s3 import ClientSettings, RetryPolicy
from manyfiles.s3.integrity import new_hash
from manyfiles.s3.store import FileBody, ObjectExists, S3Store, Store, list_buckets, store_for

KiB, MiB = 1 << 10, 1 << 20
FAST = RetryPolicy(attempts=3, base=0.002, cap=0.01)


def b64(alg: str, data: bytes) -> str:
    h = new_hash(alg)
    h.update(data)
    return base64.b64encode(h.digest()).decode()


@pytest.fixture
def store(proxy, bucket) -> S3Store:
    name, _ = bucket
    return store_for(ClientSettings(endpoint_url=proxy.url, region="us-east-1"), name, retry=FAST)


def requests_of(proxy, method: str) -> list[str]:
    return [p for m, p, _ in proxy.requests if m == method]


def test_an_s3_store_is_a_store(store):
    assert isinstance(store, Store)
    assert store_for(store.settings, store.bucket).transport is store.transport    # configured once


def test_reads_list_head_get_and_ranges(store, bucket, proxy):
    _, put = bucket
    data = {f"d/{k}": put(f"d/{k}", blob(n, k)) for k, n in (("a", 3000), ("b/c", 10), ("b/d", 0))}
    assert [(i.key, i.size) for i in store.list("d/")] == [("d/a", 3000), ("d/b/c", 10), ("d/b/d", 0)]
    assert [(i.key, i.size) for i in store.list("d/", delimiter="/")] == [("d/b/", None), ("d/a", 3000)]
    head = store.head("d/a")
    assert head.size == 3000 and head.etag == hashlib.md5(data["d/a"]).hexdigest()
    assert store.get("d/a") == data["d/a"] and store.get("d/b/d") == b""
    proxy.requests.clear()
    got = store.get_ranges("d/a", [(2000, 2099), (0, 9), (20, 29)], if_match=head.etag, gap=100)
    assert [bytes(g.data) for g in got] == [data["d/a"][2000:2100], data["d/a"][0:10], data["d/a"][20:30]]
    assert len(requests_of(proxy, "GET")) == 2      # 0-9 and 20-29 came in one request


def test_list_buckets_is_signed_and_sent_by_the_store(store, bucket, proxy):
    """ListBuckets (``GET /`` on the service): through the proxy, which checks every signature."""
    name, _ = bucket
    proxy.requests.clear()
    assert name in list_buckets(store.settings)
    assert [(m, p) for m, p, _ in proxy.requests] == [("GET", "/")]


def test_put_is_checked_by_the_server(store, bucket):
    body = blob(5000, "p")
    r = store.put("p/md5", body, content_md5=hashlib.md5(body).digest())
    assert r.etag == hashlib.md5(body).hexdigest() and store.get("p/md5") == body
    store.put("p/crc", body, checksum=("crc32", b64("crc32", body)))
    head = store.head("p/crc")      # stored with the object: what its readers check it against
    assert (head.claim.method, head.claim.value) == ("crc32", b64("crc32", body))
    assert store.get("p/crc") == body
    # the bytes the server got are not those the checksum or digest was taken of: refused, nothing written
    with pytest.raises(IntegrityError):
        store.put("p/bad-md5", body, content_md5=hashlib.md5(body + b"x").digest())
    with pytest.raises(IntegrityError):
        store.put("p/bad-crc", body, checksum=("crc32", b64("crc32", body + b"x")))
    assert [i.key for i in store.list("p/")] == ["p/crc", "p/md5"]


def test_put_from_a_file(store, tmp_path):
    path = tmp_path / "f"
    body = blob(3 * MiB + 17, "file")
    path.write_bytes(b"head" + body)
    with open(path, "rb") as f:
        store.put("f/x", FileBody(f.fileno(), 4, len(body)), content_md5=hashlib.md5(body).digest())
    assert store.get("f/x") == body


def test_put_if_none_match_never_replaces(store):
    store.put("n/x", b"first", if_none_match=True)
    with pytest.raises(ObjectExists):
        store.put("n/x", b"second", if_none_match=True)
    assert store.get("n/x") == b"first"


@pytest.mark.parametrize("given", ["checksum", "md5 of the body"])
def test_a_conditional_put_whose_answer_was_lost_is_not_taken_for_another_writer(store, proxy, given):
    """The server stored the PUT, then the kept-alive connection closed before its answer: the PUT is
    tried again as a failed request (not resent unseen), its 412 asks a HEAD, and the object there is
    this PUT's own: done, not ObjectExists.  Another writer's bytes there are still ObjectExists."""
    store.put("n/warm", b"x")                       # (a connection kept alive for the next PUT)
    body = b"conditional body"
    crc = ("crc32", base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode())
    proxy.faults.append((lambda m, path, headers: m == "PUT" and path.endswith("/n/y"), "drop-after"))
    result = store.put("n/y", body, if_none_match=True, checksum=crc if given == "checksum" else None)
    assert proxy.applied == ["drop-after"]
    assert [m for m, p, _ in proxy.requests if p.partition("?")[0].endswith("/n/y")] == ["PUT", "PUT", "HEAD"]
    assert result.etag == hashlib.md5(body).hexdigest() and store.get("n/y") == body
    proxy.faults.append((lambda m, path, headers: m == "PUT" and path.endswith("/n/y"), "drop-after"))
    with pytest.raises(ObjectExists):             # its second try finds another body: not this PUT's
        store.put("n/y", b"other body", if_none_match=True)
    assert store.get("n/y") == body


def test_multipart_upload_resumed_from_its_parts(store):
    parts = [blob(5 * MiB, "m1"), blob(5 * MiB, "m2"), blob(1000, "m3")]
    upload_id = store.create_multipart("m/x", checksum_algorithm="crc32", full_object=False)
    assert [(u.key, u.upload_id) for u in store.list_multipart_uploads("m/")] == [("m/x", upload_id)]
    sent = [store.upload_part("m/x", upload_id, n, data, checksum=("crc32", b64("crc32", data)),
                              content_md5=hashlib.md5(data).digest())
            for n, data in enumerate(parts[:2], 1)]
    # a later run finds what the server holds, and finishes
    held = store.list_parts("m/x", upload_id)
    assert [(p.number, p.etag, p.size) for p in held] == \
        [(p.number, p.etag, len(d)) for p, d in zip(sent, parts[:2], strict=True)]
    last = store.upload_part("m/x", upload_id, 3, parts[2], checksum=("crc32", b64("crc32", parts[2])))
    with pytest.raises(IntegrityError):       # a part sent with another checksum than its bytes'
        store.upload_part("m/x", upload_id, 4, b"zz", checksum=("crc32", b64("crc32", b"yy")))
    result = store.complete_multipart("m/x", upload_id, [*held, last])
    assert result.etag and result.etag.endswith("-3")
    assert store.get("m/x") == b"".join(parts)
    assert list(store.list_multipart_uploads("m/")) == []


def test_abort(store):
    upload_id = store.create_multipart("a/x")
    store.upload_part("a/x", upload_id, 1, b"some bytes")
    store.abort_multipart("a/x", upload_id)
    store.abort_multipart("a/x", upload_id)       # already gone: not an error
    assert list(store.list_multipart_uploads("a/")) == [] and list(store.list("a/")) == []


def test_delete_and_delete_objects_in_batches(store, bucket, proxy, monkeypatch):
    from manyfiles.s3 import store as store_module

    _, put = bucket
    keys = [f"x/{i}" for i in range(7)] + ["x/odd name & <tag>"]
    for k in keys:
        put(k, b"1")
    store.delete("x/0")
    store.delete("x/0")                           # gone already: not an error
    monkeypatch.setattr(store_module, "DELETE_BATCH", 3)
    proxy.requests.clear()
    assert store.delete_objects(keys[1:]) == []
    assert len(requests_of(proxy, "POST")) == 3 and list(store.list("x/")) == []


def test_a_changed_object_is_never_returned_as_the_one_asked(store, bucket):
    _, put = bucket
    put("c/x", b"one")
    head = store.head("c/x")
    put("c/x", b"two!")
    with pytest.raises(ObjectChanged):
        store.get_range("c/x", 0, 2, if_match=head.etag)
    with pytest.raises(ObjectChanged):
        store.get("c/x", if_match=head.etag)


def test_the_store_survives_a_fork(store, bucket):
    """A forked child's store forgets its parent's connections (the parent keeps using them)."""
    _, put = bucket
    put("k/x", b"data")
    assert store.get_range("k/x", 0, 3, if_match=None).data == b"data"     # a kept-alive connection
    pid = os.fork()
    if pid == 0:
        try:
            ok = bytes(store.get_range("k/x", 0, 3, if_match=None).data) == b"data"
        finally:
            os._exit(0 if ok else 1)
    assert bytes(store.get_range("k/x", 0, 1, if_match=None).data) == b"da"
    assert os.waitpid(pid, 0)[1] == 0


def test_a_response_closed_by_another_thread_keeps_its_fd_until_the_reader_leaves(store, bucket, tmp_path):
    """The cache's read-ahead thread splices a stream's body while the reader drops the stream (a
    seek).  Had close() released the fd while the splice had its number, the next connection opened
    under that number would lose its response's body to the splice (a ranged GET then waited for it
    until the read timeout)."""
    import stat
    import threading

    from manyfiles.errors import TransferError
    from manyfiles.s3.transport import Splicer

    name, put = bucket
    put("big.bin", blob(3 * MiB, "big"))
    took, go = threading.Event(), threading.Event()

    class HeldSplicer(Splicer):
        """Holds the reader between taking the socket's fd number and the splice itself."""

        def move(self, sock: int, offset: int, want: int) -> int:
            took.set()
            go.wait(30)
            return super().move(sock, offset, want)

    resp = store.transport.open("GET", f"/{name}/big.bin", [])
    fd = resp.sock.fileno()
    inode = os.fstat(fd).st_ino
    errors: list[BaseException] = []
    with open(tmp_path / "landing", "wb") as f:
        splicer = HeldSplicer(f.fileno())

        def read() -> None:
            try:
                resp.land(splicer, 0, resp.length)
            except BaseException as exc:
                errors.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        assert took.wait(30)
        resp.close()                            # from another thread, the reader about to splice
        st = os.fstat(fd)                       # still this socket: no other connection can get its number
        assert stat.S_ISSOCK(st.st_mode) and st.st_ino == inode
        go.set()
        reader.join(30)
    assert len(errors) == 1 and isinstance(errors[0], TransferError), errors
    with contextlib.suppress(OSError):          # released by the reader as it left
        assert os.fstat(fd).st_ino != inode
