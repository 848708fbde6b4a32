"""Network errors and stalls (issue 24), on real sockets: an endpoint where nothing listens, one that
accepts and never answers, one that resets, and the fault proxy in front of moto going down in the
middle of a pull and coming back.

Every cause has one wording, with the endpoint and no Python class name; an outage shorter than
the stall timeout is ridden out to the exact bytes; a stall past it ends the run with one error
naming the endpoint and the cause, and a rerun completes.  The budgets are small here (a second or
two); their defaults' arithmetic is tests/core/test_retry_budget.py's.
"""

from __future__ import annotations

import errno
import re
import socket

import pytest
from s3util import CREDS, Bucket, SilentServer, blob, files_under, nth_get, refused_url

from manyfiles.errors import Stalled, TransferError
from manyfiles.s3 import ClientSettings, RetryPolicy, pull
from manyfiles.s3.objects import ObjectClient
from manyfiles.s3.retry import NetworkError, classify, network_error

CLASS_NAME = re.compile(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)*(?:Error|Exception)\b|gaierror|timeout\(")
QUICK = RetryPolicy(base=0.01, cap=0.2, stall_timeout=1.0)      # first contact: 0.5 s
STRATEGIES = ["lean", "loop", "http", "threads", "async"]


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)


def settings_for(url: str, timeout: float = 0.3) -> ClientSettings:
    return ClientSettings(endpoint_url=url, region="us-east-1", read_timeout=timeout, connect_timeout=timeout)


@pytest.fixture
def silent():
    server = SilentServer()
    yield server
    server.close()


def test_each_cause_is_one_wording_with_the_endpoint(silent):
    resetting = SilentServer(reset=True)
    refused = refused_url()
    try:
        for url, want, code in [(refused, "connection refused", "refused"),
                                (silent.url, "timed out (no answer in 0.3 s)", "timeout"),
                                (resetting.url, "connection reset", "reset")]:
            with pytest.raises(NetworkError) as info:
                ObjectClient(settings_for(url), retry=QUICK).head("bucket", "key")
            err = info.value
            assert str(err) == f"{url}: {want}" and err.code == code and err.retryable, str(err)
            assert err.first_contact and err.unanswered      # nothing there ever answered
            # the same through botocore (the threads and async engines' transport)
            client = settings_for(url).client()
            with pytest.raises(Exception) as raw:
                client.head_object(Bucket="bucket", Key="key")
            err = classify(raw.value)
            assert str(err).startswith(f"{url}: {want.partition(' (')[0]}") and err.code == code, str(err)
            assert not CLASS_NAME.search(str(err)), str(err)
    finally:
        resetting.close()
    # the causes no loopback test can make, as the kernel reports them
    temporary = network_error(socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
                              "https://s3.example.com")
    assert (str(temporary), temporary.code, temporary.retryable) == (
        "https://s3.example.com: DNS lookup failed (temporary failure)", "dns", True)
    unknown = network_error(socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "https://s3.typo")
    assert (str(unknown), unknown.retryable) == ("https://s3.typo: DNS lookup failed (unknown host)", False)
    unreachable = network_error(OSError(errno.EHOSTUNREACH, "No route to host"), "http://10.0.0.5:9000")
    assert (str(unreachable), unreachable.code) == (
        "http://10.0.0.5:9000: host unreachable (no route to host)", "unreachable")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_engine_ends_a_run_on_an_endpoint_that_never_answered_with_its_error(strategy, tmp_path):
    """No listing to fail first (the keys come from a manifest): the first object that gives up (after
    the first-contact budget) ends the run, with the cause in words; the others would wait as long."""
    url = refused_url()
    manifest = tmp_path / "keys.txt"
    manifest.write_text("k/a\t10\nk/b\t20\n")
    with pytest.raises(Stalled) as info:
        pull("s3://bucket/k/", str(tmp_path / "d"), manifest=str(manifest), strategy=strategy,
             settings=settings_for(url), retry=QUICK)
    assert str(info.value) == f"{url}: connection refused"


def test_a_silent_endpoint_ends_the_pull_with_its_error_and_shows_the_stall_meanwhile(silent, tmp_path):
    """The issue's 368 silent seconds: now the progress says what it waits for, and the listing's own
    error (after the first-contact budget, half the stall timeout) ends the run; no DEST."""
    seen = []
    with pytest.raises(TransferError) as info:
        pull("s3://bucket/p/", str(tmp_path / "d"), settings=settings_for(silent.url, 0.5),
             retry=RetryPolicy(base=0.01, stall_timeout=4), progress=seen.append)
    timed_out = f"{silent.url}: timed out (no answer in 0.5 s)"
    assert str(info.value) == f"s3://bucket/p/: {timed_out}"
    stalls = [s.stall for s in seen if s.stall is not None]
    assert stalls and stalls[-1].error == timed_out and stalls[-1].seconds >= 0.5
    assert not any(s.finished for s in seen), "a run that stopped must not look finished"
    assert not (tmp_path / "d").exists()


def test_a_listing_that_gives_up_between_two_ticks_leaves_its_last_error_on_the_display(tmp_path):
    """The display is drawn about once a second while the first page is awaited; a listing whose
    error came after the last drawing, and that then gave up, still leaves that error on the last
    frame (the live bar said ``last error: none yet`` above the error line when the ticks fell so)."""
    from manyfiles._core.progress import Progress, StallWatch
    from manyfiles.s3._pullconfig import PullConfig
    from manyfiles.s3._run import run
    from manyfiles.s3.keys import parse_url

    timed_out = "http://127.0.0.1:9: timed out (no answer in 1 s)"
    watch = StallWatch(4, show_after=0)

    def listing():
        watch.failed(timed_out)             # a try timed out and was retried; the next one gave up,
        raise TransferError(f"s3://bucket/p/: {timed_out}", retryable=False)    # before any tick
        yield

    seen = []
    with pytest.raises(TransferError):
        list(run(parse_url("s3://bucket/p/"), listing(), str(tmp_path / "d"), cfg=PullConfig(),
                 settings=settings_for("http://127.0.0.1:9"), progress=Progress("s3pull", seen.append),
                 watch=watch))
    assert seen and seen[-1].stall is not None and seen[-1].stall.error == timed_out, seen
    assert not (tmp_path / "d").exists()


@pytest.fixture
def store(moto_direct):
    b = Bucket(moto_direct, prefix="net")
    yield b
    b.close()


def seed(store: Bucket, n: int = 30) -> dict[str, bytes]:
    return {f"{i:03d}": store.put(f"p/{i:03d}", blob(3000 + 7 * i, f"n{i}")) for i in range(n)}


@pytest.mark.parametrize(("strategy", "kind"), [("lean", "refuse"), ("http", "hang"), ("threads", "refuse"),
                                                ("async", "hang"), ("loop", "hang")])
def test_an_outage_shorter_than_the_stall_timeout_is_ridden_out(store, strategy, kind, tmp_path):
    """Two tries per object would not last the outage: the time budget of errors that heard nothing
    from the endpoint, not the count, is what rides it out."""
    objs = seed(store)
    store.proxy.faults.append((nth_get(10), f"{kind}-for:1.5"))
    retries: list[str] = []
    report = pull(f"s3://{store.bucket}/p/", str(tmp_path / "d"), strategy=strategy, concurrency=4,
                  settings=settings_for(store.endpoint, 0.5),
                  retry=RetryPolicy(attempts=2, base=0.01, cap=0.2, stall_timeout=20),
                  on_event=lambda ev: retries.append(ev.value) if ev.kind == "retry" else None)
    assert report.ok and report.done == len(objs), report.failures
    assert files_under(tmp_path / "d") == objs
    assert store.proxy.outage_hits >= 1 and retries, "the outage was not met"
    for reason in retries:
        assert reason.startswith(f"{store.endpoint}: ") and not CLASS_NAME.search(reason), reason


@pytest.mark.parametrize(("strategy", "kind"), [("lean", "hang"), ("http", "refuse"), ("loop", "hang")])
def test_a_stall_past_the_stall_timeout_ends_the_run_naming_the_endpoint_and_a_rerun_completes(
        store, strategy, kind, tmp_path):
    objs = seed(store)
    store.proxy.faults.append((nth_get(10), f"{kind}-for:600"))
    seen = []
    args = dict(strategy=strategy, concurrency=4, settings=settings_for(store.endpoint, 0.5),
                retry=RetryPolicy(base=0.01, cap=0.2, stall_timeout=2))
    with pytest.raises(Stalled) as info:
        pull(f"s3://{store.bucket}/p/", str(tmp_path / "d"), progress=seen.append, **args)
    message = str(info.value)
    assert message.startswith(f"{store.endpoint}: stalled, nothing moved for 2 s (last error: "), message
    assert ("timed out" if kind == "hang" else "connection re") in message and not CLASS_NAME.search(message)
    assert any(s.stall for s in seen) and not any(s.finished for s in seen)
    store.proxy.come_back()
    report = pull(f"s3://{store.bucket}/p/", str(tmp_path / "d"), **args)
    assert report.ok and files_under(tmp_path / "d") == objs
