"""One exit-code table for every tool (docs/cli.md, issue 17): each condition x each verb, run as a
real process (the console scripts of this venv), asserts the exit code, exactly one stderr line (or
none for a success) and no traceback.  A condition that cannot apply to a verb is in ``NOT_APPLICABLE``
with the reason, so the table is complete: ``test_every_cell_is_decided`` checks it.

The table:

==================== ==== ==========================================================================
condition            exit how it is made here
==================== ==== ==========================================================================
usage                2    an option the verb does not have
missing-extra        2    ``--profile-out`` with viztracer hidden; S3 verbs with boto3 hidden
wrong-kind           2    a file where the verb needs a directory (trace: a directory for a file)
missing              1    the path the verb acts on does not exist
no-permission        1    the path exists, the user (nobody) may not read it
aws-profile          2    ``--aws-profile nosuch`` / ``AWS_PROFILE=nosuch``
nothing-matched      1    an S3 SOURCE (prefix) with no object
interrupted          130  SIGINT while the command is held, parsed, before its work
==================== ==== ==========================================================================

Below the table, the edges a new user met (issue 26), each as real processes: a malformed AWS config
or credentials file, an endpoint that is no URL, options that exclude each other, unsafe keys, a closed
output (141 for every verb), names with newlines and bytes that are not UTF-8, the empty path, cache
verbs on a folder that holds no cache, trace on a FIFO, ``shard --csv -``, shard on /proc.

The extras are hidden for real: a ``sitecustomize`` on PYTHONPATH takes the packages out of the import
system of the child process (``HIDE=boto3,botocore``), so ``import boto3`` fails there as it does
where the extra is not installed.
"""

from __future__ import annotations

import csv
import io
import json
import os
import select
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import faults

BIN = Path(sys.executable).parent
UNPRIVILEGED = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
         "AWS_DEFAULT_REGION": "us-east-1"}

CODES = {"usage": 2, "missing-extra": 2, "wrong-kind": 2, "missing": 1, "no-permission": 1, "aws-profile": 2,
         "nothing-matched": 1, "interrupted": 130}

# verb -> its command line with {T} where the condition's path goes (a directory to act on, or for
# trace the FILE), {S3} an S3 SOURCE.  Every verb of every entry point.
VERBS: dict[str, list[str]] = {
    "fastls": ["fastls", "{T}"],
    "fastls -r": ["fastls", "-r", "{T}"],
    "fastls --sort": ["fastls", "--sort", "-l", "{T}"],          # the click command, not the fast path
    "shard apply": ["shard", "apply", "{T}"],
    "shard apply -n": ["shard", "apply", "-n", "{T}"],
    "shard revert": ["shard", "revert", "{T}"],
    "shard reshard": ["shard", "reshard", "--levels", "1", "{T}"],
    "shard verify": ["shard", "verify", "{T}"],
    "shard status": ["shard", "status", "{T}"],
    "s3pull": ["s3pull", "{S3}", "{T}"],
    "s3pull verify": ["s3pull", "verify", "{T}"],
    "fastrm": ["fastrm", "{T}"],
    "manyfiles ls": ["manyfiles", "ls", "{T}"],
    "manyfiles rm": ["manyfiles", "rm", "{T}"],
    "manyfiles shard verify": ["manyfiles", "shard", "verify", "{T}"],
    "manyfiles pull": ["manyfiles", "pull", "{S3}", "{T}"],
    "s3push": ["s3push", "{T}", "{S3}"],
    "manyfiles push": ["manyfiles", "push", "{T}", "{S3}"],
    "manyfiles check": ["manyfiles", "check", "{T}", "{S3}"],
    "cache warm": ["manyfiles", "cache", "warm", "--dir", "{T}", "{S3}"],
    "cache stats": ["manyfiles", "cache", "stats", "--dir", "{T}"],
    "cache evict": ["manyfiles", "cache", "evict", "--dir", "{T}"],
    "cache verify": ["manyfiles", "cache", "verify", "--dir", "{T}"],
    "cache clear": ["manyfiles", "cache", "clear", "--dir", "{T}"],
    "trace summary": ["manyfiles", "trace", "summary", "{T}"],
    "trace export": ["manyfiles", "trace", "export", "{T}"],
    "info": ["manyfiles", "info"],
}
PROFILED = {v for v in VERBS if v not in ("cache stats", "trace summary", "trace export", "info")}
S3_VERBS = {"s3pull", "manyfiles pull", "cache warm", "manyfiles check", "s3push", "manyfiles push"}
NO_PATH = "takes no path"

NOT_APPLICABLE: dict[tuple[str, str], str] = {
    **{(v, "missing-extra"): "needs no extra"
       for v in ("cache stats", "trace summary", "trace export", "info")},
    **{(v, c): NO_PATH for v in ("info",) for c in ("wrong-kind", "missing", "no-permission")},
    ("s3pull", "missing"): "a DEST that does not exist is created (a SOURCE naming nothing: nothing-matched)",
    ("manyfiles pull", "missing"): "as s3pull",
    **{(v, "wrong-kind"): "a SRC may be a file or a folder (a file is uploaded)"
       for v in ("s3push", "manyfiles push")},
    **{(v, "nothing-matched"): "DEST is a prefix written to, not matched"
       for v in ("s3push", "manyfiles push")},
    ("cache warm", "missing"): "warm makes the cache a new --dir names (the other cache verbs: exit 1, "
                               "nothing created)",
    **{(v, "aws-profile"): "uses no S3 (an AWS profile, even from AWS_PROFILE, is not read)"
       for v in VERBS if v not in S3_VERBS},
    **{(v, "nothing-matched"): "a path that names nothing is the missing row; a filter that matches "
       "nothing in it is a result (exit 0)" for v in VERBS if v not in S3_VERBS},
}


MANY = 60      # objects under many/ (a pull cut short leaves some of them)


@pytest.fixture(scope="module")
def s3():
    """A real S3 endpoint (moto over HTTP): one object under ``p/``, ``MANY`` under ``many/``, a key
    that would leave DEST alone under ``unsafe/`` and beside a good one under ``mixed/``."""
    from manyfiles.s3.localserver import local_s3

    bucket = f"exit-{uuid.uuid4().hex[:10]}"
    with pytest.MonkeyPatch.context() as env, local_s3(small=0, medium=0, large=0, bucket=bucket) as srv:
        for k, v in CREDS.items():
            env.setenv(k, v)
        import boto3

        client = boto3.client("s3", endpoint_url=srv.endpoint_url, region_name="us-east-1")
        for key in ("p/one", "unsafe/../evil", "mixed/../evil", "mixed/good",
                    *(f"many/{i:03d}" for i in range(MANY))):
            client.put_object(Bucket=bucket, Key=key, Body=b"1")
        yield srv.endpoint_url, bucket


@pytest.fixture
def place(world_readable_tmp: Path):
    """Paths for every condition, under a folder user nobody can reach."""
    root = world_readable_tmp
    (root / "dir").mkdir()
    (root / "dir" / "f").write_text("x")
    (root / "file").write_text("x")
    locked = root / "locked"
    locked.mkdir()
    (locked / "inside").write_text("x")   # not empty: nobody cannot rmdir it either
    locked.chmod(0)
    (root / "locked.mftrace").write_text("x")
    (root / "locked.mftrace").chmod(0)
    return root


def _hider(tmp: Path) -> Path:
    """A sitecustomize that takes the packages named in $HIDE out of the child's import system."""
    folder = tmp / "hide"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import os, sys\n"
        "from importlib.machinery import PathFinder\n"
        "HIDDEN = set(filter(None, os.environ.get('HIDE', '').split(',')))\n"
        "class Hidden(PathFinder):\n"
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in HIDDEN:\n"
        "            return None\n"
        "        return PathFinder.find_spec(name, path, target)\n"
        "sys.meta_path[sys.meta_path.index(PathFinder)] = Hidden\n")
    return folder


def _argv(verb: str, target: str, s3: tuple[str, str] | None, prefix: str = "p/") -> list[str]:
    source = f"s3://{s3[1] if s3 else 'bucket'}/{prefix}"
    return [str(BIN / a) if i == 0 else a.replace("{T}", target).replace("{S3}", source)
            for i, a in enumerate(VERBS[verb])]


def _case(verb: str, condition: str, place: Path, s3: tuple[str, str] | None,
          tmp: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """(argv, extra environment, command prefix) that make ``condition`` for ``verb``."""
    trace = verb.startswith("trace")
    # trace reads a FILE; cache uses --dir (a new folder becomes a cache); the others act on a directory
    target = str(place / ("locked.mftrace" if trace else "new-cache" if verb.startswith("cache") else "dir"))
    env: dict[str, str] = {}
    prefix: list[str] = []
    extra: list[str] = []
    s3_prefix = "p/"
    if condition == "usage":
        extra = ["--no-such-option"]
    elif condition == "missing-extra":
        env = {"PYTHONPATH": str(_hider(tmp))}
        if verb in S3_VERBS:
            env["HIDE"] = "boto3,botocore"
        else:
            env["HIDE"] = "viztracer"
            extra = ["--profile-out", str(tmp / "p.json")]
    elif condition == "wrong-kind":
        target = str(place / ("dir" if trace else "file"))
        if verb in ("fastrm", "manyfiles rm"):
            target += "/"                          # 'file/': a directory is asked for
    elif condition == "missing":
        target = str(place / "nothing-here")
    elif condition == "no-permission":
        target = str(place / ("locked.mftrace" if trace else "locked"))
        prefix = UNPRIVILEGED if os.geteuid() == 0 else []
    elif condition == "aws-profile":
        env = {"AWS_PROFILE": "nosuch"}
    elif condition == "nothing-matched":
        s3_prefix = "nothing/"
    if verb in S3_VERBS and condition == "no-permission":
        target = str(place / "locked" / "dest")    # DEST under a folder nobody may enter
    argv = _argv(verb, target, s3, s3_prefix)
    return [*prefix, *argv, *extra], env, prefix


CELLS = [(v, c) for v in VERBS for c in CODES if (v, c) not in NOT_APPLICABLE]


def test_every_cell_is_decided() -> None:
    assert {k for k in NOT_APPLICABLE} <= {(v, c) for v in VERBS for c in CODES}
    assert len(CELLS) + len(NOT_APPLICABLE) == len(VERBS) * len(CODES)
    assert all(v in PROFILED or (v, "missing-extra") in NOT_APPLICABLE or v in S3_VERBS for v in VERBS)


def _env(extra: dict[str, str], s3: tuple[str, str] | None, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MANYFILES_"))}
    # no AWS configuration of this machine leaks in: profiles are only what the test says
    env.update(CREDS, AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"))
    if s3 is not None:
        env["AWS_ENDPOINT_URL"] = s3[0]
    env.update(extra)
    return env


def _check(verb: str, condition: str, code: int, stderr: bytes) -> None:
    text = stderr.decode(errors="replace")
    prog = VERBS[verb][0]       # the entry point names its lines
    assert code == CODES[condition], (verb, condition, code, text)
    assert "Traceback" not in text, text
    lines = text.splitlines()
    assert len(lines) == 1, (verb, condition, text)
    assert lines[0].startswith(f"{prog}: "), lines


@pytest.mark.parametrize(("verb", "condition"), [c for c in CELLS if c[1] != "interrupted"],
                         ids=[f"{v}-{c}" for v, c in CELLS if c != "interrupted"])
def test_exit_code_and_one_line(verb: str, condition: str, place: Path, request, tmp_path: Path) -> None:
    s3 = request.getfixturevalue("s3") if verb in S3_VERBS else None
    argv, env, _ = _case(verb, condition, place, s3, tmp_path)
    r = subprocess.run(argv, capture_output=True, env=_env(env, s3, tmp_path), timeout=120, cwd=tmp_path)
    _check(verb, condition, r.returncode, r.stderr)
    if CODES[condition] == 2:
        assert r.stdout == b"", r.stdout    # refused before anything ran: no summary (cache warm printed one)
    if condition == "missing-extra":
        hidden = "profile" if "HIDE" in env and "viztracer" in env["HIDE"] else "s3"
        assert f'pip install "manyfiles[{hidden}]"' in r.stderr.decode()
        assert "--profile-out" in r.stderr.decode() or hidden == "s3"   # the flag the user typed
    if condition == "nothing-matched":
        assert "no object matched" in r.stderr.decode() or "no such object or prefix" in r.stderr.decode()
    if condition == "aws-profile":
        assert "'nosuch'" in r.stderr.decode()


def _ctrl_c_reaches_child() -> None:
    # a shell running CI in the background starts its children with SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("verb", [v for v, c in CELLS if c == "interrupted"])
def test_ctrl_c_exits_130_with_one_line(verb: str, place: Path, tmp_path: Path) -> None:
    """The command is held where every command passes once its options are parsed (the
    ``command`` checkpoint, held through the launcher of tests/faults.py); SIGINT lands there, on an
    event, not a sleep."""
    argv, env, _ = _case(verb, "interrupted", place, None, tmp_path)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    argv = faults.command(*argv, hold_at=f"command:1:{ready_w}:{go_r}")
    env = _env(env, None, tmp_path)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
                            pass_fds=(ready_w, go_r), preexec_fn=_ctrl_c_reaches_child)
    os.close(ready_w)
    os.close(go_r)
    try:
        held, _, _ = select.select([ready_r], [], [], 120)
        assert held and os.read(ready_r, 1) == b"h", proc.poll()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        os.close(ready_r)
        os.close(go_w)
        if proc.poll() is None:
            proc.kill()
    _check(verb, "interrupted", proc.returncode, err)
    assert err.decode().strip().endswith(": interrupted")


@pytest.mark.parametrize("verb", sorted(S3_VERBS))
def test_an_unknown_aws_profile_named_on_the_command_line_is_one_line(verb: str, place: Path, s3,
                                                                      tmp_path: Path) -> None:
    """``--aws-profile nosuch`` (the AWS_PROFILE=nosuch rows are in the table): issue 17 saw a 61-line
    ProfileNotFound traceback."""
    argv, _, _ = _case(verb, "usage", place, s3, tmp_path)
    argv[-1:] = ["--aws-profile", "nosuch"]           # in place of the bad option
    r = subprocess.run(argv, capture_output=True, env=_env({}, s3, tmp_path), timeout=120, cwd=tmp_path)
    _check(verb, "aws-profile", r.returncode, r.stderr)
    assert "AWS profile 'nosuch' (--aws-profile)" in r.stderr.decode() and r.stdout == b""


# -- the newcomer's edges (issue 26): each one line, the code of the table, no Python class name ------------


def _run(argv: list, tmp: Path, s3: tuple[str, str] | None = None, env: dict[str, str] | None = None,
         **kw) -> subprocess.CompletedProcess:
    """Run the console script ``argv[0]`` of this venv in ``tmp`` (output captured unless ``kw`` says)."""
    argv = [str(BIN / argv[0]), *argv[1:]]
    kw = kw or {"capture_output": True}
    return subprocess.run(argv, env=_env(env or {}, s3, tmp), timeout=120, cwd=tmp, **kw)


def _one_line(r: subprocess.CompletedProcess, prog: str, code: int) -> str:
    """The one stderr line of a run that ended with ``code``: ``prog: ...``, no traceback, no class name."""
    text = r.stderr.decode(errors="replace")
    assert r.returncode == code, (r.returncode, text)
    assert len(text.splitlines()) == 1 and text.startswith(f"{prog}: "), text
    assert "Traceback" not in text and "Error:" not in text, text    # ConfigParseError:, gaierror: ...
    return text.strip()


S3_ARGV = {"s3pull": ["s3pull", "{S3}", "d"], "manyfiles pull": ["manyfiles", "pull", "{S3}", "d"],
           "cache warm": ["manyfiles", "cache", "warm", "--dir", "c", "{S3}"]}


def _s3_argv(verb: str, s3: tuple[str, str], prefix: str = "p/") -> list[str]:
    return [a.replace("{S3}", f"s3://{s3[1]}/{prefix}") for a in S3_ARGV[verb]]


@pytest.mark.parametrize("verb", sorted(S3_ARGV))
def test_a_malformed_aws_config_file_is_one_line_exit_2(verb: str, s3, tmp_path: Path) -> None:
    """``[default`` without ``]`` was a 57-line ConfigParseError traceback; configuration, so usage (2)."""
    config = tmp_path / "aws-config"
    config.write_text("[default\nregion = us-east-1\n")
    r = _run(_s3_argv(verb, s3), tmp_path, s3, {"AWS_CONFIG_FILE": str(config)})
    line = _one_line(r, S3_ARGV[verb][0], 2)
    assert f"{config}: malformed at line 1" in line and r.stdout == b""
    assert not (tmp_path / "d").exists()


def test_a_malformed_aws_credentials_file_is_one_line_exit_2(s3, tmp_path: Path) -> None:
    creds = tmp_path / "aws-credentials"
    creds.write_text("aws_access_key_id = x\n")         # no [section] at all
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    line = _one_line(_run(_s3_argv("s3pull", s3), tmp_path, s3, env), "s3pull", 2)
    assert f"{creds}: malformed at line 1" in line


@pytest.mark.parametrize("verb", sorted(S3_ARGV))
@pytest.mark.parametrize("where", ["option", "AWS_ENDPOINT_URL"])
def test_an_endpoint_that_is_no_url_is_refused_up_front(verb: str, where: str, s3, tmp_path: Path) -> None:
    """``--endpoint-url not-a-url`` was exit 1 with ``gaierror: Name or service not known``."""
    argv = _s3_argv(verb, s3)
    env = {}
    if where == "option":
        argv += ["--endpoint-url", "not-a-url"]
    else:
        env = {"AWS_ENDPOINT_URL": "not-a-url"}
    line = _one_line(_run(argv, tmp_path, s3, env), argv[0], 2)
    source = "--endpoint-url" if where == "option" else "AWS_ENDPOINT_URL"
    assert f"endpoint URL not-a-url ({source}): expected http:// or https://" in line
    if (verb, where) == ("s3pull", "option"):
        for bad in ("ftp://host", "http://", "http://host:99999"):
            r = _run([*_s3_argv(verb, s3), "--endpoint-url", bad], tmp_path, s3)
            assert r.returncode == 2 and f"endpoint URL {bad} " in r.stderr.decode(), r.stderr


def test_options_that_exclude_each_other_are_a_usage_error(s3, tmp_path: Path) -> None:
    for argv, words in [(["s3pull", f"s3://{s3[1]}/p/", "d", "--no-checksum", "--etag-only"],
                         "--no-checksum and --etag-only exclude each other"),
                        # an old spelling beside the new one, even with the same value (docs/cli.md)
                        (["s3pull", f"s3://{s3[1]}/p/", "d", "--concurrency", "4", "-j", "4"],
                         "--concurrency and -j/--jobs mean the same"),
                        (["fastls", "--threads", "4", "-j", "4", "."],
                         "--threads and -j/--jobs mean the same"),
                        (["shard", "apply", "-w", "2", "-j", "2", "."],
                         "-w/--workers and -j/--jobs mean the same"),
                        (["fastrm", "--workers", "2", "-j", "2", "d"],
                         "--workers and -j/--jobs mean the same")]:
        r = _run(argv, tmp_path, s3)
        assert words in _one_line(r, argv[0], 2) and r.stdout == b""
        assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("verb", ["s3pull", "manyfiles pull"])
def test_an_unsafe_key_is_a_failed_item_alone_or_beside_good_ones(verb: str, s3, tmp_path: Path) -> None:
    """An unsafe key is an item that failed (exit 1), whether or not a good key came with it."""
    prog = S3_ARGV[verb][0]
    for prefix, installed in (("unsafe/", set()), ("mixed/", {"good"})):
        r = _run([a.replace("d", f"d-{prefix[:-1]}") if a == "d" else a for a in _s3_argv(verb, s3, prefix)],
                 tmp_path, s3)
        assert r.returncode == 1, r.stderr
        lines = r.stderr.decode().splitlines()
        assert lines[0] == f"{prog}: {prefix}../evil: unsafe key: '..' path segment", lines
        dest = tmp_path / f"d-{prefix[:-1]}"
        assert {p.name for p in dest.iterdir() if p.name != ".s3pull"} == installed
        assert not (tmp_path / "evil").exists()
    keys = tmp_path / "keys.txt"
    keys.write_text("unsafe/../evil\n")
    r = _run([*S3_ARGV[verb][:-2], f"s3://{s3[1]}/", "d-list", "--files-from", str(keys)], tmp_path, s3)
    assert r.returncode == 1 and b"unsafe key" in r.stderr


def _closed_stdout(argv: list[str], tmp: Path,
                   s3: tuple[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run with stdout a pipe whose reader is gone before the verb starts (``| head -0``)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return _run(argv, tmp, s3, stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)


def test_a_pull_whose_output_was_closed_stops_and_does_not_exit_0(s3, tmp_path: Path) -> None:
    """``s3pull ... --json | head -1`` exited 0 after 1 of 1,500 objects.  A closed output stops the
    verb quietly with 141 (128 + SIGPIPE, as ls, find, s5cmd), no summary claims the run done, and
    the same command run again completes it."""
    argv = ["s3pull", f"s3://{s3[1]}/many/", "d", "--json"]
    r = _closed_stdout(argv, tmp_path, s3)
    assert (r.returncode, r.stderr) == (141, b"")
    dest = tmp_path / "d"
    first = {p.name for p in dest.iterdir()} - {".s3pull"} if dest.exists() else set()
    assert len(first) < MANY
    r = _run(argv, tmp_path, s3)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["event"] == "summary"
    assert len({p.name for p in dest.iterdir()} - {".s3pull"}) == MANY
    assert os.listdir(dest / ".s3pull" / "tmp") == []


CLOSED_OUTPUT = {
    "fastls": ["fastls", "{D}"], "fastls -r": ["fastls", "-r", "--json", "{D}"],
    "fastls --sort": ["fastls", "--sort", "{D}"], "manyfiles ls -c": ["manyfiles", "ls", "-c", "{D}"],
    "shard status": ["shard", "status", "{D}"], "shard apply -n": ["shard", "apply", "-n", "{D}"],
    "fastrm -o -": ["fastrm", "-o", "-", "{D}"],
    "cache stats": ["manyfiles", "cache", "stats", "--dir", "{C}"], "info": ["manyfiles", "info"],
    "trace summary": ["manyfiles", "trace", "summary", "{T}"],
    "trace summary --json": ["manyfiles", "trace", "summary", "--json", "{T}"],
}


@pytest.mark.parametrize("verb", sorted(CLOSED_OUTPUT))
def test_every_verb_stops_with_141_when_its_output_is_closed(verb: str, tmp_path: Path) -> None:
    """One rule for every verb (docs/cli.md): silent, 141; trace summary exited 1, the rest 0."""
    from manyfiles.cache import Cache

    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(50):
        (tree / f"f{i}").write_text("x")
    Cache(tmp_path / "cache", min_free=0).close()
    trace = tmp_path / "t.mftrace"
    subprocess.run([str(BIN / "fastls"), "--trace", str(trace), str(tree)], capture_output=True, check=True)
    argv = [a.replace("{D}", str(tree)).replace("{C}", str(tmp_path / "cache")).replace("{T}", str(trace))
            for a in CLOSED_OUTPUT[verb]]
    r = _closed_stdout(argv, tmp_path)
    assert (r.returncode, r.stderr) == (141, b""), (r.returncode, r.stderr)


def test_names_in_error_lines_follow_one_rule(tmp_path: Path) -> None:
    """A newline split fastls' line in two, shard printed it as a space: every tool escapes a name the
    same way (manyfiles.errors.shown: \\n, \\xNN for bytes that are not UTF-8, '' for the empty one)."""
    odd = os.fsdecode(b"no\nsuch\xff")
    for argv in (["fastls", "{X}"], ["fastls", "-r", "{X}"], ["fastrm", "{X}"], ["shard", "apply", "{X}"],
                 ["shard", "status", "{X}"], ["s3pull", "verify", "{X}"],
                 ["manyfiles", "trace", "summary", "{X}"], ["manyfiles", "cache", "stats", "--dir", "{X}"]):
        r = _run([argv[0], *(os.fsencode(a.replace("{X}", odd)) for a in argv[1:])], tmp_path)
        line = _one_line(r, argv[0], 1)
        assert "no\\nsuch\\xff" in line, line


EMPTY_PATH = [["fastls", ""], ["fastls", "-r", ""], ["fastrm", ""], ["shard", "apply", ""],
              ["shard", "apply", "-n", ""], ["shard", "status", ""], ["shard", "verify", ""],
              ["s3pull", "verify", ""], ["s3pull", "s3://b/k", ""], ["manyfiles", "ls", ""],
              ["manyfiles", "trace", "summary", ""], ["manyfiles", "cache", "stats", "--dir", ""],
              ["manyfiles", "cache", "warm", "--dir", "", "x"]]


@pytest.mark.parametrize("argv", EMPTY_PATH, ids=" ".join)
def test_an_empty_path_is_a_missing_path(argv: list[str], tmp_path: Path) -> None:
    """'' names nothing: not the current directory (fastls listed it, shard sharded it, s3pull pulled
    into it), not '/' (fastrm refused "the root directory").  Missing, as rm '' and ls '' say: exit 1."""
    (tmp_path / "flat").write_text("x")
    line = _one_line(_run(argv, tmp_path), argv[0], 1)
    assert line.endswith("'': No such file or directory"), line
    assert sorted(os.listdir(tmp_path)) == ["flat"]       # nothing made in the current directory
    r = _run(["fastrm", "-f", ""], tmp_path)                # -f: a missing path is fine
    assert (r.returncode, r.stderr) == (0, b"")


def test_shard_says_what_a_pseudo_file_system_is(tmp_path: Path) -> None:
    """``shard apply /proc/self`` said "No such file or directory" of a folder that is there."""
    line = _one_line(_run(["shard", "apply", "/proc/self"], tmp_path), "shard", 1)
    assert "cannot create .manyfiles-shard.lock here: this file system makes no new files" in line


@pytest.mark.parametrize("verb", ["stats", "evict", "verify", "clear"])
def test_a_cache_verb_that_does_not_make_caches_makes_none(verb: str, tmp_path: Path) -> None:
    """``cache stats --dir nope`` made a cache named nope and exited 0; only warm makes a cache."""
    line = _one_line(_run(["manyfiles", "cache", verb, "--dir", "nope"], tmp_path), "manyfiles", 1)
    assert line == "manyfiles: nope: no cache there (No such file or directory)"
    assert not (tmp_path / "nope").exists()
    (tmp_path / "empty").mkdir()
    line = _one_line(_run(["manyfiles", "cache", verb, "--dir", "empty"], tmp_path), "manyfiles", 1)
    assert line == "manyfiles: empty: no cache there (an empty folder)"
    assert os.listdir(tmp_path / "empty") == []
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file").write_text("x")         # not a cache: the cache refuses it (2)
    line = _one_line(_run(["manyfiles", "cache", verb, "--dir", "other"], tmp_path), "manyfiles", 2)
    assert "not a manyfiles cache and not empty (file)" in line
    assert os.listdir(tmp_path / "other") == ["file"]


@pytest.mark.parametrize("make", ["fifo", "device"])
def test_trace_refuses_what_is_not_a_regular_file(make: str, tmp_path: Path) -> None:
    """``trace summary FIFO`` waited for a writer for ever: a path of the wrong kind (exit 2)."""
    path = tmp_path / "t.fifo"
    if make == "fifo":
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")    # a read that never ends
    for verb in ("summary", "export"):
        line = _one_line(_run(["manyfiles", "trace", verb, str(path)], tmp_path), "manyfiles", 2)
        kind = "a FIFO" if make == "fifo" else "a character device"
        assert line == f"manyfiles: {path}: {kind}, not a trace file"


def test_a_dash_for_the_shard_plan_csv_is_stdout(tmp_path: Path) -> None:
    """``shard apply -n --csv -`` wrote a file named '-'; the plan's lines go to stderr then."""
    flat = tmp_path / "flat"
    flat.mkdir()
    for name in ("a", "b\nc"):
        (flat / name).write_text("x")
    r = _run(["shard", "apply", "-n", "--csv", "-", str(flat)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "-").exists()
    rows = list(csv.reader(io.StringIO(r.stdout.decode(), newline="")))
    assert rows[0] == ["source", "destination"] and sorted(row[0] for row in rows[1:]) == ["a", "b\nc"]
    assert b"files to move        2" in r.stderr
    r = _run(["shard", "apply", "-n", "--csv", "-", "--json", str(flat)], tmp_path)
    assert "both want stdout" in _one_line(r, "shard", 2)


def test_a_worker_error_names_no_python_class() -> None:
    """A cluster shard that failed with a Python error (not one of ours) was ``KeyError: 'x' (on
    worker w)``: the class name reached the user."""
    from manyfiles.errors import ManyfilesError
    from manyfiles.scale._jobs import raise_shard_error
    from manyfiles.scale.executor import ShardResult

    with pytest.raises(ManyfilesError) as caught:
        raise_shard_error(ShardResult(error=("KeyError", "'x'"), worker="w1"))
    assert "KeyError" not in str(caught.value) and "'x' (on worker w1)" in str(caught.value)
