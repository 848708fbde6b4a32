"""The notebooks are committed without outputs.  (They run, in a real kernel in a fresh venv with
``manyfiles[all]``, in tests/packaging/test_notebooks_all.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NOTEBOOKS = sorted((HERE.parent / "notebooks").glob("*.ipynb"))
PROGRESS_NOTEBOOK = HERE / "notebooks" / "progress_everywhere.ipynb"


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 5, NOTEBOOKS


@pytest.mark.parametrize("path", [*NOTEBOOKS, PROGRESS_NOTEBOOK], ids=lambda p: p.stem)
def test_committed_without_outputs(path: Path) -> None:
    """Outputs stay out of git (run `python notebooks/strip_outputs.py` before committing)."""
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; run python notebooks/strip_outputs.py"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
