"""Creating, growing and deleting topics: all or nothing, within the caps, safe when concurrent."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from broker.errors import (
    InvalidPartitionsError,
    PolicyViolationError,
    StorageError,
    TopicExistsError,
    UnknownTopicError,
)
from broker.log.api import LogStore, PartitionLimits
from broker.log.config import FlushPolicy, TopicConfig
from broker.protocol.records import RecordSpec
from tests.broker.log.conftest import STORE_FACTORIES
from tests.broker.log.helpers import all_records, open_store


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with file contents (None for directories), the lock excepted."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            if f != ".lock":
                out[os.path.relpath(os.path.join(dirpath, f), root)] = Path(dirpath, f).read_bytes()
    return out


async def test_a_create_that_cannot_save_metadata_leaves_nothing_behind(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("keep", 2)
    await store.append_records("keep", [RecordSpec(b"kept")], partition=1)
    (tmp_path / "topics.json.tmp").mkdir()  # the metadata write fails (EISDIR), as on a full disk
    before = _tree(tmp_path)
    with pytest.raises(StorageError, match="topics.json"):
        store.create_topic("wide", 500)
    assert [t.name for t in store.list_topics()] == ["keep"]
    assert _tree(tmp_path) == before  # no partition directories, topics.json untouched
    with pytest.raises(StorageError, match="topics.json"):
        store.create_partitions("keep", 40)
    assert store.topic("keep").partitions == 2 and len(store.partitions("keep")) == 2
    assert _tree(tmp_path) == before
    (tmp_path / "topics.json.tmp").rmdir()
    await store.append_records("keep", [RecordSpec(b"still")], partition=1)
    await store.close()
    store = await open_store(tmp_path)
    assert [t.name for t in store.list_topics()] == ["keep"] and store.topic("keep").partitions == 2
    assert [r.value for r in all_records(store.partition("keep", 1))] == [b"kept", b"still"]
    store.create_topic("wide", 500)  # the name is free
    await store.close()


async def test_creating_partitions_costs_no_files_until_they_are_written(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("wide", 1_000)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == []
    assert json.loads((tmp_path / "topics.json").read_text())["topics"][0]["partitions"] == 1_000
    await store.append_records("wide", [RecordSpec(b"x")], partition=7)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["wide-7"]
    await store.close()
    store = await open_store(tmp_path)  # unwritten partitions come back empty, still without files
    assert store.topic("wide").partitions == 1_000
    assert store.partition("wide", 7).high_watermark == 1 and store.partition("wide", 8).high_watermark == 0
    assert store.partition("wide", 8).read(0, 100) == b""
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["wide-7"]
    await store.append_records("wide", [RecordSpec(b"y")], partition=8)
    await store.close()


@pytest.mark.parametrize("kind", sorted(STORE_FACTORIES))
async def test_partition_caps(kind: str, tmp_path: Path) -> None:
    store: LogStore = STORE_FACTORIES[kind](tmp_path, limits=PartitionLimits(per_request=100, total=150))
    await store.start()
    with pytest.raises(PolicyViolationError, match="Excessively large number of partitions per request"):
        store.create_topic("a", 101)
    with pytest.raises(InvalidPartitionsError, match="non-positive"):
        store.create_topic("a", 0)
    store.create_topic("a", 100)
    with pytest.raises(PolicyViolationError, match=r"would bring the broker to 151 .*storage.max_partitions"):
        store.create_topic("b", 51)
    with pytest.raises(PolicyViolationError, match="storage.max_partitions"):
        store.create_partitions("a", 151)
    with pytest.raises(InvalidPartitionsError, match="higher than the requested 99"):
        store.create_partitions("a", 99)
    assert store.create_partitions("a", 150).partitions == 150
    assert [log.partition for log in store.partitions("a")] == list(range(150))
    with pytest.raises(PolicyViolationError):
        store.validate_create("b", 1)
    assert [t.name for t in store.list_topics()] == ["a"]
    await store.close()


async def _topic_with_unsynced_data(store: LogStore, name: str) -> None:
    """Partitions whose close must wait for an fsync in a worker thread (so a delete yields there)."""
    store.create_topic(name, 3, TopicConfig(flush=FlushPolicy.INTERVAL, flush_interval_ms=60_000))
    for p in range(3):
        await store.append_records(name, [RecordSpec(b"x")], partition=p)


async def test_concurrent_deletes_of_one_topic(tmp_path: Path) -> None:
    """Two deletes racing: one wins, the other is told the topic is unknown (it was a KeyError)."""
    store = await open_store(tmp_path)
    await _topic_with_unsynced_data(store, "t")
    results = await asyncio.gather(store.delete_topic("t"), store.delete_topic("t"), return_exceptions=True)
    assert results[0] is None and isinstance(results[1], UnknownTopicError), results
    assert not store.has_topic("t") and not list(tmp_path.glob("t-*"))
    await store.close()


async def test_a_topic_being_deleted_cannot_be_created_again_until_its_files_are_gone(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    await _topic_with_unsynced_data(store, "t")
    deleting = asyncio.create_task(store.delete_topic("t"))
    await asyncio.sleep(0)  # the delete is waiting for an fsync
    assert not deleting.done() and not store.has_topic("t")
    with pytest.raises(TopicExistsError, match="marked for deletion"):
        store.create_topic("t", 1)
    await deleting
    store.create_topic("t", 1)
    await store.append_records("t", [RecordSpec(b"new")], partition=0)
    await store.close()
    store = await open_store(tmp_path)
    assert [r.value for r in all_records(store.partition("t", 0))] == [b"new"]
    await store.close()
