"""shard apply / verify / revert with the top buckets moved by a real 2-process Dask cluster."""

from __future__ import annotations

import os
from pathlib import Path

from manyfiles import shard
from manyfiles._core import testing as _testing
from manyfiles.scale.executor import ClusterReport
from manyfiles.shard._cluster import PARTS
from manyfiles.shard.journal import JOURNAL, LOCK

N = 20_000


def fill(root: Path, n: int, extra: tuple[str, ...] = ()) -> dict[str, bytes]:
    """n files whose content names them (a file moved into the wrong name would show)."""
    root.mkdir()
    want = {}
    for name in [f"img-{i:06d}.jpg" for i in range(n)] + list(extra):
        data = f"{name}:{len(name)}".encode()
        (root / name).write_bytes(data)
        want[name] = data
    return want


def files_under(root: Path) -> dict[str, bytes]:
    """name -> content for every file anywhere under root, outside our reserved names."""
    out = {}
    for parent, _dirs, files in os.walk(root):
        for f in files:
            if f.startswith(".manyfiles-shard"):
                continue
            assert f not in out, f"{f} twice"
            out[f] = Path(parent, f).read_bytes()
    return out


def no_leftovers(root: Path) -> None:
    left = {os.fsencode(n) for n in os.listdir(root)}
    assert not left & {PARTS, JOURNAL, LOCK}, left


def test_apply_verify_revert_20k_files_on_the_cluster(tmp_path: Path, dask_client) -> None:
    root = tmp_path / "flat"
    want = fill(root, N, extra=("ab", "0f"))         # two names of top buckets: moved aside first
    report = shard.apply(root, cluster=dask_client)
    assert isinstance(report, ClusterReport) and report.ok, report.failures
    assert (report.moved, report.set_aside, report.already) == (N + 2, 2, 0)
    assert report.shards == 4 * 2 and len(report.workers) == 2, report.worker_lines()   # 256 tops, dealt
    assert sum(w.items for w in report.workers.values()) == N    # the aside ones move on the client
    flat_left = [n for n in os.listdir(root) if not n.startswith(".manyfiles-shard")]
    assert len(flat_left) == 256 and all(len(n) == 2 for n in flat_left)   # only top buckets
    assert files_under(root) == want
    check = shard.verify(root, expected=N + 2)
    assert check.ok and check.files == N + 2, check
    no_leftovers(root)

    back = shard.revert(root, cluster=dask_client)
    assert back.ok and back.moved == N + 2, back.failures
    assert sorted(os.listdir(root)) == sorted(want)
    assert {n: (root / n).read_bytes() for n in want} == want


def test_a_worker_killed_mid_bucket_loses_nothing(tmp_path: Path, dask_client, wait_for_two) -> None:
    root = tmp_path / "flat"
    want = fill(root, N)
    # One worker SIGKILLs itself right after its 1000th rename: in the middle of its first shard
    # (32 top buckets of ~78 files each).  Dask re-runs that shard on a live worker, which finds the
    # renames of the lost attempt done: this run did them, they count as moved.
    victim = sorted(dask_client.nthreads())[0]
    pid = dask_client.run(os.getpid, workers=[victim])[victim]
    dask_client.run(_testing.configure, "kill_at=move:1000", workers=[victim])
    report = shard.apply(root, cluster=dask_client)
    wait_for_two()
    assert pid not in dask_client.run(os.getpid).values()          # it really died
    assert report.ok, report.failures
    assert report.reruns >= 1
    assert (report.moved, report.already) == (N, 0)      # the killed attempt's renames were this run's
    assert files_under(root) == want
    assert shard.verify(root, expected=N).ok
    no_leftovers(root)
    assert shard.revert(root).ok                                     # and back, on this machine
    assert sorted(os.listdir(root)) == sorted(want)



def test_cluster_rounds_show_one_growing_count(tmp_path: Path) -> None:
    """A reshard is two rounds (revert, apply); each round's job snapshots count on from the rounds
    before (Progress.start_part, issue 19): the count only grows and ends at the files moved."""
    from manyfiles._core.progress import Snapshot
    from manyfiles.scale.executor import InProcessExecutor

    root = tmp_path / "flat"
    fill(root, 2_000)
    shard.apply(root, workers=2)
    seen: list[Snapshot] = []
    report = shard.reshard(root, shard.Layout(levels=(2,)), cluster=InProcessExecutor(), progress=seen.append)
    assert report.ok and report.moved == 2 * 2_000, report.failures
    dones = [s.done for s in seen]
    assert dones == sorted(dones) and 2_000 in dones, dones   # round 2 starts where round 1 ended
    assert seen[-1].finished and seen[-1].done == report.moved
