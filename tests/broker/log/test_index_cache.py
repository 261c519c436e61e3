"""Closed segments' indexes are bounded in memory: dropped least recently used, reloaded on use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.log.index import SegmentIndex
from broker.log.indexcache import IndexCache
from tests.broker.log.helpers import Model, open_store
from tests.broker.log.test_segment_store import SMALL, check_against, fill, seg_log


@dataclass
class Holder:
    index: SegmentIndex | None
    active: bool = False


def index_of(entries: int) -> SegmentIndex:
    index = SegmentIndex(interval=1)
    for i in range(entries):
        index.on_batch(position=10 * i + 10, rel_base=i + 1, rel_last=i + 1, max_ts=i, size=10)
    return index


def test_least_recently_used_indexes_are_dropped_past_the_bound() -> None:
    size = index_of(10).nbytes
    cache = IndexCache(limit=2 * size)
    a, b, c = Holder(index_of(10)), Holder(index_of(10)), Holder(index_of(10))
    cache.hold(a)
    cache.hold(b)
    cache.hold(a)  # a is now the most recent
    cache.hold(c)
    assert b.index is None and a.index is not None and c.index is not None
    assert cache.held_bytes == 2 * size and cache.evictions == 1 and len(cache) == 2


def test_active_segments_and_released_ones_are_not_held() -> None:
    cache = IndexCache(limit=1)
    active = Holder(index_of(10), active=True)
    cache.hold(active)
    assert len(cache) == 0 and active.index is not None
    gone = Holder(index_of(10))
    cache.hold(gone)  # alone over the bound: the one being used is kept
    assert gone.index is not None and len(cache) == 1
    cache.release(gone)
    assert len(cache) == 0 and cache.held_bytes == 0


def test_entries_cost_bytes_not_objects() -> None:
    assert index_of(1000).nbytes <= 20 * 1000


async def test_reading_a_whole_log_keeps_closed_indexes_under_the_bound(tmp_path: Path) -> None:
    bound = 600  # bytes: a few of the small segments' indexes
    store = await open_store(tmp_path, index_cache_bytes=bound)
    store.create_topic("t", 1, SMALL)
    model = Model()
    await fill(store, model, 300, seed=3)
    log = seg_log(store)
    assert log.segment_count > 10
    check_against(log, model)  # every offset, batch and timestamp lookup, across evictions
    assert store.indexes.evictions > 0
    assert store.indexes.held_bytes <= bound + max(s.index.nbytes for s in log._segments if s.index)
    await store.close()

    store = await open_store(tmp_path, index_cache_bytes=bound)
    log = seg_log(store)
    check_against(log, model)  # after a restart the indexes come from their files, bounded the same way
    assert store.indexes.evictions > 0 and store.indexes.held_bytes <= 2 * bound
    await fill(store, model, 40, seed=4)  # rolls hand closed segments to the cache
    check_against(log, model)
    await store.close()
