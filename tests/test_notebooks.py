"""Every notebook in notebooks/ runs to the end in a real Jupyter kernel, and is committed without outputs.

The kernel is this venv's ipykernel (the ``notebooks`` extra, in ``dev``); each notebook
makes its own data under TMPDIR (a pytest tmp dir here) and starts its own S3 server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 120   # a hang guard, not a benchmark (each notebook runs in well under a minute)


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 4, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path: Path) -> None:
    """Outputs stay out of git (run `python notebooks/strip_outputs.py` before committing)."""
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; run python notebooks/strip_outputs.py"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TMPDIR", str(tmp_path))          # the kernel inherits it: data goes there
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, allow_errors=False,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()   # raises CellExecutionError, with the cell and its traceback, if a cell fails
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, "every notebook plots something"
    # the notebook cleaned up after itself: nothing of its data left in TMPDIR
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("manyfiles-")]
