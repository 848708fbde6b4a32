"""The loop engine (issue 26): auto's small objects on one thread over many non-blocking keep-alive
connections, against moto through the fault proxy.  The exact bytes land, every body passes its
check (a flipped, rotated or foreign body is caught and fetched again), a connection cut in the
middle of a batch is retried, and an endpoint that never answers ends the run within its budget."""

from __future__ import annotations

import threading
import time

import pytest
from s3util import FAST_RETRY, SilentServer, blob, files_under, nth_get

from manyfiles.errors import Stalled
from manyfiles.s3 import ClientSettings, RetryPolicy, pull
from manyfiles.s3.report import Tally
from manyfiles.s3.routing import LOOP_MAX, choose

KiB = 1024
LOOP_THREADS = {"s3pull-loop"}


def engine_threads(before: set[threading.Thread]) -> set[str]:
    """The engines' threads alive now that were not alive ``before`` (the planner aside): what this
    run started, not what an earlier test of the process left running (a dataset's fetcher, say)."""
    return {t.name for t in threading.enumerate()
            if t not in before and t.name.startswith("s3pull-") and t.name != "s3pull-planner"}


def seed(put, n: int, size: int = KiB) -> dict[str, bytes]:
    return {f"{i:03d}.bin": put(f"s/{i:03d}.bin", blob(size + i, f"l{i}")) for i in range(n)}


def test_auto_fetches_small_objects_on_one_thread_and_installs_the_exact_bytes(bucket, proxy, tmp_path):
    """Every 1 KiB object goes to the loop, whose one thread is the only engine thread of the run (the
    lean pool's 48 never start), each checked by its checksum, none by size alone."""
    name, put = bucket
    data = seed(put, 40)
    assert choose("auto", KiB) == ("loop", 0) and choose("auto", LOOP_MAX + 1)[0] == "lean"
    seen: set[str] = set()
    before = set(threading.enumerate())

    def on_event(ev) -> None:
        if ev.kind == "done":
            seen.update(engine_threads(before))

    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/s/", str(tmp_path / "d"), settings=via, retry=FAST_RETRY, concurrency=8,
                  on_event=on_event)
    assert report.failures == [] and report.engines == {"loop": Tally(40, sum(map(len, data.values())))}
    assert files_under(tmp_path / "d") == data
    assert seen == LOOP_THREADS
    assert "size-only" not in report.verified and sum(report.verified.values()) == 40


@pytest.mark.parametrize("faults", [("flip", "wrong-range", "other-body"), ("reset", "truncate", "503")],
                         ids=["lying bodies", "cut connections"])
def test_a_lying_body_or_a_cut_connection_in_a_batch_is_fetched_again(faults, bucket, proxy, tmp_path):
    """Three of 30 GETs in flight on 4 connections go wrong; each is retried on its own, the others
    go on, and every object lands exact (a flipped or foreign body installed would differ)."""
    name, put = bucket
    data = seed(put, 30)
    proxy.decoy_path = f"/{name}/s/000.bin"
    for n, fault in zip((3, 9, 17), faults, strict=True):
        proxy.faults.append((nth_get(n), fault))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/s/", str(tmp_path / "d"), settings=via, retry=FAST_RETRY, concurrency=4)
    assert sorted(proxy.applied) == sorted(faults)
    assert report.failures == [] and report.retries == 3 and set(report.engines) == {"loop"}
    assert files_under(tmp_path / "d") == data


def test_a_body_that_keeps_lying_fails_that_object_only(bucket, proxy, tmp_path):
    name, put = bucket
    data = seed(put, 6)
    proxy.random_faults = (1.0, "flip", lambda m, p, h: m == "GET" and p.endswith("/s/002.bin"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/s/", str(tmp_path / "d"), settings=via, retry=FAST_RETRY, concurrency=4)
    assert [(f.path, f.code) for f in report.failures] == [("s/002.bin", "integrity")]
    assert set(report.engines) == {"loop"}
    assert report.retries == FAST_RETRY.attempts - 1
    del data["002.bin"]
    assert files_under(tmp_path / "d") == data


def test_an_endpoint_that_never_answers_ends_the_run_within_its_budget(tmp_path):
    """Sizes from a manifest (no listing to fail first): every GET is on the loop and none is ever
    answered; the first to give up (after its first-contact budget, half the stall timeout) ends the
    run with one line naming the endpoint, well before the read timeouts add up."""
    silent = SilentServer()
    manifest = tmp_path / "keys.txt"
    manifest.write_text("".join(f"k/{i}\t1024\n" for i in range(20)))
    settings = ClientSettings(endpoint_url=silent.url, region="us-east-1", read_timeout=0.3,
                              connect_timeout=0.3)
    waiting: set[str] = set()
    before = set(threading.enumerate())

    def on_event(ev) -> None:
        if ev.kind == "retry":
            waiting.update(engine_threads(before))

    t0 = time.monotonic()
    try:
        with pytest.raises(Stalled) as info:
            pull("s3://bucket/k/", str(tmp_path / "d"), manifest=str(manifest), settings=settings,
                 retry=RetryPolicy(base=0.01, cap=0.2, stall_timeout=1.0), concurrency=8, on_event=on_event)
    finally:
        silent.close()
    assert str(info.value) == f"{silent.url}: timed out (no answer in 0.3 s)"
    assert waiting == LOOP_THREADS            # the GETs that timed out were the loop's
    assert time.monotonic() - t0 < 10
    assert len(silent.accepted) >= 2          # several connections at once, not one after another
