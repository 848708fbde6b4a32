"""One console script of ours run many times over, each run a real process, without paying the
interpreter's start-up for each: a driver process loads the script's entry point once, then forks a
child per argument list.  The child runs the entry point as the script's own launcher does (its
``sys.argv``, fds 1 and 2 its own files, its exit status), so what it prints and how it exits are the
script's; only the imports were done before the fork.

For tables of cases (a glob table: ~90 patterns, each once flat and once recursive), where one
subprocess per case cost ~0.2 s of start-up each::

    for r in run_many("fastls", [["-0", "--include", "*.c", root], ...]):
        assert r.returncode == 0, r.stderr
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

DRIVER = r"""
import base64, json, os, sys, tempfile, traceback
from importlib.metadata import entry_points

script, preload = sys.argv[1], sys.argv[2:]
for name in preload:
    __import__(name)
(entry,) = entry_points(group="console_scripts", name=os.path.basename(script))
assert entry.value.startswith("manyfiles."), entry
main = entry.load()
sys.path[0] = os.path.dirname(script)            # the script's directory, as its launcher has it
runs = [[os.fsdecode(base64.b64decode(a)) for a in argv] for argv in json.loads(sys.stdin.read())]
results = []
for argv in runs:
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
            sys.argv = [script, *argv]
            main()
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush(); sys.stderr.flush()
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    kept = []
    for f in (out, err):
        f.seek(0); kept.append(base64.b64encode(f.read()).decode()); f.close()
    results.append([os.waitstatus_to_exitcode(status), *kept])
sys.stdout.write(json.dumps(results))
"""


def run_many(script: str, argvs: Sequence[Sequence[str | bytes]], *, preload: Sequence[str] = (),
             timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Run the console script ``script`` (of this venv) once per argument list, each run a forked
    child of one driver process; a CompletedProcess (bytes) per run, in order.  ``preload``: modules
    the driver imports before it forks (those the entry point imports lazily, e.g. the click command
    behind ``fastls``'s fast path)."""
    path = str(Path(sys.executable).parent / script)
    encoded = [[base64.b64encode(os.fsencode(a)).decode() for a in argv] for argv in argvs]
    proc = subprocess.run([sys.executable, "-c", DRIVER, path, *preload], input=json.dumps(encoded).encode(),
                          capture_output=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return [subprocess.CompletedProcess([script, *argv], code, base64.b64decode(out), base64.b64decode(err))
            for argv, (code, out, err) in zip(argvs, json.loads(proc.stdout), strict=True)]
