"""What survives a power cut: directory entries are fsynced, and with ``flush=always`` readers see
only fsynced records (the high watermark moves with the fsync), unless ``visibility=written``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import broker.log.segment_partition as partition_module
from broker.log.config import FlushPolicy, TopicConfig, Visibility
from broker.log.segment import SegmentLogStore, SegmentPartitionLog
from broker.protocol.records import RecordSpec, decode_all, encode_batch
from tests.broker.log.helpers import open_store

FsyncAll = Callable[[list[int], list[Path]], None]


class FsyncSpy:
    """Records each fsync round's directories; ``hold()`` makes rounds wait until ``release()``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real: FsyncAll = partition_module._fsync_all
        self.rounds: list[list[Path]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        monkeypatch.setattr(partition_module, "_fsync_all", self)

    def __call__(self, files: list[int], dirs: list[Path]) -> None:
        self.rounds.append(list(dirs))
        self.started.set()
        self.gate.wait(10)
        self.real(files, dirs)

    def hold(self) -> None:
        self.gate.clear()
        self.started.clear()

    def release(self) -> None:
        self.gate.set()

    async def wait_started(self) -> None:
        while not self.started.is_set():
            await asyncio.sleep(0.001)


async def test_directory_entries_are_fsynced_before_the_append_is_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = FsyncSpy(monkeypatch)
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.ALWAYS, segment_bytes=300))
    await store.append_records("t", [RecordSpec(b"first")], partition=0)
    # The new partition directory's entry (in the data dir) and the first segment's (in it).
    assert set(spy.rounds[0]) == {tmp_path / "t-0", tmp_path}
    spy.rounds.clear()
    await store.append_records("t", [RecordSpec(b"second")], partition=0)
    assert spy.rounds == [[]]  # nothing new in the directory: no directory fsync
    spy.rounds.clear()
    while store.partition("t", 0).log_end_offset < 10:  # rolls every few records (segment_bytes=300)
        await store.append_records("t", [RecordSpec(b"x" * 100)], partition=0)
    assert [tmp_path / "t-0"] in spy.rounds  # a rolled segment's entry is fsynced with its round
    await store.close()


async def test_topic_metadata_is_replaced_atomically_and_its_directory_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import broker.log.files as files_module

    synced: list[Path] = []
    real = files_module.fsync_dir

    def spy(path: Path) -> None:
        synced.append(path)
        real(path)

    monkeypatch.setattr(files_module, "fsync_dir", spy)
    store = await open_store(tmp_path)
    synced.clear()
    store.create_topic("t", 2)
    assert synced == [tmp_path] and not (tmp_path / "topics.json.tmp").exists()
    await store.close()


async def test_readers_see_only_fsynced_records_under_flush_always(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = FsyncSpy(monkeypatch)
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.ALWAYS))
    log = store.partition("t", 0)
    await store.append_records("t", [RecordSpec(b"synced", timestamp=1_000)], partition=0)
    spy.hold()
    append = asyncio.create_task(store.append_records("t", [RecordSpec(b"pending", timestamp=2_000)],
                                                      partition=0))
    await spy.wait_started()  # written, its fsync is running
    reader = asyncio.create_task(log.wait_for_data(1, timeout=10))
    await asyncio.sleep(0.01)
    assert log.log_end_offset == 2 and log.high_watermark == 1
    assert [r.value for r in decode_all(log.read(0, 1 << 20))] == [b"synced"]
    assert log.read(1, 1 << 20) == b""  # between the high watermark and the log end: empty, not an error
    assert log.offset_for_timestamp(1_500) is None  # ListOffsets by time does not see it either
    assert not append.done() and not reader.done()
    spy.release()
    await append
    assert await reader is True and log.high_watermark == 2  # readers are woken by the fsync
    assert [r.value for r in decode_all(log.read(0, 1 << 20))] == [b"synced", b"pending"]
    assert log.offset_for_timestamp(1_500) == 1
    await store.close()


async def test_written_visibility_shows_records_before_their_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = FsyncSpy(monkeypatch)
    store = SegmentLogStore(tmp_path, visibility=Visibility.WRITTEN)
    await store.start()
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.ALWAYS))
    log = store.partition("t", 0)
    spy.hold()
    append = asyncio.create_task(store.append_records("t", [RecordSpec(b"early")], partition=0))
    await spy.wait_started()
    assert log.high_watermark == 1 and [r.value for r in decode_all(log.read(0, 100))] == [b"early"]
    spy.release()
    await append
    await store.close()


async def test_durable_visibility_stops_reads_at_the_synced_position_across_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A roll while records are unsynced: reads of the older segment stop where the last fsync ended,
    the new segment is not read at all."""
    spy = FsyncSpy(monkeypatch)
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.ALWAYS, segment_bytes=400))
    log = store.partition("t", 0)
    assert isinstance(log, SegmentPartitionLog)
    for i in range(3):
        await store.append_records("t", [RecordSpec(b"%d" % i + b"." * 60)], partition=0)
    spy.hold()
    pending = [asyncio.create_task(log.append(encode_batch([RecordSpec(b"p%d" % i + b"." * 60)])))
               for i in range(6)]
    await spy.wait_started()
    assert log.segment_count > 1 and log.log_end_offset == 9 and log.high_watermark == 3
    assert [r.offset for r in decode_all(log.read(0, 1 << 20))] == [0, 1, 2]
    spy.release()
    await asyncio.gather(*pending)
    assert log.high_watermark == 9
    assert [r.offset for r in decode_all(log.read(0, 1 << 20))] == list(range(9))
    await store.close()


async def test_leaving_flush_always_shows_everything_written(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.INTERVAL, flush_interval_ms=60_000))
    log = store.partition("t", 0)
    await store.append_records("t", [RecordSpec(b"a")], partition=0)
    assert log.high_watermark == 1  # interval/os promise nothing per write: visible at once
    await store.alter_topic_config("t", TopicConfig(flush=FlushPolicy.ALWAYS))
    assert log.high_watermark == 1  # the switch flushed what was written
    await store.close()
