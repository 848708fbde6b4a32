"""The s3push command as a real process: exit codes and one line per bad input, --json, -n,
``manyfiles push``, --abort-stale, and kill -9 at each phase then the same command again: exact."""

from __future__ import annotations

import json
import os

import pytest
from s3util import blob

MiB = 1 << 20
SMALL = ["--part-size", "5MiB", "--multipart-threshold", "5MiB", "-j", "8"]


def contents(dest) -> dict[str, bytes]:
    out = {}
    for obj in dest.admin.list_objects_v2(Bucket=dest.bucket).get("Contents", []):
        out[obj["Key"]] = dest.admin.get_object(Bucket=dest.bucket, Key=obj["Key"])["Body"].read()
    return out


def tree(root, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def env_of(dest, state) -> dict[str, str]:
    return {**dest.env, "XDG_STATE_HOME": os.fspath(state)}


def test_json_and_the_dry_run_and_manyfiles_push(run_cli, tmp_path, dest, state):
    tree(tmp_path / "src", {"a.txt": b"a", "d/b.bin": blob(6 * MiB)})
    src = f"{tmp_path / 'src'}/"
    dry = run_cli("s3push", src, dest.url("p/"), "-n", *SMALL, env=env_of(dest, state))
    assert dry.returncode == 0, dry.stderr
    keys = sorted(line.split("\t")[0] for line in dry.stdout.decode().splitlines())
    assert keys == ["p/a.txt", "p/d/b.bin"]
    assert contents(dest) == {}
    out = run_cli("manyfiles", "push", src, dest.url("p/"), "--json", *SMALL, env=env_of(dest, state))
    assert out.returncode == 0 and out.stderr == b"", out.stderr
    records = [json.loads(line) for line in out.stdout.decode().splitlines()]
    assert sorted(r["key"] for r in records if r["event"] == "done") == ["p/a.txt", "p/d/b.bin"]
    assert records[-1]["event"] == "summary" and records[-1]["uploaded"] == 2 and records[-1]["ok"]
    assert contents(dest) == {"p/a.txt": b"a", "p/d/b.bin": blob(6 * MiB)}


def test_bad_input_is_one_line_with_the_exit_code_of_the_table(run_cli, tmp_path, dest, state):
    src = tmp_path / "src"
    tree(src, {"ok.txt": b"ok"})
    with open(os.path.join(os.fsencode(src), b"bad\xff"), "wb") as f:
        f.write(b"x")
    (src / "nl\nname").write_bytes(b"y")
    env = env_of(dest, state)
    r = run_cli("s3push", f"{src}/", os.fspath(tmp_path / "nope"), dest.url("p/"), env=env)
    err = r.stderr.decode().splitlines()
    assert r.returncode == 1 and b"Traceback" not in r.stderr
    assert sorted(line.split(": ", 2)[-1] for line in err[:-1]) == [
        "No such file or directory", "name holds a newline or carriage return: rename it",
        "name is not valid UTF-8 (S3 keys are UTF-8): rename it"]
    assert any("bad\\xff" in line for line in err) and any("nl\\nname" in line for line in err)
    assert contents(dest) == {"p/ok.txt": b"ok"}
    good = tmp_path / "good"
    tree(good, {"g.txt": b"g"})
    for argv, code in [([f"{good}/", "not-s3/"], 2), ([f"{good}/"], 2),
                       ([f"{good}/", dest.url("p/"), "-j", "0"], 2),
                       ([f"{good}/", "s3://no-such-bucket-here/p/"], 1), ([f"{good}/", "s3:///p/"], 2),
                       (["--abort-stale", dest.url("p/"), "--older-than", "soon"], 2)]:
        r = run_cli("s3push", *argv, env=env)
        assert (r.returncode, len(r.stderr.decode().splitlines())) == (code, 1), (argv, r.stderr)
        assert b"Traceback" not in r.stderr and b"Error:" not in r.stderr


def test_abort_stale_on_the_command_line(run_cli, dest, state):
    dest.admin.create_multipart_upload(Bucket=dest.bucket, Key="p/x")
    r = run_cli("s3push", "--abort-stale", dest.url("p/"), "--older-than", "1h", "--json",
                env=env_of(dest, state))
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["event"] for line in r.stdout.decode().splitlines()] == ["aborted", "summary"]
    assert dest.admin.list_multipart_uploads(Bucket=dest.bucket).get("Uploads", []) == []


def _complete(method, path, headers) -> bool:
    return method == "POST" and "uploadId=" in path


def _small_put(method, path, headers) -> bool:
    return method == "PUT" and path.partition("?")[0].endswith("/p/s3.bin")


# kill -9 at every phase: at a checkpoint of the process (tests/faults.py), or while the fault
# proxy holds one request (the server never got it: "stall"; it did, the answer never came:
# "stall-after") and the test kills the process once the proxy holds it
PHASES = {
    "after-a-put": ("push-put:5", None),
    "mid-read": ("push-read:9", None),
    "create-answered-not-journaled": ("push-created:1", None),
    "between-parts": ("push-part:3", None),
    "during-a-small-put": (None, (_small_put, "stall")),
    "a-small-put-the-server-did": (None, (_small_put, "stall-after")),
    "complete-not-received": (None, (_complete, "stall")),
    "complete-done-answer-lost": (None, (_complete, "stall-after")),
}


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_kill_9_at_every_phase_then_the_same_command_again_is_exact(run_cli, tmp_path, dest, state, phase):
    """SIGKILL at each phase of a push; whatever is visible then is whole and right, and the same
    command run again leaves exactly the tree in the bucket and no multipart upload open."""
    import signal
    import subprocess
    import sys

    point, held = PHASES[phase]
    files = {f"s{i}.bin": blob(500 + i, f"k{i}") for i in range(10)}
    files["big.bin"] = blob(16 * MiB + 1, "kill")      # 4 parts
    tree(tmp_path / "src", files)
    argv = [f"{tmp_path / 'src'}/", dest.url("p/"), *SMALL, "-j", "2", "--json"]
    if point is not None:
        killed = run_cli("s3push", *argv, env=env_of(dest, state), faults=["--kill-at", point])
        assert killed.returncode == -9
    else:
        dest.proxy.faults.append(held)
        script = os.path.join(os.path.dirname(sys.executable), "s3push")
        proc = subprocess.Popen([script, *argv], env={**os.environ, **env_of(dest, state)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert dest.proxy.stalled.wait(120), "the held request never came"
            proc.send_signal(signal.SIGKILL)
        finally:
            assert proc.wait(60) == -9
    seen = contents(dest)
    assert all(files[k[2:]] == v for k, v in seen.items())        # whatever is visible is whole and right
    if phase == "create-answered-not-journaled":
        assert len(dest.admin.list_multipart_uploads(Bucket=dest.bucket).get("Uploads", [])) == 1
    if phase == "complete-done-answer-lost":
        assert seen["p/big.bin"] == files["big.bin"]       # the server completed it
    again = run_cli("s3push", *argv, env=env_of(dest, state))
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout.decode().splitlines()[-1])
    if phase == "between-parts":
        assert summary["resumed_parts"] >= 3
    if phase == "create-answered-not-journaled":
        assert summary["aborted"] == 1
    assert contents(dest) == {f"p/{k}": v for k, v in files.items()}
    assert dest.admin.list_multipart_uploads(Bucket=dest.bucket).get("Uploads", []) == []


def test_sync_delete_on_the_command_line_and_its_max_delete_guard(run_cli, tmp_path, dest, state):
    tree(tmp_path / "src", {"a": b"a", "b": b"b"})
    for key in ("p/old1", "p/old2"):
        dest.put(key, b"o")
    argv = [f"{tmp_path / 'src'}/", dest.url("p/"), "--sync", "--delete"]
    refused = run_cli("s3push", *argv, "--max-delete", "1", env=env_of(dest, state))
    assert refused.returncode == 1 and len(refused.stderr.decode().splitlines()) == 1, refused.stderr
    assert b"--max-delete" in refused.stderr and sorted(contents(dest)) == ["p/old1", "p/old2"]
    shown = run_cli("s3push", *argv, "-n", env=env_of(dest, state))
    assert sorted(shown.stdout.decode().splitlines()) == ["p/a\t1\tput", "p/b\t1\tput", "p/old1\t0\tdelete",
                                                          "p/old2\t0\tdelete"]
    done = run_cli("s3push", *argv, env=env_of(dest, state))
    assert done.returncode == 0, done.stderr
    assert contents(dest) == {"p/a": b"a", "p/b": b"b"}


def test_files_from_uploads_the_listed_files_and_refuses_the_rest_one_line_each(run_cli, tmp_path, dest,
                                                                               state):
    src, outside = tmp_path / "src", tmp_path / "outside"
    tree(src, {"a.txt": b"a", "d/b.txt": b"b", "d/not-listed": b"n"})
    tree(outside, {"secret": b"s"})
    (src / "link").symlink_to(outside, target_is_directory=True)
    (src / "nl\nname").write_bytes(b"y")
    with open(os.path.join(os.fsencode(src), b"bad\xff"), "wb") as f:
        f.write(b"x")
    names = [b"a.txt", b"./d/b.txt", b"a.txt", b"../outside/secret", os.fsencode(outside / "secret"),
             b"link/secret", b"nope", b"d", b"nl\nname", b"bad\xff"]
    r = run_cli("s3push", "--files-from", "-", f"{src}/", dest.url("p/"), input=b"\0".join(names) + b"\0",
                env=env_of(dest, state))
    assert r.returncode == 1 and b"Traceback" not in r.stderr
    err = r.stderr.decode().splitlines()
    assert sorted(line.split(": ", 2)[-1] for line in err[:-1]) == [
        "No such file or directory", "a folder (--files-from names files)",
        "link is a symlink, not followed (--follow-symlinks)",
        "name holds a newline or carriage return: rename it",
        "name is not valid UTF-8 (S3 keys are UTF-8): rename it",
        f"not a file under {src} (--files-from names paths relative to SRC)",
        f"not a file under {src} (--files-from names paths relative to SRC)"]
    assert contents(dest) == {"p/a.txt": b"a", "p/d/b.txt": b"b"}      # nothing from outside SRC
    listed = tmp_path / "list.txt"
    listed.write_bytes(b"d/not-listed\r\n")
    r = run_cli("s3push", "--files-from", os.fspath(listed), os.fspath(src), dest.url("q/"), "--json",
                env=env_of(dest, state))
    assert r.returncode == 0, r.stderr
    assert contents(dest)["q/src/d/not-listed"] == b"n"          # SRC without '/': its name kept
    for argv in (["--files-from", os.fspath(tmp_path / "no-list"), f"{src}/", dest.url("p/")],
                 ["--files-from", os.fspath(listed), f"{src}/", dest.url("p/"), "--sync"],
                 ["--files-from", os.fspath(listed), f"{src}/a.txt", dest.url("p/")]):
        r = run_cli("s3push", *argv, env=env_of(dest, state))
        assert (r.returncode, len(r.stderr.splitlines())) == (2, 1), (argv, r.stderr)
