"""Eight processes filling and reading one cache at once (issue 27), briefly: the 10-minute run of the
same script is a benchmark (benchmarks/cache_stress.py, docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cache_stress.py"


def test_eight_processes_on_one_cache_no_lock_error_no_wrong_byte_every_counter_consistent(tmp_path: Path):
    argv = [sys.executable, str(SCRIPT), "--seconds", "12", "--processes", "8", "--scale", "0.5", "--dir",
            str(tmp_path), "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["crashed"] == [] and summary["reads"] > 500, summary
    assert (summary["wrong"], summary["final_wrong"], summary["locked"]) == (0, 0, 0), summary
    assert summary["errors"] == {} and summary["stderr_warnings"] == {}, summary
    assert summary["mismatches"] == [] and summary["unbacked"] == [], summary
    assert summary["verify_exit"] == 0 and summary["verify"]["corrupt"] == 0, summary
    index = summary["index"]
    assert index["bytes"] == summary["disk_bytes"] and summary["rows"] == index["entries"]
    assert summary["processes"]["object_hits"] == summary["index"]["object_hits"] > 0
    assert proc.returncode == 0
