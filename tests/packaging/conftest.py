"""Real installs of manyfiles into fresh virtual environments, built once per session.

* ``nocc_wheel`` -- a wheel built from a copy of the working tree with a C compiler
  that does not exist (``CC=/nonexistent/cc``): what a machine without gcc gets.
* ``bare_venv`` -- that wheel installed with no extras (pip fetches click and rich only).
* ``boto_venv`` -- an environment that already has a newer boto3 than aioboto3 accepts.
* ``all_venv`` -- ``pip install ".[all]"`` from the index, no constraints, as a user does (the notebooks
  run there).

Venvs are made ``--without-pip`` and driven by this interpreter's pip (``pip --python``),
which saves the ensurepip step; downloads come from pip's cache after the first run, and
``--no-compile`` skips byte-compiling what is installed (Python does it on import).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from installkit import NEWER_BOTO3, clean_env, copy_sources, make_venv, pip


@pytest.fixture(scope="session")
def nocc_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(wheel, pip's verbose build log) for a build on a machine with no C compiler."""
    src = copy_sources(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    env = clean_env() | {"CC": "/nonexistent/cc"}
    proc = pip(None, "wheel", "-v", "--no-deps", "-w", str(out), str(src), env=env)
    (wheel,) = out.glob("manyfiles-*.whl")
    return wheel, proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory: pytest.TempPathFactory, nocc_wheel) -> Path:
    """A venv with ``pip install manyfiles`` (no extras) from the no-compiler wheel; returns its bin/."""
    python = make_venv(tmp_path_factory.mktemp("bare") / "venv")
    pip(python, "install", "-q", "--no-compile", str(nocc_wheel[0]), env=clean_env())
    return python.parent


@pytest.fixture(scope="session")
def boto_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv where a newer boto3 is already installed (the user's existing environment)."""
    python = make_venv(tmp_path_factory.mktemp("boto") / "venv")
    pip(python, "install", "-q", "--no-compile", f"boto3=={NEWER_BOTO3}", env=clean_env())
    return python


@pytest.fixture(scope="session")
def all_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with ``pip install "manyfiles[all]"`` from a clean copy of the tree; returns its python.

    The one install that resolves ``[all]`` from the index the way a user's pip does (the rest of
    the suite runs in the constrained dev venv); pip's cache makes reruns cheaper.  ``--no-compile``
    (no .pyc written up front for ~100 packages, Python writes them on import) takes ~40% off."""
    src = copy_sources(tmp_path_factory.mktemp("allsrc"))
    python = make_venv(tmp_path_factory.mktemp("all") / "venv")
    pip(python, "install", "-q", "--no-compile", f"{src}[all]", env=clean_env())
    return python


@pytest.fixture
def run_in(tmp_path: Path):
    """``run_in(bindir, script, *args)``: a console script of another venv, as a subprocess."""

    def run(bindir: Path, script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(bindir / script), *args], capture_output=True, text=True,
                              env=clean_env() | (env or {}), cwd=tmp_path, timeout=300)

    return run
