"""Bad input and unusable data directories: a clear error, and the stored data stays as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.errors import (
    CorruptRecordError,
    InvalidTopicError,
    RecordTooLargeError,
    StorageError,
    UnknownTopicError,
    UnsupportedMagicError,
)
from broker.log.config import TopicConfig
from broker.log.segment import SegmentLogStore
from broker.protocol.records import RecordSpec, encode_batch
from tests.broker.log.helpers import all_records, open_store


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name not in (".lock", ".clean-shutdown", "recovery-checkpoint.json")}


async def stored_store(root: Path) -> SegmentLogStore:
    store = await open_store(root)
    store.create_topic("keep", 1, TopicConfig(max_message_bytes=2000))
    for i in range(5):
        await store.append_records("keep", [RecordSpec(b"value-%d" % i)], partition=0)
    return store


async def test_bad_batches_are_refused_and_nothing_reaches_the_files(tmp_path: Path) -> None:
    store = await stored_store(tmp_path)
    await store.flush()
    before = snapshot(tmp_path)
    good = encode_batch([RecordSpec(b"x")])
    corrupt = bytearray(good)
    corrupt[-2] ^= 0x55
    magic = bytearray(good)
    magic[16] = 1
    cases: list[tuple[bytes, type[Exception], str]] = [
        (bytes(corrupt), CorruptRecordError, "CRC mismatch"),
        (bytes(magic), UnsupportedMagicError, "magic 1"),
        (good[:40], CorruptRecordError, "truncated"),
        (good + good[:20], CorruptRecordError, "truncated"),  # one good batch followed by a torn one
        (encode_batch([RecordSpec(b"z" * 3000)]), RecordTooLargeError, "max.message.bytes=2000"),
    ]
    for data, error, text in cases:
        with pytest.raises(error, match=text):
            await store.append("keep", 0, data)
    with pytest.raises(UnknownTopicError, match="unknown topic 'nope'"):
        await store.append("nope", 0, good)
    with pytest.raises(InvalidTopicError, match="characters other than"):
        store.create_topic("bad/name", 1)
    assert snapshot(tmp_path) == before
    await store.close()
    store = await open_store(tmp_path)
    assert [r.value for r in all_records(store.partition("keep", 0))] == [b"value-%d" % i for i in range(5)]
    assert [t.name for t in store.list_topics()] == ["keep"]
    await store.close()


async def test_data_dir_under_a_regular_file_is_a_clear_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = SegmentLogStore(blocker / "logs")
    with pytest.raises(StorageError, match=r"cannot create data directory .*file/logs: Not a directory"):
        await store.start()
    assert blocker.read_text() == "not a directory"
    await store.close()


async def test_data_dir_that_is_a_file_is_a_clear_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file")
    with pytest.raises(StorageError, match="cannot create data directory"):
        await open_store(blocker)


async def test_second_store_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    store = await stored_store(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(StorageError, match="in use by another Sluice process"):
        await open_store(tmp_path)
    assert snapshot(tmp_path) == before
    await store.append_records("keep", [RecordSpec(b"after")], partition=0)  # the first store still works
    await store.close()


async def test_partition_path_taken_by_a_file_fails_that_partitions_writes_only(tmp_path: Path) -> None:
    """A partition's directory is made by its first write, so that is what fails (creating needs no files)."""
    store = await stored_store(tmp_path)
    (tmp_path / "other-0").write_text("in the way")  # tests run as root: modes would not stop us
    store.create_topic("other", 1)
    with pytest.raises(StorageError, match="cannot create partition directory .*other-0"):
        await store.append_records("other", [RecordSpec(b"refused")], partition=0)
    assert store.partition("other", 0).log_end_offset == 0
    await store.append_records("keep", [RecordSpec(b"still fine")], partition=0)
    (tmp_path / "other-0").unlink()
    await store.append_records("other", [RecordSpec(b"now stored")], partition=0)
    await store.close()
    store = await open_store(tmp_path)
    assert sorted(t.name for t in store.list_topics()) == ["keep", "other"]
    assert store.partition("keep", 0).high_watermark == 6
    assert [r.value for r in all_records(store.partition("other", 0))] == [b"now stored"]
    await store.close()


async def test_unreadable_topic_metadata_is_refused_and_left_for_the_operator(tmp_path: Path) -> None:
    store = await stored_store(tmp_path)
    await store.close()
    (tmp_path / "topics.json").write_text('{"topics": [{"name": ')
    before = snapshot(tmp_path)
    with pytest.raises(StorageError, match=r"topics.json is not valid JSON"):
        await open_store(tmp_path)
    assert snapshot(tmp_path) == before
    (tmp_path / "topics.json").write_text('{"topics": [{"nom": "keep"}]}')
    with pytest.raises(StorageError, match="does not describe topics"):
        await open_store(tmp_path)


async def test_store_must_be_started(tmp_path: Path) -> None:
    store = SegmentLogStore(tmp_path)
    with pytest.raises(StorageError, match="not started"):
        store.create_topic("t", 1)
    await store.close()


async def test_failed_fsync_is_reported_and_the_partition_refuses_more_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import broker.log.segment_partition as segment_module

    store = await stored_store(tmp_path)

    def failing(files: list[int], dirs: list[Path]) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(segment_module, "_fsync_all", failing)  # the disk reports EIO on fsync
    with pytest.raises(StorageError, match="fsync failed .*Input/output error"):
        await store.append_records("keep", [RecordSpec(b"unsure")], partition=0)
    with pytest.raises(StorageError, match="refuses writes until restart"):
        await store.append_records("keep", [RecordSpec(b"refused")], partition=0)
    monkeypatch.undo()
    with pytest.raises(StorageError):
        await store.close()
    store = await open_store(tmp_path)  # a restart recovers; the 5 synced records are there
    assert store.recovery_stats["clean"] == 0  # a failed partition never leaves a clean-shutdown marker
    values = [r.value for r in all_records(store.partition("keep", 0))]
    assert values[:5] == [b"value-%d" % i for i in range(5)] and b"refused" not in values
    await store.close()
