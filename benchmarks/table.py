"""A folder as a table: ``mf.scan(...).to_pandas()/.to_arrow()`` against the os.scandir idiom.

The peer is what a notebook user writes today::

    pd.DataFrame([(e.path, e.name, type_of(e), e.inode()) for e in os.scandir(path)], columns=...)

(and with ``stat=True``: ``e.stat(follow_symlinks=False)`` for size and mtime).  Both run on
the same flat folder in the same run; each figure is the median of ``--repeat`` runs, and the
table gives the ratio to the scandir peer.  Every method must return ``--files`` rows.

    flock /work/team/bench.lock .venv/bin/python benchmarks/table.py --files 1000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import manyfiles as mf
from _common import machine_line, make_flat, median_time, print_table


def _type(e: os.DirEntry) -> str:
    if e.is_symlink():
        return "l"
    if e.is_dir(follow_symlinks=False):
        return "d"
    return "f" if e.is_file(follow_symlinks=False) else "?"


def scandir_frame(path: str, stat: bool) -> int:
    import pandas as pd

    if stat:
        rows = []
        for e in os.scandir(path):
            st = e.stat(follow_symlinks=False)
            rows.append((e.path, e.name, _type(e), e.inode(), st.st_size, st.st_mtime))
        df = pd.DataFrame(rows, columns=["path", "name", "type", "inode", "size", "mtime"])
        df["mtime"] = pd.to_datetime(df["mtime"], unit="s")
    else:
        df = pd.DataFrame([(e.path, e.name, _type(e), e.inode()) for e in os.scandir(path)],
                          columns=["path", "name", "type", "inode"])
    return len(df)


def methods(path: str, stat: bool) -> list[tuple[str, Callable[[], int]]]:
    out = [
        ("os.scandir -> DataFrame", lambda: scandir_frame(path, stat)),
        ("mf.scan", lambda: len(mf.scan(path, stat=stat))),
        ("mf.scan().to_pandas()", lambda: len(mf.scan(path, stat=stat).to_pandas())),
    ]
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return out
    return [*out, ("mf.scan().to_arrow()", lambda: mf.scan(path, stat=stat).to_arrow().num_rows)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parent / "_data"))
    ap.add_argument("--keep", action="store_true", help="keep the generated folder")
    opts = ap.parse_args()
    path = str(make_flat(Path(opts.data) / f"table-flat-{opts.files}", opts.files))
    print(f"# scan -> table, {opts.files:,} entries in one folder; {machine_line()}; "
          f"load {os.getloadavg()[0]:.1f}")
    try:
        for stat in (False, True):
            rows = []
            for name, fn in methods(path, stat):
                n = fn()
                expected = opts.files + 1   # the .complete marker make_flat leaves
                assert n == expected, f"{name}: {n} rows, expected {expected}"
                rows.append((name, median_time(fn, opts.repeat)))
            print_table(f"flat folder, stat={stat}", rows, "os.scandir -> DataFrame", unit_count=opts.files)
    finally:
        if not opts.keep:
            shutil.rmtree(path)
    print(f"\nload after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
