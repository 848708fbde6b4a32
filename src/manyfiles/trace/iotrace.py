"""I/O operation log (``--trace FILE``): every syscall-level operation, a few hundred ns each.

Contract used by every module that performs I/O:

    from manyfiles.trace import iotrace
    tr = iotrace.TRACER                  # None when tracing is off (the common case)
    if tr is not None:
        t0 = time.monotonic_ns()
    ... the operation ...
    if tr is not None:
        tr.record(op, path, offset, length, t0, time.monotonic_ns() - t0, result)

``op`` is a short str ("getdents", "stat", "open", "write", "fsync", "rename",
"unlink", "mkdir", "rmdir", "s3.list", "s3.get", "s3.get_range"), ``path`` a str or
bytes (S3: "bucket/key"), ``result`` 0 on success, else the errno or HTTP status.
For "getdents", ``offset`` is the number of entries and ``length`` the bytes returned.
For S3 GETs ``offset``/``length`` are the byte range (``length`` = bytes received).
CLOCK_MONOTONIC is shared by all processes, so worker traces can be merged.

Design (after the ~1% overhead I/O loggers of parallel filesystems): ``record()``
only appends one tuple to an in-memory deque (no formatting, no lock, no syscall);
a background thread drains it every ``flush_interval`` seconds into a compact
binary file (format in :mod:`manyfiles.trace.format`), one ``write()`` per block,
so a process killed with SIGKILL leaves every block flushed before the kill.
Memory is bounded: when the deque holds ``buffer_records`` records, new ones are
counted as dropped and the caller carries on without waiting.

Worker processes (``manyfiles._core.worker.instrumented_worker()``) write their own
``FILE.worker-<pid>``, found and merged by ``manyfiles trace summary FILE``.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

from manyfiles.errors import ManyfilesError

__all__ = ["TRACER", "Tracer", "native_sink", "record", "span", "tracing"]

TRACER: Tracer | None = None
"""The active tracer of this process, or None (tracing off)."""

ENV_TRACE = "MANYFILES_TRACE"          # parent's trace file, inherited by worker processes
ENV_RUN = "MANYFILES_TRACE_RUN"        # run id tying worker files to their parent's file
DEFAULT_BUFFER_RECORDS = 1 << 18       # ~200 B each held; the writer drains 10x a second
DEFAULT_FLUSH_INTERVAL = 0.1
BLOCK_RECORDS = 4096                   # per marshal.dumps call: ~1 ms of GIL at most
_THREADS: dict[int, threading.Thread] = threading._active  # type: ignore[attr-defined]  # ident -> Thread
WORKER_SUFFIX = ".worker-"             # same as manyfiles.trace.format.WORKER_SUFFIX


class Tracer:
    """Buffers I/O records and writes them to ``path`` from a background thread.

    ``record(op, path, offset, length, start_ns, dur_ns, result)`` is the hot path:
    it never blocks, formats nothing and is safe to call from any thread.  Use
    :func:`tracing` rather than constructing one directly.
    """

    def __init__(self, path: str, *, header: dict[str, Any] | None = None,
                 buffer_records: int = DEFAULT_BUFFER_RECORDS,
                 flush_interval: float = DEFAULT_FLUSH_INTERVAL) -> None:
        from manyfiles.trace.format import FIELDS, encode_block, encode_header

        self.path = path
        self.buffer_records = buffer_records
        self.flush_interval = flush_interval
        self.records_written = 0
        self.error: OSError | None = None
        self._encode_block = encode_block
        self._fields = FIELDS
        self._dropped = 0
        self._drop_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._threads: dict[int, tuple[int, str]] = {}
        self._stop = threading.Event()
        self._closed = False
        buf: list = []
        self._buf = buf
        self.record = self._make_record(buf, buffer_records)
        info = {"format": 2, "pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv,
                "hostname": os.uname().nodename, "clock": "CLOCK_MONOTONIC",
                "monotonic_ns": time.monotonic_ns(), "realtime_ns": time.time_ns(), "role": "main"}
        info.update(header or {})
        self.header = info
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            self._write(encode_header(info))
        except OSError:
            os.close(self._fd)
            raise
        # A bare thread: threading.Thread.start() waits until the new thread has been
        # scheduled, milliseconds on a busy machine, for nothing we need.
        _thread.start_new_thread(self._run, ())

    def _make_record(self, buf: list, cap: int) -> Any:
        from manyfiles.trace.format import FIELDS

        extend = buf.extend
        drop = self._drop
        limit = cap * FIELDS

        # Closure over locals: no attribute lookups on the hot path.  One list.extend
        # per record is atomic under the GIL (records never interleave), and the writer
        # only removes a prefix, so no lock is needed; the columns are sliced out later.
        # The thread is kept as its Thread object (threading's own ident -> Thread map, one
        # dict lookup): its native id stays right even if the thread ends before the flush.
        def record(op: str, path: Any, offset: int, length: int, start_ns: int, dur_ns: int, result: int,
                   _len=len, _ident=threading.get_ident, _thread_of=_THREADS.get) -> None:
            if _len(buf) < limit:
                i = _ident()
                extend((op, path, offset, length, start_ns, dur_ns, result, _thread_of(i, i)))
            else:
                drop()

        return record

    def record(self, op: str, path: Any, offset: int, length: int, start_ns: int, dur_ns: int,
               result: int) -> None:  # pragma: no cover - replaced per instance in __init__
        """Append one operation to the log (see the module docstring for the fields)."""

    def record_native(self, flat: list, threads: dict[int, str]) -> None:
        """Records made by native threads (the C walker's workers), attributed to them.

        ``flat`` holds the records back to back, each as :meth:`record`'s seven values followed
        by the kernel thread id of the thread that made the call; ``threads`` names those ids.
        Called from a Python thread that collected them, any time after the calls.
        """
        self._threads.update((tid, (tid, name)) for tid, name in threads.items())
        room = self.buffer_records * self._fields - len(self._buf)
        if len(flat) > room:
            kept = max(0, room - room % self._fields)
            with self._drop_lock:
                self._dropped += (len(flat) - kept) // self._fields
            flat = flat[:kept]
        self._buf.extend(flat)

    def _drop(self) -> None:
        with self._drop_lock:
            self._dropped += 1

    @property
    def dropped(self) -> int:
        """Records lost because the buffer was full (or the trace file could not be written)."""
        return self._dropped

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval):
            self.flush()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def _known_threads(self) -> dict[int, tuple[int, str]]:
        # Only for records that carry a bare ident (threads threading did not know yet).
        for t in threading.enumerate():
            if t.ident is not None:
                self._threads[t.ident] = (t.native_id or 0, t.name)
        return self._threads

    def flush(self, *, last: bool = False) -> None:
        """Write everything buffered so far (the writer thread calls this every ``flush_interval``)."""
        with self._write_lock:
            if self._closed:
                return
            buf = self._buf
            end = len(buf) - len(buf) % self._fields
            flat = buf[:end]
            del buf[:end]  # records appended meanwhile sit after ``end`` and stay
            n = end // self._fields
            if not n and not last:
                return
            step = BLOCK_RECORDS * self._fields
            threads = self._known_threads()
            for i in range(0, max(end, 1), step):
                # Blocks of at most BLOCK_RECORDS: encoding holds the GIL, and the traced
                # program's threads must not wait long for it.
                chunk = flat[i:i + step]
                k = len(chunk) // self._fields
                final = last and i + step >= end
                if self.error is None:
                    try:
                        self._write(self._encode_block(chunk, self._dropped, threads, final))
                        self.records_written += k
                        continue
                    except OSError as exc:  # disk full, ...: keep the work going, count the loss
                        self.error = exc
                    except Exception as exc:  # a caller passed something unencodable
                        self.error = OSError(0, f"cannot encode records: {exc}")
                with self._drop_lock:
                    self._dropped += k

    def close(self) -> None:
        """Stop the writer, write the remaining records and a clean-close marker, close the file."""
        if self._closed:
            return
        self._stop.set()
        # No join: the lock serializes this last flush with one the writer may be doing,
        # and once _closed is set the writer thread only exits.
        self.flush(last=True)
        with self._write_lock:
            self._closed = True
            os.close(self._fd)
        if self.error is not None:
            warnings.warn(f"{self.path}: trace incomplete: {self.error.strerror or self.error} "
                          f"({self._dropped} records dropped)", RuntimeWarning, stacklevel=2)


def native_sink(tracer: Any) -> Any:
    """Where native code (the C walker) hands its records: ``tracer.record_native``, or for a
    tracer that only has ``record`` (a test's recorder), the records replayed through it."""
    sink = getattr(tracer, "record_native", None)
    if sink is not None:
        return sink

    def replay(flat: list, threads: dict[int, str]) -> None:
        for i in range(0, len(flat), 8):
            tracer.record(*flat[i:i + 7])

    return replay


def record(op: str, path: Any, offset: int, length: int, start_ns: int, dur_ns: int, result: int) -> None:
    """Record one operation if tracing is on (convenience; hot loops should use ``TRACER`` directly)."""
    tr = TRACER
    if tr is not None:
        tr.record(op, path, offset, length, start_ns, dur_ns, result)


@contextlib.contextmanager
def span(op: str, path: Any, offset: int = 0, length: int = 0) -> Iterator[None]:
    """Time the block and record it as ``op`` (result = errno of an OSError raised inside).

    Example:
        >>> with iotrace.span("open", path):          # doctest: +SKIP
        ...     fd = os.open(path, os.O_RDONLY)
    """
    tr = TRACER
    if tr is None:
        yield
        return
    t0 = time.monotonic_ns()
    try:
        yield
    except OSError as exc:
        tr.record(op, path, offset, length, t0, time.monotonic_ns() - t0, exc.errno or -1)
        raise
    tr.record(op, path, offset, length, t0, time.monotonic_ns() - t0, 0)


@contextlib.contextmanager
def tracing(file: str | os.PathLike, *, buffer_records: int = DEFAULT_BUFFER_RECORDS,
            flush_interval: float = DEFAULT_FLUSH_INTERVAL) -> Iterator[Tracer]:
    """Log every I/O operation of the block (and of instrumented worker processes) to ``file``.

    Read the result with ``manyfiles trace summary FILE`` or :func:`manyfiles.trace.summarize`.

    Example:
        >>> import manyfiles as mf
        >>> with mf.tracing("/tmp/run.mftrace"):      # doctest: +SKIP
        ...     mf.remove_tree("/scratch/old")
    """
    global TRACER
    if TRACER is not None:
        raise ManyfilesError(f"{file}: I/O tracing is already on (to {TRACER.path})")
    path = os.path.abspath(os.fspath(file))
    run_id = os.urandom(8).hex()
    _remove_worker_files(path)
    try:
        tracer = Tracer(path, header={"run_id": run_id}, buffer_records=buffer_records,
                        flush_interval=flush_interval)
    except OSError as exc:
        raise ManyfilesError(f"{file}: cannot write trace: {exc.strerror or exc}") from exc
    saved = {k: os.environ.get(k) for k in (ENV_TRACE, ENV_RUN)}
    os.environ[ENV_TRACE] = path
    os.environ[ENV_RUN] = run_id
    TRACER = tracer
    try:
        yield tracer
    finally:
        TRACER = None
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tracer.close()


def _remove_worker_files(path: str) -> None:
    """Worker files of an earlier run to the same name would be merged into this one."""
    folder, base = os.path.split(path)
    prefix = base + WORKER_SUFFIX
    try:
        with os.scandir(folder) as it:
            stale = [e.path for e in it if e.name.startswith(prefix) and e.name[len(prefix):].isdigit()]
    except OSError:
        return
    for p in stale:
        with contextlib.suppress(OSError):
            os.unlink(p)


def start_worker() -> Tracer | None:
    """In a worker process: start tracing to ``FILE.worker-<pid>`` if the parent traces to FILE."""
    global TRACER
    path = os.environ.get(ENV_TRACE)
    if not path or TRACER is not None:
        return None
    try:
        tracer = Tracer(f"{path}{WORKER_SUFFIX}{os.getpid()}",
                        header={"role": "worker", "run_id": os.environ.get(ENV_RUN, "")})
    except OSError as exc:
        warnings.warn(f"{path}: worker trace not written: {exc.strerror or exc}", RuntimeWarning,
                      stacklevel=2)
        return None
    TRACER = tracer
    return tracer


def stop_worker(tracer: Tracer | None) -> None:
    """Counterpart of :func:`start_worker`: flush and close the worker's trace file."""
    global TRACER
    if tracer is None:
        return
    if TRACER is tracer:
        TRACER = None
    tracer.close()


def _after_fork_in_child() -> None:
    # The parent's writer thread does not exist in a forked child, and its file
    # descriptor is shared: the child must not use the inherited tracer.  Workers
    # start their own through start_worker() (MANYFILES_TRACE is inherited).
    global TRACER
    if TRACER is not None:
        TRACER._closed = True
        TRACER = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
