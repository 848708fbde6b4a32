"""`--trace` on real commands, `manyfiles trace summary/export`, and strace as an outside cross-check."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from manyfiles import trace


def make_flat(folder: Path, n: int) -> Path:
    """``n`` empty files with 30-character names (56-byte dirents)."""
    folder.mkdir()
    for i in range(n):
        os.close(os.open(folder / f"entry_with_a_long_name_{i:06d}", os.O_WRONLY | os.O_CREAT, 0o644))
    return folder


def summary_json(run_cli, *files: Path) -> dict:
    proc = run_cli("manyfiles", "trace", "summary", "--json", *map(str, files))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def by_op(summary: dict) -> dict[str, dict]:
    return {o["op"]: o for o in summary["ops"]}


def test_fastls_trace_counts_entries_and_summary_renders(tmp_path: Path, run_cli) -> None:
    folder = make_flat(tmp_path / "flat", 500)
    t = tmp_path / "ls.mft"
    proc = run_cli("fastls", "--trace", str(t), "--bufsize", "4K", str(folder))
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 500
    g = by_op(summary_json(run_cli, t))["getdents"]
    assert g["entries"] == 500 and g["count"] >= 500 * 56 // 4096 and g["errors"] == 0
    text = run_cli("manyfiles", "trace", "summary", str(t))
    assert text.returncode == 0
    out = text.stdout.decode()
    assert "getdents" in out and "p99" in out and "500" in out


def test_trace_of_a_failing_command_still_written(tmp_path: Path, run_cli) -> None:
    t = tmp_path / "fail.mft"
    proc = run_cli("fastls", "--trace", str(t), str(tmp_path / "missing"))
    assert proc.returncode == 1
    s = summary_json(run_cli, t)
    assert s["notes"] == [] and s["dropped"] == 0   # closed cleanly despite the error


def test_summary_and_export_errors_are_one_line(tmp_path: Path, run_cli) -> None:
    proc = run_cli("manyfiles", "trace", "summary", str(tmp_path / "nope.mft"))
    assert proc.returncode == 1
    assert proc.stderr.decode().strip() == f"manyfiles: {tmp_path / 'nope.mft'}: No such file or directory"
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00" * 64)
    proc = run_cli("manyfiles", "trace", "export", "--chrome", str(junk))
    assert proc.returncode == 1 and b"not a manyfiles trace" in proc.stderr
    assert not (tmp_path / "junk.json").exists()
    proc = run_cli("fastls", "--trace", str(tmp_path / "no" / "t.mft"), str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.decode().strip().endswith("no/t.mft: cannot write trace: No such file or directory")


def test_export_chrome_has_one_async_pair_per_operation(tmp_path: Path, run_cli) -> None:
    folder = make_flat(tmp_path / "flat", 300)
    t = tmp_path / "ls.mft"
    assert run_cli("fastls", "--trace", str(t), "--bufsize", "4K", str(folder)).returncode == 0
    n = len(trace.load([t]))
    proc = run_cli("manyfiles", "trace", "export", "--chrome", str(t))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "ls.mft.json").read_text())
    begins = [e for e in doc["traceEvents"] if e["ph"] == "b"]
    ends = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "e"}
    assert len(begins) == len(ends) == n > 0
    for b in begins:
        e = ends[b["id"]]
        assert b["name"] == e["name"] == "getdents" and b["cat"] == "io"
        assert e["ts"] >= b["ts"] and b["pid"] == e["pid"]
    assert sum(b["args"]["entries"] for b in begins) == 300
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in doc["traceEvents"])


# --- strace: the kernel's own count ------------------------------------------------------------------


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    return subprocess.run(["strace", "-o", os.devnull, "true"], capture_output=True).returncode == 0


needs_strace = pytest.mark.skipif(not _strace_works(), reason="strace missing or ptrace not allowed here")


@needs_strace
def test_getdents_batches_match_strace(tmp_path: Path, run_cli) -> None:
    folder = make_flat(tmp_path / "flat", 700)
    t, log = tmp_path / "ls.mft", tmp_path / "strace.log"
    fastls = str(Path(sys.executable).parent / "fastls")
    proc = subprocess.run(["strace", "-f", "-qq", "-P", str(folder), "-e", "trace=getdents64", "-o", str(log),
                           fastls, "--trace", str(t), "--bufsize", "4K", str(folder)], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    returns = [int(m.group(1)) for m in re.finditer(r"getdents64\(.*\) = (\d+)$", log.read_text(), re.M)]
    nonzero = [r for r in returns if r > 0]
    recs = [r for r in trace.load([t]).records() if r.op == "getdents"]
    assert len(recs) == len(nonzero) > 1
    assert sorted(r.length for r in recs) == sorted(nonzero)   # same batches, byte for byte


RENAMER = textwrap.dedent("""
    import os, sys
    from manyfiles._core import fsops as _fsops
    from manyfiles.trace import iotrace
    folder, n = sys.argv[1], int(sys.argv[2])
    for i in range(n):
        os.close(os.open(os.path.join(folder, f"a{i}"), os.O_CREAT | os.O_WRONLY))
    with iotrace.tracing(sys.argv[3]):
        for i in range(n):
            _fsops.rename(os.path.join(folder, f"a{i}"), os.path.join(folder, f"b{i}"))
""")


@needs_strace
def test_rename_count_matches_strace(tmp_path: Path) -> None:
    n = 250
    t, log = tmp_path / "r.mft", tmp_path / "strace.log"
    (tmp_path / "d").mkdir()
    cmd = ["strace", "-f", "-qq", "-c", "-e", "trace=rename,renameat,renameat2", "-o", str(log),
           sys.executable, "-c", RENAMER, str(tmp_path / "d"), str(n), str(t)]
    proc = subprocess.run(cmd, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    calls = sum(int(m.group(1)) for m in re.finditer(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?rename",
                                                     log.read_text(), re.M))
    assert calls == n
    assert sum(1 for r in trace.load([t]).records() if r.op == "rename") == calls


def test_shard_apply_trace_has_one_rename_per_migrated_file(tmp_path: Path, run_cli) -> None:
    n = 300
    folder = make_flat(tmp_path / "flat", n)
    t = tmp_path / "shard.mft"
    proc = run_cli("shard", "apply", "-q", "--trace", str(t), str(folder))
    assert proc.returncode == 0, proc.stderr
    renames = [r for r in trace.load([t]).records() if r.op == "rename" and r.result == 0]
    moved = [r for r in renames if os.path.basename(r.path).startswith(b"entry_with_a_long_name_")]
    assert len(moved) == n
    assert sorted(os.path.basename(r.path) for r in moved) == sorted(
        f"entry_with_a_long_name_{i:06d}".encode() for i in range(n))


@needs_strace
def test_shard_apply_renames_match_strace(tmp_path: Path) -> None:
    n = 200
    folder = make_flat(tmp_path / "flat", n)
    t, log = tmp_path / "shard.mft", tmp_path / "strace.log"
    shard = str(Path(sys.executable).parent / "shard")
    cmd = ["strace", "-f", "-qq", "-c", "-e", "trace=rename,renameat,renameat2", "-o", str(log),
           shard, "apply", "-q", "--trace", str(t), str(folder)]
    proc = subprocess.run(cmd, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    calls = sum(int(m.group(1)) for m in re.finditer(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?rename",
                                                     log.read_text(), re.M))
    assert calls >= n
    assert sum(1 for r in trace.load([t]).records() if r.op == "rename") == calls   # none untraced


def test_fastrm_trace_has_one_unlink_per_file_and_one_rmdir_per_dir(tmp_path: Path, run_cli) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    for d in range(5):
        make_flat(root / f"d{d}", 40)
    t = tmp_path / "rm.mft"
    proc = run_cli("fastrm", "--trace", str(t), str(root))
    assert proc.returncode == 0, proc.stderr
    assert not root.exists()
    recs = [r for r in trace.load([t]).records() if r.result == 0]
    assert sum(1 for r in recs if r.op == "unlink") == 200
    assert sum(1 for r in recs if r.op == "rmdir") == 6
