"""`manyfiles info` / mf.info() where the C core is built (the no-compiler side: tests/packaging)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import manyfiles as mf


def test_info_json_tells_the_c_core_backends_and_extras(run_cli) -> None:
    proc = run_cli("manyfiles", "info", "--json")
    assert proc.returncode == 0, proc.stderr
    about = json.loads(proc.stdout)
    assert about["version"] == mf.__version__
    assert about["c_core"] is True and about["c_core_reason"] is None
    assert Path(about["c_core_path"]).is_file()
    assert about["default_backend"] == "dents"
    assert about["backends"] == {"dents": True, "scandir": True, "getdents": True}
    assert about["extras"]["s3"] == {"boto3": metadata.version("boto3")}
    assert about["extras"]["profile"] == {"viztracer": metadata.version("viztracer")}
    assert about["executable"] == sys.executable


def test_info_text_and_notebook_table() -> None:
    about = mf.info()
    text = str(about)
    assert text.splitlines()[0].split() == ["manyfiles", mf.__version__]
    assert any(line.split()[:3] == ["C", "core", "built"] for line in text.splitlines())
    html = about._repr_html_()
    assert html.startswith("<table>") and "dents (default)" in html


def test_fastls_with_the_c_core_is_silent_about_it(run_cli, tmp_path: Path) -> None:
    (tmp_path / "a").write_text("a")
    proc = run_cli("fastls", str(tmp_path))
    assert proc.returncode == 0 and proc.stdout == b"a\n" and proc.stderr == b""
    help_text = b" ".join(run_cli("fastls", "--help").stdout.split())
    assert b"default: dents, the C core" in help_text


def test_subpackages_are_attributes_without_importing_them_first() -> None:
    code = ("import sys, manyfiles as mf\n"
            "assert 'manyfiles.s3' not in sys.modules\n"
            "print(mf.s3.pull.__module__, mf.shard.ShardedDir.__name__, mf.trace.load.__name__)\n"
            "try:\n    mf.nonexistent\nexcept AttributeError as e:\n    print('AttributeError', e)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines() == [
        "manyfiles.s3.pull ShardedDir load",
        "AttributeError module 'manyfiles' has no attribute 'nonexistent'",
    ], proc.stderr
