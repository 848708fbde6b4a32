"""Hugging Face ``datasets`` through the cache: ``load_dataset("parquet", data_files=...)`` in every
form reads the exact rows; the first process (without s3fs) fills the cache with the documented form
and reads it again in every other form, and a later process (with s3fs) reads every form sending no
object GET: no form bypasses the cache."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

RUN = textwrap.dedent("""
    import json, sys
    forms, hf_cache, no_s3fs = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    if no_s3fs:
        sys.modules["s3fs"] = None          # as if it were not installed: import s3fs fails
    from datasets import load_dataset
    for i, kw in enumerate(forms):          # each form with a datasets cache of its own: it reads the files
        ds = load_dataset("parquet", cache_dir=f"{hf_cache}-{i}", **kw)["train"]
        print(json.dumps(sorted(ds["i"])), flush=True)
""")

def _forms(bucket: str, opts: dict) -> dict[str, dict]:
    pattern = f"s3://{bucket}/train/*.parquet"
    return {
        "documented": {"data_files": f"manyfiles://{pattern}", "storage_options": opts},
        "by protocol": {"data_files": f"manyfiles://{pattern}", "storage_options": {"manyfiles": opts}},
        "bare": {"data_files": f"manyfiles://{bucket}/train/*.parquet", "storage_options": opts},
        "no options": {"data_files": f"manyfiles://{pattern}"},
        "chained": {"data_files": f"manyfiles::{pattern}"},       # needs s3fs (fsspec resolves "s3")
    }


def test_load_dataset_reads_through_the_cache_in_every_form(s3, tmp_path, roomy_dir):
    rows = []
    for i in range(3):
        ids = list(range(i * 100, i * 100 + 100))
        rows += ids
        buf = io.BytesIO()
        pq.write_table(pa.table({"i": ids, "s": [f"r{j}" for j in ids]}), buf)
        s3.put(f"train/part-{i}.parquet", buf.getvalue())
    cache = str(roomy_dir / "cache")        # (the forms without options open it with the default watermarks)
    opts = {"cache": cache, "endpoint_url": s3.endpoint, "region": "us-east-1"}
    # the forms without options find the cache and endpoint in the environment; the hub's endpoint is
    # a closed local port: nothing leaves the machine
    env = {**os.environ, **s3.env, "MANYFILES_CACHE_DIR": cache, "HF_ENDPOINT": "http://127.0.0.1:9",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    forms = _forms(s3.bucket, opts)

    def run(names: list[str], no_s3fs: bool) -> None:
        hf = tmp_path / f"hf-{int(no_s3fs)}-{len(names)}"
        proc = subprocess.run([sys.executable, "-c", RUN, json.dumps([forms[n] for n in names]), str(hf),
                               "1" if no_s3fs else "0"], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{names}, s3fs hidden: {no_s3fs}: {proc.stderr[-3000:]}"
        got = [json.loads(line) for line in proc.stdout.strip().splitlines()]
        assert got == [sorted(rows)] * len(names), names

    # the first process, without s3fs: the documented form fills the cache (3 GETs), the others read it
    run([n for n in forms if n != "chained"], no_s3fs=True)
    assert len(s3.gets()) == 3 and os.path.isdir(cache), f"a form read around the cache: {s3.gets()}"
    run(list(forms), no_s3fs=False)             # every form, in a later process: 0 object GETs
    assert len(s3.gets()) == 3, f"a form read around the cache: {s3.gets()[3:]}"
