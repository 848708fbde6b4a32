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

The extras are hidden for real: a ``sitecustomize`` on PYTHONPATH takes the packages out of the import
system of the child process (``HIDE=boto3,botocore``), so ``import boto3`` fails there as it does
where the extra is not installed.
"""

from __future__ import annotations

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
S3_VERBS = {"s3pull", "manyfiles pull", "cache warm"}
CACHE_DIR = "a cache --dir that does not exist is created: not a failure"
NO_PATH = "takes no path"

NOT_APPLICABLE: dict[tuple[str, str], str] = {
    **{(v, "missing-extra"): "needs no extra"
       for v in ("cache stats", "trace summary", "trace export", "info")},
    **{(v, c): NO_PATH for v in ("info",) for c in ("wrong-kind", "missing", "no-permission")},
    ("s3pull", "missing"): "a DEST that does not exist is created (a SOURCE naming nothing: nothing-matched)",
    ("manyfiles pull", "missing"): "as s3pull",
    **{(v, "missing"): CACHE_DIR for v in ("cache warm", "cache stats", "cache evict", "cache verify",
                                           "cache clear")},
    **{(v, "aws-profile"): "uses no S3 (an AWS profile, even from AWS_PROFILE, is not read)"
       for v in VERBS if v not in S3_VERBS},
    **{(v, "nothing-matched"): "a path that names nothing is the missing row; a filter that matches "
       "nothing in it is a result (exit 0)" for v in VERBS if v not in S3_VERBS},
}


@pytest.fixture(scope="module")
def s3():
    """A real S3 endpoint (moto over HTTP) with one object under ``p/``."""
    from manyfiles.s3.localserver import local_s3

    bucket = f"exit-{uuid.uuid4().hex[:10]}"
    with pytest.MonkeyPatch.context() as env, local_s3(small=0, medium=0, large=0, bucket=bucket) as srv:
        for k, v in CREDS.items():
            env.setenv(k, v)
        import boto3

        boto3.client("s3", endpoint_url=srv.endpoint_url, region_name="us-east-1").put_object(
            Bucket=bucket, Key="p/one", Body=b"1")
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
