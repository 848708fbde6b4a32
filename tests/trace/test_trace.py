"""The I/O operation log: records match what happened, survive kills, stay bounded."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from manyfiles import listing, trace
from manyfiles._core import fsops as _fsops
from manyfiles._core.worker import instrumented_worker
from manyfiles.errors import ManyfilesError
from manyfiles.trace import iotrace
from manyfiles.trace.format import read_file


def make_flat(folder: Path, n: int) -> Path:
    """``n`` empty files with 30-character names (56-byte dirents)."""
    folder.mkdir()
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            os.close(os.open(f"entry_with_a_long_name_{i:06d}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dfd))
    finally:
        os.close(dfd)
    return folder


def ops_of(path: Path) -> dict[str, list[trace.Record]]:
    out: dict[str, list[trace.Record]] = {}
    for r in trace.load([path]).records():
        out.setdefault(r.op, []).append(r)
    return out


def test_tracer_is_off_by_default_and_after_the_block(tmp_path: Path) -> None:
    assert iotrace.TRACER is None
    with iotrace.tracing(tmp_path / "t.mft") as tr:
        assert iotrace.TRACER is tr
        assert os.environ[iotrace.ENV_TRACE] == str(tmp_path / "t.mft")
    assert iotrace.TRACER is None
    assert iotrace.ENV_TRACE not in os.environ


def test_each_rename_is_one_record_with_its_path_and_result(tmp_path: Path) -> None:
    n = 300
    for i in range(n):
        (tmp_path / f"f{i}").touch()
    with iotrace.tracing(tmp_path / "t.mft"):
        for i in range(n):
            _fsops.rename(str(tmp_path / f"f{i}"), str(tmp_path / f"g{i}"))
        with pytest.raises(FileNotFoundError):
            _fsops.rename(str(tmp_path / "missing"), str(tmp_path / "x"))
        _fsops.mkdir(str(tmp_path / "d"))
        _fsops.rmdir(str(tmp_path / "d"))
        _fsops.unlink(str(tmp_path / "g0"))
    ops = ops_of(tmp_path / "t.mft")
    renames = ops["rename"]
    assert len(renames) == n + 1
    ok = [r for r in renames if r.result == 0]
    assert sorted(r.path for r in ok) == sorted(os.fsencode(tmp_path / f"f{i}") for i in range(n))
    failed = [r for r in renames if r.result != 0]
    assert [(r.path, r.result) for r in failed] == [(os.fsencode(tmp_path / "missing"), errno.ENOENT)]
    assert [len(ops[k]) for k in ("mkdir", "rmdir", "unlink")] == [1, 1, 1]
    for r in renames:
        assert r.pid == os.getpid() and r.tid == threading.get_native_id()
        assert r.dur_ns >= 0
    starts = [r.start_ns for r in renames]
    assert starts == sorted(starts)  # one thread: records keep their order


def test_summary_counts_errors_and_percentiles(tmp_path: Path) -> None:
    path = tmp_path / "t.mft"
    with iotrace.tracing(path) as tr:
        for i in range(100):
            tr.record("stat", f"/x/{i}", 0, 0, 1_000_000 + i * 1000, (i + 1) * 10, 0)
        tr.record("stat", "/x/missing", 0, 0, 2_000_000, 5, errno.ENOENT)
        tr.record("s3.get", "b/k", 0, 4096, 3_000_000, 1000, 200)
        tr.record("s3.get", "b/k2", 0, 0, 3_000_500, 1000, 404)
        tr.record("getdents", "/x", 1000, 32768, 4_000_000, 50, 0)
    s = trace.summarize(trace.load([path]))
    by = {o.op: o for o in s.ops}
    assert by["stat"].count == 101 and by["stat"].errors == 1
    assert by["stat"].results == {"ENOENT": 1}
    assert by["stat"].p50_ns == 500 and by["stat"].p99_ns == 990 and by["stat"].max_ns == 1000
    assert by["s3.get"].errors == 1 and by["s3.get"].results == {"HTTP 404": 1}
    assert by["s3.get"].bytes == 4096
    assert by["getdents"].entries == 1000 and by["getdents"].bytes == 32768
    assert s.records == 104 and s.dropped == 0 and s.processes == 1
    assert json.loads(json.dumps(s.to_dict()))["ops"][0]["op"] == "stat"


def test_listing_records_every_getdents_batch(tmp_path: Path) -> None:
    n = 1000
    folder = make_flat(tmp_path / "flat", n)
    with iotrace.tracing(tmp_path / "t.mft"):
        names = listing.listdir(str(folder), bufsize=4096)
    assert len(names) == n
    batches = ops_of(tmp_path / "t.mft")["getdents"]
    assert sum(r.offset for r in batches) == n
    # 4 KiB batches of 56-byte dirents: many batches, none larger than the buffer
    assert len(batches) >= n * 56 // 4096
    assert all(0 < r.length <= 4096 for r in batches)
    assert {r.path for r in batches} == {os.fsencode(folder)}


def test_records_from_many_threads_are_all_kept(tmp_path: Path) -> None:
    per_thread, nthreads = 5000, 4
    tids: list[int] = []

    def work(k: int) -> None:
        tids.append(threading.get_native_id())
        tr = iotrace.TRACER
        for i in range(per_thread):
            tr.record("stat", f"/t{k}/{i}", k, i, i, 1, 0)

    with iotrace.tracing(tmp_path / "t.mft", flush_interval=0.01):
        threads = [threading.Thread(target=work, args=(k,)) for k in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    recs = list(trace.load([tmp_path / "t.mft"]).records())
    assert len(recs) == per_thread * nthreads
    # every record is intact: the thread's own values, never mixed with another's
    for r in recs:
        assert r.path == f"/t{r.offset}/{r.length}".encode()
    assert {r.tid for r in recs} == set(tids)


def test_full_buffer_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    path = tmp_path / "t.mft"
    # A writer that never wakes up on its own: only 100 records fit.
    with iotrace.tracing(path, buffer_records=100, flush_interval=3600) as tr:
        for i in range(1000):
            tr.record("unlink", f"/x/{i}", 0, 0, i, 1, 0)
        assert tr.dropped == 900
    ts = trace.load([path])
    assert len(ts) == 100 and ts.dropped == 900
    assert [r.path for r in ts.records()] == [f"/x/{i}".encode() for i in range(100)]
    assert trace.summarize(ts).dropped == 900


def test_odd_paths_and_bad_values_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "t.mft"
    names = [b"bad\xff\xfe", "new\nline", "caf\u00e9", os.fsdecode(b"esc\xff"), b"", tmp_path / "pathlike"]
    with iotrace.tracing(path) as tr:
        for p in names:
            tr.record("open", p, 0, 0, 1, 1, 0)
        tr.record("write", "/w", None, 2**70, 1, 1, 0)  # a caller bug must not lose the block
    got = [r.path for r in trace.load([path]).records()]
    assert got[:6] == [b"bad\xff\xfe", b"new\nline", "caf\u00e9".encode(), b"esc\xff", b"",
                       os.fsencode(tmp_path / "pathlike")]
    assert got[6] == b"/w"


def test_nested_tracing_is_refused(tmp_path: Path) -> None:
    with iotrace.tracing(tmp_path / "a.mft"), pytest.raises(ManyfilesError, match="already on"), \
            iotrace.tracing(tmp_path / "b.mft"):
        pass


def test_unwritable_trace_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ManyfilesError, match=r"no-such-dir/t\.mft: cannot write trace"), \
            iotrace.tracing(tmp_path / "no-such-dir" / "t.mft"):
        pass


# --- kills and torn files ----------------------------------------------------------------------------

KILLED_CHILD = textwrap.dedent("""
    import sys, time
    from manyfiles.trace import iotrace
    with iotrace.tracing(sys.argv[1], flush_interval=0.02) as tr:
        for i in range(500):
            tr.record("rename", f"/before/{i}", 0, 0, time.monotonic_ns(), 1, 0)
        tr.flush()
        print("flushed", flush=True)
        i = 0
        while True:                      # keeps recording until SIGKILL
            tr.record("unlink", f"/after/{i}", 0, 0, time.monotonic_ns(), 1, 0)
            i += 1
            if i % 1000 == 0:
                time.sleep(0.001)
""")


def test_sigkilled_process_leaves_a_readable_trace_up_to_its_last_flush(tmp_path: Path) -> None:
    path = tmp_path / "killed.mft"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(path)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"flushed\n"
        # wait until a periodic flush after the explicit one has landed whole (a record of the
        # second loop reads back: a size change alone may be a block still being written), then
        # kill: no clean-up
        def unlinks_landed() -> bool:
            return any(r.op == "unlink" for r in trace.load([path]).records())

        deadline = time.monotonic() + 60
        while not unlinks_landed() and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    raw = read_file(path)
    assert not raw.complete
    ts = trace.load([path])
    recs = list(ts.records())
    before = [r.path for r in recs if r.op == "rename"]
    assert before == [f"/before/{i}".encode() for i in range(500)]
    after = [r.path for r in recs if r.op == "unlink"]
    assert after == [f"/after/{i}".encode() for i in range(len(after))]  # a prefix, no holes
    assert len(after) > 0
    assert any("without a clean close" in n for n in ts.notes)


def test_torn_tail_is_ignored_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "t.mft"
    with iotrace.tracing(path, flush_interval=3600) as tr:
        for i in range(10):
            tr.record("stat", f"/a/{i}", 0, 0, i, 1, 0)
        tr.flush()
        good = path.stat().st_size
        for i in range(10):
            tr.record("stat", f"/b/{i}", 0, 0, i, 1, 0)
    data = path.read_bytes()
    for cut in (good + 5, len(data) - 3):
        path.write_bytes(data[:cut])
        raw = read_file(path)
        assert sum(len(b) for b in raw.blocks) == 10 and raw.torn_bytes == cut - good and not raw.complete
    # a flipped byte inside the last block: the CRC catches it
    bad = bytearray(data)
    bad[-10] ^= 0xFF
    path.write_bytes(bytes(bad))
    assert sum(len(b) for b in read_file(path).blocks) == 10


def test_not_a_trace_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"hello")
    with pytest.raises(ManyfilesError, match="x: not a manyfiles trace"):
        trace.load([tmp_path / "x"])
    with pytest.raises(ManyfilesError, match="nope: No such file"):
        trace.load([tmp_path / "nope"])


# --- worker processes -----------------------------------------------------------------------------


def _worker(folder: str, tag: str, n: int) -> None:
    with instrumented_worker():
        for i in range(n):
            p = os.path.join(folder, f"{tag}-{i}")
            open(p, "w").close()
            _fsops.unlink(p)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_processes_write_their_own_files_merged_by_the_summary(tmp_path: Path, method: str) -> None:
    import multiprocessing

    path = tmp_path / "t.mft"
    stale = Path(f"{path}.worker-999999")
    stale.write_bytes(b"left over from an earlier run")
    ctx = multiprocessing.get_context(method)
    with iotrace.tracing(path):
        _fsops.mkdir(str(tmp_path / "d"))
        procs = [ctx.Process(target=_worker, args=(str(tmp_path / "d"), f"w{k}", 50 + k)) for k in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        assert [p.exitcode for p in procs] == [0, 0]
    assert not stale.exists()
    files = trace.worker_files(path)
    assert sorted(files) == sorted(f"{path}.worker-{p.pid}" for p in procs)
    ts = trace.load([path])
    s = trace.summarize(ts)
    by = {o.op: o for o in s.ops}
    assert by["unlink"].count == 50 + 51 and by["mkdir"].count == 1
    assert s.processes == 3
    per_pid = {}
    for r in ts.records():
        per_pid.setdefault(r.pid, set()).add(r.op)
    assert per_pid[os.getpid()] == {"mkdir"}
    assert all(per_pid[p.pid] == {"unlink"} for p in procs)
    # --no-workers equivalent
    assert len(trace.load([path], workers=False)) == 1


def test_a_big_flush_is_split_into_blocks_and_read_back_in_order(tmp_path: Path) -> None:
    path = tmp_path / "t.mft"
    n = 2 * iotrace.BLOCK_RECORDS + 10
    with iotrace.tracing(path, flush_interval=3600) as tr:
        for i in range(n):
            tr.record("stat", f"/s/{i}", i, 0, i, 1, 0)
    raw = read_file(path)
    assert [len(b) for b in raw.blocks] == [iotrace.BLOCK_RECORDS, iotrace.BLOCK_RECORDS, 10]
    assert [b.last for b in raw.blocks] == [False, False, True] and raw.complete
    assert [r.offset for r in trace.load([path]).records()] == list(range(n))
