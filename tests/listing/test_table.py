"""mf.scan(): a listing as a table (len, rows, columns, pandas, Arrow), checked against os.walk/lstat."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import manyfiles as mf
from manyfiles import listing
from manyfiles.errors import PartialFailure, UsageError
from manyfiles.listing import Filter
from manyfiles.table import ListingTable, Row

BACKENDS = ["dents", "scandir"] if listing.default_backend() == "dents" else ["scandir"]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "flat"
    (root / "sub" / "deeper").mkdir(parents=True)
    for i in range(50):
        (root / f"f{i:03d}.bin").write_bytes(b"x" * i)
    (root / "sub" / "inner.txt").write_bytes(b"abc")
    (root / "sub" / "deeper" / "leaf").write_bytes(b"")
    os.symlink("f001.bin", root / "link")
    (root / os.fsdecode(b"bad\xff\xfename")).write_bytes(b"12345")
    return root


def os_rows(root: Path, recursive: bool) -> dict[str, tuple[str, str, int]]:
    """path -> (name, type letter, inode), from os.walk + lstat."""
    out = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(top, name)
            st = os.lstat(p)
            letter = "l" if os.path.islink(p) else "d" if os.path.isdir(p) else "f"
            out[p] = (name, letter, st.st_ino)
        if not recursive:
            break
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("recursive", [False, True])
def test_scan_rows_match_os_walk(folder: Path, backend: str, recursive: bool) -> None:
    t = mf.scan(folder, recursive=recursive, backend=backend)
    assert isinstance(t, ListingTable) and t.ok
    expected = os_rows(folder, recursive)
    assert len(t) == len(expected)
    got = {r.path: (r.name, r.type, r.inode) for r in t}
    assert got == expected
    assert all(isinstance(r, Row) and r.size is None for r in t)
    assert t.columns == ("path", "name", "type", "inode")
    assert t.directories == (3 if recursive else 1)


def test_stat_adds_size_and_mtime_of_the_entry_itself(folder: Path) -> None:
    t = mf.scan(folder, stat=True)
    assert t.columns[-2:] == ("size", "mtime")
    for r in t:
        st = os.lstat(r.path)
        assert (r.size, r.mtime) == (st.st_size, st.st_mtime), r
    sizes = dict(zip(t.column("name"), t.column("size"), strict=True))
    assert sizes["f049.bin"] == 49 and sizes["link"] == len("f001.bin")


def test_names_are_str_with_surrogate_escapes_like_listdir(folder: Path) -> None:
    t = mf.scan(folder)
    assert sorted(t.column("name")) == sorted(os.listdir(folder))
    bad = next(n for n in t.column("name") if n.startswith("bad"))
    assert os.fsencode(bad) == b"bad\xff\xfename"
    with pytest.raises(TypeError):
        mf.scan(os.fsencode(folder))


def test_to_pandas_columns_and_types(folder: Path) -> None:
    pd = pytest.importorskip("pandas")
    df = mf.scan(folder, recursive=True, stat=True).to_pandas()
    assert list(df.columns) == ["path", "name", "type", "inode", "size", "mtime"]
    assert len(df) == len(os_rows(folder, True))
    assert str(df["inode"].dtype) == "uint64" and str(df["size"].dtype) == "int64"
    assert pd.api.types.is_datetime64_any_dtype(df["mtime"])
    row = df[df["name"] == "inner.txt"].iloc[0]
    assert row["path"] == str(folder / "sub" / "inner.txt") and row["size"] == 3 and row["type"] == "f"
    # the non-UTF-8 name survives exactly (an object column where needed)
    bad = df[df["name"].map(lambda n: n.startswith("bad"))].iloc[0]
    assert os.fsencode(bad["path"]) == os.fsencode(folder) + b"/bad\xff\xfename"
    assert df.groupby("type", observed=True).size().to_dict() == {"d": 2, "f": 53, "l": 1}


def test_to_arrow_marks_non_utf8_names_with_exact_bytes(folder: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    tab = mf.scan(folder, stat=True).to_arrow()
    assert tab.column_names == ["path", "name", "type", "inode", "size", "mtime", "path_bytes"]
    assert tab.schema.field("inode").type == pa.uint64()
    assert pa.types.is_timestamp(tab.schema.field("mtime").type)
    rows = tab.to_pylist()
    exact = [r for r in rows if r["path_bytes"] is not None]
    assert [r["path_bytes"] for r in exact] == [os.fsencode(folder) + b"/bad\xff\xfename"]
    assert exact[0]["name"] == "bad\ufffd\ufffdname"
    f5 = next(r for r in rows if r["name"] == "f005.bin")
    assert f5["size"] == 5 and f5["inode"] == os.lstat(folder / "f005.bin").st_ino
    # a clean folder has no path_bytes column
    clean = mf.scan(folder / "sub").to_arrow()
    assert clean.column_names == ["path", "name", "type", "inode"] and clean.num_rows == 2


def test_filter_and_options_are_walks(folder: Path) -> None:
    t = mf.scan(folder, recursive=True, filter=Filter(include=("*.txt", "leaf")))
    assert sorted(t.column("name")) == ["inner.txt", "leaf"]
    assert len(mf.scan(folder, recursive=True, max_depth=1)) == len(os_rows(folder, True)) - 1
    with pytest.raises(TypeError):
        mf.scan(folder, max_depth=1)   # max_depth without recursive=True


def test_errors_missing_root_raises_a_bad_subdir_is_a_failure(folder: Path) -> None:
    with pytest.raises(FileNotFoundError):
        mf.scan(folder / "missing")
    os.symlink("..", folder / "sub" / "up")   # followed: a cycle, reported on the directory that closes it
    t = mf.scan(folder, recursive=True, follow_symlinks=True)
    assert [f.code for f in t.failures] == ["ELOOP"] and not t.ok
    assert t.failures[0].path == str(folder / "sub" / "up")
    with pytest.raises(PartialFailure):
        t.raise_for_failures()


def test_bad_progress_is_refused_before_reading(folder: Path) -> None:
    with pytest.raises(UsageError):
        mf.scan(folder, progress="yes")


def test_html_and_repr(folder: Path) -> None:
    t = mf.scan(folder)
    html = t._repr_html_()
    assert "<table>" in html and f"{len(t):,} entries" in html and html.count("<tr>") == 11
    assert "columns path, name, type, inode" in repr(t)
    odd = folder / "sub" / "deeper"
    (odd / os.fsdecode(b"<\xff>")).touch()
    assert "&lt;\\xff&gt;" in mf.scan(odd)._repr_html_()   # escaped, and the byte shown as \xff


def test_to_arrow_without_pyarrow_names_the_extra(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)   # import pyarrow -> ImportError
    with pytest.raises(mf.MissingExtra, match=r'pip install "manyfiles\[arrow\]"'):
        mf.scan(folder).to_arrow()
