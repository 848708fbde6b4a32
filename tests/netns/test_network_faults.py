"""Cluster jobs across simulated hosts (network namespaces, tests/netns/netlab.py) whose network
fails: a blip never fails a job, a worker cut off is replaced, a client cut off stops its shards,
a lost scheduler ends the job with one line and a rerun completes it.  The scenarios run at once
(tests/netns/scenarios.py); each test checks one outcome, on bytes: DEST against the bucket as
the S3 host holds it, nothing outside DEST, no temp file left."""

from __future__ import annotations

import re

import pytest
from scenarios import CLIENT_LEASE, STALL_TIMEOUT, Outcome, Run

CONNECT_TIMEOUT = 10.0      # s3pull's default --connect-timeout

SUMMARY = re.compile(r"^s3pull: (\d+) downloaded .*; (\d+) skipped, (\d+) failed")


def summary(run: Run) -> tuple[int, int, int]:
    """(downloaded, skipped, failed) of a run's summary line."""
    for line in run.messages:
        m = SUMMARY.match(line)
        if m:
            return int(m[1]), int(m[2]), int(m[3])
    raise AssertionError(f"no summary line in:\n{run.stderr}")


def assert_exact(o: Outcome) -> None:
    assert o.bucket, "the scenario recorded no bucket"
    missing = sorted(set(o.bucket) - set(o.dest))
    wrong = sorted(k for k in o.bucket.keys() & o.dest.keys() if o.bucket[k] != o.dest[k])
    extra = sorted(set(o.dest) - set(o.bucket))
    assert (missing[:5], wrong[:5], extra[:5]) == ([], [], []), (len(missing), len(wrong), len(extra))
    assert o.outside == [] and o.leftovers == []


def assert_one_line(run: Run, pattern: str) -> None:
    """Exit 1, and besides progress lines exactly one stderr line, matching ``pattern``."""
    assert run.code == 1, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert len(run.messages) == 1 and re.fullmatch(pattern, run.messages[0]), run.stderr


def assert_clean_success(o: Outcome, run: Run) -> None:
    assert run.code == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert_exact(o)
    assert summary(run) == (len(o.bucket), 0, 0), run.stderr       # every object counted once


@pytest.mark.netfault("link-down")
def test_a_worker_unplugged_for_20_s_costs_the_job_nothing(netfaults) -> None:
    o = netfaults.outcome("link-down")
    assert_clean_success(o, o.runs[0])
    # the other worker went on while the cut one was away (shards enough for both from the start)
    assert o.served_by("other", "healed") > o.served_by("other", "cut")


@pytest.mark.netfault("silent-drop")
def test_a_worker_whose_packets_vanish_for_20_s_costs_the_job_nothing(netfaults) -> None:
    o = netfaults.outcome("silent-drop")
    assert_clean_success(o, o.runs[0])
    assert o.served_by("other", "healed") > o.served_by("other", "cut")


@pytest.mark.netfault("permanent-cut")
def test_a_worker_unplugged_for_good_is_replaced(netfaults) -> None:
    o = netfaults.outcome("permanent-cut")
    run = o.runs[0]
    assert_clean_success(o, run)
    assert "re-run after a worker was lost or cut off" in run.stderr, run.stderr    # its slice, elsewhere


@pytest.mark.netfault("scheduler-cut")
def test_a_worker_cut_off_from_the_scheduler_longer_than_the_lease_is_rerun(netfaults) -> None:
    """Its shards stop when the lease lapses there (it cannot see the beat), and their results
    say so once the link is back: the client, which never lost the scheduler, runs them again."""
    o = netfaults.outcome("scheduler-cut")
    run = o.runs[0]
    assert_clean_success(o, run)
    assert "re-run after a worker was lost or cut off" in run.stderr, run.stderr
    assert o.served_by("cut", "healed") > o.served_by("cut", "cut")      # it did download meanwhile


@pytest.mark.netfault("client-cut")
def test_a_client_cut_off_stops_its_shards_and_ends_with_one_line(netfaults) -> None:
    o = netfaults.outcome("client-cut")
    first, rerun = o.runs
    assert_one_line(first, r"s3pull: (the job's lease lapsed: this client could not renew it|lost the Dask "
                           r"scheduler) at (the Dask scheduler )?tcp://[\d.]+:\d+.*rerun to resume")
    # no shard wrote into DEST later than the lease (+5 s) after the cut, and nothing under a final
    # name was half-written
    assert o.facts["newest_write"] <= o.facts["cut_wall"] + CLIENT_LEASE + 5
    stopped = o.facts["files_at_stop"]
    assert 0 < len(stopped) < len(o.bucket)
    assert all(o.bucket[k] == md5 for k, md5 in stopped.items())
    assert rerun.code == 0, rerun.stderr
    assert_exact(o)


@pytest.mark.netfault("scheduler-kill")
def test_a_killed_scheduler_ends_the_job_with_one_line_and_a_rerun_completes_it(netfaults) -> None:
    o = netfaults.outcome("scheduler-kill")
    first, rerun = o.runs
    address = re.escape(o.facts["scheduler"])
    assert_one_line(first, rf"s3pull: lost the Dask scheduler at {address}: \d+ of (at least )?\d+ shards "
                           r"done; rerun to resume")
    assert rerun.code == 0, rerun.stderr
    assert_exact(o)


@pytest.mark.netfault("spread")
def test_5004_keys_on_two_workers_keep_both_busy(netfaults) -> None:
    o = netfaults.outcome("spread")
    run = o.runs[0]
    assert_clean_success(o, run)
    shards = o.facts["shards"]
    assert set(shards) == o.facts["workers"], run.stderr
    total = sum(shards.values())
    assert all(n >= 0.3 * total for n in shards.values()), shards


@pytest.mark.netfault("s3-outage")
def test_workers_cut_off_from_s3_for_a_minute_stall_visibly_and_ride_it_out(netfaults) -> None:
    o = netfaults.outcome("s3-outage")
    run = o.runs[0]
    assert_clean_success(o, run)
    shown = o.facts["stalled_shown_after"]
    assert shown is not None and shown <= 15, (shown, run.stderr)
    stalled = [line for _, line in run.lines if "stalled" in line]
    assert re.search(r", stalled \d+s: last error: ", stalled[0]), stalled[0]


@pytest.mark.netfault("s3-lost")
def test_workers_cut_off_from_s3_for_good_end_the_job_with_one_line(netfaults) -> None:
    o = netfaults.outcome("s3-lost")
    first, rerun = o.runs
    assert_one_line(first, rf"s3pull: http://[\d.]+:\d+: stalled, nothing moved for {STALL_TIMEOUT:g} s "
                           r"\(last error: .*\).*")
    # within the stall timeout and a request's budget (a connect in flight when the stall ends is
    # given its timeout, 10 s), and a few seconds for the exit
    assert o.moments["client ended"] - o.moments["cut"] <= STALL_TIMEOUT + CONNECT_TIMEOUT + 5
    stopped = o.facts["files_at_stop"]
    assert all(o.bucket[k] == md5 for k, md5 in stopped.items())      # nothing half-written
    assert rerun.code == 0, rerun.stderr
    assert_exact(o)
