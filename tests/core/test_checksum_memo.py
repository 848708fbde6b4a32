"""manyfiles._core.checksum_memo on real files: a value is used only for the same (device, inode,
size, mtime, ctime) and only when it was taken safely after the file's last change; a file changed
while hashed is not memoized; a memo file that is truncated, corrupt, of another root or half
written by a killed process is ignored (never an error, never a value), and concurrent saves on
one root leave a whole memo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from manyfiles._core import checksum_memo
from manyfiles._core.checksum_memo import MARGIN_NS, ChecksumMemo, Identity


def _ident(path: Path) -> Identity:
    return Identity.of(os.lstat(path))


def _safe_taken(ident: Identity) -> int:
    """A hash started safely after the file's last change (as if it ran MARGIN_NS later)."""
    return max(ident.mtime_ns, ident.ctime_ns) + MARGIN_NS + 1


def _remember(memo: ChecksumMemo, root: Path, rel: str, value: str) -> Identity:
    ident = _ident(root / rel)
    memo.put(rel, ident, ident, _safe_taken(ident), "md5", value)
    return ident


def _new_ctime(path: Path, old: Identity) -> None:
    """Rewind mtime to ``old``'s until the kernel's coarse clock has moved on (ctime then differs)."""
    while os.lstat(path).st_ctime_ns == old.ctime_ns:
        os.utime(path, ns=(old.mtime_ns, old.mtime_ns))
    os.utime(path, ns=(old.mtime_ns, old.mtime_ns))


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    root.mkdir()
    for i in range(3):
        (root / f"f{i}.bin").write_bytes(b"%04d" % i)
    return root, tmp_path / "memo"


def test_a_value_is_kept_across_runs_for_the_same_identity_only(tree) -> None:
    root, where = tree
    memo = ChecksumMemo.open(root, where)
    ident = _remember(memo, root, "f0.bin", "aa")
    memo.save()
    again = ChecksumMemo.open(root, where)
    assert again.get("f0.bin", ident, "md5") == "aa"
    assert again.get("f0.bin", ident, "crc64nvme") is None
    assert again.get("f1.bin", _ident(root / "f1.bin"), "md5") is None
    for field in Identity._fields:       # each field alone decides (the inode: another file in place)
        assert again.get("f0.bin", ident._replace(**{field: getattr(ident, field) + 1}), "md5") is None


def test_a_same_size_edit_with_its_mtime_put_back_is_not_trusted(tree) -> None:
    root, where = tree
    memo = ChecksumMemo.open(root, where)
    old = _remember(memo, root, "f0.bin", "aa")
    memo.save()
    (root / "f0.bin").write_bytes(b"XXXX")          # same size, in place (same inode)
    _new_ctime(root / "f0.bin", old)
    now = _ident(root / "f0.bin")
    assert now._replace(ctime_ns=old.ctime_ns) == old    # only ctime tells
    assert ChecksumMemo.open(root, where).get("f0.bin", now, "md5") is None


def test_another_file_moved_into_place_is_not_trusted(tree) -> None:
    """A file of another inode renamed over a memoized one, with the same size and mtime, is not
    trusted; and when its ctime too is the old one's (two writes within one tick of a coarse clock,
    which a file system with fine-grained timestamps never gives), only the inode tells them apart."""
    root, where = tree
    a, b = root / "a.bin", root / "b.bin"
    a.write_bytes(b"AAAA")
    b.write_bytes(b"BBBB")
    for p in (a, b):
        os.utime(p, ns=(10**18, 10**18))
    memo = ChecksumMemo.open(root, where)
    old = _remember(memo, root, "a.bin", "aa")
    memo.save()
    os.replace(b, a)
    now = _ident(a)
    assert (now.dev, now.size, now.mtime_ns) == (old.dev, old.size, old.mtime_ns) and now.ino != old.ino
    again = ChecksumMemo.open(root, where)
    assert again.get("a.bin", now, "md5") is None
    assert again.get("a.bin", now._replace(ctime_ns=old.ctime_ns), "md5") is None     # the inode alone
    assert again.get("a.bin", old, "md5") == "aa"                                     # (the entry is there)


def test_a_file_changed_within_the_margin_or_while_hashed_is_not_memoized(tree) -> None:
    root, where = tree
    memo = ChecksumMemo.open(root, where)
    taken = time.time_ns()                   # the hash starts now: f0 was written just before
    ident = _ident(root / "f0.bin")
    memo.put("f0.bin", ident, ident, taken, "md5", "aa")
    assert memo.get("f0.bin", ident, "md5") is None
    memo.save()         # (not kept at all: a reader with no margin would not see it either)
    assert ChecksumMemo.open(root, where, margin_ns=0).get("f0.bin", ident, "md5") is None
    before = _ident(root / "f1.bin")         # f1 changes while it is read
    (root / "f1.bin").write_bytes(b"YYYY")
    _new_ctime(root / "f1.bin", before)
    memo.put("f1.bin", before, _ident(root / "f1.bin"), _safe_taken(before), "md5", "bb")
    assert memo.get("f1.bin", before, "md5") is None
    memo.save()
    assert ChecksumMemo.open(root, where).get("f1.bin", before, "md5") is None
    # an entry taken too early is not trusted when read back either (a memo of an older version)
    late = ChecksumMemo.open(root, where, margin_ns=0)
    late.put("f0.bin", ident, ident, max(ident.mtime_ns, ident.ctime_ns) + 1, "md5", "aa")
    late.save()
    assert ChecksumMemo.open(root, where, margin_ns=0).get("f0.bin", ident, "md5") == "aa"
    assert ChecksumMemo.open(root, where).get("f0.bin", ident, "md5") is None


def _memo_file(where: Path) -> Path:
    [path] = [p for p in where.iterdir() if p.name.endswith(".memo")]
    return path


def test_a_damaged_memo_is_ignored_never_an_error_never_a_value(tree) -> None:
    root, where = tree
    memo = ChecksumMemo.open(root, where)
    idents = {rel: _remember(memo, root, rel, f"v{rel}") for rel in ("f0.bin", "f1.bin", "f2.bin")}
    memo.save()
    path = _memo_file(where)
    good = path.read_bytes()
    at = good.index(b"vf1.bin")
    flipped = bytearray(good)
    flipped[at + 1] ^= 1                                      # a value that now says another thing
    other_root = good.replace(os.fsencode(os.path.realpath(root)), b"/elsewhere", 1)
    for bad in (good[: len(good) // 2], good[:-1], bytes(flipped), b"", b"\x00" * 64, other_root,
                good.replace(b"manyfiles-checksum-memo 1", b"manyfiles-checksum-memo 9")):
        path.write_bytes(bad)
        damaged = ChecksumMemo.open(root, where)
        assert all(damaged.get(rel, ident, "md5") is None for rel, ident in idents.items()), bad
    path.unlink()
    path.mkdir()                                              # not even a file
    assert ChecksumMemo.open(root, where).get("f0.bin", idents["f0.bin"], "md5") is None
    ChecksumMemo.open(root, where).save()                     # cannot replace a folder: no error
    path.rmdir()
    path.write_bytes(good)
    assert ChecksumMemo.open(root, where).get("f1.bin", idents["f1.bin"], "md5") == "vf1.bin"


_KILLED_SAVE = """
import os, signal, sys
from manyfiles._core import checkpoints
from manyfiles._core.checksum_memo import ChecksumMemo, Identity
root, where = sys.argv[1], sys.argv[2]
memo = ChecksumMemo.open(root, where)
for i in range(5000):
    memo.put(f"new{i}", Identity(1, i, 4, 1, 1), Identity(1, i, 4, 1, 1), 10**10, "md5", "%032x" % i)
checkpoints.add("checksum-memo", lambda tmp: os.kill(os.getpid(), signal.SIGKILL))
memo.save()
"""


def test_a_save_killed_half_way_leaves_the_old_memo_and_its_temporary_file_goes_later(tree) -> None:
    root, where = tree
    memo = ChecksumMemo.open(root, where)
    ident = _remember(memo, root, "f0.bin", "aa")
    memo.save()
    r = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(root), str(where)], capture_output=True,
                       timeout=60)
    assert r.returncode == -signal.SIGKILL, r.stderr
    [tmp] = [p for p in where.iterdir() if p.name.endswith(".tmp")]
    assert tmp.stat().st_size > 0
    after = ChecksumMemo.open(root, where)
    assert after.get("f0.bin", ident, "md5") == "aa"
    assert after.get("new1", Identity(1, 1, 4, 1, 1), "md5") is None
    tmp.rename(_memo_file(where))                             # even half a file in place is ignored
    assert ChecksumMemo.open(root, where).get("new1", Identity(1, 1, 4, 1, 1), "md5") is None
    stale = where / "x.memo.1.2.tmp"
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 2 * checksum_memo.STALE_TEMP_SECONDS,) * 2)
    _remember(after, root, "f1.bin", "bb")
    after.save()
    assert not stale.exists()


def test_concurrent_saves_on_one_root_leave_a_whole_memo(tree) -> None:
    root, where = tree
    memos = [ChecksumMemo.open(root, where) for _ in range(2)]
    values = [{rel: f"{n}-{rel}" for rel in ("f0.bin", "f1.bin", "f2.bin")} for n in range(2)]
    for memo, vals in zip(memos, values, strict=True):
        for rel, v in vals.items():
            _remember(memo, root, rel, v)
    go = threading.Barrier(2)

    def saves(memo: ChecksumMemo) -> None:
        go.wait()
        for _ in range(30):
            memo.puts += 1          # (each save writes again)
            memo.save()

    threads = [threading.Thread(target=saves, args=(m,)) for m in memos]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = ChecksumMemo.open(root, where)
    got = {rel: final.get(rel, _ident(root / rel), "md5") for rel in values[0]}
    assert got in values
    assert [p.name for p in where.iterdir() if p.name.endswith(".tmp")] == []


def test_the_least_recently_saved_roots_go_beyond_the_bound(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(checksum_memo, "MAX_ROOTS", 3)
    where = tmp_path / "memo"
    for i in range(5):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "f").write_bytes(b"x")
        memo = ChecksumMemo.open(tmp_path / f"r{i}", where)
        _remember(memo, tmp_path / f"r{i}", "f", "v")
        memo.save()
        os.utime(memo.path, (1000 + i, 1000 + i))           # saved in this order
    kept = sorted(p.name for p in where.iterdir())
    assert len(kept) == 3 and os.path.basename(memo.path) in kept
    assert ChecksumMemo.open(tmp_path / "r4", where).get("f", _ident(tmp_path / "r4" / "f"), "md5") == "v"
    assert ChecksumMemo.open(tmp_path / "r0", where).get("f", _ident(tmp_path / "r0" / "f"), "md5") is None
