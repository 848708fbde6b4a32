"""The public many-objects fetch (manyfiles.s3.Fetcher, fetch_objects): whole objects and ranges of one
bucket, concurrently, each checked, under the retry policy and the stall watch; through the fault
proxy in front of moto (which checks every signature)."""

from __future__ import annotations

import hashlib
import threading

import pytest
from s3util import blob, nth_get

from manyfiles.errors import NotFound, ObjectChanged, PartialFailure, Stalled
from manyfiles.s3 import ClientSettings, Fetcher, FetchResult, RetryPolicy, fetch_objects

FAST = RetryPolicy(attempts=3, base=0.002, cap=0.01)


@pytest.fixture
def settings(proxy) -> ClientSettings:
    return ClientSettings(endpoint_url=proxy.url, region="us-east-1")


def object_gets(proxy) -> list[str]:
    return [p for m, p, _ in proxy.requests if m == "GET" and "list-type" not in p]


def test_fetch_objects_gives_every_object_and_range_checked_in_the_order_asked(bucket, proxy, settings):
    name, put = bucket
    data = {f"k/{i}": put(f"k/{i}", blob(1000 + i, str(i))) for i in range(20)}
    big = put("big", blob(300_000, "big"))
    # one object's bytes flipped in transit: caught by its check, fetched again
    proxy.faults.append((lambda m, path, headers: m == "GET" and path.endswith("/k/3"), "flip"))
    asked = [*data, ("big", (1000, 1999)), "big", ("big", (0, 0))]
    got = list(fetch_objects(name, asked, settings=settings, workers=4, retry=FAST))
    assert [(r.key, r.range) for r in got] == [(k, None) for k in data] + [
        ("big", (1000, 1999)), ("big", None), ("big", (0, 0))]
    assert all(r.error is None for r in got)
    assert [bytes(r.data) for r in got[:20]] == list(data.values())
    assert all(r.checked not in (None, "size-only") for r in got[:20])     # (moto: its crc32 or the MD5)
    assert bytes(got[20].data) == big[1000:2000] and got[20].checked is None    # a range: not checked whole
    assert bytes(got[21].data) == big and bytes(got[22].data) == big[:1]
    assert len(object_gets(proxy)) == 24              # 23 asked, the flipped one twice


def test_whole_objects_go_through_one_loop_thread_started_on_the_first_submit(bucket, settings):
    """A batch of small misses is s3pull's small-object shape: one thread multiplexing the
    connections (the loop engine), not a pool of threads handing the GIL to each other."""
    name, put = bucket
    data = {f"s/{i}": put(f"s/{i}", blob(500 + i, str(i))) for i in range(30)}
    before = set(threading.enumerate())

    def new() -> list[threading.Thread]:    # (the S3 test server's threads run in this process too)
        return [t for t in threading.enumerate() if t not in before and t.name.startswith("s3pull-")]

    with Fetcher(name, settings=settings, workers=8, retry=FAST) as f:
        assert new() == [], "a thread before any submit"
        for key in data:
            f.submit(key, etag=hashlib.md5(data[key]).hexdigest())
        got = [f.result(key) for key in data]
        started = new()
    assert [bytes(r.data) for r in got] == list(data.values())
    assert all(r.checked not in (None, "size-only") for r in got)
    assert [t.name for t in started] == ["s3pull-loop"]
    assert not any(t.is_alive() for t in started), "closed: the loop thread ended"


def test_a_fetcher_writes_into_the_buffers_given(bucket, settings):
    name, put = bucket
    a, b = put("a", blob(5000, "a")), put("b", blob(70_000, "b"))
    etag = hashlib.md5(a).hexdigest()
    whole, part = bytearray(len(a)), bytearray(100)
    with Fetcher(name, settings=settings, workers=2, retry=FAST) as f:
        f.submit("a", etag=etag, into=whole)
        f.submit("b", range=(500, 599), into=part)
        r = f.result("b", range=(500, 599))
        assert r.data.obj is part and part == b[500:600]      # a view of the buffer, no copy
        r = f.result("a")
        assert r.data.obj is whole and whole == a and r.checked not in (None, "size-only")


def test_failures_come_back_with_their_result_in_words(bucket, settings):
    name, put = bucket
    put("there", b"x" * 10)
    with Fetcher(name, settings=settings, workers=2, retry=FAST) as f:
        f.submit("missing")
        f.submit("there", etag="0" * 32)          # the object is not that version any more
        f.submit("missing", range=(0, 9))
        changed, gone = f.result("there"), f.result("missing")
        assert isinstance(gone.error, NotFound) and str(gone.error).startswith(f"s3://{name}/missing: ")
        assert isinstance(changed.error, ObjectChanged) and changed.data is None
        assert isinstance(f.result("missing", range=(0, 9)).error, NotFound)
    with pytest.raises(PartialFailure) as info:
        list(fetch_objects(name, ["there", "missing"], settings=settings, retry=FAST))
    assert [k for k, _ in info.value.failures] == ["missing"]
    seen: list[FetchResult] = list(fetch_objects(name, ["there", "missing"], settings=settings, retry=FAST,
                                                 errors="ignore"))
    assert [r.data for r in seen] == [b"x" * 10, None]


def test_a_fetch_that_stalls_ends_with_the_stall_naming_the_endpoint(bucket, proxy):
    """The second GET is held for ever; the read timeout is far: the stall watch ends the wait."""
    name, put = bucket
    for k in ("a", "b"):
        put(k, blob(100, k))
    slow = ClientSettings(endpoint_url=proxy.url, region="us-east-1", read_timeout=600)
    proxy.faults.append((nth_get(2), "stall"))
    with Fetcher(name, settings=slow, workers=1, retry=RetryPolicy(base=0.01, cap=0.2, stall_timeout=1)) as f:
        f.submit("a")
        f.submit("b")
        assert f.result("a").error is None
        with pytest.raises(Stalled) as info:
            f.result("b")
    assert str(info.value).startswith(f"{proxy.url}: stalled, nothing moved for 1 s"), str(info.value)
