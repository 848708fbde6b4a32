"""fsspec's own abstract tests for reading (``fsspec.tests.abstract.AbstractGetTests``: ``get`` from
the filesystem to local files, with globs, ``recursive``, ``maxdepth``, lists of paths) against the
manyfiles filesystem on a bucket of the S3 test server.

The filesystem is read only, so the scenarios their fixtures write are written through s3fs (the
abstract suite's own scenario builders, given s3fs), once per class: the get tests only read them.
The one test that writes its source itself (``test_get_directory_recursive``) gets a view of our
filesystem whose two writes go to s3fs; everything it reads goes through ours.  Every test of theirs
passes: none is in docs/ml.md's list of differences from s3fs."""

from __future__ import annotations

import posixpath

import pytest

fsspec = pytest.importorskip("fsspec")
s3fs = pytest.importorskip("s3fs")
abstract = pytest.importorskip("fsspec.tests.abstract")

@pytest.fixture(scope="module")
def seeded(moto_direct, tmp_path_factory):
    """A bucket behind its own proxy, s3fs to write to it, the cache directory our filesystem uses."""
    from s3util import Bucket

    s3 = Bucket(moto_direct, prefix="abs")
    writer = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3.endpoint, "region_name": "us-east-1"},
                               skip_instance_cache=True, use_listings_cache=False)
    yield s3, writer, str(tmp_path_factory.mktemp("abstractcache"))
    s3.close()


class _SeedingWrites:
    """Our filesystem, except ``mkdir``/``touch``, which go to s3fs (a test that writes its own source)."""

    def __init__(self, fs, writer) -> None:
        self._fs, self._writer = fs, writer

    def mkdir(self, path, *args, **kwargs):
        self._writer.mkdir(path, *args, **kwargs)

    def touch(self, path, *args, **kwargs):
        self._writer.touch(path, *args, **kwargs)
        self._fs.invalidate_cache(path)

    def __getattr__(self, name):
        return getattr(self._fs, name)


def _scenario(builder: str):
    """The class-scoped fixture named ``"fs" + builder``: the abstract suite's scenario ``builder``
    written through s3fs, in a folder of its own."""

    def scenario(cls, seeded):
        s3, writer, _ = seeded
        return getattr(cls(), builder)(writer, posixpath.join, f"{s3.bucket}/{builder.strip('_')}")

    return pytest.fixture(scope="class", name="fs" + builder)(classmethod(scenario))


class ManyfilesFixtures(abstract.AbstractFixtures):
    """The abstract suite's fixtures for the manyfiles filesystem: its scenarios written once per class
    through s3fs, under a folder of their own each."""

    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, seeded):
        s3, _, cache = seeded
        return fsspec.filesystem("manyfiles", cache=cache, endpoint_url=s3.endpoint, region="us-east-1",
                                 skip_instance_cache=True)

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self, seeded, request):
        return f"{seeded[0].bucket}/{request.node.name}"

    @pytest.fixture
    def supports_empty_directories(self):
        return False            # S3

    fs_bulk_operations_scenario_0 = _scenario("_bulk_operations_scenario_0")
    fs_glob_edge_cases_files = _scenario("_glob_edge_cases_files")
    fs_dir_and_file_with_same_name_prefix = _scenario("_dir_and_file_with_same_name_prefix")
    fs_10_files_with_hashed_names = _scenario("_10_files_with_hashed_names")


class TestManyfilesGet(abstract.AbstractGetTests, ManyfilesFixtures):
    def test_get_directory_recursive(self, fs, seeded, fs_join, fs_path, local_fs, local_join, local_target):
        super().test_get_directory_recursive(_SeedingWrites(fs, seeded[1]), fs_join, fs_path, local_fs,
                                             local_join, local_target)


def test_every_get_test_of_fsspec_runs_here():
    """None is left out or replaced (but the one that writes its source, run as it is with its writes
    sent to s3fs): each passes against the filesystem."""
    own = {name for name in vars(TestManyfilesGet) if name.startswith("test_")}
    assert own == {"test_get_directory_recursive"}
    theirs = {name for name in dir(abstract.AbstractGetTests) if name.startswith("test_")}
    assert own < theirs and len(theirs) >= 14
