"""File sources resume exactly after a crash in the middle of a chunk (ingest/file/positions.py).

In process: the store's partitions end the process's work at the n-th write (``Crash``, which nothing in
the sink or the source catches, like a kill at that point: what was written stays, nothing after it
happens), for every n across a replay; a new source on the same store and position file then finishes the
file, and every line must be in the log exactly once, dead letters included. tests/sluice/serve has the
same check with ``kill -9`` of ``sluice serve``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.log.api import TopicInfo
from broker.log.config import FlushPolicy, TopicConfig
from broker.log.memory import MemoryLogStore, MemoryPartitionLog
from broker.log.partition_log import AppendResult, PartitionLog
from broker.protocol.records import BatchHeader
from ingest.file.source import FileSource, FileSourceConfig, PositionStore
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import KeySpec, RouteDefaults, RouteRule
from ingest.sink import IngestSink
from tests.ingest.conftest import records


class Crash(BaseException):
    """The process ends here (not an error anything handles)."""


class CrashingPartitionLog(MemoryPartitionLog):
    store: CrashingStore

    def append_nowait(
        self, data: bytes | bytearray | memoryview, *, verified: bool = False, header: BatchHeader | None = None
    ) -> AppendResult:
        self.store.writes += 1
        if self.store.writes == self.store.crash_at:
            raise Crash
        result = super().append_nowait(data, verified=verified, header=header)
        if self.store.writes == self.store.crash_after:
            raise Crash
        return result


class CrashingStore(MemoryLogStore):
    """Ends the work at the ``crash_at``-th write, before it is made, or after the ``crash_after``-th."""

    def __init__(self) -> None:
        super().__init__(default_partitions=4, default_config=TopicConfig(flush=FlushPolicy.OS))  # no fsyncs
        self.writes = 0
        self.crash_at = -1
        self.crash_after = -1

    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
        log = CrashingPartitionLog(info.name, partition, info.config)
        log.store = self
        return log


def _file(path: Path, fmt: str) -> list[str]:
    """Lines of ``fmt`` (with bad ones among them) written to ``path``; the values expected in the log."""
    rows: list[str] = ["device_id,i"] if fmt == "csv" else []
    good: list[str] = []
    for i in range(120):
        if fmt == "csv":
            row = f"d{i % 5},{i}" if i % 37 else f"d{i % 5},{i},extra"  # a row too many columns: a dead letter
        elif fmt == "ndjson":
            row = json.dumps({"device_id": f"d{i % 5}", "i": i}) if i % 37 else '{"device_id": ' + str(i)
        else:
            row = f"line {i}" + (" " * 300 if i % 37 == 0 else "")  # over max_line_bytes: a dead letter
        rows.append(row)
        good.append(row)
    path.write_text("\n".join(rows) + "\n")
    return good


def _source(store: MemoryLogStore, tmp_path: Path, path: Path, fmt: str, rules: list[RouteRule]) -> FileSource:
    sink = IngestSink(store, Router(rules, RouteDefaults()), HealthRegistry())
    config = FileSourceConfig(name="f", path=path, format=fmt, mode="replay", read_bytes=700, max_line_bytes=200)
    return FileSource(config, sink, sink.health, PositionStore(tmp_path / "state"))


async def _replay(src: FileSource) -> None:
    await src.start()
    try:
        await src.finished.wait()
    finally:
        try:
            await src.stop()
        except Crash:
            pass


def _stored(store: MemoryLogStore) -> list[str]:
    found = [(r.value or b"").decode() for r in records(store, "readings")]
    found += [(r.value or b"").decode() for r in records(store, "_dead_letters")]
    return found


_KEYED = [RouteRule("r", "readings", "file", key=KeySpec("field", "device_id"))]
_KEYLESS = [RouteRule("r", "readings", "file", key=KeySpec("none"))]


@pytest.mark.parametrize(("fmt", "rules"), [("ndjson", _KEYED), ("csv", _KEYED), ("raw", _KEYLESS)])
async def test_a_crash_at_any_write_of_a_replay_stores_every_line_once(tmp_path: Path, fmt: str,
                                                                       rules: list[RouteRule]) -> None:
    path = tmp_path / f"in.{fmt}"
    expected = _file(path, fmt)
    clean = CrashingStore()
    await _replay(_source(clean, tmp_path / "clean", path, fmt, rules))
    total = clean.writes
    assert sorted(v[:200] for v in _stored(clean)) == sorted(v[:200] for v in expected)
    assert total > 8, total  # several chunks, several partitions each
    for n in range(1, total + 1):
        for before in (True, False):
            store = CrashingStore()
            if before:
                store.crash_at = n
            else:
                store.crash_after = n
            state = tmp_path / f"crash-{n}-{before}"
            await _replay(_source(store, state, path, fmt, rules))
            store.crash_at = store.crash_after = -1
            again = _source(store, state, path, fmt, rules)
            await _replay(again)
            assert sorted(v[:200] for v in _stored(store)) == sorted(v[:200] for v in expected), (n, before)
