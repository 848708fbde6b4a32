"""Issue 19: ``progress`` keeps one form from the public call down to the walker's hook.

``fastls.run`` turns its ``progress=`` into a Progress once; each path is a part of it
(``Progress.start_part``), and the tree walk reports into that same object (``count_into`` /
``write_into``; the C walker is handed ``Progress.part_done``).  So a run over several paths is one
count that only grows and ends at the total, whichever engine lists the paths.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from manyfiles import fastls
from manyfiles._core.progress import Snapshot, progress_for
from manyfiles.errors import UsageError
from manyfiles.listing._tree import count_into, tree_args, write_into
from manyfiles.scale.executor import InProcessExecutor


def make_tree(root: Path, dirs: int, files: int) -> int:
    """``dirs`` directories of ``files`` files under ``root``; returns the entries below it."""
    for d in range(dirs):
        sub = root / f"d{d:02d}"
        sub.mkdir(parents=True)
        for f in range(files):
            (sub / f"f{f:03d}").write_bytes(b"")
    return dirs * (files + 1)


ENGINES = {"c-walker": {}, "python-walk": {"backend": "scandir"}, "cluster": {}}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("count_only", [False, True], ids=["names", "count"])
def test_fastls_over_several_paths_shows_one_growing_count(tmp_path: Path, engine: str,
                                                             count_only: bool) -> None:
    a = make_tree(tmp_path / "a", 3, 20)
    b = make_tree(tmp_path / "b", 5, 7)
    paths = (str(tmp_path / "a"), str(tmp_path / "missing"), str(tmp_path / "b"))
    cluster = InProcessExecutor() if engine == "cluster" else None   # the job's snapshots, forwarded
    seen: list[Snapshot] = []
    with open(tmp_path / "out", "wb") as out:
        report = fastls.run(fastls.ListRequest(paths=paths, recursive=True, count_only=count_only,
                                               **ENGINES[engine]),
                            out.fileno(), progress=seen.append, cluster=cluster)
    # (the Python walk also keeps a 0 for the missing path; the C walker's OSError skips it)
    assert {p: n for p, n in report.counts.items() if n} == {paths[0]: a, paths[2]: b}
    assert report.entries == a + b and len(report.failures) == 1
    assert os.path.getsize(tmp_path / "out") == (0 if count_only else sum(
        len(os.fsencode(os.path.join(p, name))) + 1 for p, name in _names(paths[0], paths[2])))
    dones = [s.done for s in seen]
    assert dones == sorted(dones), dones
    assert seen[-1].finished and (seen[-1].done, seen[-1].failures) == (a + b, 1)


def _names(*roots: str) -> list[tuple[str, str]]:
    return [(top, name) for root in roots for top, dirs, files in os.walk(root) for name in dirs + files]


@pytest.mark.parametrize("backend", ["dents", "scandir"])
def test_tree_parts_count_on_in_the_one_progress(tmp_path: Path, backend: str) -> None:
    """Two tree counts as two parts of one Progress: every value of the second part is above the
    first part's total (the base count lives in the Progress, not in a wrapper around the hook)."""
    a = make_tree(tmp_path / "a", 4, 10)
    b = make_tree(tmp_path / "b", 6, 3)
    args = tree_args(threads=2)
    seen: list[Snapshot] = []
    with progress_for(seen.append, "count", unit="entries", interval=0) as shown:
        first = count_into(shown, tmp_path / "a", args, backend)
        shown.start_part()
        mark = len(seen)
        second = count_into(shown, tmp_path / "b", args, backend)
    assert (first.entries, second.entries) == (a, b)
    assert seen[mark - 1].done == a and all(a < s.done <= a + b for s in seen[mark:])
    assert seen[-1].finished and seen[-1].done == a + b


def test_write_into_reports_its_part(tmp_path: Path) -> None:
    a = make_tree(tmp_path / "a", 2, 5)
    seen: list[Snapshot] = []
    with open(tmp_path / "out", "wb") as out, progress_for(seen.append, "write", interval=0) as shown:
        shown.start_part(done=100)          # as if earlier paths had listed 100 entries
        tally = write_into(shown, tmp_path / "a", out.fileno(), tree_args(threads=2))
    assert tally.entries == a and seen[-1].done == 100 + a
    assert len((tmp_path / "out").read_bytes().splitlines()) == a


def test_nobody_listening_costs_no_progress_object(tmp_path: Path) -> None:
    """None (what fastls.run passes down for progress=False, and the click-free script) works."""
    a = make_tree(tmp_path / "a", 2, 5)
    assert count_into(None, tmp_path / "a", tree_args()).entries == a


@pytest.mark.parametrize("bad", ["yes", 3])
def test_bad_progress_is_one_line_before_any_cluster_is_reached(tmp_path: Path, bad: object) -> None:
    """The check is progress_for's, once, before the cluster (a port nothing listens on) is tried."""
    request = fastls.ListRequest(paths=(str(tmp_path),), recursive=True)
    with pytest.raises(UsageError, match=r"^progress must be") as caught:
        fastls.run(request, 1, progress=bad, cluster="tcp://127.0.0.1:9")
    assert "\n" not in str(caught.value)
