"""manyfiles.s3.pull against moto's server over real HTTP: every engine, re-runs, hostile keys."""

from __future__ import annotations

import hashlib
import os

import pytest
from s3util import FAST_RETRY, blob, files_under

from manyfiles.s3 import get_objects, iter_objects, pull
from manyfiles.s3.keys import STATE_DIR
from manyfiles.s3.routing import STRATEGIES

KiB = 1024
PART = 64 * KiB     # tiny parts so a 200 KiB object is fetched as 4 ranged GETs


def seed_mixed(put) -> dict[str, bytes]:
    data = {}
    for i in range(12):
        data[f"data/small/{i:02d}.txt"] = put(f"data/small/{i:02d}.txt", blob(100 + i * 50, f"s{i}"))
    data["data/medium.bin"] = put("data/medium.bin", blob(90 * KiB, "m"))
    data["data/big.bin"] = put("data/big.bin", blob(200 * KiB + 123, "b"))
    data["data/empty"] = put("data/empty", b"")
    return data


def small_cfg(**kw):
    # auto: up to 64 KiB on the loop, < 128 KiB whole in the lean pool, larger in 64 KiB parts
    return {"ranged_min": 128 * KiB, "part_size": PART, "retry": FAST_RETRY,
            "concurrency": 8, **kw}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_engine_downloads_exact_bytes(strategy, bucket, settings, tmp_path):
    name, put = bucket
    data = seed_mixed(put)
    dest = tmp_path / "out"
    report = pull(f"s3://{name}/data/", str(dest), strategy=strategy, settings=settings,
                  processes=2, **small_cfg())
    assert report.failures == []
    assert report.done == len(data)
    assert files_under(dest) == {k.removeprefix("data/"): v for k, v in data.items()}
    assert report.bytes == sum(len(v) for v in data.values())
    if strategy == "auto":     # up to 64 KiB on the loop, the 90 KiB object whole on the lean pool
        assert set(report.engines) == {"loop", "lean", "ranged"}
        assert (report.engines["loop"].objects, report.engines["lean"].objects,
                report.engines["ranged"].objects) == (13, 1, 1)
    else:
        assert set(report.engines) == {strategy}
    # nothing left behind in the temp folder
    assert os.listdir(dest / STATE_DIR / "tmp") == []


def test_rerun_skips_finished_objects_and_refetches_changed_ones(bucket, settings, tmp_path):
    name, put = bucket
    data = seed_mixed(put)
    dest = tmp_path / "out"
    first = pull(f"s3://{name}/data/", str(dest), settings=settings, **small_cfg())
    assert first.done == len(data)
    put("data/small/00.txt", b"new content")
    os.remove(dest / "small" / "01.txt")
    (dest / "small" / "02.txt").write_bytes(b"truncated")   # size differs from the state record
    second = pull(f"s3://{name}/data/", str(dest), settings=settings, **small_cfg())
    assert second.failures == []
    assert second.done == 3 and second.skipped == len(data) - 3
    assert (dest / "small" / "00.txt").read_bytes() == b"new content"
    assert (dest / "small" / "01.txt").read_bytes() == data["data/small/01.txt"]
    assert (dest / "small" / "02.txt").read_bytes() == data["data/small/02.txt"]


def flip_first_byte(path, keep_mtime: bool = False) -> None:
    st = os.stat(path)
    with open(path, "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0x01]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def state_records(dest) -> dict[str, dict]:
    import json

    lines = (dest / STATE_DIR / "state.jsonl").read_text().splitlines()
    return {r["k"]: r for r in map(json.loads, lines)}


def test_rerun_rehashes_files_changed_since_against_the_check_they_passed(bucket, s3plain, settings,
                                                                         tmp_path):
    """The state records the check each file passed; a re-run re-hashes a file whose mtime or
    inode changed (same size) and fetches it again only if the bytes no longer pass;
    ``verify_existing`` re-hashes even the files that look untouched."""
    name, _ = bucket
    data = {f"r/{n}.bin": blob(3000 + i, n) for i, n in enumerate(("same", "flip", "touch", "copy", "quiet"))}
    for k, v in data.items():
        s3plain.put_object(Bucket=name, Key=k, Body=v)       # MD5-only objects
    dest = tmp_path / "o"
    first = pull(f"s3://{name}/r/", str(dest), settings=settings, **small_cfg())
    assert first.verified == {"md5": 5}
    for k, rec in state_records(dest).items():
        assert (rec["m"], rec["c"], rec["s"]) == ("md5", hashlib.md5(data[k]).hexdigest(), len(data[k]))
        assert rec["i"] == os.stat(dest / rec["r"]).st_ino
    flip_first_byte(dest / "flip.bin")                        # same size, new mtime, wrong bytes
    os.utime(dest / "touch.bin", ns=(1, 1))                   # new mtime, right bytes
    copy = dest / "copy.bin"
    os.rename(copy, tmp_path / "moved")                       # new inode, right bytes
    copy.write_bytes((tmp_path / "moved").read_bytes())
    flip_first_byte(dest / "quiet.bin", keep_mtime=True)      # wrong bytes, size/mtime/inode as recorded
    second = pull(f"s3://{name}/r/", str(dest), settings=settings, **small_cfg())
    assert (second.done, second.skipped, second.failures) == (1, 4, [])
    got = files_under(dest)
    assert got.pop("quiet.bin") != data["r/quiet.bin"]       # only a re-hash of everything sees it
    assert got == {k[2:]: v for k, v in data.items() if k != "r/quiet.bin"}
    assert state_records(dest)["r/copy.bin"]["i"] == copy.stat().st_ino    # re-recorded after its re-hash
    third = pull(f"s3://{name}/r/", str(dest), settings=settings, verify_existing=True, **small_cfg())
    assert (third.done, third.skipped, third.failures) == (1, 4, [])
    assert files_under(dest) == {k[2:]: v for k, v in data.items()}


def test_a_size_only_record_cannot_be_rehashed_so_a_changed_file_is_fetched_again(bucket, settings, tmp_path):
    name, put = bucket
    data = {f"z/{i}.bin": put(f"z/{i}.bin", blob(2000 + i, f"z{i}")) for i in range(3)}
    dest = tmp_path / "o"
    assert pull(f"s3://{name}/z/", str(dest), settings=settings, verify=False,
                **small_cfg()).verified == {"size-only": 3}
    assert {r["m"] for r in state_records(dest).values()} == {"size-only"}
    os.utime(dest / "1.bin", ns=(1, 1))                       # right bytes, but nothing to prove it
    again = pull(f"s3://{name}/z/", str(dest), settings=settings, **small_cfg())
    assert (again.done, again.skipped) == (1, 2) and again.verified == {"crc32": 1}
    assert files_under(dest) == {k[2:]: v for k, v in data.items()}


def test_hostile_keys_never_escape_dest(bucket, settings, tmp_path):
    name, put = bucket
    hostile = ["../escape.txt", "a/../../escape2.txt", "/abs.txt", "a//b.txt", "x/./y.txt",
               ".s3pull/state.jsonl", "n" * 300]
    for k in hostile:
        put(k, b"evil")
    put("dirmarker/", b"")
    put("ok/file.txt", b"fine")
    put("weird name (1)/ünï ключ.txt", b"unicode")
    dest = tmp_path / "inner" / "out"
    report = pull(f"s3://{name}/", str(dest), settings=settings, **small_cfg())
    failed = {f.path for f in report.failures}
    assert failed == set(hostile)
    assert all("unsafe key" in f.reason and f.code == "unsafe-key" for f in report.failures)
    assert report.skipped == 1            # the directory marker
    assert report.done == 2
    assert files_under(dest) == {"ok/file.txt": b"fine", "weird name (1)/ünï ключ.txt": b"unicode"}
    # nothing was written next to or above DEST
    assert sorted(os.listdir(tmp_path)) == ["inner"]
    assert os.listdir(tmp_path / "inner") == ["out"]
    failures = (dest / STATE_DIR / "failures.tsv").read_text()
    assert "../escape.txt\tunsafe key" in failures


def test_symlink_inside_dest_is_not_followed(bucket, settings, tmp_path):
    name, put = bucket
    put("sub/x.txt", b"data")
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "out"
    dest.mkdir()
    os.symlink(outside, dest / "sub")
    report = pull(f"s3://{name}/", str(dest), settings=settings, **small_cfg())
    assert report.done == 0 and len(report.failures) == 1
    assert "symlink" in report.failures[0].reason
    assert os.listdir(outside) == []


def test_wildcards_include_exclude(bucket, settings, tmp_path):
    name, put = bucket
    for k in ("logs/2026-01/a.json", "logs/2026-01/b.txt", "logs/2026-02/c.json", "logs/2025-12/d.json",
              "logs/2026-02/tmp/e.json"):
        put(k, k.encode())
    dest = tmp_path / "out"
    report = pull(f"s3://{name}/logs/2026-*/*.json", str(dest), settings=settings,
                  exclude=["*/tmp/*"], **small_cfg())
    assert report.failures == []
    assert sorted(files_under(dest)) == ["2026-01/a.json", "2026-02/c.json"]
    put("logs/../evil.json", b"filtered out before it could fail")
    dest2 = tmp_path / "out2"
    report = pull(f"s3://{name}/logs/", str(dest2), settings=settings, include=["*.txt"], **small_cfg())
    assert report.failures == [] and report.listed == 1
    assert sorted(files_under(dest2)) == ["2026-01/b.txt"]


def test_downloads_start_while_listing_continues(bucket, settings, tmp_path):
    """The source below refuses to go on until the first object is on disk: only a pipeline passes."""
    import time

    from manyfiles.s3.keys import parse_url
    from manyfiles.s3.object_listing import list_objects
    from manyfiles.s3.pull import PullConfig, run

    name, put = bucket
    for i in range(12):
        put(f"p/{i:03d}", b"x" * i)
    url = parse_url(f"s3://{name}/p/")
    dest = tmp_path / "o"

    def gated():
        for n, info in enumerate(list_objects(settings, url, page_size=5)):
            if n == 5:   # second page: wait for a download of the first page to finish
                deadline = time.monotonic() + 60
                while not (dest / "000").exists() and not (dest / "004").exists():
                    assert time.monotonic() < deadline, "no download started before the listing ended"
                    time.sleep(0.01)
            yield info

    kinds = [ev.kind for ev in run(url, gated(), str(dest), settings=settings,
                                       cfg=PullConfig(retry=FAST_RETRY))]
    assert kinds.count("done") == 12
    assert kinds.index("done") < kinds.index("listed")


def test_manifest_with_and_without_sizes(bucket, settings, tmp_path):
    name, put = bucket
    a = put("m/a.bin", blob(300, "a"))
    b = put("m/b.bin", blob(200 * KiB, "b"))
    put("m/not-listed", b"no")
    manifest = tmp_path / "keys.txt"
    manifest.write_text(f"m/a.bin\nm/b.bin\t{len(b)}\n\nm/missing\n")
    report = pull(f"s3://{name}/m/", str(tmp_path / "o"), settings=settings, manifest=str(manifest),
                  **small_cfg())
    assert files_under(tmp_path / "o") == {"a.bin": a, "b.bin": b}
    assert report.engines["ranged"].objects == 1
    assert [f.path for f in report.failures] == ["m/missing"]
    assert "no such key" in report.failures[0].reason


def test_object_changed_since_listing_is_a_clear_failure(bucket, settings, tmp_path):
    name, put = bucket
    data = put("c/x.bin", blob(1000, "x"))
    stale = hashlib.md5(b"something else").hexdigest()
    manifest = tmp_path / "keys.txt"
    manifest.write_text(f"c/x.bin\t{len(data)}\t{stale}\n")
    report = pull(f"s3://{name}/c/", str(tmp_path / "o"), settings=settings, manifest=str(manifest),
                  **small_cfg())
    assert report.done == 0
    assert "changed" in report.failures[0].reason
    assert not (tmp_path / "o" / "x.bin").exists()


def test_memory_api(bucket, settings):
    name, put = bucket
    data = seed_mixed(put)
    got = get_objects(f"s3://{name}/data/", settings=settings, **small_cfg())
    assert got == data
    got = dict(iter_objects(f"s3://{name}/data/small/0*", settings=settings, strategy="threads",
                            **small_cfg()))
    assert set(got) == {k for k in data if k.startswith("data/small/0")}


def test_dry_run_writes_nothing_and_reports_the_plan(bucket, settings, tmp_path):
    name, put = bucket
    data = seed_mixed(put)
    plans = []
    plan = pull(f"s3://{name}/data/", str(tmp_path / "o"), settings=settings, dry_run=True,
                on_event=lambda e: plans.append((e.key, e.engine)) if e.kind == "plan" else None,
                **small_cfg())
    assert not (tmp_path / "o").exists()
    assert dict(plans)["data/big.bin"] == "ranged"
    assert dict(plans)["data/small/00.txt"] == "loop"
    assert dict(plans)["data/medium.bin"] == "lean"
    assert sum(v.objects for v in plan.planned.values()) == len(data)
    assert {j.key: j.engine for j in plan.objects} == dict(plans)


def test_sharded_layout_writes_through_the_shard_library(bucket, settings, tmp_path):
    from manyfiles.shard import ShardedDir

    name, put = bucket
    data = seed_mixed(put)
    put("data/100%/x.txt", b"percent")
    data["data/100%/x.txt"] = b"percent"
    dest = tmp_path / "sharded"
    report = pull(f"s3://{name}/data/", str(dest), settings=settings, layout="sharded", **small_cfg())
    assert report.failures == [] and report.done == len(data)
    sd = ShardedDir(dest)
    for key, body in data.items():
        flat = key.removeprefix("data/").replace("%", "%25").replace("/", "%2F")
        with open(sd.path_for(flat), "rb") as f:
            assert f.read() == body
    again = pull(f"s3://{name}/data/", str(dest), settings=settings, layout="sharded", **small_cfg())
    assert again.done == 0 and again.skipped == len(data)
