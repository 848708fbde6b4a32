"""Every notebook in notebooks/ runs to the end in a real Jupyter kernel, and is committed without outputs.

The kernel is this venv's ipykernel (the ``notebooks`` extra, in ``dev``); each notebook
makes its own data under TMPDIR (a pytest tmp dir here) and starts its own S3 server.
tests/notebooks/progress_everywhere.ipynb calls every long public call with ``progress=True``
under the kernel: each must leave its live display in the saved outputs, in its final state.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NOTEBOOKS = sorted((HERE.parent / "notebooks").glob("*.ipynb"))
PROGRESS_NOTEBOOK = HERE / "notebooks" / "progress_everywhere.ipynb"
CELL_TIMEOUT_S = 120   # a hang guard, not a benchmark (each notebook runs in well under a minute)


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 5, NOTEBOOKS


def execute(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    """Run ``path`` in a fresh kernel with TMPDIR=tmp_path; return its code cells with their outputs."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TMPDIR", str(tmp_path))          # the kernel inherits it: data goes there
    monkeypatch.setenv("MANYFILES_NOTEBOOK_SMALL", "1")  # notebooks with a size knob (06) run a small one
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, allow_errors=False,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()   # raises CellExecutionError, with the cell and its traceback, if a cell fails
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    # the notebook cleaned up after itself: nothing of its data left in TMPDIR
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("manyfiles-")]
    return code


def progress_displays(cell) -> list[str]:
    """The HTML of the progress displays a cell left in its saved outputs."""
    return [o.data["text/html"] for o in cell.outputs
            if o.output_type == "display_data" and "<progress" in o.get("data", {}).get("text/html", "")]


@pytest.mark.parametrize("path", [*NOTEBOOKS, PROGRESS_NOTEBOOK], ids=lambda p: p.stem)
def test_committed_without_outputs(path: Path) -> None:
    """Outputs stay out of git (run `python notebooks/strip_outputs.py` before committing)."""
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; run python notebooks/strip_outputs.py"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = execute(path, tmp_path, monkeypatch)
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, "every notebook plots something"
    shown = [html for c in code for html in progress_displays(c)]
    assert shown, "every notebook shows progress=True on its long calls"
    assert all("[done]" in html for html in shown), [h for h in shown if "[done]" not in h]


def test_progress_true_everywhere_ends_in_its_final_state(tmp_path: Path, monkeypatch) -> None:
    """Each cell prints ``CHECK <call> <n>``; its progress display must be saved finished, showing n."""
    code = execute(PROGRESS_NOTEBOOK, tmp_path, monkeypatch)
    checked = []
    for cell in code:
        text = "".join(o.text for o in cell.outputs if o.output_type == "stream")
        m = re.search(r"^CHECK (.+) (\d+)$", text, re.M)
        if m is None:
            continue
        call, n = m.group(1), int(m.group(2))
        shown = progress_displays(cell)
        assert n > 0 and len(shown) == 1, (call, n, shown)
        assert "[done]" in shown[0] and re.search(rf"\b{n:,}\b", shown[0]), (call, n, shown[0])
        checked.append(call)
    assert len(checked) == sum(c.source.startswith("check(") for c in code) >= 20, checked
