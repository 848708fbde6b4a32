"""`make demo`'s program runs every step on a small folder and tells the truth about what it leaves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_demo_runs_every_step_and_reports_its_footprint(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "manyfiles.demo", "--dir", str(demo), "--files", "3000"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for step in ("generating 3,000 files", "fastls:", "shard:", "fastrm:", "s3pull:", "ML:", "tracing:"):
        assert f"=== {step}" in proc.stdout, step
    said = int(re.search(r"it leaves (\d+) MB on disk there", proc.stdout).group(1))
    du = int(subprocess.run(["du", "-s", "-B1", str(demo)], capture_output=True, text=True,
                            check=True).stdout.split()[0])
    assert abs(said - du / 1e6) <= max(1, 0.05 * du / 1e6), (said, du)
    assert len(list((demo / "flat").iterdir())) >= 3000     # the folder is back flat, all files there
