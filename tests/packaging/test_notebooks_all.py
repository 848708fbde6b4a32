"""The bar check of issue 12: a fresh venv, ``pip install ".[all]"`` (no constraints, as a user does),
then every notebook of notebooks/ executed there with nbclient: every cell succeeds.

This is the one test that resolves ``[all]`` from the index the way a user's pip does (the rest of
the suite runs in the constrained dev venv); pip's cache makes reruns cheaper.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from installkit import REPO, clean_env, copy_sources, make_venv, pip

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_all_extra_in_a_fresh_venv_runs_every_notebook(tmp_path: Path) -> None:
    src = copy_sources(tmp_path / "src")
    python = make_venv(tmp_path / "venv")
    pip(python, "install", "-q", f"{src}[all]", env=clean_env())
    runner = Path(__file__).with_name("run_notebooks.py")
    proc = subprocess.run([str(python), str(runner), *map(str, NOTEBOOKS)], capture_output=True, text=True,
                          env=clean_env(), cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["notebook"] for r in runs] == [p.name for p in NOTEBOOKS] and len(runs) >= 5
    for r in runs:
        assert r["error"] is None, (r["notebook"], r["error"])
        assert r["executed"] == r["cells"], r
        assert r["kernel"] == str(python), r          # the kernel ran in the fresh venv, not in ours
        assert not r["left"], r                      # each notebook deleted its data
