"""Per-worker counters of a dataset, gathered by the process that made it.

A ``DataLoader``'s workers are processes of their own: what each one read from the cache, fetched,
queued for the cache disk and how long its hits took is in its memory, not in the process that
asks.  Each process that reads through a dataset publishes its counters in a small file of its
own (one ``mmap`` of a few hundred bytes: a publish is a memory write, no system call), in a folder
named after the dataset and the process that made it; :meth:`Board.gather` reads them all.  The
folder goes when that process ends (and, after a ``kill -9``, when the next dataset is made).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import struct
import tempfile
import weakref
from typing import Any

from manyfiles._core.procs import pid_alive

#: what a dataset counts itself, then the cache's per-process counters (Cache.process_stats)
DATASET_FIELDS = ("samples", "packed_hits", "hits", "fetched", "hit_ns", "hit_bytes", "fetched_bytes")
CACHE_FIELDS = ("fills_queued", "fill_bytes_queued", "fills_done", "fill_bytes_done", "fills",
                "fills_dropped")
FIELDS = DATASET_FIELDS + CACHE_FIELDS
_SLOT = struct.Struct(f"<{len(FIELDS) + 1}q")       # the fields, then a publish count (torn-read check)
PREFIX = "manyfiles-dataset-"


def _base() -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


class Board:
    """The counters of one dataset's processes: ``slot()`` is this process's, ``gather()`` everyone's."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        base = _base()
        _clean_stale(base)
        self.path = tempfile.mkdtemp(prefix=f"{PREFIX}{self.owner}-", dir=base)
        weakref.finalize(self, _remove, self.path, self.owner)
        self._slot: Slot | None = None

    def __getstate__(self) -> dict:
        return {"owner": self.owner, "path": self.path, "_slot": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def slot(self) -> Slot:
        """This process's slot (a new one in a forked or spawned worker)."""
        s = self._slot
        if s is None or s.pid != os.getpid():
            s = self._slot = Slot(self.path)
        return s

    def gather(self) -> list[dict[str, int]]:
        """The counters every process published (``pid`` included), this one's first."""
        me = self._slot
        if me is not None and me.pid == os.getpid():
            me.flush()
        out = []
        try:
            names = sorted(os.listdir(self.path), key=lambda n: (n != str(os.getpid()), n))
        except FileNotFoundError:
            return []
        for name in names:
            if not name.isdigit():
                continue
            values = _read(os.path.join(self.path, name))
            if values is not None:
                out.append({"pid": int(name), **dict(zip(FIELDS, values, strict=False))})
        return out


class Slot:
    """One process's counters: ``add`` in memory, ``publish`` to the shared mapping."""

    def __init__(self, folder: str) -> None:
        self.pid = os.getpid()
        self.values = [0] * len(FIELDS)
        self._publishes = 0
        self._map: mmap.mmap | None = None
        with contextlib.suppress(OSError):
            fd = os.open(os.path.join(folder, str(self.pid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, _SLOT.size)
                self._map = mmap.mmap(fd, _SLOT.size)
            finally:
                os.close(fd)
        self.cache_stats: Any = None     # () -> dict: the cache's process_stats, read at each publish

    def publish(self) -> None:
        m = self._map
        if m is None:
            return
        values = self.values
        stats = self.cache_stats
        if stats is not None:
            c = stats()
            base = len(DATASET_FIELDS)
            for k, name in enumerate(CACHE_FIELDS):
                values[base + k] = c.get(name, 0)
        self._publishes += 1
        _SLOT.pack_into(m, 0, *values, self._publishes)

    flush = publish


def _read(path: str) -> tuple[int, ...] | None:
    for _ in range(3):
        try:
            with open(path, "rb") as f:
                raw = f.read(_SLOT.size)
        except OSError:
            return None
        if len(raw) != _SLOT.size:
            return None
        first = _SLOT.unpack(raw)
        with contextlib.suppress(OSError), open(path, "rb") as f:
            again = _SLOT.unpack(f.read(_SLOT.size))
            if again == first:       # not torn by a publish in between
                return first[:-1]
    return first[:-1]


def _remove(path: str, owner: int) -> None:
    if os.getpid() == owner:        # (a forked child inherits the finalizer; only the owner removes)
        shutil.rmtree(path, ignore_errors=True)


def _clean_stale(base: str) -> None:
    """Remove the folders of datasets whose process is gone (killed: no finalizer ran)."""
    with contextlib.suppress(OSError), os.scandir(base) as it:
        for e in it:
            if not e.name.startswith(PREFIX):
                continue
            pid = e.name[len(PREFIX):].partition("-")[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(e.path, ignore_errors=True)
