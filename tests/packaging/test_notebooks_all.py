"""Every notebook runs to the end in a real Jupyter kernel, in a fresh venv with ``manyfiles[all]``.

The bar check of issue 12: ``pip install ".[all]"`` (no constraints, as a user does; built once,
the ``all_venv`` fixture), then each notebook of notebooks/ executed there with nbclient: every cell
succeeds, the kernel is that venv's, each notebook plots, shows its progress displays finished,
and deletes its data.  tests/notebooks/progress_everywhere.ipynb calls every long public call with
``progress=True`` under the kernel: each must leave its live display in the saved outputs, in its
final state.  (tests/test_notebooks.py checks they are committed without outputs.)
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from installkit import REPO, clean_env

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
PROGRESS_NOTEBOOK = REPO / "tests" / "notebooks" / "progress_everywhere.ipynb"
RUNNER = Path(__file__).with_name("run_notebook.py")

def execute(python: Path, path: Path, tmp_path: Path) -> list[dict]:
    """Run ``path`` with ``python``'s Jupyter kernel, TMPDIR and working directory a fresh folder;
    return its code cells with their outputs."""
    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "executed.ipynb"
    env = clean_env() | {
        "TMPDIR": str(data),                     # the kernel inherits it: the notebook's data goes there
        "MANYFILES_NOTEBOOK_SMALL": "1",          # notebooks with a size knob (06) run a small one
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    }
    proc = subprocess.run([str(python), str(RUNNER), str(path), str(out)], capture_output=True, text=True,
                          env=env, cwd=data, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(proc.stdout.splitlines()[-1])
    assert run["error"] is None, run["error"]
    assert run["kernel"] == str(python), run          # the kernel ran in the fresh venv, not in ours
    code = [c for c in json.loads(out.read_text())["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] for c in code)
    assert not [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert not list(data.iterdir()), "the notebook left its data behind"
    return code


def progress_displays(cell: dict) -> list[str]:
    """The HTML of the progress displays a cell left in its saved outputs."""
    return ["".join(o["data"]["text/html"]) for o in cell["outputs"]
            if o["output_type"] == "display_data" and "<progress" in "".join(o["data"].get("text/html", ""))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(all_venv: Path, path: Path, tmp_path: Path) -> None:
    code = execute(all_venv, path, tmp_path)
    images = [o for c in code for o in c["outputs"] if "image/png" in o.get("data", {})]
    assert images, "every notebook plots something"
    shown = [html for c in code for html in progress_displays(c)]
    assert shown, "every notebook shows progress=True on its long calls"
    assert all("[done]" in html for html in shown), [h for h in shown if "[done]" not in h]


def test_progress_true_everywhere_ends_in_its_final_state(all_venv: Path, tmp_path: Path) -> None:
    """Each cell prints ``CHECK <call> <n>``; its progress display must be saved finished, showing n."""
    code = execute(all_venv, PROGRESS_NOTEBOOK, tmp_path)
    checked = []
    for cell in code:
        text = "".join("".join(o["text"]) for o in cell["outputs"] if o["output_type"] == "stream")
        m = re.search(r"^CHECK (.+) (\d+)$", text, re.M)
        if m is None:
            continue
        call, n = m.group(1), int(m.group(2))
        shown = progress_displays(cell)
        assert n > 0 and len(shown) == 1, (call, n, shown)
        assert "[done]" in shown[0] and re.search(rf"\b{n:,}\b", shown[0]), (call, n, shown[0])
        checked.append(call)
    assert len(checked) == sum("".join(c["source"]).startswith("check(") for c in code) >= 20, checked
