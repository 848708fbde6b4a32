"""The conventions every tool shares: errors, reports, progress, the worker pool, sizes."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import manyfiles as mf
from manyfiles._core.pool import Pool
from manyfiles._core.progress import Snapshot, check_progress, progress_for
from manyfiles._core.report import Failure, Report
from manyfiles._core.units import format_size, parse_size
from manyfiles.errors import (
    AccessDenied,
    ManyfilesError,
    MissingExtra,
    NotFound,
    PartialFailure,
    UsageError,
    from_oserror,
)

# -- errors ----------------------------------------------------------------------------------------


def test_error_tree_is_exported_and_rooted():
    for name in ("NotFound", "AccessDenied", "CredentialsError", "UnsafeKey", "TransferError",
                 "ObjectChanged", "IntegrityError", "PartialFailure", "MissingExtra", "UsageError"):
        cls = getattr(mf, name)
        assert issubclass(cls, mf.ManyfilesError), name
    assert issubclass(mf.ObjectChanged, mf.TransferError)
    assert issubclass(mf.IntegrityError, mf.TransferError)
    assert issubclass(mf.UnsafeKey, ValueError)   # callers that caught ValueError keep working


def test_from_oserror_maps_errno_and_keeps_the_path(tmp_path):
    try:
        (tmp_path / "missing").read_bytes()
    except OSError as exc:
        err = from_oserror(exc)
    assert isinstance(err, NotFound)
    assert str(err) == f"{tmp_path / 'missing'}: No such file or directory"
    denied = from_oserror(PermissionError(errno.EACCES, "Permission denied"), b"/x\xff")
    # the path as every error line writes it (manyfiles.errors.shown): a byte that is not UTF-8 as \xNN
    assert isinstance(denied, AccessDenied) and str(denied) == "/x\\xff: Permission denied"
    assert str(from_oserror(OSError(errno.EIO, "I/O error"), "/d")) == "/d: I/O error"
    assert type(from_oserror(OSError(errno.EIO, "I/O error"), "/d")) is ManyfilesError


def test_missing_extra_names_the_install_line():
    err = MissingExtra("s3", "s3pull", "boto3")
    assert isinstance(err, UsageError) and err.exit_code == 2
    assert str(err) == 's3pull needs the [s3] extra (boto3 is not installed): pip install "manyfiles[s3]"'


# -- reports ---------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class _CopyReport(Report):
    copied: int = 0
    names: list = None  # type: ignore[assignment]

    def summary(self) -> str:
        return f"copied {self.copied:,} files in {self.seconds:.2f} s"


def test_report_str_lists_first_failures_and_counts_the_rest():
    r = _CopyReport(copied=1234, seconds=1.5)
    assert r.ok and str(r) == "copied 1,234 files in 1.50 s"
    for i in range(12):
        r.add_failure(f"d/f{i}".encode() + b"\xff", "Permission denied", "EACCES")
    text = str(r).splitlines()
    assert text[0] == "copied 1,234 files in 1.50 s; 12 failed"
    assert text[1] == "  d/f0\udcff: Permission denied"
    assert text[-1] == "  ... and 2 more"
    assert not r.ok


def test_report_to_dict_is_json_ready():
    r = _CopyReport(copied=2, seconds=0.25, names=[b"a\xff", "b"])
    r.failures.append(Failure.from_oserror(b"x\xfe", FileNotFoundError(errno.ENOENT, "No such file")))
    d = json.loads(json.dumps(r.to_dict(), ensure_ascii=False))
    assert d["ok"] is False and d["copied"] == 2 and d["seconds"] == 0.25
    assert d["failures"] == [{"path": "x\udcfe", "code": "ENOENT", "reason": "No such file"}]
    assert d["names"] == ["a\udcff", "b"]
    assert d["summary"] == "copied 2 files in 0.25 s"


def test_report_raise_for_failures_carries_the_report():
    r = _CopyReport()
    r.raise_for_failures()
    r.add_failure("k", "checksum mismatch", "integrity")
    with pytest.raises(PartialFailure) as info:
        r.raise_for_failures()
    assert info.value.report is r and info.value.failures == r.failures
    assert "k: checksum mismatch" in str(info.value)


def test_report_html_escapes_names():
    r = _CopyReport(copied=1)
    r.add_failure("<script>", "bad & worse", "E")
    page = r._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page and "bad &amp; worse" in page
    assert "1 failed" in page


# -- progress --------------------------------------------------------------------------------------


def test_progress_callable_gets_throttled_snapshots_and_a_final_one():
    seen: list[Snapshot] = []
    with progress_for(seen.append, "copy", unit="files", total=1000, interval=3600) as p:
        for _ in range(1000):
            p.add(1, bytes=10)
    assert len(seen) == 2          # the first add (nothing rendered yet) and the final one
    last = seen[-1]
    assert (last.done, last.total, last.bytes, last.finished, last.unit) == (1000, 1000, 10000, True, "files")
    assert "copy: 1,000/1,000 files" in str(last)


def test_progress_from_worker_threads_renders_only_in_the_owner():
    seen_threads = set()

    def render(s: Snapshot) -> None:
        seen_threads.add(threading.get_ident())

    with progress_for(render, "walk", interval=0) as p:
        workers = [threading.Thread(target=lambda: [p.add(1) for _ in range(100)]) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        p.tick()
        assert p.snapshot().done == 400
    assert seen_threads == {threading.get_ident()}


def test_progress_false_costs_nothing_and_bad_values_are_refused_before_work():
    with progress_for(False, "x") as p:
        assert not p
        p.add(5)
        assert p.snapshot().done == 0
    for bad in ("yes", 3, [1]):
        with pytest.raises(UsageError):
            check_progress(bad)


def test_progress_parts_count_on_from_the_parts_before():
    """start_part / part_done / part_progress: the base count of a run over several paths (or
    rounds) lives in the Progress; part_done is the hook a native walker is handed."""
    seen: list[Snapshot] = []
    with progress_for(seen.append, "fastls", unit="entries", interval=0) as p:
        p.part_done(5)                              # the first part starts at 0
        p.start_part(done=7, failures=1)            # its exact totals, then the next part
        p.part_done(3)
        p.part_progress(Snapshot("job", done=4, failures=2))
        p.start_part()
        p.part_done(1)
    assert [(s.done, s.failures) for s in seen] == [(5, 0), (10, 1), (11, 3), (12, 3), (12, 3)]
    assert seen[-1].finished
    with progress_for(False, "x") as quiet:          # nobody listens: parts are no-ops too
        quiet.start_part(done=3)
        quiet.part_done(2)
        assert quiet.snapshot().done == 0


def test_wait_ticking_returns_once_its_thread_has_ended_in_the_kernel_too():
    """s3pull's processes engine forks right after the listing's first page, which wait_ticking
    awaited in a thread that used TLS: OpenSSL's destructor at that thread's C-level end takes a
    global lock, and a fork in the middle left it taken in the workers (their first TLS call hung;
    the pull stalled for 120 s).  Here a destructor of the thread's own keeps it 0.3 s past its
    function's return (``usleep`` as the destructor, the key's value its argument)."""
    import ctypes

    from manyfiles._core.progress import wait_ticking

    libc = ctypes.CDLL(None, use_errno=True)
    key = ctypes.c_uint()
    usleep = ctypes.cast(libc.usleep, ctypes.c_void_p)
    assert libc.pthread_key_create(ctypes.byref(key), usleep) == 0
    try:
        def ends_late() -> int:
            libc.pthread_setspecific(key, ctypes.c_void_p(300_000))
            return threading.get_native_id()

        tid = wait_ticking(ends_late, lambda: None)
        assert not Path(f"/proc/self/task/{tid}").exists(), "returned while its thread was still ending"
    finally:
        libc.pthread_key_delete(key)


def test_progress_true_without_terminal_prints_plain_lines():
    code = ("from manyfiles._core.progress import progress_for\n"
            "with progress_for(True, 'demo', unit='files', total=3) as p:\n"
            "    p.add(3)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("demo: 3/3 files")
    assert proc.stderr.strip().endswith("[done]")


# -- pool ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 4])
def test_pool_runs_items_and_what_tasks_submit(workers):
    seen = []
    lock = threading.Lock()

    def fn(n: int) -> None:
        with lock:
            seen.append(n)
        if n < 100:
            pool.submit(n * 10 + 100, n * 10 + 101)

    pool = Pool(fn, workers, lifo=True)
    pool.run(range(5))
    assert sorted(seen) == sorted([*range(5), *(n * 10 + 100 + k for n in range(5) for k in (0, 1))])


@pytest.mark.parametrize("workers", [1, 3])
def test_pool_first_error_cancels_and_is_raised(workers):
    started = []

    def fn(n: int) -> None:
        started.append(n)
        if n == 3:
            raise ValueError("boom")
        time.sleep(0.001)

    pool = Pool(fn, workers, max_pending=4)
    with pytest.raises(ValueError, match="boom"):
        pool.run(range(10_000))
    assert len(started) < 10_000    # the rest of the (lazy) input was never started
    assert pool.cancelled


def test_pool_bounds_what_it_reads_ahead():
    taken = []
    gate = threading.Event()

    def source():
        for i in range(1000):
            taken.append(i)
            yield i

    def fn(n: int) -> None:
        gate.wait()

    pool = Pool(fn, 2, max_pending=8)
    t = threading.Thread(target=pool.run, args=(source(),))
    t.start()
    time.sleep(0.3)
    ahead = len(taken)
    gate.set()
    t.join()
    assert ahead <= 2 + 8 + 1       # running + waiting + the one the feeder holds
    assert len(taken) == 1000


def test_pool_interrupt_in_tick_leaves_unstarted_items_for_cleanup():
    ran = []

    def fn(n: int) -> None:
        ran.append(n)
        time.sleep(0.01)

    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 2:
            raise KeyboardInterrupt

    pool = Pool(fn, 2, max_pending=10_000)
    with pytest.raises(KeyboardInterrupt):
        pool.run(list(range(2000)), tick=tick, interval=0.05)
    assert pool.cancelled
    assert len(ran) + len(pool.leftover) <= 2000 and pool.leftover
    assert not set(ran) & set(pool.leftover)


# -- sizes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("4096", 4096), ("64K", 65536), ("64KiB", 65536), ("64kb", 65536),
    ("1.5M", 1572864), ("2GiB", 2 << 30), (".5K", 512), ("1 M", 1 << 20)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "1.5.2M", "-1K", "12Q", "1e3"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_parse_size_minimum_and_format():
    with pytest.raises(ValueError, match="minimum"):
        parse_size("100", minimum=280)
    assert format_size(512) == "512 B" and format_size(1572864) == "1.5 MiB"


@pytest.mark.parametrize("workers", [2, 8])
def test_pool_wakes_the_right_threads_and_never_stalls(workers):
    # A tree-shaped workload (tasks submit tasks, some slow, fed from a bounded iterable):
    # each wake-up goes to a worker, the feeder or the waiting thread, never lost.
    import random

    rng = random.Random(workers)
    done, made = [], []
    lock = threading.Lock()

    def fn(n: int) -> None:
        with lock:
            done.append(n)
            kids = [len(made) + k for k in range(rng.randint(0, 3))] if len(made) < 3000 else []
            made.extend(kids)
        pool.submit(*kids)
        if n % 97 == 0:
            time.sleep(0.001)

    for _ in range(20):
        done.clear()
        made[:] = range(1000, 1050)  # the fed items; submitted ones are numbered after them
        pool = Pool(fn, workers, lifo=True, max_pending=2)
        runner = threading.Thread(target=pool.run, args=(range(1000, 1050),))
        runner.start()
        runner.join(30)
        assert not runner.is_alive(), "the pool stalled"
        assert sorted(done) == sorted(made)
