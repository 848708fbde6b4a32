"""Remove outputs and execution counts from notebooks, in place: `python notebooks/strip_outputs.py [FILES]`.

Run it before committing a notebook (tests/test_notebooks.py checks that none has outputs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def strip(path: Path) -> bool:
    """Strip ``path``; True if it changed."""
    text = path.read_text()
    nb = json.loads(text)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    nb["metadata"].pop("widgets", None)
    new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or sorted(Path(__file__).parent.glob("*.ipynb"))
    for p in paths:
        if strip(p):
            print(f"stripped {p}")
