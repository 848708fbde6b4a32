"""The fastrm command as a real subprocess: exit codes, messages, output, refusals, kill -9."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_remove import all_paths, make_tree, table_selection  # its sibling (tests/remove/ is on sys.path)

from forkcli import run_many
from globcases import PATTERNS, make_files
from privileges import not_root_cmd
from terminal import stderr_on_a_terminal

BIN = Path(sys.executable).parent


def test_removes_tree_and_writes_output(run_cli, tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root, 400)
    before = all_paths(root)
    out = tmp_path / "removed.txt"
    r = run_cli("fastrm", "-j", "3", "-o", str(out), str(root))
    assert (r.returncode, r.stderr) == (0, b"")
    assert not root.exists()
    lines = out.read_bytes().decode().splitlines()
    assert set(lines) == before and len(lines) == len(before)


def test_manyfiles_rm_alias(run_cli, tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    r = run_cli("manyfiles", "rm", "-v", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    assert b"removed 0 files and 2 directories" in r.stderr
    assert not (tmp_path / "d").exists()


def test_permission_denied_is_reported_each_and_exit_1(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root, 300)
    locked = root / "x" / "locked"
    locked.mkdir(parents=True)
    (locked / "one").touch()
    (locked / "new\nline").touch()
    locked.chmod(0o555)
    try:
        r = subprocess.run(
            [*not_root_cmd(), str(BIN / "fastrm"), str(root)], capture_output=True, timeout=120
        )
    finally:
        locked.chmod(0o755)
    assert r.returncode == 1
    assert sorted(r.stderr.decode().splitlines()) == [
        f"fastrm: {locked}/new\\nline: Permission denied",  # one line, newline escaped
        f"fastrm: {locked}/one: Permission denied",
    ]
    assert sorted(os.path.relpath(p, root) for p in all_paths(root)) == [
        ".",
        "x",
        "x/locked",
        "x/locked/new\nline",
        "x/locked/one",
    ]


@pytest.mark.parametrize("path", ["/", "/tmp/..", "."])
def test_refuses_root(run_cli, path: str) -> None:
    # --dry-run as a belt: even a broken refusal could not delete anything here
    r = run_cli("fastrm", "--dry-run", "--force-root", path)
    assert r.returncode == 2
    assert r.stderr.startswith(f"fastrm: {path}: refusing".encode()), r.stderr


def test_refuses_a_mount_root_unless_forced_and_never_crosses_mounts(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    assert unshare, "util-linux unshare is needed for the mount tests"
    mnt = tmp_path / "mnt"
    tree = tmp_path / "tree"
    (tree / "inner").mkdir(parents=True)
    (tree / "plain").touch()
    mnt.mkdir()
    fastrm = BIN / "fastrm"
    script = f"""
set -u
mount -t tmpfs none {mnt} && mount -t tmpfs none {tree}/inner || exit 99
touch {mnt}/a {tree}/inner/b && mkdir {mnt}/sub && touch {mnt}/sub/c
{fastrm} {mnt}; echo "refused=$?"; ls {mnt} | tr '\\n' ' '; echo
{fastrm} --force-root {mnt}; echo "forced=$?"; ls -A {mnt} | wc -l
{fastrm} {tree}; echo "nested=$?"; ls {tree}/inner
"""
    flags = ["-m"] if os.geteuid() == 0 else ["-r", "-m"]
    r = subprocess.run([unshare, *flags, "sh", "-c", script], capture_output=True, timeout=120)
    out = r.stdout.decode().split("\n")
    assert r.returncode == 0, r.stderr
    assert out[0] == "refused=2" and out[1].split() == ["a", "sub"]
    assert out[2:4] == ["forced=0", "0"]
    assert out[4:6] == ["nested=1", "b"]
    assert b"is a mount root; refusing without --force-root" in r.stderr
    assert f"fastrm: {tree}/inner: is a mount point; not crossed".encode() in r.stderr
    assert not (tree / "plain").exists()  # the rest of the tree went


def test_missing_path_and_force(run_cli, tmp_path: Path) -> None:
    (tmp_path / "real").touch()
    r = run_cli("fastrm", str(tmp_path / "missing"), str(tmp_path / "real"))
    assert r.returncode == 1
    assert r.stderr.decode() == f"fastrm: {tmp_path}/missing: No such file or directory\n"
    assert not (tmp_path / "real").exists()
    assert run_cli("fastrm", "-f", str(tmp_path / "missing")).returncode == 0


def test_dry_run_null_output_exact_bytes(run_cli, tmp_path: Path) -> None:
    root = os.fsencode(tmp_path / "odd")
    os.mkdir(root)
    names = {b"a\xff", b"new\nline", b"plain"}
    for n in names:
        open(os.path.join(root, n), "wb").close()
    r = run_cli("fastrm", "-n", "-0", "-o", "-", root)
    assert r.returncode == 0
    assert set(r.stdout.split(b"\0")[:-1]) == {os.path.join(root, n) for n in names} | {root}
    assert b"would remove 3 files and 1 directories" in r.stderr
    assert sorted(os.listdir(root)) == sorted(names)


def test_glob_and_exclude(run_cli, tmp_path: Path) -> None:
    for rel in ["a/x.tmp", "a/y.tmp", "a/z.txt", "b.tmp/inner", "keep.tmp"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).touch()
    r = run_cli("fastrm", "--glob", "*.tmp", "--exclude", "keep*", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert sorted(os.path.relpath(p, tmp_path) for p in all_paths(tmp_path)) == [
        ".",
        "a",
        "a/z.txt",
        "keep.tmp",
    ]


def test_progress_only_on_a_terminal(run_cli, tmp_path: Path) -> None:
    make_tree(tmp_path / "a", 200)
    r = run_cli("fastrm", str(tmp_path / "a"))
    assert (r.returncode, r.stderr) == (0, b"")  # not a TTY: no progress by default
    make_tree(tmp_path / "a", 200)
    r = run_cli("fastrm", "--progress", str(tmp_path / "a"))
    assert r.returncode == 0 and r.stderr.endswith(b"[done]\n")  # asked for in a log: plain lines
    files, dirs = make_tree(tmp_path / "b", 200)
    total = files + dirs + 1
    seen = stderr_on_a_terminal([str(BIN / "fastrm"), "--progress", str(tmp_path / "b")])
    # the shared rich display: done/total, rate, elapsed and remaining time
    assert f"{total}/{total} entries".encode() in seen and b"/s" in seen and b"0:00:0" in seen
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_then_rerun_completes(tmp_path: Path, sig: int) -> None:
    root = tmp_path / "tree"
    make_tree(root, 3000)
    out = tmp_path / "out"
    proc = subprocess.Popen([str(BIN / "fastrm"), "-j", "2", "-o", str(out), str(root)])
    deadline = time.monotonic() + 60
    while (
        time.monotonic() < deadline
        and proc.poll() is None
        and (not out.exists() or out.stat().st_size < 8192)
    ):
        time.sleep(0.005)
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
    if sig == signal.SIGINT:  # Ctrl-C: workers finish their directory, exit 130
        assert code in (130, 0)
    # whatever state kill -9 left, the same command run again finishes the job
    r = subprocess.run([str(BIN / "fastrm"), "-f", str(root)], capture_output=True, timeout=120)
    assert (r.returncode, r.stderr) == (0, b"")
    assert not root.exists()


def test_dt_unknown_recursion_is_driven_by_eisdir(run_cli, tmp_path: Path) -> None:
    # as on sshfs / NFSv3: getdents says DT_UNKNOWN for every entry, and nothing is stat'ed,
    # so unlink's EISDIR is what reveals each directory (seen in the I/O trace)
    import json

    unknown = ["--fake-dtype", "0"]  # through the launcher of tests/faults.py
    root = tmp_path / "tree"
    files, dirs = make_tree(root, 150)
    (root / "a.tmp").touch()
    (root / "0" / "b.tmp").mkdir(parents=True)
    (root / "0" / "b.tmp" / "inside").touch()
    r = run_cli("fastrm", "--glob", "*.tmp", str(root), faults=unknown)
    assert r.returncode == 0, r.stderr
    assert not (root / "a.tmp").exists() and not (root / "0" / "b.tmp").exists()
    assert len(all_paths(root)) == 1 + files + dirs
    trace = tmp_path / "rm.mftrace"
    r = run_cli("fastrm", "--trace", str(trace), str(root), faults=unknown)
    assert r.returncode == 0, r.stderr
    assert not root.exists()
    summary = json.loads(run_cli("manyfiles", "trace", "summary", "--json", str(trace)).stdout)
    unlink = next(op for op in summary["ops"] if op["op"] == "unlink")
    assert unlink["results"] == {"EISDIR": dirs}  # one failed unlink per directory
    assert unlink["count"] == files + dirs
    assert not any(op["op"] == "stat" for op in summary["ops"])


def test_glob_table_through_the_command_line(tmp_path: Path) -> None:
    """The parity table once more, as a user types it: `fastrm -n -0 -o - --include P DIR` prints
    exactly what fnmatch.fnmatchcase selects (patterns with non-UTF-8 bytes arrive through argv)."""
    root = os.fsencode(tmp_path / "t")
    os.mkdir(root)
    make_files(root)
    os.mkdir(os.path.join(root, b"sub"))
    make_files(os.path.join(root, b"sub"))
    runs = run_many("fastrm", [["-n", "-0", "-o", "-", "--include", os.fsencode(pattern), root]
                               for pattern in PATTERNS])
    for pattern, r in zip(PATTERNS, runs, strict=True):
        assert r.returncode == 0, (pattern, r.stderr)
        assert sorted(r.stdout.split(b"\0")[:-1]) == sorted(table_selection(root, pattern, False)), pattern


def test_a_read_only_tree_is_shortened_errors_then_the_summary(small_tmpfs, run_cli) -> None:
    """A real read-only filesystem (issue 17: one line per file and no summary): the first ten
    failures of the kind, one count line for the rest, then what was done and how many failed."""
    disk = small_tmpfs()
    tree = disk / "tree"
    for i in range(4):
        (tree / f"d{i}").mkdir(parents=True)
        for j in range(10):
            (tree / f"d{i}" / f"f{j}").write_bytes(b"x")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    r = run_cli("fastrm", "-j", "1", str(tree))
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 1 and "Traceback" not in r.stderr.decode()
    shown = [x for x in lines if x.endswith(": Read-only file system") and not x.startswith("fastrm: ...")]
    assert len(shown) == 10 and all(x.startswith(f"fastrm: {tree}/") for x in shown), lines
    assert lines[10] == "fastrm: ... and 30 more: Read-only file system", lines
    assert lines[11].startswith("fastrm: removed 0 files and 0 directories") and lines[11].endswith(
        "; 40 could not be removed"), lines
    assert len(lines) == 12
    assert sum(len(files) for _, _, files in os.walk(tree)) == 40      # nothing removed, nothing lost
