"""The library conventions of s3.pull: the shared report, progress, plans, errors with causes."""

from __future__ import annotations

import json
import os

import pytest
from s3util import FAST_RETRY, blob, files_under

from manyfiles._core import report as _report
from manyfiles.errors import AccessDenied, NotFound, PartialFailure, UsageError
from manyfiles.s3 import ClientSettings, PullPlan, get_objects, iter_objects, plan, pull, verify
from manyfiles.s3.keys import STATE_DIR

KiB = 1024


def cfg(**kw):
    return {"ranged_min": 128 * KiB, "part_size": 64 * KiB, "retry": FAST_RETRY, "concurrency": 4, **kw}


def test_report_is_a_shared_report_with_coded_failures(bucket, settings, s3plain, proxy, tmp_path):
    name, put = bucket
    ok = put("r/ok.bin", blob(3000, "ok"))
    put("r/../evil", b"x")
    s3plain.put_object(Bucket=name, Key="r/flipped.bin", Body=blob(2000, "flip"))
    put("r/denied.bin", b"no")
    proxy.faults.append((lambda m, p, h: m == "GET" and p.endswith("/r/denied.bin"), "403-always"))
    proxy.random_faults = (1.0, "flip", lambda m, p, h: m == "GET" and p.endswith("/r/flipped.bin"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/r/", str(tmp_path / "o"), settings=via, **cfg())
    assert isinstance(report, _report.Report) and not report.ok
    codes = {f.path: f.code for f in report.failures}
    assert codes == {"r/../evil": "unsafe-key", "r/flipped.bin": "integrity", "r/denied.bin": "AccessDenied"}
    assert files_under(tmp_path / "o") == {"ok.bin": ok}
    # failures.tsv keeps its format: key<TAB>reason
    lines = (tmp_path / "o" / STATE_DIR / "failures.tsv").read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in lines) == sorted(codes)
    assert all(len(line.split("\t")) == 2 for line in lines)
    text = str(report)
    assert text.startswith("1 downloaded") and "3 failed" in text and "verified: crc32 1" in text
    assert "r/denied.bin: AccessDenied" in text
    record = json.loads(json.dumps(report.to_dict()))
    assert record["engines"] == {"loop": {"objects": 1, "bytes": 3000}} and record["failed"] == 3
    assert {f["code"] for f in record["failures"]} == set(codes.values())
    with pytest.raises(PartialFailure) as info:
        report.raise_for_failures()
    assert info.value.report is report


def test_progress_callable_sees_objects_and_bytes(bucket, settings, tmp_path):
    name, put = bucket
    data = {f"p/{i}.bin": put(f"p/{i}.bin", blob(1000 * (i + 1), str(i))) for i in range(5)}
    data["p/big.bin"] = put("p/big.bin", blob(300 * KiB, "big"))
    seen = []
    report = pull(f"s3://{name}/p/", str(tmp_path / "o"), settings=settings, progress=seen.append, **cfg())
    last = seen[-1]
    assert last.finished and last.unit == "objects"
    assert (last.done, last.total) == (6, 6)
    assert last.bytes == report.bytes == last.bytes_total == sum(map(len, data.values()))
    # a re-run counts the skipped objects as done
    seen.clear()
    pull(f"s3://{name}/p/", str(tmp_path / "o"), settings=settings, progress=seen.append, **cfg())
    assert (seen[-1].done, seen[-1].total, seen[-1].bytes) == (6, 6, 0)
    seen.clear()
    got = get_objects(f"s3://{name}/p/", settings=settings, progress=seen.append, **cfg())
    assert got == data and seen[-1].done == 6 and seen[-1].bytes == sum(map(len, data.values()))


def test_progress_true_without_a_terminal_prints_plain_lines(bucket, settings, tmp_path, capsys):
    name, put = bucket
    put("t/x", b"x" * 10)
    pull(f"s3://{name}/t/", str(tmp_path / "o"), settings=settings, progress=True, **cfg())
    assert "s3pull: 1/1 objects" in capsys.readouterr().err


@pytest.mark.parametrize("call", ["pull", "get_objects", "iter_objects", "plan", "verify"])
def test_bad_arguments_are_refused_before_anything_happens(call, bucket, settings, tmp_path):
    name, put = bucket
    put("b/x", b"x")
    dest = tmp_path / "o"
    src = f"s3://{name}/b/"
    with pytest.raises(UsageError):
        if call == "pull":
            pull(src, str(dest), settings=settings, progress="yes")
        elif call == "get_objects":
            get_objects(src, settings=settings, progress=3)
        elif call == "iter_objects":
            iter_objects(src, settings=settings, progress="yes")   # not even iterated
        elif call == "plan":
            plan(src, str(dest), settings=settings, progress=[])
        else:
            verify(dest, progress="yes")
    with pytest.raises(UsageError):
        pull(src, str(dest), settings=settings, layout="flat")
    with pytest.raises(UsageError):
        pull(src, str(dest), settings=settings, no_such_option=1)
    with pytest.raises(UsageError):
        pull(src, str(dest), settings=settings, on_event="print")
    assert not dest.exists()


def test_dry_run_is_a_plan_that_executes_exactly_its_objects(bucket, settings, tmp_path):
    name, put = bucket
    a = put("d/a.bin", blob(1000, "a"))
    put("d/b.bin", blob(2000, "b"))
    c = put("d/c.bin", blob(200 * KiB, "c"))
    put("d/../evil", b"x")
    dest = tmp_path / "o"
    p = plan(f"s3://{name}/d/", str(dest), settings=settings, **cfg())
    assert isinstance(p, PullPlan) and not dest.exists()
    assert {j.key: (j.engine, j.rel) for j in p.objects} == {
        "d/a.bin": ("loop", "a.bin"), "d/b.bin": ("loop", "b.bin"), "d/c.bin": ("ranged", "c.bin")}
    assert [f.code for f in p.failures] == ["unsafe-key"]
    assert p.to_dict()["objects"][0]["engine"] in ("loop", "ranged")
    put("d/b.bin", blob(2001, "b changed"))           # changed since the plan: pinned to the old ETag
    put("d/new.bin", b"listed after the plan")       # not in the plan: not fetched
    with pytest.raises(UsageError):
        pull(plan=p, dest=str(tmp_path / "elsewhere"))
    report = p.execute()
    assert report.done == 2 and not isinstance(report, PullPlan)
    assert sorted((f.path, f.code) for f in report.failures) == [("d/../evil", "unsafe-key"),
                                                                 ("d/b.bin", "changed")]
    assert files_under(dest) == {"a.bin": a, "c.bin": c}
    # executed again, the state says a and c are there: nothing is fetched twice
    again = pull(plan=p)
    assert again.done == 0 and again.skipped == 2


def test_missing_bucket_and_refused_listing_raise_their_error_with_the_cause(settings, proxy, bucket,
                                                                            tmp_path):
    with pytest.raises(NotFound) as info:
        pull("s3://no-such-bucket-here/x/", str(tmp_path / "o"), settings=settings, **cfg())
    assert "no such bucket" in str(info.value) and info.value.__cause__ is not None
    assert "NoSuchBucket" in str(info.value.__cause__)
    # a manifest run (no listing) stops at the first GET the same way
    manifest = tmp_path / "keys"
    manifest.write_text("x/1\nx/2\nx/3\n")
    with pytest.raises(NotFound):
        pull("s3://no-such-bucket-here/x/", str(tmp_path / "m"), settings=settings, manifest=str(manifest),
             **cfg())
    name, put = bucket
    put("x/y", b"y")
    proxy.faults.append((lambda m, p, h: "list-type" in p, "403-always"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    with pytest.raises(AccessDenied) as info:
        pull(f"s3://{name}/x/", str(tmp_path / "o2"), settings=via, **cfg())
    assert "AccessDenied" in str(info.value) and info.value.__cause__ is not None
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o").exists()


def test_missing_credentials_raise_credentials_error(bucket, moto_server, tmp_path, monkeypatch):
    from manyfiles.errors import CredentialsError
    from manyfiles.s3 import config

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    config.CONFIG.clear()
    name, _ = bucket
    with pytest.raises(CredentialsError) as info:
        pull(f"s3://{name}/x/", str(tmp_path / "o"), settings=ClientSettings(endpoint_url=moto_server,
                                                                            region="us-east-1"), **cfg())
    assert info.value.__cause__ is not None and not (tmp_path / "o").exists()
    config.CONFIG.clear()


def test_failure_codes_of_local_errors():
    import errno

    from manyfiles.s3.retry import classify, failure_code

    assert failure_code(classify(OSError(errno.ENOSPC, "No space left on device"))) == "ENOSPC"
    assert failure_code(classify(PermissionError(errno.EACCES, "Permission denied"))) == "EACCES"
    assert os.strerror(errno.ENOSPC) in str(classify(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))


@pytest.mark.parametrize("strategy", ["auto", "lean", "ranged", "http", "sync", "async"])
def test_etag_only_checks_the_md5_and_never_asks_for_checksums(strategy, bucket, proxy, tmp_path):
    name, put = bucket
    small = put("e/small.bin", blob(3000, "s"))        # uploaded with a CRC32 checksum
    big = put("e/big.bin", blob(300 * KiB, "b"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    first = pull(f"s3://{name}/e/", str(tmp_path / "a"), strategy=strategy, settings=via, **cfg())
    assert first.verified == {"crc32": 2}
    asked = proxy.checksum_mode_asked
    assert asked > 0
    proxy.checksum_mode_asked = 0
    report = pull(f"s3://{name}/e/", str(tmp_path / "b"), strategy=strategy, settings=via,
                  checksum_mode=False, **cfg())
    assert report.ok and report.verified == {"md5": 2}
    assert files_under(tmp_path / "b") == {"small.bin": small, "big.bin": big}
    assert proxy.checksum_mode_asked == 0
