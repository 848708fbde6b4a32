"""``manyfiles cache ...`` as real subprocesses: output, exit codes, one-line errors, traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cachekit import blob, cli


def _src(tmp_path: Path, n: int = 5) -> list[Path]:
    folder = tmp_path / "src"
    folder.mkdir()
    paths = []
    for i in range(n):
        p = folder / f"f{i}"
        p.write_bytes(blob(50_000 * (i + 1), f"cli{i}"))
        paths.append(p)
    return paths


def test_warm_stats_verify_evict_clear(tmp_path: Path):
    paths = _src(tmp_path)
    cache = str(tmp_path / "c")
    trace = tmp_path / "warm.mftrace"
    listing = b"".join(bytes(p) + b"\n" for p in paths[:3]) + str(tmp_path / "missing").encode() + b"\n"
    r = cli("cache", "warm", "--dir", cache, "--files-from", "-", str(paths[4]), "--trace", str(trace),
            input=listing)
    assert r.returncode == 1, r.stderr
    assert r.stderr.decode().splitlines() == [f"manyfiles: {tmp_path / 'missing'}: No such file or directory"]
    assert r.stdout.decode().startswith("5 objects: 4 fetched")

    s = cli("trace", "summary", str(trace), "--json")
    ops = {o["op"]: o for o in json.loads(s.stdout)["ops"]}
    assert ops["cache.fill"]["count"] == 4 and ops["cache.fill"]["bytes"] == sum(
        p.stat().st_size for p in (*paths[:3], paths[4]))

    r = cli("cache", "warm", "--dir", cache, str(tmp_path / "src"), "--json")
    assert r.returncode == 0
    report = json.loads(r.stdout)
    assert (report["objects"], report["cached"], report["fetched"]) == (5, 4, 1)

    stats = json.loads(cli("cache", "stats", "--dir", cache, "--json").stdout)
    assert stats["entries"] == 5 and stats["fills"] == 5 and stats["hit_ratio"] == 0.0
    assert "hit ratio" in cli("cache", "stats", "--dir", cache).stdout.decode()

    r = cli("cache", "verify", "--dir", cache, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["blocks"] == 5

    r = cli("cache", "evict", "--dir", cache, "--to", "200K")
    assert r.returncode == 0 and "entries evicted" in r.stdout.decode()
    assert json.loads(cli("cache", "stats", "--dir", cache, "--json").stdout)["bytes"] <= 200 << 10
    r = cli("cache", "evict", "--dir", cache, str(paths[0]), "--json")
    assert r.returncode == 0
    assert cli("cache", "clear", "--dir", cache).returncode == 0
    assert json.loads(cli("cache", "stats", "--dir", cache, "--json").stdout)["entries"] == 0


def test_usage_errors_and_refused_dirs(tmp_path: Path):
    paths = _src(tmp_path, 1)
    cache = str(tmp_path / "c")
    for args in (["cache", "warm", "--dir", cache],
                 ["cache", "evict", "--dir", cache, str(paths[0]), "--to", "1M"],
                 ["cache", "evict", "--dir", cache, "--to", "lots"],
                 ["cache", "evict", "--dir", cache, "--older-than", "soon"],
                 ["cache", "warm", "--dir", cache, "--files-from", str(tmp_path / "nope.txt")]):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
    r = cli("cache", "stats", "--dir", str(tmp_path / "src"))
    assert r.returncode == 2
    expected = f"manyfiles: {tmp_path / 'src'}: not a manyfiles cache and not empty (f0); refusing to use it"
    assert r.stderr.decode().strip() == expected
    # nothing listens there: the endpoint is given up on after half the stall timeout
    r = cli("cache", "warm", "--dir", cache, "--stall-timeout", "1", "s3://no-such-bucket-xyz/k", env={
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1", "MANYFILES_RETRY_BASE": "0.001"})
    assert r.returncode == 1 and len(r.stderr.decode().splitlines()) == 1, r.stderr
    assert r.stderr.decode() == \
        "manyfiles: s3://no-such-bucket-xyz/k: http://127.0.0.1:9: connection refused\n"


def test_warm_an_s3_prefix_from_the_command_line(tmp_path: Path, s3):
    objs = {f"p/{i}": s3.put(f"p/{i}", blob(10_000 + i, f"o{i}")) for i in range(6)}
    cache = str(tmp_path / "c")
    r = cli("cache", "warm", "--dir", cache, s3.url("p/"), "-j", "3", env=s3.env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().startswith("6 objects: 6 fetched")
    from manyfiles.cache import Cache

    with Cache(cache, min_free=0, settings=s3.settings) as c:
        gets = len(s3.gets())
        for k, data in objs.items():
            assert c.get_bytes(s3.url(k)) == data
        assert len(s3.gets()) == gets


def test_s3pull_reads_through_the_cache(tmp_path: Path, s3, roomy_dir: Path):
    objs = {f"data/{i}.bin": s3.put(f"data/{i}.bin", blob(30_000 * i + 7, f"pull{i}")) for i in range(1, 6)}
    cache = str(roomy_dir / "c")            # (s3pull opens it with the default watermarks)
    s3pull = os.path.join(os.path.dirname(sys.executable), "s3pull")

    def pull(dest: Path) -> dict:
        r = subprocess.run([s3pull, s3.url("data/"), str(dest), "--cache", cache, "--json"],
                           capture_output=True, env={**os.environ, **s3.env}, timeout=120)
        assert r.returncode == 0, r.stderr
        for key, data in objs.items():
            assert (dest / key.removeprefix("data/")).read_bytes() == data
        events = [json.loads(line) for line in r.stdout.splitlines()]
        return {e["key"]: e.get("engine") for e in events if e["event"] == "done"}

    first = pull(tmp_path / "one")
    assert "cache" not in first.values() and len(first) == 5
    gets = len(s3.gets())
    second = pull(tmp_path / "two")
    assert set(second.values()) == {"cache"} and len(second) == 5
    assert len(s3.gets()) == gets, "objects in the cache were downloaded again"
    objs["data/3.bin"] = s3.put("data/3.bin", blob(1000, "changed"))
    third = pull(tmp_path / "three")
    assert third["data/3.bin"] != "cache" and third["data/1.bin"] == "cache"
