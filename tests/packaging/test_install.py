"""`pip install manyfiles` as users meet it: a light core, extras that say their name, no C compiler.

Everything here installs a real wheel into a real venv and runs its console scripts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
import zipfile
from pathlib import Path

import pytest
from installkit import NEWER_BOTO3, clean_env, pip

from manyfiles._core.extras import EXTRAS

HEAVY = {"boto3", "botocore", "aioboto3", "aiobotocore", "viztracer", "moto", "getdents", "distributed"}
S3_LINE = 's3pull: S3 access needs the [s3] extra (boto3 is not installed): pip install "manyfiles[s3]"'


def installed(bindir: Path) -> dict[str, str]:
    out = pip(bindir / "python", "list", "--format", "json").stdout
    return {d["name"].lower(): d["version"] for d in json.loads(out)}


def planned(python: Path, *requirements: str) -> dict[str, str]:
    """What ``pip install REQS`` would install or change in ``python``'s venv: {name: version}."""
    proc = pip(python, "install", "--dry-run", "--quiet", "--report", "-", *requirements, env=clean_env())
    report = json.loads(proc.stdout)
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}


def test_wheel_without_compiler_builds_warns_and_records_why(nocc_wheel) -> None:
    wheel, log = nocc_wheel
    assert "WARNING: manyfiles: the C core (manyfiles._dents) was not built" in log
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert not [n for n in names if n.startswith("manyfiles/_dents") and n.endswith(".so")]
        assert "/nonexistent/cc" in z.read("manyfiles/_dents_not_built.txt").decode()
        assert any(n.endswith("/licenses/LICENSE") for n in names), names
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip() for line in z.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    core = sorted(re.match(r"[\w.-]+", r).group() for r in requires if "extra ==" not in r)
    assert core == ["click", "rich"]
    assert not [r for r in requires if "==" in r.split(";")[0]], requires  # ranges only, never pins


def test_core_install_brings_no_aws_stack_nor_profiler(bare_venv: Path) -> None:
    have = installed(bare_venv)
    assert "manyfiles" in have and "click" in have and "rich" in have
    assert not HEAVY & set(have), sorted(HEAVY & set(have))


def test_core_install_lists_shards_and_removes(bare_venv: Path, run_in, tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    names = {f"f{i:04d}.bin" for i in range(300)}
    for n in names:
        (flat / n).write_bytes(n.encode())

    proc = run_in(bare_venv, "fastls", "--count", str(flat))
    assert proc.returncode == 0 and proc.stdout.strip() == "300", proc.stderr
    assert run_in(bare_venv, "shard", "apply", str(flat)).returncode == 0
    assert not list(flat.glob("*.bin"))                             # every file moved into a bucket
    assert len(list(flat.glob("*/*/*.bin"))) == 300
    assert run_in(bare_venv, "shard", "verify", str(flat)).returncode == 0
    assert run_in(bare_venv, "shard", "revert", str(flat)).returncode == 0
    assert {p.name for p in flat.iterdir() if not p.name.startswith(".")} == names
    assert all((flat / n).read_bytes() == n.encode() for n in names)
    proc = run_in(bare_venv, "fastrm", str(flat))
    assert proc.returncode == 0, proc.stderr
    assert not flat.exists()


def test_core_install_s3pull_names_the_extra_in_one_line(bare_venv: Path, run_in, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    for argv in (("s3pull",), ("manyfiles", "pull")):
        proc = run_in(bare_venv, *argv, "s3://bucket/prefix/", str(dest))
        assert proc.returncode == 2
        line = S3_LINE if argv == ("s3pull",) else S3_LINE.replace("s3pull:", "manyfiles:")
        assert proc.stderr.splitlines() == [line]
        assert not dest.exists()    # said before anything was written
    # the library says the same, as MissingExtra (a UsageError)
    code = ("import manyfiles as mf\n"
            "try:\n    mf.s3.get_objects('s3://bucket/x')\n"
            "except mf.MissingExtra as e:\n    print(type(e).__mro__[1].__name__, e)")
    proc = subprocess.run([str(bare_venv / "python"), "-c", code], capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert proc.stdout.strip() == 'UsageError ' + S3_LINE.removeprefix("s3pull: "), proc.stderr


@pytest.mark.parametrize("argv, extra", [
    (("fastls", "--profile-out", "p.json", "."), "profile"),
    (("fastls", "--backend", "getdents", "."), "getdents"),
])
def test_core_install_other_extras_one_line(bare_venv: Path, run_in, argv, extra: str) -> None:
    proc = run_in(bare_venv, *argv)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("fastls: ") and line.endswith(f'pip install "manyfiles[{extra}]"'), line


def test_core_install_cluster_names_the_dask_extra_before_touching_anything(bare_venv: Path, run_in,
                                                                           tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    proc = run_in(bare_venv, "shard", "apply", "--cluster", "local:2", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == ('shard: running on a Dask cluster (--cluster) needs the [dask] extra '
                                    '(distributed is not installed): pip install "manyfiles[dask]"\n')
    assert os.listdir(tmp_path) == ["f"]                  # no lock, no journal, nothing moved


def test_without_c_core_every_tool_says_so(bare_venv: Path, run_in, tmp_path: Path) -> None:
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x").write_text("x")

    about = json.loads(run_in(bare_venv, "manyfiles", "info", "--json").stdout)
    assert about["c_core"] is False and "/nonexistent/cc" in about["c_core_reason"]
    assert about["default_backend"] == "scandir"
    assert about["backends"] == {"dents": False, "scandir": True, "getdents": False}
    assert about["extras"]["s3"] == {"boto3": None}
    text = run_in(bare_venv, "manyfiles", "info").stdout
    assert "not built: the build failed:" in text and 'pip install "manyfiles[s3]"' in text

    help_text = " ".join(run_in(bare_venv, "fastls", "--help").stdout.split())
    assert "default: scandir; the C core is not built" in help_text and "dents, the C core" not in help_text

    # a listing verb works, and says once (not per directory) which backend it fell back to
    proc = run_in(bare_venv, "fastls", "-r", str(tmp_path / "a"), str(tmp_path / "b"))
    assert proc.returncode == 0 and sorted(proc.stdout.split()) == sorted(
        [str(tmp_path / "a" / "x"), str(tmp_path / "b" / "x")]), proc.stderr
    (warning,) = proc.stderr.splitlines()
    assert warning.startswith("fastls: C core not built (the build failed: ")
    assert warning.endswith("using the os.scandir backend (slower)")

    proc = run_in(bare_venv, "fastls", "--backend", "dents", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("fastls: the dents backend needs the C core, not built here (the build failed:")


def test_install_into_env_with_newer_boto3_keeps_it(boto_venv: Path, nocc_wheel) -> None:
    wheel = str(nocc_wheel[0])
    # control: the exact pin manyfiles used to ship downgrades boto3/botocore, and the report shows it
    assert {"boto3", "botocore"} <= set(planned(boto_venv, "aioboto3==15.5.0"))
    for req in (wheel, f"{wheel}[s3]", f"{wheel}[profile,getdents]", f"{wheel}[s3,checksums,profile]"):
        plan = planned(boto_venv, req)
        assert not {"boto3", "botocore", "s3transfer"} & set(plan), (req, plan)
    assert installed(boto_venv.parent)["boto3"] == NEWER_BOTO3


def test_s3_extra_works_with_newer_boto3(boto_venv: Path, nocc_wheel, run_in, tmp_path: Path) -> None:
    """Installed for real next to boto3 1.44: s3pull downloads with it; [async] names itself."""
    import boto3

    from manyfiles.s3.localserver import local_s3

    pip(boto_venv, "install", "-q", f"{nocc_wheel[0]}[s3]", env=clean_env())
    bindir = boto_venv.parent
    assert installed(bindir)["boto3"] == NEWER_BOTO3
    # a bucket of its own: moto's state is global to this process, other tests seed the default one
    with local_s3(small=30, medium=2, large=0, bucket=f"packaging-{uuid.uuid4().hex[:8]}") as srv:
        proc = run_in(bindir, "s3pull", "--strategy", "threads", f"s3://{srv.bucket}/", "out", env=srv.env)
        assert proc.returncode == 0, proc.stderr
        client = boto3.client("s3", endpoint_url=srv.endpoint_url, region_name="us-east-1",
                              aws_access_key_id="demo", aws_secret_access_key="demo")
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=srv.bucket)["Contents"]]
        assert len(keys) == srv.objects == 32
        for key in keys:
            body = client.get_object(Bucket=srv.bucket, Key=key)["Body"].read()
            assert (tmp_path / "out" / key).read_bytes() == body

        proc = run_in(bindir, "s3pull", "--strategy", "async", f"s3://{srv.bucket}/", "out2", env=srv.env)
        assert proc.returncode == 2
        assert proc.stderr.splitlines() == [
            "s3pull: the async engine (--strategy async) needs the [async] extra "
            '(aioboto3 is not installed): pip install "manyfiles[async]"']


def test_all_extra_holds_every_extra_the_tests_and_notebooks_use(nocc_wheel) -> None:
    """The notebooks run under [dev] in CI; a user runs them under [all]: [all] must hold dev's extras
    (but [async], which would downgrade a newer boto3)."""
    with zipfile.ZipFile(nocc_wheel[0]) as z:
        (metadata,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        lines = z.read(metadata).decode().splitlines()
    provided = {line.split(":", 1)[1].strip() for line in lines if line.startswith("Provides-Extra:")}
    uses: dict[str, set[str]] = {}     # extra -> the extras of manyfiles it pulls in
    for line in lines:
        m = re.match(r'Requires-Dist: manyfiles\[([^\]]+)\].*extra == "(\w+)"', line)
        if m:
            uses.setdefault(m.group(2), set()).update(e.strip() for e in m.group(1).split(","))
    # [async] is left out of [all] on purpose: it is the one extra that downgrades a newer boto3
    assert uses["dev"] - {"async"} <= uses["all"]
    assert uses["all"] == provided - {"all", "dev", "async"}
    assert set(EXTRAS) == provided - {"all", "dev"}   # `manyfiles info` lists every extra
