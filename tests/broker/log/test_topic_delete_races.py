"""A topic being deleted is gone at once for everyone else (found by ``python -m bench.fuzz http --connections 4``).

``delete_topic`` awaited the partitions' close between taking the partitions away and taking the topic
away: meanwhile a listing (``/metrics``, ``GET /topics``) saw a topic without partitions, a second delete
or a config change hit ``KeyError`` and logged a traceback. Kafka answers a second delete
UNKNOWN_TOPIC_OR_PARTITION and refuses to re-create a name still being deleted.
"""

from __future__ import annotations

import asyncio

import pytest

from broker.errors import TopicExistsError, UnknownTopicError
from broker.log.api import LogStore
from broker.log.config import FlushPolicy, TopicConfig
from broker.protocol.records import RecordSpec, encode_batch

# Data not yet synced makes closing a partition wait for its fsync: the window the races need.
LAZY = TopicConfig(flush=FlushPolicy.INTERVAL, flush_interval_ms=60_000)


def _create_with_unsynced_data(store: LogStore, name: str, partitions: int) -> None:
    store.create_topic(name, partitions, LAZY)


async def _while_deleting(store: LogStore, name: str) -> asyncio.Task[None]:
    for p in range(len(store.partitions(name))):
        await store.append(name, p, encode_batch([RecordSpec(b"unsynced")]))
    task = asyncio.create_task(store.delete_topic(name))
    await asyncio.sleep(0)  # the delete runs up to its first await
    return task


async def test_two_deletes_of_one_topic_one_wins_the_other_is_unknown(store: LogStore) -> None:
    _create_with_unsynced_data(store, "t", 3)
    await store.append("t", 0, encode_batch([RecordSpec(b"unsynced")]))
    results = await asyncio.gather(store.delete_topic("t"), store.delete_topic("t"), return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["NoneType", "UnknownTopicError"], results
    assert not store.has_topic("t")


async def test_a_listing_during_a_delete_never_sees_a_topic_without_partitions(store: LogStore) -> None:
    _create_with_unsynced_data(store, "t", 3)
    task = await _while_deleting(store, "t")
    for info in store.list_topics(include_internal=True):
        assert len(store.partitions(info.name)) == info.partitions
    with pytest.raises(UnknownTopicError):
        await store.alter_topic_config("t", TopicConfig())
    await task
    assert [t.name for t in store.list_topics()] == []


async def test_a_name_being_deleted_cannot_be_created_until_the_delete_is_done(store: LogStore) -> None:
    _create_with_unsynced_data(store, "t", 2)
    task = await _while_deleting(store, "t")
    if not task.done():  # the store's close suspended: the name is still being deleted
        with pytest.raises(TopicExistsError, match="marked for deletion"):
            store.create_topic("t", 1)
    await task
    assert store.create_topic("t", 1).partitions == 1


async def test_a_config_change_that_a_delete_overtakes_does_not_bring_the_topic_back(store: LogStore) -> None:
    # alter_topic_config flushes each partition before switching (an await); a delete landing meanwhile
    # left the topic listed without partitions for good: every /metrics scrape and delete hit KeyError.
    _create_with_unsynced_data(store, "t", 3)
    for p in range(3):
        await store.append("t", p, encode_batch([RecordSpec(b"unsynced")]))
    alter = asyncio.create_task(store.alter_topic_config("t", TopicConfig()))
    await asyncio.sleep(0)  # the config change is inside its first flush (if the store's flush waits)
    overtaken = not alter.done()
    await store.delete_topic("t")
    if overtaken:
        with pytest.raises(UnknownTopicError):
            await alter
    else:
        await alter
    assert not store.has_topic("t")
    assert [t.name for t in store.list_topics(include_internal=True)] == []
    store.create_topic("t", 1)
    assert len(store.partitions("t")) == 1
