"""Helpers shared by the benchmark scripts: data generation, timing, ratio tables.

Rules every script follows (docs/benchmarks.md): peers run in the same process run on the
same data, each measurement is the median of several repetitions, results are reported as
ratios against a peer measured in the same run.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE / "_build"  # compiled C peers (git-ignored)


def make_flat(path: str | os.PathLike, n: int, *, size: int = 0, prefix: str = "f") -> Path:
    """Create ``n`` files named ``{prefix}{i:08d}`` in ``path`` (reused if already complete)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    marker = root / f".complete-{n}-{size}"
    if marker.exists():
        return root
    payload = b"x" * size
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            fd = os.open(f"{prefix}{i:08d}", flags, 0o644, dir_fd=dfd)
            if payload:
                os.write(fd, payload)
            os.close(fd)
    finally:
        os.close(dfd)
    marker.touch()
    return root


def make_hashed_tree(path: str | os.PathLike, n: int, *, levels: int = 2, width: int = 2) -> Path:
    """Create ``n`` empty files in a ``ab/cd/<name>`` tree (md5 of the name), like `shard apply`."""
    import hashlib

    root = Path(path)
    marker = root / f".complete-tree-{n}-{levels}"
    if marker.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    made: set[str] = set()
    for i in range(n):
        name = f"f{i:08d}"
        h = hashlib.md5(name.encode()).hexdigest()
        sub = "/".join(h[k * width : (k + 1) * width] for k in range(levels))
        if sub not in made:
            os.makedirs(root / sub, exist_ok=True)
            made.add(sub)
        os.close(os.open(root / sub / name, os.O_WRONLY | os.O_CREAT, 0o644))
    marker.touch()
    return root


def drop_caches() -> bool:
    """Drop the page/dentry/inode caches (root only); False if not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def median_time(
    fn: Callable[[], object], repeat: int = 5, setup: Callable[[], object] | None = None
) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs, ``setup()`` untimed before each."""
    times = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def shell(cmd: str | Sequence[str]) -> Callable[[], None]:
    """A callable that runs a shell command, stdout to /dev/null, failing loudly."""

    def run() -> None:
        subprocess.run(cmd, shell=isinstance(cmd, str), check=True, stdout=subprocess.DEVNULL)

    return run


def compile_c(source: Path, name: str | None = None) -> Path:
    """Compile a C peer in benchmarks/ with -O2 into benchmarks/_build (cached by mtime)."""
    BUILD.mkdir(exist_ok=True)
    exe = BUILD / (name or source.stem)
    if not exe.exists() or exe.stat().st_mtime < source.stat().st_mtime:
        subprocess.run(["cc", "-O2", "-o", str(exe), str(source)], check=True)
    return exe


def machine_line() -> str:
    """One line describing this machine, for the results header."""
    return (
        f"{os.cpu_count()} CPU, {platform.machine()}, Linux {platform.release()}, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
    )


def print_table(
    title: str,
    rows: list[tuple[str, float]],
    baseline: str,
    unit_count: int | None = None,
    unit: str = "entry",
) -> None:
    """Print a markdown table: name, median seconds, ns per unit, ratio to ``baseline``."""
    base = dict(rows)[baseline]
    print(f"\n### {title}\n")
    per = f" | ns/{unit}" if unit_count else ""
    print(f"| method | median s{per} | x {baseline} |")
    print("|---|---:|" + ("---:|" if unit_count else "") + "---:|")
    for name, secs in rows:
        extra = f" | {secs / unit_count * 1e9:.0f}" if unit_count else ""
        print(f"| {name} | {secs:.3f}{extra} | {secs / base:.2f} |")
    sys.stdout.flush()
