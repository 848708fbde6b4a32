"""One option set across every verb (issue 12 #5): each verb lists the shared options it should,
the old spellings still work and print exactly one deprecation line, --json is JSON lines,
-n changes nothing on disk, --files-from reads files and stdin (newline or NUL lists).

s3pull's share of this is in tests/s3/test_cli_options.py (it needs the moto endpoint).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from manyfiles._core import files_from as _files_from
from manyfiles.cli import group
from manyfiles.cli._common import deprecation_line, resolve_progress
from manyfiles.errors import NotFound

# verb (as typed after `manyfiles`) -> the shared options its --help must list
JOBS, DRY, FILTER, JSON, QUIET, PROGRESS, FILES, PROFILE = (
    "-j, --jobs", "-n, --dry-run", "--include", "--json", "-q, --quiet", "--progress / --no-progress",
    "--files-from", "--profile-out")
MUTATING_SHARD = {JOBS, DRY, JSON, QUIET, PROGRESS, PROFILE}
SHARED = {
    ("ls",): {JOBS, FILTER, "--exclude", JSON, QUIET, PROGRESS, FILES, PROFILE},
    ("rm",): {JOBS, DRY, FILTER, "--exclude", JSON, QUIET, PROGRESS, FILES, PROFILE},
    ("shard", "apply"): MUTATING_SHARD,
    ("shard", "revert"): MUTATING_SHARD,
    ("shard", "reshard"): MUTATING_SHARD,
    ("shard", "verify"): {JSON, QUIET, PROGRESS, PROFILE},
    ("shard", "status"): {JSON, PROFILE},
    ("pull",): {JOBS, DRY, FILTER, "--exclude", JSON, QUIET, PROGRESS, FILES, PROFILE, "--no-checksum"},
    ("pull", "verify"): {JOBS, JSON, QUIET, PROGRESS, PROFILE},
    ("push",): {JOBS, DRY, FILTER, "--exclude", JSON, QUIET, PROGRESS, PROFILE, "--abort-stale"},
    ("check",): {JOBS, FILTER, "--exclude", JSON, QUIET, PROGRESS, PROFILE},
    ("cache", "warm"): {JOBS, JSON, QUIET, PROGRESS, FILES, PROFILE},
    ("cache", "stats"): {JSON},
    ("cache", "evict"): {DRY, JSON, QUIET, PROFILE},
    ("cache", "verify"): {JSON, QUIET, PROGRESS, PROFILE},
    ("cache", "clear"): {DRY, JSON, QUIET, PROFILE},
    ("info",): {JSON},
}
# spellings that must never show in --help again (they still work, hidden)
OLD = ["--threads", "--workers", "--concurrency", "--glob", "--manifest", "--no-verify", "--plan",
       "--profile FILE", "--profile PATH", "-w,"]


def _help(verb: tuple[str, ...]) -> str:
    r = CliRunner().invoke(group, [*verb, "--help"], prog_name="manyfiles", terminal_width=200)
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("verb", sorted(SHARED), ids=" ".join)
def test_every_verb_lists_its_shared_options_and_hides_the_old_ones(verb: tuple[str, ...]) -> None:
    text = _help(verb)
    missing = {opt for opt in SHARED[verb] if opt not in text}
    assert not missing, (verb, missing)
    assert not [old for old in OLD if old in text], text


def test_progress_default_is_on_only_for_a_terminal_without_json_or_quiet() -> None:
    tty, pipe = (lambda: True), (lambda: False)
    assert resolve_progress(None, isatty=tty) is True
    assert resolve_progress(None, isatty=pipe) is False
    assert resolve_progress(None, quiet=True, isatty=tty) is False
    assert resolve_progress(None, as_json=True, isatty=tty) is False
    # an explicit flag wins either way
    assert resolve_progress(True, quiet=True, as_json=True, isatty=pipe) is True
    assert resolve_progress(False, isatty=tty) is False


# -- old spellings: still work, one line on stderr -----------------------------------------------------


def _flat(root: Path, n: int = 12) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"f{i:02d}.dat").write_bytes(b"x" * (i + 1))
    (root / "keep.txt").write_text("k")
    return root


def _one_line(stderr: bytes, prog: str, old: str, new: str) -> None:
    assert stderr.decode().splitlines() == [deprecation_line(prog, old, new)], stderr


def test_old_spellings_of_fastls(run_cli, tmp_path: Path) -> None:
    root = _flat(tmp_path / "d")
    r = run_cli("fastls", "--threads", "2", "-r", "-c", str(root))
    assert (r.returncode, r.stdout) == (0, b"13\n")
    _one_line(r.stderr, "fastls", "--threads", "-j/--jobs")
    r = run_cli("fastls", "--glob", "keep*", str(root))
    assert (r.returncode, r.stdout) == (0, b"keep.txt\n")
    _one_line(r.stderr, "fastls", "--glob", "--include")
    # both spellings of a repeatable filter add up; both of a single value are a usage error
    r = run_cli("fastls", "--glob", "keep*", "--include", "f00*", "--sort", str(root))
    assert r.stdout == b"f00.dat\nkeep.txt\n"
    r = run_cli("fastls", "--threads", "2", "-j", "3", str(root))
    assert r.returncode == 2 and b"give -j/--jobs only" in r.stderr
    r = run_cli("manyfiles", "ls", "--threads", "2", "-c", str(root))
    assert r.returncode == 0
    _one_line(r.stderr, "manyfiles", "--threads", "-j/--jobs")


def test_old_spellings_of_fastrm_and_shard(run_cli, tmp_path: Path) -> None:
    root = _flat(tmp_path / "rm")
    r = run_cli("fastrm", "--workers", "2", str(root))
    assert r.returncode == 0 and not root.exists()
    _one_line(r.stderr, "fastrm", "--workers", "-j/--jobs")
    root = _flat(tmp_path / "rm2")
    r = run_cli("fastrm", "--glob", "f*", str(root))
    assert r.returncode == 0 and sorted(os.listdir(root)) == ["keep.txt"]
    _one_line(r.stderr, "fastrm", "--glob", "--include")

    flat = _flat(tmp_path / "s")
    r = run_cli("shard", "apply", str(flat), "--plan")
    assert r.returncode == 0 and b"files to move        13" in r.stdout
    _one_line(r.stderr, "shard", "--plan", "-n/--dry-run")
    r = run_cli("shard", "apply", str(flat), "-w", "2", "-q")
    assert r.returncode == 0 and not [p for p in flat.iterdir() if p.is_file() and not p.name.startswith(".")]
    _one_line(r.stderr, "shard", "-w/--workers", "-j/--jobs")
    r = run_cli("shard", "revert", str(flat), "--workers", "2", "-q")
    assert r.returncode == 0 and len([p for p in flat.iterdir() if p.is_file()]) == 13
    _one_line(r.stderr, "shard", "-w/--workers", "-j/--jobs")


def test_old_profile_spelling_writes_the_viztracer_profile(run_cli, tmp_path: Path) -> None:
    pytest.importorskip("viztracer")
    root = _flat(tmp_path / "d")
    out = tmp_path / "p.json"
    r = run_cli("shard", "status", str(root), "--profile", str(out))
    assert r.returncode == 0, r.stderr
    _one_line(r.stderr, "shard", "--profile", "--profile-out")
    assert json.loads(out.read_text())["traceEvents"]


# -- --json: JSON lines on stdout ------------------------------------------------------------------------


def _json_lines(stdout: bytes) -> list[dict]:
    lines = stdout.decode().splitlines()
    assert lines, "no output"
    return [json.loads(line) for line in lines]


def test_json_is_json_lines_for_every_local_verb(run_cli, tmp_path: Path) -> None:
    root = _flat(tmp_path / "d")
    cache = str(tmp_path / "cache")
    at = ["--dir", cache, "--min-free", "0"]     # what is filled stays, however full the disk
    checks = [
        (["fastls", "--json", str(root)], lambda recs: len(recs) == 13),
        (["fastls", "-r", "-c", "--json", str(root)], lambda recs: recs[-1]["entries"] == 13),
        (["manyfiles", "info", "--json"], lambda recs: "version" in recs[0]),
        (["shard", "apply", str(root), "-n", "--json"], lambda recs: recs[-1]["moves"] == 13),
        (["shard", "apply", str(root), "--json"], lambda recs: recs[-1]["moved"] == 13),
        (["shard", "verify", str(root), "--json"], lambda recs: recs[-1]["files"] == 13),
        (["shard", "status", str(root), "--json"], lambda recs: recs[-1]["layout"]),
        (["shard", "reshard", str(root), "--levels", "1", "-n", "--json"],
         lambda recs: recs[-1]["planned"] == 13),
        (["shard", "reshard", str(root), "--levels", "1", "--json"],   # out of the old tree, into the new
         lambda recs: recs[-1]["moved"] == 26),
        (["shard", "revert", str(root), "--json"], lambda recs: recs[-1]["moved"] == 13),
        (["manyfiles", "cache", "warm", *at, str(root), "--json"], lambda recs: recs[-1]["ok"]),
        (["manyfiles", "cache", "stats", *at, "--json"], lambda recs: recs[-1]["entries"] == 13),
        (["manyfiles", "cache", "verify", *at, "--json"], lambda recs: recs[-1]["ok"]),
        (["manyfiles", "cache", "evict", *at, "--to", "0", "--json"],
         lambda recs: recs[-1]["entries"] == 13),
        (["manyfiles", "cache", "clear", *at, "--json"], lambda recs: recs[-1]["entries"] == 0),
        (["fastrm", str(root), "--json"], lambda recs: recs[-1]["files"] == 13 and recs[-1]["ok"]),
    ]
    for argv, check in checks:
        r = run_cli(*argv)
        assert r.returncode == 0, (argv, r.stderr)
        records = _json_lines(r.stdout)
        assert check(records), (argv, records)
        if argv[0] != "fastls" and argv[1:2] != ["info"] and "status" not in argv and "stats" not in argv:
            assert records[-1]["event"] == "summary", argv


# -- -n: nothing changes on disk --------------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every path under ``root`` with its type, inode and content: a dry run must keep all of it."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            data = Path(path).read_bytes() if os.path.isfile(path) else b""
            out[os.path.relpath(path, root)] = (st.st_mode, st.st_ino, data)
    return out


def test_dry_run_changes_nothing_for_each_mutating_verb(run_cli, tmp_path: Path) -> None:
    flat = _flat(tmp_path / "flat")
    sharded = _flat(tmp_path / "sharded")
    assert run_cli("shard", "apply", str(sharded), "-q").returncode == 0
    cache = str(tmp_path / "cache")
    at = ["--dir", cache, "--min-free", "0"]     # what is filled stays, however full the disk
    assert run_cli("manyfiles", "cache", "warm", *at, str(flat), "-q").returncode == 0
    runs = [
        (["fastrm", "-n", str(flat)], b"would remove 13 files"),
        (["fastrm", "-n", "--include", "f0*", str(flat)], b"would remove 10 files"),
        (["manyfiles", "rm", "-n", str(flat)], b"would remove 13 files"),
        (["shard", "apply", "-n", str(flat)], b"files to move        13"),
        (["shard", "revert", "-n", str(sharded)], b"13 files would move back"),
        (["shard", "reshard", "-n", "--levels", "1", str(sharded)], b"13 files would move into levels 1"),
        (["manyfiles", "cache", "evict", *at, "-n", "--to", "0"], b"13 entries would be evicted"),
        (["manyfiles", "cache", "evict", *at, "-n", str(flat / "f01.dat")],
         b"1 entries would be evicted"),
        (["manyfiles", "cache", "clear", *at, "-n"], b"13 entries would be removed"),
    ]
    for argv, said in runs:
        before = _snapshot(tmp_path)
        r = run_cli(*argv)
        assert r.returncode == 0, (argv, r.stderr)
        assert said in r.stdout + r.stderr, (argv, r.stdout, r.stderr)
        assert _snapshot(tmp_path) == before, argv
    r = run_cli("manyfiles", "cache", "stats", *at, "--json")
    assert json.loads(r.stdout)["entries"] == 13 and json.loads(r.stdout)["evictions"] == 0


# -- --files-from ------------------------------------------------------------------------------------------


def test_fastrm_files_from_stdin_newline_and_nul_lists(run_cli, tmp_path: Path) -> None:
    root = _flat(tmp_path / "d")
    odd = os.path.join(os.fsencode(root), b"with\nnewline\xff")
    with open(odd, "wb") as f:
        f.write(b"odd")
    listed = [root / "f01.dat", root / "f02.dat"]
    r = run_cli("fastrm", "--files-from", "-", input=b"".join(os.fsencode(p) + b"\n" for p in listed))
    assert r.returncode == 0, r.stderr
    assert not any(p.exists() for p in listed) and (root / "f03.dat").exists()
    # NUL-terminated (find -print0): a name with a newline and non-UTF-8 bytes goes, nothing else
    r = run_cli("fastrm", "--files-from", "-", input=odd + b"\0" + os.fsencode(root / "f03.dat") + b"\0")
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(odd) and not (root / "f03.dat").exists() and (root / "f04.dat").exists()
    # from a file, with PATHs too; a missing list is a usage error before anything is removed
    lst = tmp_path / "list.txt"
    lst.write_bytes(os.fsencode(root / "f05.dat") + b"\r\n")
    r = run_cli("fastrm", str(root / "f06.dat"), "--files-from", str(lst))
    assert r.returncode == 0 and not (root / "f05.dat").exists() and not (root / "f06.dat").exists()
    r = run_cli("fastrm", str(root), "--files-from", str(tmp_path / "nope"))
    assert r.returncode == 2 and root.exists()


def test_fastls_and_cache_warm_files_from(run_cli, tmp_path: Path) -> None:
    a, b = _flat(tmp_path / "a", 3), _flat(tmp_path / "b", 5)
    r = run_cli("fastls", "-c", "--files-from", "-", input=os.fsencode(a) + b"\0" + os.fsencode(b) + b"\0")
    assert r.returncode == 0 and r.stdout.decode().splitlines()[-1] == "10\ttotal"
    cache = str(tmp_path / "cache")
    at = ["--dir", cache, "--min-free", "0"]     # what is filled stays, however full the disk
    r = run_cli("manyfiles", "cache", "warm", *at, "--files-from", "-", "--json",
                input=os.fsencode(a / "f01.dat") + b"\n" + os.fsencode(b) + b"\n")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["objects"] == 7


def test_read_names_detects_nul_lists_past_the_sniffed_bytes() -> None:
    names = [b"n%06d-" % i + b"x" * 100 for i in range(2000)]          # ~210 KB > SNIFF
    names[1500] = b"line\nbreak"
    assert list(_files_from.read_names(io.BytesIO(b"\0".join(names) + b"\0"))) == names
    assert list(_files_from.read_names(io.BytesIO(b"\n".join(names[:1000]) + b"\n"))) == names[:1000]
    assert list(_files_from.read_names(io.BytesIO(b"a\nb"), sep=b"\0")) == [b"a\nb"]
    assert list(_files_from.read_names(io.BytesIO(b""))) == []
    with pytest.raises(NotFound, match="nope"):
        _files_from.read_names("/nonexistent/nope")


def test_fastls_auto_progress_rule_keeps_the_terminal_listing_clean() -> None:
    from manyfiles.listing._fastls_core import progress_fits

    assert progress_fits(False, stderr_tty=True, stdout_tty=False)       # fastls -r /d > list.txt
    assert progress_fits(True, stderr_tty=True, stdout_tty=True)         # fastls -r -c /d
    assert not progress_fits(False, stderr_tty=True, stdout_tty=True)    # names on the same terminal
    assert not progress_fits(True, stderr_tty=False, stdout_tty=False)   # a log: never by default


# -- issue 17: --version everywhere, help text as printed --------------------------------------------


@pytest.mark.parametrize("script", ["fastls", "shard", "s3pull", "s3push", "fastrm", "manyfiles"])
def test_every_entry_point_has_version(run_cli, script: str) -> None:
    from manyfiles import __version__

    r = run_cli(script, "--version")
    assert (r.returncode, r.stdout.decode(), r.stderr) == (0, f"{script}, version {__version__}\n", b"")


def _commands():
    """(entry point, its click command, the words to the command) for every command and group."""
    import click

    from manyfiles.cli import ls, rm, s3pull, s3push, shard

    def walk(root: str, top: click.Command, cmd: click.Command, words: list[str]):
        yield root, top, words
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                yield from walk(root, top, cmd.get_command(ctx, name), [*words, name])

    for root, top in (("manyfiles", group), ("fastls", ls.command), ("shard", shard.command),
                      ("s3pull", s3pull.command), ("s3push", s3push.command), ("fastrm", rm.command)):
        yield from walk(root, top, top, [])
    yield "s3pull", s3pull.command, ["verify"]


def test_help_text_shows_no_markup() -> None:
    """Help is printed as written: no '%%' (click does not %-format it), no reST double backticks and
    no Markdown backticks (issue 17 saw '10%%' and ``shard``)."""
    seen = 0
    for root, top, words in _commands():
        r = CliRunner().invoke(top, [*words, "--help"], prog_name=root, terminal_width=200)
        assert r.exit_code == 0, (root, words, r.output)
        leaks = [line for line in r.output.splitlines() if "%%" in line or "`" in line]
        assert not leaks, (root, words, leaks)
        seen += 1
    assert seen >= 24   # every command: the five entry points, shard's 5, cache's 5, trace's 2...


def test_every_help_line_fits_an_80_column_terminal() -> None:
    """Every line of every command's --help is at most 79 characters in an 80-column terminal (click
    then wraps to 78; CliRunner would use 80): the examples blocks (\\b) are printed as written, and
    shard's were 103 characters wide (issue 26)."""
    seen = 0
    for root, top, words in _commands():
        r = CliRunner().invoke(top, [*words, "--help"], prog_name=root, terminal_width=78)
        assert r.exit_code == 0, (root, words, r.output)
        wide = [line for line in r.output.splitlines() if len(line) > 79]
        assert not wide, (root, words, wide)
        seen += 1
    assert seen >= 24


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
@pytest.mark.parametrize("command", [("s3pull", "s3://bucket/prefix/", "DEST"),
                                     ("manyfiles", "cache", "warm", "--dir", "CACHE", "s3://bucket/prefix/")])
def test_a_bad_retry_base_setting_is_a_usage_error_before_any_work(run_cli, tmp_path: Path, value: str,
                                                                  command: tuple[str, ...]) -> None:
    """MANYFILES_RETRY_BASE (docs/cli.md) is a documented setting, checked like an option: exit 2,
    one line naming it, nothing created (no destination, no cache directory)."""
    args = [str(tmp_path / a) if a in ("DEST", "CACHE") else a for a in command]
    proc = run_cli(*args, env={"MANYFILES_RETRY_BASE": value, "AWS_ACCESS_KEY_ID": "x",
                               "AWS_SECRET_ACCESS_KEY": "x", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines == [f"{command[0]}: MANYFILES_RETRY_BASE={value!r}: expected a number of seconds >= 0"]
    assert list(tmp_path.iterdir()) == []


def test_the_retry_base_setting_reaches_the_retry_policy(monkeypatch) -> None:
    from manyfiles.cli._common import retry_base

    monkeypatch.delenv("MANYFILES_RETRY_BASE", raising=False)
    assert retry_base() is None
    monkeypatch.setenv("MANYFILES_RETRY_BASE", " 0.25 ")
    assert retry_base() == 0.25
    monkeypatch.setenv("MANYFILES_RETRY_BASE", "0")
    assert retry_base() == 0.0
