"""The state journal of a push: what a run killed at any moment left, so that the same command
run again completes it.

One JSON line per event, appended with one ``write`` on an ``O_APPEND`` file (a line is whole or
absent after kill -9; a torn last line is ignored):

``{"t": "start", "key", "uid", "path", "size", "mtime", "ino", "psize", "alg", "at"}``
    a multipart upload was created for this file (written right after CreateMultipartUpload)
``{"t": "part", "uid", "n", "etag", "size", "sum"}``
    a part was sent, its checksum checked by the server, and S3 answered this ETag
``{"t": "end", "uid"}``
    the upload was completed or aborted
``{"t": "done", "key", "path", "size", "mtime", "ino"}``
    the file is in the bucket, checked
``{"t": "intent", "key"}``
    a CreateMultipartUpload is about to be sent (again after it was retried or failed: an answer
    may be lost);
    an intent with no ``start`` after it makes the next run abort the key's uploads it does not know
``{"t": "cleared", "key"}``
    those were aborted

A rerun keeps an upload whose file is the same (path, size, mtime, inode, part size, algorithm)
and keeps of its listed parts only those whose ETag and size are the ones recorded (never by
size alone: a cut body can be listed with its declared size); it aborts the uploads it no longer
needs, and skips the files recorded done with the same identity.  A run that ends with every file
pushed removes the journal: it only ever serves the resume of an unfinished run (a later run
uploads everything again).  The file lives in the state folder (``$XDG_STATE_HOME/manyfiles/s3push``,
else ``~/.local/state/manyfiles/s3push``), one per endpoint, bucket and prefix, locked while a
push runs (a second push to the same place is refused).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from typing import Any

from manyfiles.errors import ManyfilesError


def default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "manyfiles", "s3push")


class Busy(ManyfilesError):
    """Another push to the same destination holds the journal."""


class Journal:
    """The journal of one destination (see the module docstring); thread-safe appends."""

    def __init__(self, state_dir: str, where: str) -> None:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        name = hashlib.sha256(where.encode()).hexdigest()[:24] + ".jsonl"
        self.path = os.path.join(state_dir, name)
        self.where = where
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        self._fd = os.open(self.path, flags, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise Busy(f"{where}: another s3push to this destination is running (its journal {self.path} "
                       "is locked)") from None
        self._lock = threading.Lock()
        self.uploads: dict[str, dict[str, Any]] = {}    # uid -> start record + "parts": {n: record}
        self.done: dict[str, dict[str, Any]] = {}       # key -> done record
        self.intents: set[str] = set()    # keys whose CreateMultipartUpload answer may be lost
        self._intended: set[str] = set()
        self._load()

    def _load(self) -> None:
        with open(self._fd, "rb", closefd=False) as f:
            f.seek(0)
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue            # a line cut by a kill: never acted on
                self._apply(rec, loading=True)

    def append(self, **rec: Any) -> None:
        data = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, data)
            self._apply(rec, loading=False)

    def _apply(self, rec: dict[str, Any], *, loading: bool) -> None:
        kind = rec.get("t")
        if kind == "start":
            self.uploads[rec["uid"]] = {**rec, "parts": {}}
            if loading:     # the create's answer reached the journal (this run: see the retried case)
                self.intents.discard(rec["key"])
        elif kind == "part" and rec.get("uid") in self.uploads:
            self.uploads[rec["uid"]]["parts"][rec["n"]] = rec
        elif kind == "end":
            self.uploads.pop(rec.get("uid"), None)
        elif kind == "done":
            self.done[rec["key"]] = rec
        elif kind == "intent" and (loading or rec["key"] in self.intents or self._second_intent(rec["key"])):
            self.intents.add(rec["key"])
        elif kind == "cleared":
            self.intents.discard(rec["key"])

    def _second_intent(self, key: str) -> bool:
        """This run's first intent of a key only marks the create; a second one (the create was
        retried, or failed) is what needs the cleanup."""
        seen = self._intended
        if key in seen:
            return True
        seen.add(key)
        return False

    def start(self, key: str, uid: str, path: bytes, size: int, mtime: int, ino: int, psize: int,
              alg: str) -> None:
        self.append(t="start", key=key, uid=uid, path=os.fsdecode(path), size=size, mtime=mtime, ino=ino,
                    psize=psize, alg=alg, at=time.time())

    def is_done(self, key: str, path: bytes, size: int, mtime: int, ino: int) -> bool:
        rec = self.done.get(key)
        return rec is not None and (rec["path"], rec["size"], rec["mtime"], rec["ino"]) == \
            (os.fsdecode(path), size, mtime, ino)

    def finish(self, *, complete: bool) -> None:
        """End of a run: remove the journal if the run completed (nothing left to resume), else
        rewrite it with only what is still live; release the lock."""
        with self._lock:
            if (complete or not self.done) and not self.uploads and not self.intents:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            else:
                lines = [json.dumps({k: v for k, v in u.items() if k != "parts"}, separators=(",", ":"))
                         for u in self.uploads.values()]
                lines += [json.dumps(p, separators=(",", ":")) for u in self.uploads.values()
                          for p in u["parts"].values()]
                lines += [json.dumps(d, separators=(",", ":")) for d in self.done.values()]
                lines += [json.dumps({"t": "intent", "key": k}, separators=(",", ":")) for k in self.intents]
                tmp = self.path + ".tmp"
                with open(tmp, "w") as f:
                    f.write("".join(line + "\n" for line in lines))
                os.replace(tmp, self.path)
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
