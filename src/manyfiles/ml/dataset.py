"""Training data through the cache: a map-style :class:`Dataset` and an :class:`IterableDataset`.

Both list their source once (an S3 prefix, one ListObjectsV2 request per 1,000 objects, or a
local/NFS folder) and read every object through a persistent :class:`~manyfiles.cache.Cache`
shared by every process of the machine.  The listing is the validation: each S3 object is read
at the version (ETag, size) the listing saw, from its cached blocks or by GETs pinned to that
ETag, so epoch 2 sends no request at all (not a HEAD per object) and a changed object is never
mixed with its old bytes.  :meth:`Dataset.refresh` lists again (a changed ETag: fetched again).

Misses are fetched whole by s3pull's lean engine (several at once: a batch of a ``DataLoader``,
``prefetch`` objects ahead when iterating), checked whole, then kept in the cache.

Neither imports torch.  When torch is loaded they follow its protocols: ``DataLoader`` calls
``__getitems__`` with a batch of indices, and the iterable dataset shards itself by
``torch.utils.data.get_worker_info()`` and ``torch.distributed`` rank.  Both pickle to a few
strings and the listing, so they go to ``DataLoader`` workers by fork or spawn.

Example:
    >>> import manyfiles as mf
    >>> ds = mf.Dataset("s3://bucket/train/", cache="/scratch/mf-cache")             # doctest: +SKIP
    >>> key, data = ds[0]                                                            # doctest: +SKIP
    >>> loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=4)      # doctest: +SKIP
"""

from __future__ import annotations

import os
import random
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any, NamedTuple

from manyfiles._core.checkpoints import reached
from manyfiles.cache import Cache
from manyfiles.errors import ObjectChanged, UsageError
from manyfiles.ml._hitpath import HitPath
from manyfiles.ml._source import PREFETCH_MAX_BYTES, CacheRef, Item, Listing, ObjectFetcher, list_source
from manyfiles.ml._workers import Board, Slot

Source = str | os.PathLike
CacheArg = Cache | str | os.PathLike
DEFAULT_PREFETCH = 32        # objects fetched ahead of an iterating reader
FETCH_WORKERS = 16           # connections of one process's fetcher


class Sample(NamedTuple):
    """What a dataset gives without a ``transform``: the object's key (S3 key or file path) and bytes."""

    key: str
    data: bytes


_new_sample = tuple.__new__     # Sample(key, data) without the Python of NamedTuple's __new__


class _Base:
    """What both datasets share: the listing, the cache reference, reads of one object or many."""

    def __init__(self, source: Source, cache: CacheArg, transform: Callable | None,
                 *, include: Iterable[str], exclude: Iterable[str], settings: Any, prefetch: int,
                 offline: bool | None = None) -> None:
        if cache is None:
            raise UsageError("a dataset reads through a cache: give cache=DIR (or a manyfiles.Cache)")
        if transform is not None and not callable(transform):
            raise UsageError(f"transform must be callable, not {transform!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise UsageError(f"prefetch must be an integer >= 0, not {prefetch!r}")
        if settings is None and isinstance(cache, Cache):
            settings = cache.settings
        self.source = source if isinstance(source, str) else os.fspath(source)
        self.transform = transform
        self.prefetch = prefetch
        self._filters = (tuple(include), tuple(exclude))
        self._cache_ref = CacheRef.of(cache, settings)
        self._settings = settings
        if offline is not None and not isinstance(offline, bool):
            raise UsageError(f"offline={offline!r}: give True, False or None")
        self.offline = offline
        self._listing: Listing = self._list()
        self._fetcher: ObjectFetcher | None = None
        self._board = Board()
        self._hits = self._hit_path()

    def _list(self) -> Listing:
        include, exclude = self._filters
        return list_source(self.source, settings=self._settings, include=include, exclude=exclude,
                           cache=self._cache_ref.get(), offline=self.offline)

    # -- pickling: the listing and a few strings; the cache and the fetcher are per process ----------

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fetcher"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    # -- the listing ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._listing.items)

    @property
    def keys(self) -> list[str]:
        """Every object's key (S3) or path (files), in key order: ``ds[i]`` is ``keys[i]``."""
        return [it.key for it in self._listing.items]

    @property
    def listed_at(self) -> float:
        """When the source was listed (``time.time()``): the versions read are those of then."""
        return self._listing.listed_at

    @property
    def cache(self) -> Cache:
        """This process's :class:`~manyfiles.cache.Cache` (``cache.stats()``...)."""
        return self._cache_ref.get()

    def refresh(self) -> None:
        """List the source again: new and removed objects, and changed ETags (fetched again), with
        the settings resolved as the environment is now (misses then fetched with them)."""
        old, self._listing = self._listing, self._list()
        if self._fetcher is not None and (old.bucket, old.settings) != (self._listing.bucket,
                                                                       self._listing.settings):
            self._fetcher.close()
            self._fetcher = None
        self._hits = self._hit_path()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r}, {len(self):,} objects, cache={self._cache_ref.dir!r})"

    # -- reading ----------------------------------------------------------------------------------

    def _sample(self, item: Item, data: bytes) -> Any:
        sample = _new_sample(Sample, (item.key, data))
        return self.transform(sample) if self.transform is not None else sample

    def _batch(self, indexes: list[int]) -> list[Any]:
        """The samples of ``indexes`` (each ``0 <= i < len(self)``), in order: what the hit table
        holds read in one call, the rest through :meth:`_stream` (fetched at once); counters
        published once."""
        items = self._listing.items
        cache = self._cache_ref.get()
        table = self._hits.table(cache)
        slot = self._slot()
        table.refresh()
        datas = self._table_hits(table, indexes, slot.values)
        if None in datas:
            missed = [k for k, d in enumerate(datas) if d is None]
            got = self._stream([indexes[k] for k in missed], len(missed))
            for k, (_item, data) in zip(missed, got, strict=True):
                datas[k] = data
        table.settle()
        slot.publish()
        samples = [_new_sample(Sample, (items[i].key, d)) for i, d in zip(indexes, datas, strict=True)]
        return samples if self.transform is None else list(map(self.transform, samples))

    def _table_hits(self, table: Any, indexes: list[int], values: list[int]) -> list[bytes | None]:
        """The objects of ``indexes`` that the hit table holds, read in one call, None for the others
        (read them through :meth:`_cached`); the hits counted and timed once for the batch."""
        if not table.enabled:
            return [None] * len(indexes)
        reached("hit-batch")
        t0 = time.perf_counter_ns()
        if self._hits.files:
            items = self._listing.items
            datas, nbytes = table.get_files(indexes, [os.fsencode(items[i].url) for i in indexes])
        else:
            datas, nbytes = table.get_many(indexes)
        hits = len(datas) - datas.count(None)
        if hits:
            values[0] += hits                       # samples
            values[1] += hits                       # packed_hits
            values[2] += hits                       # hits
            values[5] += nbytes                     # hit_bytes
            values[4] += time.perf_counter_ns() - t0    # hit_ns
        return datas

    def _cached_export(self, cache: Cache, item: Item) -> bytes | None:
        """The object from the cache at its listed version, or None (no request is made)."""
        if item.etag is None or item.size is None or item.size > PREFETCH_MAX_BYTES:
            return None
        parts: list[bytes] = []
        if cache.export(item.url, item.etag, item.size, parts.append):
            return parts[0] if len(parts) == 1 else b"".join(parts)
        return None

    def _read(self, cache: Cache, item: Item) -> bytes:
        """One object through the cache (its own fetch path: files, large objects, a fallback)."""
        listing = self._listing
        if item.etag is not None and item.size is not None:
            try:
                return cache.get_bytes(item.url, settings=listing.settings, etag=item.etag, size=item.size,
                                       listed_at=listing.listed_at, offline=self.offline)
            except ObjectChanged:
                pass           # changed since the listing: read what is there now
        return cache.get_bytes(item.url, settings=listing.settings, offline=self.offline)

    def _offline_now(self, cache: Cache) -> bool:
        """Are misses to be read offline (listing served offline, ``offline=True``, endpoint down)?"""
        listing = self._listing
        if listing.bucket is None:
            return False
        if listing.offline is not None or self.offline:
            return self.offline is not False
        return cache.offline_reason(listing.items[0].url, settings=listing.settings,
                                    offline=self.offline) is not None

    def _fetcher_for(self) -> ObjectFetcher | None:
        listing = self._listing
        if listing.bucket is None:
            return None
        f = self._fetcher
        if f is None or f.pid != os.getpid():
            f = self._fetcher = ObjectFetcher(listing.bucket, listing.settings, FETCH_WORKERS)
            # its threads end with the dataset (they hold no reference to it): a notebook that makes
            # datasets again and again would otherwise keep every one's connections and threads
            weakref.finalize(self, f.close)
        return f

    def _fetchable(self, item: Item) -> bool:
        return item.etag is not None and item.size is not None and item.size <= PREFETCH_MAX_BYTES

    def _finish(self, cache: Cache, fetcher: ObjectFetcher, item: Item) -> bytes:
        got = fetcher.result(item)
        if got.error is None and got.data is not None:
            cache.fill(item.url, got.data, etag=item.etag, checked=got.checked,
                       listed_at=self._listing.listed_at, settings=self._listing.settings)
            self._fetched(got.data)
            return got.data
        if isinstance(got.error, ObjectChanged):
            return self._read(cache, item)
        raise got.error

    def _stream(self, indexes: Iterable[int], ahead: int) -> Iterator[tuple[Item, bytes]]:
        """(item, bytes) in the order of ``indexes``; what the hit table holds is read ``ahead``
        objects at a time (one call each: :meth:`_table_hits`), misses are fetched ``ahead`` objects
        in advance."""
        items = self._listing.items
        cache = self._cache_ref.get()
        table = self._hits.table(cache)
        table.refresh()
        read, elsewhere, counts = self._hits.reader(table), self._hits.elsewhere(table), self._slot().values
        window: deque[tuple[Item, bytes | None]] = deque()
        read_ahead: deque[tuple[int, bytes | None]] = deque()     # (index, its bytes if the table held it)
        step = max(1, ahead)
        fetcher: ObjectFetcher | None = None
        submitted: set[str] = set()
        offline: bool | None = None     # misses are not fetched: _read says what is missing
        it = iter(indexes)
        more = True
        try:
            while True:
                while more and len(window) <= ahead:
                    if not read_ahead:
                        chunk = list(islice(it, step))
                        if not chunk:
                            more = False
                            break
                        read_ahead.extend(zip(chunk, self._table_hits(table, chunk, counts), strict=True))
                    i, data = read_ahead.popleft()
                    item = items[i]
                    if data is None:
                        data = self._cached(cache, item, i, read, elsewhere, counts)
                    if data is not None and not window:
                        yield item, data        # a hit with nothing before it: straight out
                        continue
                    if data is None and self._fetchable(item):
                        if offline is None:
                            offline = self._offline_now(cache)
                        fetcher = fetcher or (None if offline else self._fetcher_for())
                        # an index repeated in the window is one GET: its later turns read what the
                        # first filled (two GETs of one key in flight are one outcome's: the second
                        # found its bytes taken by the first and came out empty)
                        if fetcher is not None and item.key not in submitted:
                            fetcher.submit(item)
                            submitted.add(item.key)
                    window.append((item, data))
                if not window:
                    return
                item, data = window.popleft()
                if data is None:
                    if fetcher is not None and item.key in submitted:
                        submitted.discard(item.key)
                        data = self._finish(cache, fetcher, item)
                    else:
                        data = self._read_counted(cache, item)
                yield item, data
        finally:            # a reader that stopped early: its fetches ahead are not waited for
            table.settle()
            if fetcher is not None:
                for item, data in window:
                    if data is None and item.key in submitted:
                        fetcher.abandon(item)

    def _samples(self, indexes: Iterable[int]) -> Iterator[Any]:
        """Iteration: the samples of ``indexes``, ``prefetch`` ahead; counters published as it goes."""
        slot = self._slot()
        table = self._hits.table(self._cache_ref.get())
        for n, (item, data) in enumerate(self._stream(indexes, self.prefetch), 1):
            if n & 255 == 0:
                table.refresh()
                table.settle()
                slot.publish()
            yield self._sample(item, data)
        slot.publish()

    # -- the hit path and the per-worker counters (ml/_workers.py) -----------------------------------

    def worker_stats(self) -> list[dict[str, int]]:
        """The counters of every process that read through this dataset (this one and its
        ``DataLoader`` workers, each since it started), one dict per process, as each one last
        published them (at the end of each batch, every 256 samples of an iteration and at its end):
        ``pid``, ``samples``, ``packed_hits`` (hits read by one ``pread`` from a pack), ``hits``
        (all hits), ``fetched`` (misses), ``hit_ns`` (time in the hit path), ``hit_bytes``,
        ``fetched_bytes``, and the cache's write-behind of that process (``fills_queued``,
        ``fill_bytes_queued``, ``fills_done``, ``fill_bytes_done``, ``fills`` accounted,
        ``fills_dropped``)."""
        return self._board.gather()

    def _slot(self) -> Slot:
        slot = self._board.slot()
        if slot.cache_stats is None:
            slot.cache_stats = self._cache_ref.get().process_stats
        return slot

    def _hit_path(self) -> HitPath:
        """The object ids of the listing's versions (for the hit path: ml/_hitpath.py)."""
        listing = self._listing
        cache = self._cache_ref.get()
        items = listing.items
        if listing.bucket is not None:
            ids = cache.object_ids([it.url for it in items], etags=[it.etag for it in items],
                                   sizes=[it.size for it in items], settings=listing.settings)
            return HitPath(ids, files=False)
        stats = listing.take_stats()
        there = [k for k, st in enumerate(stats) if st is not None]
        found = cache.object_ids([items[k].url for k in there], stats=[stats[k] for k in there])
        ids = bytearray(16 * len(items))        # (a file gone since it was listed: all zeros, never found)
        for n, k in enumerate(there):
            ids[16 * k:16 * k + 16] = found[16 * n:16 * n + 16]
        return HitPath(bytes(ids), files=True)

    def _cached(self, cache: Cache, item: Item, index: int, read: Callable, elsewhere: Any,
                values: list[int]) -> bytes | None:
        """The object from the cache at its listed version, or None; counted and timed (``read``:
        this thread's hit path; ``elsewhere``: its table when what it does not hold may be held
        elsewhere in this process only, else None; ``values``: this process's counters)."""
        t0 = time.perf_counter_ns()
        data = read(index, item.url)
        if data is not None:
            values[1] += 1                          # packed_hits
        elif elsewhere is not None and item.size is not None and item.size <= elsewhere.packed_max:
            data = elsewhere.get_elsewhere(index, item.size)
        else:
            data = self._cached_export(cache, item)     # (held in blocks, perhaps: the general path)
        values[0] += 1                              # samples
        if data is not None:
            values[2] += 1                          # hits
            values[5] += len(data)                  # hit_bytes
        values[4] += time.perf_counter_ns() - t0    # hit_ns
        return data

    def _fetched(self, data: bytes) -> None:
        values = self._slot().values
        values[3] += 1
        values[6] += len(data)

    def _read_counted(self, cache: Cache, item: Item) -> bytes:
        data = self._read(cache, item)
        self._fetched(data)
        return data


class Dataset(_Base):
    """A map-style dataset over an S3 prefix or a local/NFS folder, in key order, read through a cache.

    Args:
        source: ``s3://bucket/prefix/`` (s3pull's wildcards: ``s3://bucket/train/*.jpg``) or a folder
            (every file under it) or one file.
        cache: a cache directory or a :class:`~manyfiles.cache.Cache` (every process of the machine
            shares the directory; each opens it once).
        transform: called with each :class:`Sample` (``key``, ``data``); its result is the item.
            Default: the Sample itself.
        include, exclude: s3pull's filters, on names or paths relative to the source.
        settings: :class:`manyfiles.s3.ClientSettings` (endpoint, profile...).
        prefetch: objects fetched ahead when iterating (``for sample in ds``).
        offline: None (default): when S3 cannot be reached, the listing kept in the cache and the
            objects it holds are served (warned once per process; an object it does not hold raises
            :class:`~manyfiles.errors.OfflineMiss`); True: never ask S3; False: never fall back.

    ``ds[i]``, ``len(ds)``, ``ds.keys``, iteration (key order), ``ds.refresh()``.  ``DataLoader``
    calls ``ds.__getitems__(batch)``, which fetches the misses of the batch at once.
    """

    def __init__(self, source: Source, cache: CacheArg, transform: Callable | None = None,
                 *, include: Iterable[str] = (), exclude: Iterable[str] = (), settings: Any = None,
                 prefetch: int = DEFAULT_PREFETCH, offline: bool | None = None) -> None:
        super().__init__(source, cache, transform, include=include, exclude=exclude, settings=settings,
                         prefetch=prefetch, offline=offline)

    def __getitem__(self, index: int) -> Any:
        items = self._listing.items
        if isinstance(index, slice) or (not isinstance(index, int) and not hasattr(index, "__index__")):
            raise TypeError(f"dataset indices must be integers, not {type(index).__name__}")
        item = items[index]             # IndexError past the end, as a list
        cache = self._cache_ref.get()
        table = self._hits.table(cache)
        slot = self._slot()
        if slot.values[0] & 63 == 0:
            table.refresh()
        data = self._cached(cache, item, index % len(items), self._hits.reader(table),
                            self._hits.elsewhere(table), slot.values)
        if data is None:
            data = self._read_counted(cache, item)
        table.settle()
        if slot.values[0] & 63 == 0:
            slot.publish()
        return self._sample(item, data)

    def __getitems__(self, indexes: list[int]) -> list[Any]:
        """A batch (what ``DataLoader`` asks for): what the packs hold read in one call (one
        ``preadv`` per run of records close together in a pack), every miss of it fetched at once."""
        n = len(self._listing.items)
        return self._batch([i + n if i < 0 else i for i in indexes])

    def __iter__(self) -> Iterator[Any]:
        yield from self._samples(range(len(self)))


class IterableDataset(_Base):
    """An iterable dataset: shards by ``DataLoader`` worker and by distributed rank, shuffles by
    seed and epoch, prefetches ``prefetch`` objects ahead through the fast engine.

    Arguments as :class:`Dataset`, and:
        shuffle: a new order every epoch (``random.Random(seed + epoch)``), the same in every process.
        seed: the shuffle's seed.
        rank, world_size: this process's place among the training processes (default: from
            ``torch.distributed`` when it is initialized, else the ``RANK``/``WORLD_SIZE`` variables
            ``torchrun`` sets, else 0 of 1).

    Each epoch, every object goes to exactly one (rank, worker).  Call ``set_epoch(n)`` before each
    epoch (as with torch's DistributedSampler) when a ``DataLoader`` copies the dataset into workers;
    iterating the object itself advances the epoch by one each time.  Outside torch, ``worker(i, n)``
    gives the copy that worker ``i`` of ``n`` iterates.
    """

    def __init__(self, source: Source, cache: CacheArg, transform: Callable | None = None,
                 *, include: Iterable[str] = (), exclude: Iterable[str] = (), settings: Any = None,
                 prefetch: int = DEFAULT_PREFETCH, shuffle: bool = False, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, offline: bool | None = None) -> None:
        super().__init__(source, cache, transform, include=include, exclude=exclude, settings=settings,
                         prefetch=prefetch, offline=offline)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self._rank = rank
        self._world_size = world_size
        self._worker: tuple[int, int] | None = None
        if (rank is None) != (world_size is None):
            raise UsageError("give rank and world_size together")
        if world_size is not None and not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} of world_size {world_size}: need 0 <= rank < world_size")

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads (its shuffle order)."""
        self.epoch = int(epoch)

    def worker(self, index: int, count: int) -> IterableDataset:
        """A copy that iterates the share of worker ``index`` of ``count`` (for pools without torch)."""
        if not 0 <= index < count:
            raise UsageError(f"worker {index} of {count}: need 0 <= index < count")
        import copy

        other = copy.copy(self)
        other._fetcher = None
        other._worker = (index, count)
        return other

    def order(self) -> list[int]:
        """The indexes this process (rank, worker) reads this epoch, in reading order."""
        order = list(range(len(self)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        rank, world = self._distributed()
        worker, workers = self._worker_info()
        return order[rank * workers + worker::world * workers]

    def _distributed(self) -> tuple[int, int]:
        if self._world_size is not None:
            return self._rank, self._world_size
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        try:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            rank = int(os.environ.get("RANK", "0"))
        except ValueError:
            return 0, 1
        return (rank, world) if world > 0 and 0 <= rank < world else (0, 1)

    def _worker_info(self) -> tuple[int, int]:
        if self._worker is not None:
            return self._worker
        data = sys.modules.get("torch.utils.data")      # loaded in a DataLoader worker; never imported here
        info = data.get_worker_info() if data is not None else None
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def __iter__(self) -> Iterator[Any]:
        order = self.order()
        self.epoch += 1          # the next pass is the next epoch (set_epoch sets it explicitly)
        yield from self._samples(order)
