"""File source: replay, resume after a restart from the saved position, tail with rotation."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict, Unpack

from broker.errors import StorageError
from broker.log.api import LogStore, TopicInfo
from broker.log.memory import MemoryLogStore, MemoryPartitionLog
from broker.log.partition_log import AppendResult, PartitionLog
from broker.protocol.records import BatchHeader
from ingest.file.source import FileSource, FileSourceConfig, PositionStore
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import KeySpec, RouteDefaults, RouteRule, TimeSpec
from ingest.sink import IngestSink
from tests.ingest.conftest import records


class FileOptions(TypedDict, total=False):
    """The fields of ``FileSourceConfig`` a test may set (name and path are fixed by ``_source``)."""

    format: str
    mode: str
    start: str
    poll_interval_s: float
    max_line_bytes: int
    read_bytes: int


def _source(
    store: LogStore, tmp_path: Path, path: Path, *, rules: bool = True, **config: Unpack[FileOptions]
) -> FileSource:
    rule = RouteRule("f", "readings", source_kind="file", key=KeySpec("field", "device_id"),
                     time=TimeSpec("ts", "epoch_ms"))
    sink = IngestSink(store, Router([rule] if rules else [], RouteDefaults()), HealthRegistry())
    cfg = FileSourceConfig(name="readings", path=path, **config)
    return FileSource(cfg, sink, sink.health, PositionStore(tmp_path / "state"))


async def _wait(store: LogStore, topic: str, count: int) -> None:
    deadline = time.monotonic() + 15
    while len(records(store, topic)) < count:
        assert time.monotonic() < deadline, f"{len(records(store, topic))} of {count}"
        await asyncio.sleep(0.02)


async def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 15
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _lines(start: int, stop: int) -> str:
    return "".join(json.dumps({"device_id": f"d{i % 3}", "ts": 1_700_000_000_000 + i, "i": i}) + "\n"
                   for i in range(start, stop))


async def test_replay_then_resume_after_restart(tmp_path: Path) -> None:
    path = tmp_path / "readings.ndjson"
    path.write_text(_lines(0, 500) + '{"device_id": "broken"\n' + '{"device_id": "d9", "ts": 1, "i": -1}')
    store = MemoryLogStore(default_partitions=2)
    first = _source(store, tmp_path, path, format="ndjson", mode="replay", read_bytes=4096)
    await first.start()
    await asyncio.wait_for(first.finished.wait(), 15)
    await first.stop()
    found = records(store, "readings")
    assert len(found) == 501  # the last line had no newline: replay takes it at end of file
    assert {r.timestamp for r in found if r.key == b"d0"} == {1_700_000_000_000 + i for i in range(0, 500, 3)}
    assert len(records(store, "_dead_letters")) == 1
    saved = PositionStore(tmp_path / "state").load("readings")
    assert saved is not None and saved.offset == path.stat().st_size and saved.inode == path.stat().st_ino

    # Restart: the same file grew; only the new lines are read.
    with path.open("a") as f:
        f.write("\n" + _lines(500, 600))
    second = _source(store, tmp_path, path, format="ndjson", mode="replay")
    await second.start()
    await asyncio.wait_for(second.finished.wait(), 15)
    await second.stop()
    ids = sorted(json.loads(r.value or b"")["i"] for r in records(store, "readings"))
    assert ids == [-1, *range(600)]  # nothing read twice, nothing skipped


async def test_tail_follows_appends_truncation_and_rotation(tmp_path: Path) -> None:
    path = tmp_path / "app.log"
    path.write_text("ignored-before-start\n")
    store = MemoryLogStore()
    src = _source(store, tmp_path, path, rules=False, format="raw", mode="tail", start="end", poll_interval_s=0.02)
    await src.start()
    try:
        await asyncio.wait_for(src.following.wait(), 15)  # "end" is where the file ended when it was opened
        with path.open("a") as f:
            f.write("line one\nline tw")
            f.flush()
            await _until(lambda: src.read_offset == path.stat().st_size, "the partial line read")
            f.write("o\n")
        await _wait(store, "file", 2)
        assert [r.value for r in records(store, "file")] == [b"line one", b"line two"]
        # rotation: the old file moves away, a new one takes its name
        os.rename(path, tmp_path / "app.log.1")
        path.write_text("after rotation\n")
        await _wait(store, "file", 3)
        assert records(store, "file")[-1].value == b"after rotation"
        assert src.files_opened == 2
        # truncation in place: noticed (the file is followed from 0 again) before anything new is written
        path.write_text("")
        await _until(lambda: src.files_opened == 3, "the truncation noticed")
        path.write_text("fresh\n")
        await _wait(store, "file", 4)
        assert records(store, "file")[-1].value == b"fresh"
    finally:
        await src.stop()


async def test_csv_file_resume_rereads_header(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("device_id,ts,v\nd1,1700000000000,1\nd2,1700000000001,2\n")
    store = MemoryLogStore()
    src = _source(store, tmp_path, path, format="csv", mode="replay")
    await src.start()
    await asyncio.wait_for(src.finished.wait(), 15)
    with path.open("a") as f:
        f.write("d3,1700000000002,3\n")
    again = _source(store, tmp_path, path, format="csv", mode="replay")
    await again.start()
    await asyncio.wait_for(again.finished.wait(), 15)
    found = records(store, "readings")
    assert [(r.key, r.timestamp) for r in found] == [
        (b"d1", 1_700_000_000_000), (b"d2", 1_700_000_000_001), (b"d3", 1_700_000_000_002)
    ]
    assert not store.has_topic("_dead_letters")


class FailingPartitionLog(MemoryPartitionLog):
    """A partition of ``FailingStore``: every write fails while the store is ``broken``."""

    store: FailingStore

    def append_nowait(
        self, data: bytes | bytearray | memoryview, *, verified: bool = False, header: BatchHeader | None = None
    ) -> AppendResult:
        if self.store.broken:
            self.store.refused.set()
            raise StorageError(f"cannot append to {self.topic}-{self.partition}: No space left on device")
        return super().append_nowait(data, verified=verified, header=header)


class FailingStore(MemoryLogStore):
    """The in-memory store on a disk that fails while ``broken`` is set (every append: StorageError)."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True
        self.refused = asyncio.Event()

    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
        log = FailingPartitionLog(info.name, partition, info.config)
        log.store = self
        return log


async def test_storage_failure_is_retried_from_the_saved_position_not_dead_lettered(tmp_path: Path) -> None:
    path = tmp_path / "readings.ndjson"
    path.write_text(_lines(0, 50))
    store = FailingStore()
    src = _source(store, tmp_path, path, format="ndjson", mode="replay", poll_interval_s=0.01)
    await src.start()
    try:
        await asyncio.wait_for(store.refused.wait(), 15)
        saved = PositionStore(tmp_path / "state").load("readings")
        assert saved is None or saved.offset == 0  # nothing durable: the next line to store is still the first
        store.broken = False
        await asyncio.wait_for(src.finished.wait(), 15)
    finally:
        await src.stop()
    assert sorted(json.loads(r.value or b"")["i"] for r in records(store, "readings")) == list(range(50))
    assert not store.has_topic("_dead_letters")
    assert src.sink.storage_failures >= 1
