"""How s3pull --cluster cuts what a lister found into download slices (scale/slices.py's cut_slices,
which s3push --cluster uses too): enough for every worker from the start, by keys and by bytes,
never so fine that 10^8 keys make millions of tasks."""

from __future__ import annotations

from manyfiles.scale.slices import MAX_SLICES_PER_BATCH, MIN_SLICE_KEYS, SLICE_KEYS, Slice, cut_slices

MiB = 1 << 20


def objects(n: int, size: int = 1000) -> list[tuple]:
    return [(f"k/{i:06d}", size, f"e{i}") for i in range(n)]


def assert_tiles(slices: list[Slice], objs: list[tuple]) -> None:
    """The slices hold every object once, in key order."""
    assert [o for s in slices for o in s.objects] == objs


def test_a_5004_key_job_on_two_workers_is_four_slices_per_worker() -> None:
    objs = objects(5004)
    slices = cut_slices(objs, 2, whole=True)
    assert_tiles(slices, objs)
    assert [len(s.objects) for s in slices] == [626] * 7 + [622]
    assert len({s.id for s in slices}) == 8


def test_large_objects_are_cut_by_bytes() -> None:
    objs = objects(20, 50 * MiB)
    slices = cut_slices(objs, 2, whole=True)
    assert_tiles(slices, objs)
    assert [len(s.objects) for s in slices] == [2] * 10          # 1000 MiB / 8 per slice: 2 objects
    mixed = objects(300) + [(f"m/{i}", 300 * MiB, None) for i in range(3)]
    assert [len(s.objects) for s in cut_slices(mixed, 1, whole=True)] == [100, 100, 100, 1, 1, 1]


def test_small_jobs_keep_a_floor_and_the_listing_budget_a_ceiling() -> None:
    assert [len(s.objects) for s in cut_slices(objects(30), 8, whole=True)] == [30]
    assert [len(s.objects) for s in cut_slices(objects(250), 8, whole=True)] == [MIN_SLICE_KEYS] * 2 + [50]
    assert {len(s.objects) for s in cut_slices(objects(100), 1, 40, whole=True)} == {40, 20}
    assert cut_slices([], 4) == []


def test_a_batch_of_a_big_job_is_cut_at_most_16_ways_on_a_big_cluster() -> None:
    """More keys follow (not the whole job): 10^8 keys on 32 workers make ~1.6 x 10^5 slices, not
    10^6; a whole job of 5,004 keys there still gets every worker going (51 slices of <= 100)."""
    batch = objects(SLICE_KEYS)
    assert [len(s.objects) for s in cut_slices(batch, 32)] == [SLICE_KEYS // MAX_SLICES_PER_BATCH] * 16
    assert len(cut_slices(batch, 2)) == 8
    assert len(cut_slices(objects(5004), 32, whole=True)) == 51
