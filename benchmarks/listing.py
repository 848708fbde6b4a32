"""fastls benchmark: manyfiles listing vs os.listdir/os.scandir/getdents/ls/find vs the C floor.

    python benchmarks/listing.py                         # every shape, 1M entries (~35 min)
    python benchmarks/listing.py --shape ext4 --repeat 5
    python benchmarks/listing.py --shape usr --shape usrlike --shape tree
    python benchmarks/listing.py --shape sshfs --sshfs-entries 200000

Shapes (all in one run, same data for every peer):

* ``ext4``   1M-entry flat folder on ext4 (benchmarks/_data/listing), warm, then cold
             (``drop_caches`` before every single run)
* ``tmpfs``  the same on /dev/shm
* ``usr``    the real /usr, warm (~150k entries in ~17k small directories on this machine)
* ``usrlike`` a generated tree of that shape (150k entries, 17k directories, random-recursive
             nesting, heavy-tailed directory sizes, 5k symlinks; seeded, so every machine gets
             the same), warm
* ``tree``   1M files in a two-level hashed tree (65,536 leaf dirs, what ``shard`` makes), warm
             and cold (drop_caches before every run)
* ``sshfs``  200k and 1M flat folders over sshfs on loopback (benchmarks/_sshfs.py): warm (sshfs
             directory cache valid; mounted with ``dcache_timeout=3600`` so a 40-s peer stays warm
             across repetitions) and freshly mounted (remount before every run)
* ``memory`` RSS growth of one process that lists the 1M folder 5 times (fresh process per method)

Every timed value is the median of ``--repeat`` runs (the ~1-minute peers on sshfs 1M stop after
``--slow-repeat`` runs; the ``runs`` column says so).  Runs are interleaved round-robin
across methods so machine noise hits every method alike.  The C floor (benchmarks/floor.c, a bare
getdents64 loop) times itself inside its process, so its start-up is not counted; every other
command-line peer is timed as a whole process (start-up included, like a user sees it).  Each
method's entry count is checked against os.listdir of the same folder ("entries" column).

Tree peers: ``find``, ``find | wc -l``, ``fd`` (built by this script with ``cargo install fd-find``
into benchmarks/_build/fd on first use; skipped with a note when cargo is missing) and, in
process, ``os.walk`` against ``manyfiles.walk``.  The load average is printed with each table:
the machine is shared, so compare ratios inside one table only.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import compile_c, drop_caches, machine_line, make_flat, make_hashed_tree

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("MANYFILES_BENCH_DATA", HERE / "_data" / "listing"))
SHM = Path("/dev/shm/mf-bench-listing")
BIN = Path(sys.executable).parent
MiB = 1 << 20


# -- methods -------------------------------------------------------------------------------------

# (entries listed or None, self-timed wall seconds or None, self-measured CPU seconds or None)
Outcome = tuple[int | None, float | None, float | None]


@dataclass
class Method:
    name: str
    run: Callable[[], Outcome]
    check: Callable[[], int] | None = None   # untimed counting run for commands writing to /dev/null
    slow: bool = False                       # known to take ~a minute: no untimed warm-up/check run


@dataclass
class Result:
    name: str
    times: list[float] = field(default_factory=list)   # wall seconds
    cpus: list[float] = field(default_factory=list)    # user+sys CPU seconds of the same runs
    entries: int | None = None
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpus)


def py(name: str, fn: Callable[[], int], slow: bool = False) -> Method:
    return Method(name, lambda: (fn(), None, None), slow=slow)


def cmd(name: str, argv: list[str], extra_lines: int = 0, slow: bool = False) -> Method:
    """A command timed with stdout to /dev/null; ``extra_lines`` are non-entries it prints (., .., DIR)."""

    def run() -> Outcome:
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
        return None, None, None

    def check() -> int:
        out = subprocess.run(argv, stdout=subprocess.PIPE, check=True).stdout
        return out.count(b"\n") - extra_lines

    return Method(name, run, check, slow)


def floor(path: Path, bufsize: int = MiB, recursive: bool = False, slow: bool = False) -> Method:
    exe = compile_c(HERE / "floor.c")
    argv = [str(exe), "-b", str(bufsize), *(["-r"] if recursive else []), str(path)]
    label = f"C floor: getdents64 {_size(bufsize)}{' walk, 1 thread' if recursive else ''}"

    def run() -> Outcome:
        out = subprocess.run(argv, stdout=subprocess.PIPE, check=True, text=True).stdout
        fields = dict(kv.split("=") for kv in out.split())
        return int(fields["entries"]), float(fields["seconds"]), float(fields["cpu"])

    return Method(label, run, slow=slow)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= MiB else f"{n >> 10} KiB"


def _getdents_names(path: str, buff_size: int = MiB, filtered: bool = False) -> list[str]:
    import getdents

    if filtered:  # the package's default filter (ls_a): drops DT_UNKNOWN entries
        return [name for _ino, _type, name in getdents.getdents(path, buff_size=buff_size)]
    names = [name for _ino, _type, name in getdents.getdents(path, buff_size=buff_size, filter_function=None)]
    return [n for n in names if n not in (".", "..")]


def _scandir_names(path: str) -> list[str]:
    with os.scandir(path) as it:
        return [e.name for e in it]


def flat_methods(path: Path, *, sshfs: bool = False, slow_peers: bool = False) -> list[Method]:
    import manyfiles

    p = str(path)
    fastls = str(BIN / "fastls")
    if sshfs:   # the network shape: buffer size is what matters
        return [
            floor(path, MiB),
            floor(path, 32 << 10, slow=slow_peers),
            py("manyfiles.count", lambda: manyfiles.count(p)),
            py("manyfiles.listdir (1 MiB)", lambda: len(manyfiles.listdir(p))),
            cmd("fastls DIR > /dev/null", [fastls, p]),
            py("getdents pkg (1 MiB, filter_function=None)", lambda: len(_getdents_names(p))),
            py("getdents pkg (1 MiB, default filter)", lambda: len(_getdents_names(p, filtered=True))),
            py("os.scandir (names)", lambda: len(_scandir_names(p)), slow=slow_peers),
            cmd("ls -f > /dev/null", ["ls", "-f", p], extra_lines=2, slow=slow_peers),
        ]
    return [
        floor(path, MiB),
        py("manyfiles.count", lambda: manyfiles.count(p)),
        py("manyfiles.listdir", lambda: len(manyfiles.listdir(p))),
        cmd("fastls DIR > /dev/null", [fastls, p]),
        py("os.listdir", lambda: len(os.listdir(p))),
        py("os.scandir (names)", lambda: len(_scandir_names(p))),
        py("getdents pkg (1 MiB, filter_function=None)", lambda: len(_getdents_names(p))),
        cmd("ls -f > /dev/null", ["ls", "-f", p], extra_lines=2),
        cmd("find DIR -maxdepth 1 > /dev/null", ["find", p, "-maxdepth", "1"], extra_lines=1),
    ]


FD_ROOT = HERE / "_build" / "fd"


def fd_binary() -> Path | None:
    """fd (sharkdp/fd), built once with cargo into benchmarks/_build/fd; None without cargo."""
    exe = FD_ROOT / "bin" / "fd"
    if exe.exists():
        return exe
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not Path(cargo).exists():
        return None
    print("building fd with cargo (once, a few minutes) ...", file=sys.stderr, flush=True)
    subprocess.run([cargo, "install", "fd-find", "--locked", "--root", str(FD_ROOT)], check=True)
    return exe


def tree_methods(root: Path, threads: int, *, sharded: bool = False, cold: bool = False) -> list[Method]:
    """Peers for a tree; ``sharded``: also ShardedDir.count() vs ``find DIR, piped to wc -l``."""
    import manyfiles
    from manyfiles import listing

    r = str(root)
    fastls = str(BIN / "fastls")

    def mf_walk() -> int:
        n = 0
        for d in manyfiles.walk(r, threads=threads):
            if d.error is not None:
                raise d.error
            n += len(d.entries)
        return n

    def os_walk() -> int:
        return sum(len(dirs) + len(files) for _top, dirs, files in os.walk(r))

    def shard_count() -> int:
        from manyfiles.shard import ShardedDir

        # + the 65,792 bucket directories and the root's .complete marker, to compare with all entries
        return ShardedDir(r).count() + 65_536 + 256 + 1

    # the default thread count keeps fastls on its click-free fast path (no --threads option)
    th = [] if threads == listing.DEFAULT_THREADS else ["-j", str(threads)]
    methods = [
        floor(root, MiB, recursive=True),
        cmd("fastls -r DIR > /dev/null", [fastls, "-r", *th, r]),
        Method("fastls -r --count DIR", lambda: (_int_output([fastls, "-r", "-c", *th, r]), None, None)),
        py(f"manyfiles.walk (batches, threads={threads})", mf_walk),
        py("os.walk", os_walk),
        cmd("find DIR > /dev/null", ["find", r], extra_lines=1),
    ]
    if not cold:
        methods.append(py(f"manyfiles.count_tree (threads={threads})",
                          lambda: listing.count_tree(r, threads=threads).entries))
        find_wc = ["sh", "-c", f"find '{r}' | wc -l"]
        methods.append(Method("find DIR, piped to wc -l", lambda: (_int_output(find_wc) - 1, None, None)))
    if sharded:
        methods.append(py("ShardedDir.count() (+ bucket dirs)", shard_count))
    fd = fd_binary()
    if fd is not None:
        methods.append(cmd("fd -uu . DIR > /dev/null", [str(fd), "--hidden", "--no-ignore", ".", r]))
    return methods


def _int_output(argv: list[str]) -> int:
    return int(subprocess.run(argv, stdout=subprocess.PIPE, check=True).stdout.split()[0])


# -- measuring ----------------------------------------------------------------------------------

@dataclass
class Opts:
    repeat: int
    slow_repeat: int


def measure(methods: list[Method], opts: Opts, before_each: Callable[[], object] | None = None,
            check: bool = True) -> list[Result]:
    """Round-robin ``methods`` ``opts.repeat`` times; ``before_each`` (untimed) precedes every run."""
    results = [Result(m.name) for m in methods]
    if check:   # untimed warm-up that also counts what /dev/null-bound commands list
        for m, r in zip(methods, results, strict=True):
            # Slow peers are checked by their timed runs; so are in-process methods of cold tables
            # (whose warm-up would be wasted), while commands are counted once without a drop.
            if m.slow or (before_each is not None and m.check is None):
                continue
            try:
                r.entries = m.check() if m.check is not None else m.run()[0]
            except Exception as exc:   # a failing peer is reported, not fatal
                r.error = _why(exc)
    for rep in range(opts.repeat):
        for m, r in zip(methods, results, strict=True):
            if r.error or (m.slow and rep >= opts.slow_repeat):
                continue
            try:
                if before_each is not None:
                    before_each()
                gc.collect()
                c0, k0 = time.process_time(), _children_cpu()
                t0 = time.perf_counter()
                entries, secs, cpu = m.run()
                wall = time.perf_counter() - t0
                used = time.process_time() - c0 + _children_cpu() - k0
            except Exception as exc:
                r.error = _why(exc)
                continue
            r.times.append(secs if secs is not None else wall)
            r.cpus.append(cpu if cpu is not None else used)
            if entries is not None:
                r.entries = entries
            print(f"  .. {m.name}: {r.times[-1]:.3f} s", file=sys.stderr, flush=True)
    return results


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _why(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        return f"exit {exc.returncode}"
    return f"{type(exc).__name__}: {exc}"[:80]


def table(title: str, results: list[Result], expected: int, note: str = "") -> dict[str, Result]:
    """Print a markdown table with ratios to the first row (the C floor)."""
    base = results[0]
    print(f"\n#### {title}\n")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{note + ' ' if note else ''}Load average after the runs (1/5/15 min): {load}.\n")
    print("| method | runs | median s | ns/entry | x floor | CPU s | CPU x floor | entries listed |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        if not r.times:
            print(f"| {r.name} | 0 | - | - | - | - | - | error: {r.error} |")
            continue
        ratio = f"{r.median / base.median:.2f}" if base.times else "-"
        cratio = f"{r.cpu / base.cpu:.2f}" if base.cpus and base.cpu > 0 else "-"
        if r.entries is None:
            ok = "not checked"
        elif r.entries == expected:
            ok = f"{r.entries:,} (all)"
        else:
            ok = f"**{r.entries:,} of {expected:,}**"
        ns = r.median / expected * 1e9
        cells = [r.name, len(r.times), f"{r.median:.3f}", f"{ns:,.0f}", ratio, f"{r.cpu:.3f}", cratio, ok]
        print("| " + " | ".join(map(str, cells)) + " |")
    sys.stdout.flush()
    return {r.name: r for r in results}


# -- shapes -------------------------------------------------------------------------------------

TARGETS: list[str] = []


def _ratio(results: dict[str, Result], slow: str, fast: str) -> tuple[float, float] | None:
    """(wall ratio, CPU ratio) of two methods' medians."""
    a, b = results.get(slow), results.get(fast)
    if not a or not b or not a.times or not b.times:
        return None
    return a.median / b.median, (a.cpu / b.cpu if b.cpu > 0 else float("nan"))


def _target(text: str, value: tuple[float, float] | float | None, ok: Callable[[float], bool],
            fmt: str = "{:.2f}x", cpu_bound: bool = True) -> None:
    """Record a target, judged on wall time; for CPU-bound shapes the CPU-time ratio is shown too."""
    if value is None:
        TARGETS.append(f"- {text}: not measured")
        return
    wall, cpu = value if isinstance(value, tuple) else (value, None)
    if not cpu_bound:
        cpu = None
    line = f"- {text}: {fmt.format(wall)} -> **{'met' if ok(wall) else 'missed'}**"
    if cpu is not None:
        line += f" (CPU time: {cpu:.2f}x, {'met' if ok(cpu) else 'missed'})"
    TARGETS.append(line)


def shape_flat(where: str, path: Path, n: int, opts: Opts, cold: bool) -> None:
    make_flat(path, n)
    expected = len(os.listdir(path))
    warm = table(f"{n:,} entries, flat, {where}, warm", measure(flat_methods(path), opts), expected)
    if where == "ext4" and n >= 1_000_000:
        c, ls, fl = "manyfiles.count", "manyfiles.listdir", "C floor: getdents64 1 MiB"
        _target(f"ext4 {n:,} warm: count <= 1.15x floor", _ratio(warm, c, fl), lambda v: v <= 1.15)
        _target(f"ext4 {n:,} warm: listdir <= 1.35x floor", _ratio(warm, ls, fl), lambda v: v <= 1.35)
        _target("ext4 warm: listdir faster than os.listdir (os.listdir / listdir)",
                _ratio(warm, "os.listdir", ls), lambda v: v > 1.0)
        _target("ext4 warm: `fastls DIR >/dev/null` faster than `ls -f >/dev/null` (ls / fastls)",
                _ratio(warm, "ls -f > /dev/null", "fastls DIR > /dev/null"), lambda v: v > 1.0)
    if cold:
        if not drop_caches():
            print("\n(cold runs skipped: cannot write /proc/sys/vm/drop_caches)")
            return
        table(f"{n:,} entries, flat, {where}, cold (drop_caches before every run)",
              measure(flat_methods(path), opts, before_each=drop_caches), expected)


def shape_tree(n: int, opts: Opts, threads: int) -> None:
    root = make_hashed_tree(DATA / f"tree{n}", n)
    expected = sum(len(d) + len(f) for _t, d, f in os.walk(root))
    note = "Entries = files + directories below the root (single-threaded C walk = floor)."
    warm = table(f"{n:,} files, two-level hashed tree, ext4, warm",
                 measure(tree_methods(root, threads, sharded=True), opts), expected, note)
    _tree_targets(f"{n:,} hashed tree warm", warm, threads, sharded=True)
    if not drop_caches():
        print("\n(cold runs skipped: cannot write /proc/sys/vm/drop_caches)")
        return
    cold = table(f"{n:,} files, two-level hashed tree, ext4, cold (drop_caches before every run)",
                 measure(tree_methods(root, threads, cold=True), opts, before_each=drop_caches), expected,
                 note)
    walk = f"manyfiles.walk (batches, threads={threads})"
    fd = "fd -uu . DIR > /dev/null"
    for ours in ("fastls -r DIR > /dev/null", walk):
        _target(f"{n:,} hashed tree cold: {ours} >= 1.2x faster than fd", _ratio(cold, fd, ours),
                lambda v: v >= 1.2, cpu_bound=False)
        _target(f"{n:,} hashed tree cold: {ours} >= 4x faster than os.walk", _ratio(cold, "os.walk", ours),
                lambda v: v >= 4, cpu_bound=False)


def _tree_targets(label: str, res: dict[str, Result], threads: int, sharded: bool = False) -> None:
    find = "find DIR > /dev/null"
    for ours in ("fastls -r DIR > /dev/null", "fastls -r --count DIR"):
        _target(f"{label}: `{ours}` <= 0.9x `find`", _ratio(res, ours, find), lambda v: v <= 0.9)
    _target(f"{label}: manyfiles.walk (batches) <= 1.0x os.walk",
            _ratio(res, f"manyfiles.walk (batches, threads={threads})", "os.walk"), lambda v: v <= 1.0)
    if sharded:
        find_wc = "find DIR, piped to wc -l"
        _target(f"{label}: ShardedDir.count() <= 1.0x `{find_wc}`",
                _ratio(res, "ShardedDir.count() (+ bucket dirs)", find_wc), lambda v: v <= 1.0)


def shape_usr(opts: Opts, threads: int) -> None:
    root = Path("/usr")
    expected = sum(len(d) + len(f) for _t, d, f in os.walk(root))
    table("/usr of this machine, warm", measure(tree_methods(root, threads), opts), expected,
          "Entries = files + directories + symlinks below /usr.")


def make_usrlike(path: Path, *, dirs: int = 17_000, files: int = 130_000, links: int = 5_000,
                 seed: int = 10) -> Path:
    """A /usr-shaped tree: each new directory hangs under a random earlier one (depth ~log n),
    files go to directories with heavy-tailed weights (a few hold thousands, most a handful)."""
    import random

    marker = path / f".complete-usrlike-{dirs}-{files}-{links}-{seed}"
    if marker.exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    rng = random.Random(seed)
    path.mkdir(parents=True)
    tree = [path]
    for i in range(1, dirs):
        d = rng.choice(tree) / f"dir{i:05d}"
        d.mkdir()
        tree.append(d)
    weights = [rng.paretovariate(1.1) for _ in tree]
    names = ("lib{}.so.6", "{}.py", "README.{}", "{}-config", "{}.h", "x86_64-{}")
    owners = rng.choices(range(len(tree)), weights=weights, k=files)
    made: list[Path] = []
    for i, owner in enumerate(owners):
        f = tree[owner] / names[i % len(names)].format(f"f{i:06d}")
        os.close(os.open(f, os.O_CREAT | os.O_WRONLY, 0o644))
        made.append(f)
    for i in range(links):
        target = rng.choice(made)
        os.symlink(target.name, target.parent / f"link{i:05d}")
    marker.touch()
    return path


def shape_usrlike(opts: Opts, threads: int) -> None:
    root = make_usrlike(DATA / "usrlike")
    expected = sum(len(d) + len(f) for _t, d, f in os.walk(root))
    res = table("/usr-like generated tree (17,000 dirs, 130,000 files, 5,000 symlinks), ext4, warm",
                measure(tree_methods(root, threads), opts), expected, "Entries = everything below the root.")
    _tree_targets("/usr-like tree warm", res, threads)


FRESH_1M = ("C floor: getdents64 1 MiB", "C floor: getdents64 32 KiB", "manyfiles.listdir (1 MiB)",
            "os.scandir (names)", "ls -f > /dev/null")


def shape_sshfs(sizes: list[int], opts: Opts) -> None:
    from _sshfs import remount, sshfs_mount

    for n in sizes:
        remote = make_flat(DATA / f"flat{n}", n)
        expected = len(os.listdir(remote))
        slow = n >= 500_000
        with sshfs_mount(remote, options=("dcache_timeout=3600",)) as mnt:
            subprocess.run([str(compile_c(HERE / "floor.c")), str(mnt)], check=True,
                           stdout=subprocess.DEVNULL)   # fill sshfs's directory cache
            types = _dtypes(mnt)
            warm = table(f"{n:,} entries, flat, sshfs over loopback, warm",
                         measure(flat_methods(mnt, sshfs=True, slow_peers=slow), opts), expected,
                         f"Warm listing reports d_type/inode: {types}.")
            fresh = flat_methods(mnt, sshfs=True, slow_peers=slow)
            note = ""
            fresh_opts = opts
            if slow:   # every run is server-bound (~30 s to minutes at 1M): the brief's set, fewer runs
                fresh = [m for m in fresh if m.name in FRESH_1M]
                fresh_opts = Opts(min(opts.repeat, 3), 1)
                note = (f"At {n:,} entries: {len(fresh)} methods; 3 runs each, 1 run for the 32 KiB peers "
                        "(32 KiB floor, os.scandir, ls -f).")
            table(f"{n:,} entries, flat, sshfs over loopback, freshly mounted (remount before every run)",
                  measure(fresh, fresh_opts, before_each=lambda m=mnt: remount(m)), expected, note)
        if n >= 1_000_000:
            ml = "manyfiles.listdir (1 MiB)"
            for peer in ("os.scandir (names)", "ls -f > /dev/null"):
                _target(f"sshfs {n:,} warm: manyfiles.listdir >= 20x faster than {peer}",
                        _ratio(warm, peer, ml), lambda v: v >= 20, cpu_bound=False)
            got = warm[ml].entries if ml in warm else None
            _target(f"sshfs {n:,} warm: every entry listed by manyfiles.listdir ({expected:,} expected)",
                    None if got is None else float(got), lambda v, e=expected: v == e, "{:,.0f}")


def _dtypes(path: Path) -> str:
    """What the kernel reports for the first entries (DT_UNKNOWN / inode 0xffffffff on warm sshfs)."""
    import getdents

    seen = set()
    for ino, typ, name in getdents.getdents(str(path), filter_function=None):
        if name not in (".", ".."):
            seen.add((typ, ino))
        if len(seen) > 3 or name.endswith("00100"):
            break
    return ", ".join(f"d_type={'DT_UNKNOWN' if t == getdents.DT_UNKNOWN else t} inode={ino:#x}"
                     for t, ino in sorted(seen))


_RSS_SCRIPT = r"""
import gc, os, sys
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
path, which = sys.argv[1], sys.argv[2]
if which == "manyfiles.listdir":
    import manyfiles.listing as m
    fn = m.listdir
elif which == "getdents":
    import getdents
    fn = lambda p: [e[2] for e in getdents.getdents(p, buff_size=1 << 20, filter_function=None)]
else:
    fn = os.listdir
gc.collect()
sizes = [rss()]
for _ in range(5):
    names = fn(path)
    n = len(names)
    del names
    gc.collect()
    sizes.append(rss())
print(n, *sizes)
"""


def shape_memory(n: int) -> None:
    path = make_flat(DATA / f"flat{n}", n)
    print(f"\n#### Memory: RSS growth after listing {n:,} entries 5 times in one process\n")
    print("RSS (MiB) before the first listing, after the 1st and after the 5th; the names are dropped after "
          "each listing. Growth from the 1st to the 5th listing is what leaks; the first listing's growth is "
          "the allocator keeping freed memory (os.listdir shows the same).\n")
    print("| method | entries per listing | before | after 1 | after 5 | growth 0->5 | growth 1->5 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for which in ("manyfiles.listdir", "os.listdir", "getdents"):
        out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(path), which], capture_output=True,
                             text=True, check=True).stdout
        cnt, *sizes = map(int, out.split())
        before, first, after = sizes[0] / MiB, sizes[1] / MiB, sizes[-1] / MiB
        growth = after - before
        label = "getdents pkg (filter_function=None)" if which == "getdents" else which
        print(f"| {label} | {cnt:,} | {before:.1f} | {first:.1f} | {after:.1f} | {growth:.1f} | "
              f"{after - first:.1f} |")
        if which == "manyfiles.listdir":
            _target(f"memory: manyfiles.listdir {n:,} entries x5, RSS growth < 10 MiB", growth,
                    lambda v: v < 10, "{:.1f} MiB")


# -- main ---------------------------------------------------------------------------------------

def _core() -> str:
    try:
        import manyfiles._dents as d
    except ImportError as exc:
        return f"C core not importable ({exc}): scandir fallback"
    if not hasattr(d, "count"):
        return f"placeholder {d.__file__} (no count): scandir fallback"
    return f"C core {Path(d.__file__).name}"


@contextlib.contextmanager
def _tmpfs_data(n: int, keep: bool) -> Iterator[Path]:
    path = SHM / f"flat{n}"
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(SHM, ignore_errors=True)


def _compile_package() -> None:
    """Byte-compile manyfiles as an install would: with PYTHONDONTWRITEBYTECODE set (some shells
    set it) and no .pyc, every `fastls` run would compile its modules again (~20 ms, a sixth of
    a `find /usr`)."""
    import compileall

    import manyfiles

    compileall.compile_dir(os.path.dirname(manyfiles.__file__), quiet=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", action="append",
                    choices=["ext4", "tmpfs", "usr", "usrlike", "tree", "sshfs", "memory", "all"],
                    help="what to run (repeatable; default all)")
    ap.add_argument("--entries", type=int, default=1_000_000, help="entries for ext4/tmpfs/tree/memory")
    ap.add_argument("--sshfs-entries", default="200000,1000000", help="comma-separated folder sizes")
    ap.add_argument("--repeat", type=int, default=5, help="runs per method (median)")
    ap.add_argument("--slow-repeat", type=int, default=2,
                    help="runs for the ~1-minute peers on sshfs 1M (os.scandir, ls -f, 32 KiB floor)")
    ap.add_argument("--threads", type=int, default=None,
                    help="walker threads (fastls -r, manyfiles.walk; default: the library's default)")
    ap.add_argument("--no-cold", action="store_true", help="skip the drop_caches runs of the ext4 shape")
    ap.add_argument("--keep-tmpfs", action="store_true", help="leave the tmpfs data set in /dev/shm")
    a = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so sshfs mounts and tmpfs data are cleaned up.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if a.threads is None:
        from manyfiles.listing import DEFAULT_THREADS

        a.threads = DEFAULT_THREADS
    shapes = set(a.shape or ["all"])
    if "all" in shapes:
        shapes = {"ext4", "tmpfs", "usr", "usrlike", "tree", "sshfs", "memory"}
    opts = Opts(a.repeat, a.slow_repeat)
    _compile_package()
    t0 = time.time()
    args = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"`python benchmarks/listing.py{' ' + args if args else ''}`")
    print(f"\n{machine_line()}; manyfiles: {_core()}; {time.strftime('%H:%M UTC', time.gmtime())}")
    if "ext4" in shapes:
        shape_flat("ext4", DATA / f"flat{a.entries}", a.entries, opts, cold=not a.no_cold)
    if "tmpfs" in shapes:
        with _tmpfs_data(a.entries, a.keep_tmpfs) as path:
            shape_flat("tmpfs", path, a.entries, opts, cold=False)
    if "usr" in shapes:
        shape_usr(opts, a.threads)
    if "usrlike" in shapes:
        shape_usrlike(opts, a.threads)
    if "tree" in shapes:
        shape_tree(a.entries, opts, a.threads)
    if "sshfs" in shapes:
        shape_sshfs([int(x) for x in a.sshfs_entries.split(",")], opts)
    if "memory" in shapes:
        shape_memory(a.entries)
    if TARGETS:
        print("\n#### Targets (issues 2 and 10)\n")
        print("\n".join(TARGETS))
    print(f"\n(total {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
