"""The small state kept under ``DEST/.s3pull/`` so that a re-run skips finished work.

``state.jsonl``  one line per finished object: key, size, ETag (append-only; a lost
                 tail after a crash only means those objects are fetched again)
``tmp/``         temp files; large objects also keep ``<name>.parts`` listing the
                 finished part numbers so a re-run resumes them part by part
``failures.tsv`` key<TAB>reason for every object that failed in the last run
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

from manyfiles import _fsops
from manyfiles.s3.keys import STATE_DIR


class State:
    """Finished objects of previous runs (key -> (size, etag)) plus an append log."""

    def __init__(self, dest: str) -> None:
        self.dir = os.path.join(dest, STATE_DIR)
        self.tmp = os.path.join(self.dir, "tmp")
        self.path = os.path.join(self.dir, "state.jsonl")
        self.done: dict[str, tuple[int, str | None]] = {}
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._f = None
        self._lines = 0
        self._flushed = 0.0

    def open(self) -> State:
        _fsops.makedirs(self.tmp)
        try:
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    self._lines += 1
                    try:
                        rec = json.loads(line)
                        self.done[rec["k"]] = (int(rec["s"]), rec.get("e"))
                    except (ValueError, KeyError, TypeError):
                        continue  # a torn last line from a crash
        except FileNotFoundError:
            pass
        if self._lines > 2 * len(self.done) + 1000:
            self._compact()
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 -- closed in close()
        return self

    def is_done(self, key: str, size: int | None, etag: str | None, path: str) -> bool:
        """True if a previous run finished ``key`` with this size and ETag and the file is still there."""
        rec = self.done.get(key)
        if rec is None or size is None or rec[0] != size or (etag and rec[1] and rec[1] != etag):
            return False
        try:
            return os.stat(path).st_size == size
        except OSError:
            return False

    def record(self, key: str, size: int, etag: str | None) -> None:
        line = json.dumps({"k": key, "s": size, "e": etag}, ensure_ascii=False) + "\n"
        with self._lock:
            self.done[key] = (size, etag)
            self._pending.append(line)
            now = time.monotonic()
            if len(self._pending) >= 256 or now - self._flushed > 0.5:
                self._flushed = now
                self._flush_locked()

    def _flush_locked(self) -> None:
        if self._f is not None and self._pending:
            self._f.write("".join(self._pending))
            self._f.flush()
            self._pending.clear()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        with self._lock:
            self._flush_locked()
            if self._f is not None:
                self._f.close()
                self._f = None

    def _compact(self) -> None:
        tmp = self.path + ".new"
        with open(tmp, "w", encoding="utf-8") as f:
            for k, (s, e) in self.done.items():
                f.write(json.dumps({"k": k, "s": s, "e": e}, ensure_ascii=False) + "\n")
            f.flush()
            _fsops.fsync(f.fileno(), tmp)
        _fsops.rename(tmp, self.path)
        self._lines = len(self.done)

    def write_failures(self, failures: list[tuple[str, str]]) -> str | None:
        """Write ``failures.tsv`` (or remove a stale one); returns its path if written."""
        path = os.path.join(self.dir, "failures.tsv")
        if not failures:
            with contextlib.suppress(FileNotFoundError):
                _fsops.unlink(path)
            return None
        tmp = path + ".new"
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
            for key, reason in failures:
                f.write(f"{_escape(key)}\t{reason}\n")
        _fsops.rename(tmp, path)
        return path


def _escape(key: str) -> str:
    return key.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
