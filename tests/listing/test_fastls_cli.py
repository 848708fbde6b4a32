"""The fastls command, run as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import faults
from manyfiles.fastls import ListRequest, decode_json_path
from manyfiles.listing import _fastls_main
from terminal import stderr_on_a_terminal

ODD_NAMES = [b"plain", b"with\nnewline", b"bad\xff\xfebytes", b"-dash", b"x" * 255, b"tab\there"]


@pytest.fixture
def odd(tmp_path: Path) -> Path:
    for n in ODD_NAMES:
        with open(os.path.join(os.fsencode(tmp_path), n), "wb") as f:
            f.write(b"abc")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner").write_bytes(b"12345")
    os.symlink("plain", tmp_path / "link")
    return tmp_path


def nul_split(data: bytes) -> list[bytes]:
    assert data.endswith(b"\0") or data == b""
    return data.split(b"\0")[:-1]


@pytest.mark.parametrize("backend", ["dents", "scandir", "getdents"])
def test_names_nul_separated_match_os_listdir(odd: Path, run_cli, backend: str) -> None:
    proc = run_cli("fastls", "-0", "--backend", backend, str(odd))
    assert proc.returncode == 0, proc.stderr
    assert sorted(nul_split(proc.stdout)) == sorted(os.listdir(os.fsencode(odd)))


def test_recursive_lists_full_paths(odd: Path, run_cli) -> None:
    proc = run_cli("fastls", "-r", "-0", str(odd))
    assert proc.returncode == 0
    want = set()
    for dirpath, dirnames, filenames in os.walk(os.fsencode(odd)):
        want.update(os.path.join(dirpath, n) for n in dirnames + filenames)
    assert set(nul_split(proc.stdout)) == want


def test_sort_is_bytes_order(odd: Path, run_cli) -> None:
    proc = run_cli("fastls", "--sort", "-0", str(odd))
    names = nul_split(proc.stdout)
    assert names == sorted(os.listdir(os.fsencode(odd)))


def test_json_round_trips_every_name(odd: Path, run_cli) -> None:
    proc = run_cli("fastls", "--json", "-l", str(odd))
    assert proc.returncode == 0
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    paths = {decode_json_path(r) for r in records}
    assert paths == {os.path.join(os.fsencode(odd), n) for n in os.listdir(os.fsencode(odd))}
    by_name = {r["name"]: r for r in records}
    assert by_name["plain"]["size"] == 3 and by_name["plain"]["type"] == "f"
    assert by_name["sub"]["type"] == "d" and by_name["link"]["type"] == "l"
    assert "path_b64" in next(r for r in records if r["name"].startswith("bad"))


def test_count_flat_and_recursive(odd: Path, run_cli) -> None:
    assert run_cli("fastls", "--count", str(odd)).stdout == f"{len(ODD_NAMES) + 2}\n".encode()
    assert run_cli("fastls", "-r", "--count", str(odd)).stdout == f"{len(ODD_NAMES) + 3}\n".encode()


def test_type_and_glob_filters(odd: Path, run_cli) -> None:
    assert run_cli("fastls", "--type", "d", str(odd)).stdout == b"sub\n"
    assert run_cli("fastls", "--type", "l", str(odd)).stdout == b"link\n"
    got = run_cli("fastls", "--glob", "p*", "--glob", "t*", str(odd)).stdout.split(b"\n")
    assert sorted(got[:-1]) == [b"plain", b"tab\there"]
    got = run_cli("fastls", "-r", "--exclude", "*", "--count", str(odd)).stdout
    assert got == b"0\n"


def _fastls_with_knobs(*args: str) -> subprocess.CompletedProcess:
    """fastls in a subprocess whose C core reads every d_type as DT_UNKNOWN (tests/faults.py)."""
    return subprocess.run(faults.command("fastls", *args, fake_dtype=0), capture_output=True, timeout=120)


def test_dt_unknown_source_lists_everything(odd: Path) -> None:
    """With every d_type reported as DT_UNKNOWN (as on sshfs) nothing is dropped and
    --type still works through the fstatat fallback, flat and recursive."""
    proc = _fastls_with_knobs("-0", str(odd))
    assert sorted(nul_split(proc.stdout)) == sorted(os.listdir(os.fsencode(odd)))
    assert _fastls_with_knobs("--type", "d", str(odd)).stdout == b"sub\n"
    assert _fastls_with_knobs("-r", "--type", "d", str(odd)).stdout == os.fsencode(odd / "sub") + b"\n"
    assert _fastls_with_knobs("-r", "--count", str(odd)).stdout == f"{len(ODD_NAMES) + 3}\n".encode()
    assert json.loads(_fastls_with_knobs("--json", str(odd / "sub")).stdout)["type"] == "f"


def test_long_format_shows_size(odd: Path, run_cli) -> None:
    lines = run_cli("fastls", "-l", str(odd / "sub")).stdout.decode().splitlines()
    assert len(lines) == 1
    kind, size, *_, name = lines[0].split()
    assert (kind, size, name) == ("f", "5", "inner")


def test_missing_path_is_reported_and_others_listed(odd: Path, run_cli, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    proc = run_cli("fastls", missing, str(odd / "sub"))
    assert proc.returncode == 1
    assert proc.stderr.decode() == f"fastls: {missing}: No such file or directory\n"
    assert proc.stdout == os.fsencode(str(odd / "sub" / "inner")) + b"\n"


def test_not_a_directory_is_a_usage_error_and_the_other_paths_are_listed(odd: Path, run_cli) -> None:
    # a file where a directory is needed: exit 2 in every tool (docs/cli.md), the fast path as the click one
    for extra in ((), ("--sort",)):
        proc = run_cli("fastls", *extra, str(odd / "plain"), str(odd / "sub"))
        assert proc.returncode == 2
        assert proc.stderr.decode() == f"fastls: {odd / 'plain'}: Not a directory\n"
        assert os.fsencode(str(odd / "sub" / "inner")) in proc.stdout


def test_usage_errors_exit_2(odd: Path, run_cli) -> None:
    assert run_cli("fastls", "--bufsize", "12", str(odd)).returncode == 2
    assert run_cli("fastls", "--no-such-option").returncode == 2
    assert run_cli("fastls", "--type", "x", str(odd)).returncode == 2


def test_leading_dash_directory(tmp_path: Path, run_cli) -> None:
    (tmp_path / "-weird").mkdir()
    (tmp_path / "-weird" / "f").touch()
    proc = run_cli("fastls", "--", "-weird", cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, b"f\n")


def test_symlink_loop_not_followed_by_default_and_detected_with_L(tmp_path: Path, run_cli) -> None:
    (tmp_path / "a").mkdir()
    os.symlink("..", tmp_path / "a" / "up")
    assert run_cli("fastls", "-r", "--count", str(tmp_path)).returncode == 0
    proc = run_cli("fastls", "-r", "-L", "--count", str(tmp_path))
    assert proc.returncode == 1
    assert b"File system loop detected" in proc.stderr


def test_permission_denied_deep_in_tree(world_readable_tmp: Path, run_unprivileged) -> None:
    root = world_readable_tmp
    (root / "ok" / "deep").mkdir(parents=True)
    (root / "ok" / "deep" / "file").touch()
    (root / "locked").mkdir()
    (root / "locked" / "hidden").touch()
    (root / "locked").chmod(0)
    fastls = str(Path(sys.executable).parent / "fastls")
    proc = run_unprivileged([fastls, "-r", str(root)], check=False)
    assert proc.returncode == 1
    assert proc.stderr == f"fastls: {root / 'locked'}: Permission denied\n"
    assert str(root / "ok" / "deep" / "file") in proc.stdout.splitlines()


def test_a_closed_pipe_stops_the_listing_quietly_with_141(tmp_path: Path) -> None:
    """``fastls | head``: stopped before the end, so not 0; quiet, 141, as SIGPIPE ends ls (docs/cli.md)."""
    for i in range(20000):
        (tmp_path / f"f{i}").touch()
    fastls = str(Path(sys.executable).parent / "fastls")
    script = f"'{fastls}' '{tmp_path}' | head -1; exit ${{PIPESTATUS[0]}}"  # fastls' own status
    proc = subprocess.run(["bash", "-c", script], capture_output=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (141, b"")
    assert len(proc.stdout.splitlines()) == 1


FAST_FORMS = [[], ["-r"], ["--recursive", "a", "b"], ["-c", "x"], ["--count", "-r", "x"], ["-0", "-r", "d"],
              ["--null", "d"], ["--json", "d"], ["-r", "--json", "-c", "d", "e"], ["-r", "-r", "d"]]


@pytest.mark.parametrize("argv", FAST_FORMS)
def test_click_free_fast_path_parses_like_click(argv: list[str]) -> None:
    """fastls parses its common forms without importing click: the request must be click's."""
    from manyfiles.cli.ls import build_request, command

    fields = _fastls_main.parse_fast(argv)
    assert fields is not None
    ctx = command.make_context("fastls", list(argv))
    assert ListRequest(**fields) == build_request(**ctx.params)


@pytest.mark.parametrize("argv", [["--help"], ["-r0", "d"], ["--", "-d"], ["--glob", "*", "d"], ["-L"], [""],
                                  ["--threads", "2", "d"], ["-"]])
def test_anything_else_goes_to_click(argv: list[str]) -> None:
    assert _fastls_main.parse_fast(argv) is None


def test_fast_path_does_not_import_click(tmp_path: Path) -> None:
    (tmp_path / "f").touch()
    code = ("import sys; sys.argv = ['fastls', '-r', '-c', sys.argv[1]]\n"
            "from manyfiles.listing import _fastls_main\n"
            "try:\n    _fastls_main.main()\nexcept SystemExit as e:\n    code = e.code\n"
            "print(code, 'click' in sys.modules, 'rich' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, timeout=60)
    assert proc.stdout == b"1\n" and proc.stderr == b"0 False False\n"


def test_closed_pipe_during_a_tree_walk_is_not_an_error(roomy_dir: Path) -> None:
    """The walker threads meet EPIPE: they stop, the command exits 141 quietly.  (The tree on a
    tmpfs of its own: 20k creations are cheap there.)"""
    tmp_path = roomy_dir
    for d in range(40):
        sub = tmp_path / f"d{d}"
        sub.mkdir()
        for i in range(500):
            (sub / f"f{i}").touch()
    fastls = str(Path(sys.executable).parent / "fastls")
    for args in ("-r", "-r --json"):
        script = f"'{fastls}' {args} '{tmp_path}' | head -1; exit ${{PIPESTATUS[0]}}"  # fastls' own status
        proc = subprocess.run(["bash", "-c", script], capture_output=True, timeout=60)
        assert (proc.returncode, proc.stderr) == (141, b"")
        assert len(proc.stdout.splitlines()) == 1


@pytest.mark.parametrize("recursive", [False, True])
def test_library_run_returns_the_shared_report(odd: Path, tmp_path: Path, recursive: bool) -> None:
    """fastls.run: a Report like every tool's (failures as Failure with an errno code, ok,
    raise_for_failures, str), and progress=callable receives Snapshots of the entries so far."""
    import tempfile

    from manyfiles import fastls
    from manyfiles._core.progress import Snapshot
    from manyfiles.errors import PartialFailure

    missing = str(tmp_path / "missing")
    seen: list[Snapshot] = []
    with tempfile.TemporaryFile() as out:  # not in odd (= tmp_path)
        report = fastls.run(ListRequest(paths=(str(odd), missing), recursive=recursive), out.fileno(),
                            progress=seen.append)
        out.seek(0)
        listed = out.read().count(b"\n") - sum(n.count(b"\n") for n in ODD_NAMES)
    total = len(ODD_NAMES) + 2 + (1 if recursive else 0)  # + sub, link (+ sub/inner)
    assert report.entries == listed == total and report.counts == {str(odd): total}
    assert [(f.path, f.code) for f in report.failures] == [(missing, "ENOENT")] and not report.ok
    assert str(report).startswith(f"listed {total:,} entries in ")
    assert f"  {missing}: No such file" in str(report)
    with pytest.raises(PartialFailure):
        report.raise_for_failures()
    assert seen and seen[-1].finished and seen[-1].done == total and seen[-1].failures == 1
    flat = fastls.run(ListRequest(paths=(str(odd),), count_only=True), 1)
    assert flat.ok and flat.to_dict()["entries"] == len(ODD_NAMES) + 2


def test_progress_on_a_terminal_uses_the_shared_display(tmp_path: Path) -> None:
    """The shared rich bar (manyfiles._core.progress) on a terminal, by default (stdout elsewhere) or
    with --progress; --no-progress: none; not a terminal: none by default, log lines with --progress."""
    for i in range(30):
        (tmp_path / "t" / f"d{i}").mkdir(parents=True)
        for j in range(20):
            (tmp_path / "t" / f"d{i}" / f"f{j}").touch()
    fastls = str(Path(sys.executable).parent / "fastls")
    plain = subprocess.run([fastls, "-r", "-c", str(tmp_path / "t")], capture_output=True)
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, b"630\n", b"")
    logged = subprocess.run([fastls, "-r", "-c", "--progress", str(tmp_path / "t")], capture_output=True)
    assert (logged.returncode, logged.stdout) == (0, b"630\n")
    assert logged.stderr.decode().splitlines()[-1].endswith("[done]"), logged.stderr
    for flags in (["--progress"], []):     # [] = the fast form, handed to click for the bar
        seen = stderr_on_a_terminal([fastls, "-r", *flags, str(tmp_path / "t")])
        assert b"fastls" in seen and b"630 entries" in seen, (flags, seen)
    assert stderr_on_a_terminal([fastls, "-r", "--no-progress", str(tmp_path / "t")]) == b""
