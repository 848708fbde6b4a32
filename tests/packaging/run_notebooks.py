"""Run notebooks with nbclient in THIS interpreter's environment; print one JSON line per notebook.

Executed by another venv's python (tests/packaging/test_notebooks_all.py), so it imports only what
``manyfiles[all]`` installs: ``python run_notebooks.py NOTEBOOK...``.  A last cell is added to each
notebook to report which interpreter ran the kernel.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import nbformat
from nbclient import NotebookClient

for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('KERNEL', sys.executable)"))
    tmp = tempfile.mkdtemp(prefix="nbrun-")
    os.environ["TMPDIR"] = tmp                       # the kernel inherits it: the notebook's data goes there
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    t0 = time.monotonic()
    error = None
    try:
        NotebookClient(nb, kernel_name="python3", timeout=120, allow_errors=False,
                       resources={"metadata": {"path": tmp}}).execute()
    except Exception as exc:   # CellExecutionError names the cell and its traceback
        error = str(exc)[-3000:]
    code = [c for c in nb.cells if c.cell_type == "code"]
    streams = "".join(o.get("text", "") for c in code for o in c.outputs if o.output_type == "stream")
    kernel = [line.split(" ", 1)[1] for line in streams.splitlines() if line.startswith("KERNEL ")]
    print(json.dumps({"notebook": os.path.basename(path), "error": error, "seconds": time.monotonic() - t0,
                      "cells": len(code), "executed": sum(1 for c in code if c.execution_count),
                      "kernel": kernel[0] if kernel else None, "left": os.listdir(tmp)}), flush=True)
