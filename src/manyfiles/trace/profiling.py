"""viztracer profiles (``--profile FILE`` / :func:`manyfiles.profile`), worker processes included.

The parent traces itself with viztracer and publishes a scratch directory in
``MANYFILES_PROFILE_DIR``; every worker process that runs inside
``manyfiles._core.worker.instrumented_worker()`` saves its own profile there (forked
workers reuse the tracer they inherited, spawned ones start a fresh one), and the
parent combines them all into ``output_file`` with viztracer's ReportBuilder, the
code behind ``viztracer --combine``.  Open the result with ``vizviewer FILE`` or
https://ui.perfetto.dev.  viztracer is imported only when profiling starts.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from manyfiles._core.extras import require
from manyfiles.errors import ManyfilesError, UsageError

FEATURE = "--profile-out (manyfiles.profile)"

__all__ = ["profile"]

ENV_DIR = "MANYFILES_PROFILE_DIR"
ENV_OPTIONS = "MANYFILES_PROFILE_OPTIONS"
_ACTIVE = False


@contextlib.contextmanager
def profile(output_file: str | os.PathLike = "manyfiles-profile.json",
            **viztracer_options: Any) -> Iterator[Any]:
    """Profile the block with viztracer and save a Perfetto-loadable trace to ``output_file``.

    ``output_file`` may end in ``.json``, ``.json.gz`` or ``.html``.  Keyword
    arguments go to ``viztracer.VizTracer`` (e.g. ``tracer_entries``, ``max_stack_depth``,
    ``log_async``); the tracer is yielded so the block can add its own events.

    Example:
        >>> import manyfiles as mf
        >>> with mf.profile("pull.json"):          # doctest: +SKIP
        ...     mf.count("/data/flat")
    """
    global _ACTIVE
    VizTracer = require("profile", "viztracer", FEATURE).VizTracer

    if _ACTIVE:
        raise ManyfilesError(f"{os.fsdecode(output_file)}: a profile is already being recorded")
    out = os.path.abspath(os.fspath(output_file))
    if not out.endswith((".json", ".json.gz", ".html")):
        raise UsageError(f"{os.fsdecode(output_file)}: a profile is saved as .json, .json.gz or .html")
    if not os.path.isdir(os.path.dirname(out)):
        raise ManyfilesError(f"{os.fsdecode(output_file)}: No such file or directory")
    options = {"verbose": 0, **viztracer_options}
    scratch = tempfile.mkdtemp(prefix="manyfiles-profile-")
    thread_hook = threading.getprofile()  # VizTracer() replaces it (Python < 3.12)
    try:
        tracer = VizTracer(output_file=os.path.join(scratch, "main.json"), **options)
    except BaseException:
        threading.setprofile(thread_hook)
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    saved = {k: os.environ.get(k) for k in (ENV_DIR, ENV_OPTIONS)}
    # Worker processes (fork or spawn) find the scratch folder through the environment.
    os.environ[ENV_DIR] = scratch
    os.environ[ENV_OPTIONS] = json.dumps(_jsonable(options))
    _ACTIVE = True
    tracer.start()
    try:
        yield tracer
    finally:
        tracer.stop()
        _ACTIVE = False
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            tracer.save(os.path.join(scratch, "main.json"))
            _combine(scratch, out)
        finally:
            _release(tracer, thread_hook)
            shutil.rmtree(scratch, ignore_errors=True)


def _combine(scratch: str, output_file: str) -> None:
    ReportBuilder = require("profile", "viztracer.report_builder", FEATURE).ReportBuilder

    parts = [os.path.join(scratch, "main.json")]
    parts += sorted(glob.glob(os.path.join(scratch, "worker-*.json")))
    try:
        ReportBuilder(parts, verbose=0).save(output_file=output_file)
    except OSError as exc:
        raise ManyfilesError(f"{output_file}: {exc.strerror or exc}") from exc


def _jsonable(options: dict[str, Any]) -> dict[str, Any]:
    """The options a spawned worker can re-create (callables and plugins stay in the parent)."""
    keep = {}
    for k, v in options.items():
        try:
            json.dumps(v)
        except TypeError:
            continue
        keep[k] = v
    return keep


def _release(tracer: Any, thread_hook: Any = None) -> None:
    """Drop every reference viztracer keeps to a stopped tracer, so that it is freed when its
    user drops it rather than at interpreter exit.

    On Python < 3.12, creating a VizTracer sets ``threading.setprofile`` to one of its methods:
    every thread started later, long after the profile, would still be profiled, and the hook
    keeps the tracer alive until exit.  There, its C dealloc calls ``threading.setprofile(None)``
    through a module pointer that shutdown has already cleared and leaves the SystemError set;
    CPython then blames the next object its exit GC clears ("Exception ignored in m_clear of
    module manyfiles._dents").  The tracer and its plugin manager also refer to each other, a
    cycle that only a full collection (often none before exit) would free.
    """
    import builtins

    if builtins.__dict__.get("__viz_tracer__") is tracer:
        del builtins.__dict__["__viz_tracer__"]
    if getattr(threading.getprofile(), "__self__", None) is tracer:
        threading.setprofile(thread_hook)
    plugins = getattr(tracer, "_plugin_manager", None)
    if getattr(plugins, "_tracer", None) is tracer:
        plugins._tracer = None


def start_worker() -> Any:
    """In a worker process: start (or, after fork, take over) a viztracer if the parent profiles."""
    scratch = os.environ.get(ENV_DIR)
    if not scratch or not os.path.isdir(scratch):
        return None
    viztracer = require("profile", "viztracer", FEATURE)
    VizTracer, get_tracer = viztracer.VizTracer, viztracer.get_tracer

    tracer = get_tracer()
    if tracer is not None and tracer.enable:
        # Forked from the profiled parent: drop the parent's events, keep tracing here
        # (what viztracer itself does after fork).
        tracer.clear()
        tracer.reset_stack()
    else:
        try:
            options = json.loads(os.environ.get(ENV_OPTIONS) or "{}")
        except ValueError:
            options = {}
        options.pop("output_file", None)
        tracer = VizTracer(**{"verbose": 0, **options})
        tracer.start()
    return tracer


def stop_worker(tracer: Any) -> None:
    """Counterpart of :func:`start_worker`: save this worker's profile for the parent to combine."""
    if tracer is None:
        return
    scratch = os.environ.get(ENV_DIR)
    tracer.stop()
    if scratch and os.path.isdir(scratch):
        with contextlib.suppress(OSError):
            tracer.save(os.path.join(scratch, f"worker-{os.getpid()}.json"))
    _release(tracer)
