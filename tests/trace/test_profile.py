"""`--profile-out` / manyfiles.profile(): a viztracer JSON that includes worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import manyfiles as mf
from manyfiles.errors import ManyfilesError


def function_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def test_cli_profile_is_a_viztracer_json_with_our_functions(tmp_path: Path, run_cli) -> None:
    (tmp_path / "d").mkdir()
    for i in range(20):
        (tmp_path / "d" / f"f{i}").touch()
    out = tmp_path / "ls.json"
    proc = run_cli("fastls", "--profile-out", str(out), str(tmp_path / "d"))
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 20
    doc = json.loads(out.read_text())
    assert "viztracer_metadata" in doc
    names = {e["name"] for e in function_events(doc)}
    assert any("manyfiles/listing/" in n for n in names), sorted(names)[:20]
    assert all(e["dur"] >= 0 for e in function_events(doc))


def test_profile_and_trace_together_put_io_events_on_the_profile_timeline(tmp_path: Path, run_cli) -> None:
    (tmp_path / "d").mkdir()
    for i in range(50):
        (tmp_path / "d" / f"f{i}").touch()
    out, t = tmp_path / "ls.json", tmp_path / "ls.mft"
    proc = run_cli("fastls", "--profile-out", str(out), "--trace", str(t), "--bufsize", "1K",
                   str(tmp_path / "d"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    io = [e for e in doc["traceEvents"] if e.get("cat") == "io" and e["ph"] == "b"]
    funcs = function_events(doc)
    assert io and funcs
    # the same clock: every getdents batch lies inside the profiled run
    lo = min(e["ts"] for e in funcs)
    hi = max(e["ts"] + e["dur"] for e in funcs)
    assert all(lo <= e["ts"] <= hi for e in io)


WORKERS = textwrap.dedent("""
    import multiprocessing, sys
    import manyfiles as mf
    from manyfiles._core.worker import instrumented_worker

    def busy_function_in_worker(n):
        return sum(i * i for i in range(n))

    def work(n):
        with instrumented_worker():
            busy_function_in_worker(n)

    def pool_task(n):
        return busy_function_in_pool(n)

    def busy_function_in_pool(n):
        return sum(range(n))

    if __name__ == "__main__":
        from manyfiles._core.worker import worker_initializer
        with mf.profile(sys.argv[1]):
            pids = []
            for method in ("fork", "spawn"):
                p = multiprocessing.get_context(method).Process(target=work, args=(1000,))
                p.start()
                p.join()
                pids.append(p.pid)
            pool = multiprocessing.get_context("fork").Pool(1, initializer=worker_initializer)
            pool.map(pool_task, [10])
            pool.close()
            pool.join()
        print(*pids)
""")


def test_profile_includes_forked_spawned_and_pool_workers(tmp_path: Path) -> None:
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    out = tmp_path / "w.json"
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    fork_pid, spawn_pid = map(int, proc.stdout.split())
    doc = json.loads(out.read_text())
    events = function_events(doc)
    worker_pids = {e["pid"] for e in events if e["name"].startswith("busy_function_in_worker")}
    assert worker_pids == {fork_pid, spawn_pid}
    pool_pids = {e["pid"] for e in events if e["name"].startswith("busy_function_in_pool")}
    assert len(pool_pids) == 1 and pool_pids.isdisjoint({fork_pid, spawn_pid})
    main_pids = {e["pid"] for e in events if e["name"].startswith("BaseProcess.start")}
    assert len(main_pids) == 1 and main_pids.isdisjoint(worker_pids | pool_pids)
    # the parent's events are not duplicated into the forked child's share
    child_starts = [e for e in events if e["pid"] == fork_pid and e["name"].startswith("BaseProcess.start")]
    assert child_starts == []
    assert os.environ.get("MANYFILES_PROFILE_DIR") is None


def test_profile_in_process_and_bad_output(tmp_path: Path) -> None:
    out = tmp_path / "p.json"

    def some_library_call() -> int:
        return mf.count(str(tmp_path))

    with mf.profile(out) as tracer:
        assert tracer.enable
        some_library_call()
    names = {e["name"] for e in function_events(json.loads(out.read_text()))}
    assert any(n.startswith("test_profile_in_process_and_bad_output.<locals>.some_library_call")
               for n in names)
    bad = tmp_path / "no" / "p.json"
    with pytest.raises(ManyfilesError, match="No such file or directory"), mf.profile(bad):
        pass
    with pytest.raises(mf.UsageError, match=r"saved as \.json"), mf.profile(tmp_path / "p.txt"):
        pass
    assert not (tmp_path / "p.txt").exists()


EXIT_AFTER_PROFILE = textwrap.dedent("""
    import gc, sys
    import manyfiles as mf
    gc.disable()  # as in a big process (a test session) where no full collection runs before exit
    with mf.profile(sys.argv[1]) as tracer:
        mf.count(sys.argv[2])
    del tracer
""")


def test_a_finished_profile_leaves_nothing_for_interpreter_exit(tmp_path: Path) -> None:
    """viztracer's C dealloc (Python < 3.12) leaves a SystemError set when it runs at exit, which
    CPython reported as "Exception ignored in m_clear of module manyfiles._dents" (or whichever
    module its exit GC cleared next): the tracer must be freed before, when its user drops it."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_AFTER_PROFILE)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "p.json"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    assert json.loads((tmp_path / "p.json").read_text())["traceEvents"]


def test_threads_started_after_a_profile_are_not_profiled(tmp_path: Path) -> None:
    import gc
    import threading
    import weakref

    hook = threading.getprofile()
    was_enabled = gc.isenabled()
    gc.disable()  # only reference counting may free the tracer
    try:
        with mf.profile(tmp_path / "p.json") as tracer:
            mf.count(str(tmp_path))
        assert threading.getprofile() is hook
        seen = []
        thread = threading.Thread(target=lambda: seen.append(sys.getprofile()))
        thread.start()
        thread.join()
        assert seen == [None]
        alive = weakref.ref(tracer)
        del tracer
        assert alive() is None
    finally:
        if was_enabled:
            gc.enable()
