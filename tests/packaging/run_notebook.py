"""Run one notebook with nbclient in THIS interpreter's environment and save it executed.

Executed by another venv's python (tests/packaging/test_notebooks.py), so it imports only what
``manyfiles[all]`` installs: ``python run_notebook.py NOTEBOOK OUT.ipynb``.  A last cell is added
to report which interpreter ran the kernel.  Prints one JSON line: the error (None when every
cell succeeded), the kernel's interpreter and the seconds it took.  The notebook's data goes to
TMPDIR (set by the caller; the kernel inherits it).
"""

from __future__ import annotations

import json
import sys
import time

import nbformat
from nbclient import NotebookClient

CELL_TIMEOUT_S = 120   # a hang guard, not a benchmark (each notebook runs in well under a minute)

path, out = sys.argv[1:3]
nb = nbformat.read(path, as_version=4)
nb.cells.append(nbformat.v4.new_code_cell("import sys; print('KERNEL', sys.executable)"))
t0 = time.monotonic()
error = None
try:
    NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, allow_errors=False).execute()
except Exception as exc:   # CellExecutionError names the cell and its traceback
    error = str(exc)[-3000:]
nbformat.write(nb, out)
streams = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                  if o.output_type == "stream")
kernel = [line.split(" ", 1)[1] for line in streams.splitlines() if line.startswith("KERNEL ")]
print(json.dumps({"error": error, "kernel": kernel[0] if kernel else None,
                  "seconds": round(time.monotonic() - t0, 1)}), flush=True)
