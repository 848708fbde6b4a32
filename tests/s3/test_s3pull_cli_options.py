"""s3pull's part of the shared option set (tests/cli/test_cli_options.py has the rest): the old
spellings still work with one deprecation line, ``--files-from -`` reads keys from stdin
(newline or NUL lists, the manifest's key<TAB>size<TAB>etag format kept), ``--json`` is JSON
lines, ``-n`` writes nothing."""

from __future__ import annotations

import hashlib
import json

from s3util import blob, files_under

from manyfiles.cli._common import deprecation_line


def _one_line(stderr: bytes, old: str, new: str) -> list[str]:
    """The deprecation line is there exactly once; returns the other stderr lines."""
    lines = stderr.decode().splitlines()
    assert lines.count(deprecation_line("s3pull", old, new)) == 1, lines
    return [line for line in lines if "deprecated" not in line]


def test_old_spellings_still_work(run_cli, bucket, cli_env, tmp_path) -> None:
    name, put = bucket
    data = {f"o/{i}.bin": put(f"o/{i}.bin", blob(300 + i, str(i))) for i in range(4)}
    want = {k[2:]: v for k, v in data.items()}
    r = run_cli("s3pull", f"s3://{name}/o/", str(tmp_path / "a"), "--concurrency", "2", "-q", env=cli_env)
    assert r.returncode == 0 and _one_line(r.stderr, "--concurrency", "-j/--jobs") == []
    assert files_under(tmp_path / "a") == want
    manifest = tmp_path / "keys.txt"
    manifest.write_text("o/1.bin\no/3.bin\n")
    r = run_cli("s3pull", f"s3://{name}/o/", str(tmp_path / "b"), "--manifest", str(manifest), "-q",
                env=cli_env)
    assert r.returncode == 0 and _one_line(r.stderr, "--manifest", "--files-from") == []
    assert files_under(tmp_path / "b") == {"1.bin": want["1.bin"], "3.bin": want["3.bin"]}
    r = run_cli("s3pull", f"s3://{name}/o/", str(tmp_path / "c"), "--no-verify", "--glob", "2*", "-q",
                env=cli_env)
    assert r.returncode == 0, r.stderr
    _one_line(r.stderr, "--no-verify", "--no-checksum")
    _one_line(r.stderr, "--glob", "--include")
    assert files_under(tmp_path / "c") == {"2.bin": want["2.bin"]}


def test_files_from_stdin_newline_and_nul_lists(run_cli, bucket, cli_env, tmp_path) -> None:
    name, put = bucket
    a = put("s/a.bin", blob(1000, "a"))
    b = put("s/b.bin", blob(2000, "b"))
    odd = put("s/sp ace.txt", b"odd key")      # (moto refuses keys with a newline)
    put("s/not-listed", b"no")
    etag = hashlib.md5(b).hexdigest()
    listing = f"s/a.bin\ns/b.bin\t{len(b)}\t\"{etag}\"\n".encode()   # the manifest format, as before
    r = run_cli("s3pull", f"s3://{name}/s/", str(tmp_path / "o"), "--files-from", "-", "--json",
                input=listing, env=cli_env)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert events[-1]["event"] == "summary" and events[-1]["done"] == 2
    assert files_under(tmp_path / "o") == {"a.bin": a, "b.bin": b}
    r = run_cli("s3pull", f"s3://{name}/s/", str(tmp_path / "z"), "--files-from", "-",
                input=b"s/sp ace.txt\0s/a.bin\0", env=cli_env)      # find -print0 style
    assert r.returncode == 0, r.stderr
    assert files_under(tmp_path / "z") == {"sp ace.txt": odd, "a.bin": a}


def test_json_lines_dry_run_and_verify(run_cli, bucket, cli_env, tmp_path) -> None:
    name, put = bucket
    put("v/x.bin", blob(5000, "x"))
    dest = tmp_path / "o"
    r = run_cli("s3pull", f"s3://{name}/v/", str(dest), "-n", env=cli_env)
    assert r.returncode == 0 and r.stdout == b"loop\t5000\tv/x.bin\n"
    assert not dest.exists()            # -n: nothing created, not even DEST
    r = run_cli("s3pull", f"s3://{name}/v/", str(dest), "-n", "--json", env=cli_env)
    assert r.returncode == 0 and not dest.exists()
    events = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert [e["key"] for e in events if e["event"] == "plan"] == ["v/x.bin"]
    assert events[-1]["event"] == "summary"
    assert run_cli("s3pull", f"s3://{name}/v/", str(dest), "-j", "2", "-q", env=cli_env).returncode == 0
    r = run_cli("s3pull", "verify", str(dest), "--json", "-j", "2", env=cli_env)
    assert r.returncode == 0, r.stderr
    summary = [json.loads(line) for line in r.stdout.decode().splitlines()][-1]
    assert summary["event"] == "summary" and summary["ok"]
