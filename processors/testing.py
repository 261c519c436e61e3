"""Test helpers: a fake clock, an in-memory source and sink, and a synchronous harness.

``FakeClock`` moves only on ``advance``; ``sleep`` waits until the clock has moved far enough, so
runner loops driven by it never sleep in real time. ``Harness`` feeds records straight into an
``Executor`` (one call per batch) and decodes what the sinks produced. ``MemorySource`` and
``MemorySink`` stand in for the log in the async runner.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from broker.protocol.records import Record
from processors.checkpoint import CheckpointCodec, CheckpointRecord, PartitionRestore, restore_executor, take_checkpoint
from processors.executor import Executor, OutRecord, RecordLike, TopicPartition
from processors.pipeline import Pipeline, Stream
from processors.serde import HEADER_EMIT, HEADER_WATERMARK
from processors.sources import AssignmentListener

__all__ = ["FakeClock", "Harness", "MemoryCheckpointStore", "MemorySink", "MemorySource", "decode_output"]


class FakeClock:
    """Processing time under the test's control (ms since the epoch)."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        self._now += ms
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + round(seconds * 1000), next(self._seq), future))
        await future


def decode_output(record: OutRecord | Record) -> dict[str, Any]:
    """An output record as a dict: its JSON value plus ``_key``/``_headers``/``_ts``."""
    value = json.loads(record.value) if record.value else None
    out = dict(value) if isinstance(value, dict) else {"value": value}
    out["_key"] = json.loads(record.key) if record.key else None
    out["_headers"] = {k: (v.decode() if v is not None else None) for k, v in record.headers}
    out["_ts"] = record.timestamp
    return out


def _as_pipeline(p: Pipeline | Stream) -> Pipeline:
    return p.pipeline if isinstance(p, Stream) else p


class Harness:
    """Drive a pipeline by hand: ``send`` records, ``advance`` the clock, read ``outputs``."""

    def __init__(self, pipeline: Pipeline | Stream, *, clock: FakeClock | None = None, partitions: int = 1,
                 restore: list[CheckpointRecord] | None = None) -> None:
        """``restore``: start from checkpoint records (``checkpoint()`` of an earlier harness), the
        way a runner restores after a restart."""
        self.pipeline = _as_pipeline(pipeline)
        self.clock = clock or FakeClock()
        self.topic = self.pipeline.source_config.topics[0]
        self.executor = Executor(self.pipeline, self.clock.now_ms())
        self.offsets: dict[int, int] = defaultdict(int)
        self.partitions = partitions
        self.codec = CheckpointCodec()
        tps = [(self.topic, p) for p in range(partitions)]
        restores = self.codec.decode(restore) if restore is not None else {}
        restore_executor(self.executor, [(tp, restores.get(tp)) for tp in tps], self.clock.now_ms())
        for tp, r in restores.items():
            self.offsets[tp[1]] = max(r.offset, 0)
        self.sent: list[OutRecord] = []

    def checkpoint(self) -> list[CheckpointRecord]:
        """The records a runner would store for a checkpoint now (every partition)."""
        positions = {(self.topic, p): self.offsets[p] for p in range(self.partitions)}
        cp = take_checkpoint(self.pipeline.name, self.executor, positions, self.clock.now_ms())
        return self.codec.encode(cp)

    def _record(self, partition: int, value: Any, timestamp: int | None, key: bytes | None,
                headers: tuple[tuple[str, bytes | None], ...] = ()) -> Record:
        offset = self.offsets[partition]
        self.offsets[partition] += 1
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        return Record(offset, timestamp if timestamp is not None else self.clock.now_ms(), key, raw, headers)

    def send(self, value: Any, *, partition: int = 0, timestamp: int | None = None, key: bytes | None = None) -> None:
        self.send_batch([value], partition=partition, timestamps=[timestamp] if timestamp is not None else None,
                        key=key)

    def send_batch(self, values: Sequence[Any], *, partition: int = 0, timestamps: Sequence[int] | None = None,
                   key: bytes | None = None) -> None:
        stamps: Iterable[int | None] = timestamps if timestamps is not None else [None] * len(values)
        records = [self._record(partition, v, t, key) for v, t in zip(values, stamps, strict=True)]
        self.executor.process((self.topic, partition), records, self.clock.now_ms())
        self._collect()

    def send_each(self, values: Iterable[Any], *, partition: int = 0) -> None:
        for v in values:
            self.send(v, partition=partition)

    def heartbeat(self, watermark: int, *, partition: int = 0) -> None:
        """A punctuation record: nothing at or before ``watermark`` will follow on this partition."""
        record = self._record(partition, b"", None, None, ((HEADER_WATERMARK, str(watermark).encode()),))
        self.executor.process((self.topic, partition), [record], self.clock.now_ms())
        self._collect()

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.executor.tick(self.clock.now_ms())
        self._collect()

    def eof(self) -> None:
        self.executor.eof(self.clock.now_ms())
        self._collect()

    def _collect(self) -> None:
        self.sent.extend(self.executor.take_outputs())

    def outputs(self, topic: str) -> list[dict[str, Any]]:
        return [decode_output(r) for r in self.sent if r.topic == topic]

    def final_results(self, topic: str) -> dict[tuple[Any, ...], Any]:
        """The last emitted value per deterministic key (what a compacted output topic holds)."""
        last: dict[tuple[Any, ...], Any] = {}
        for out in self.outputs(topic):
            if out["_headers"].get(HEADER_EMIT) in ("first", "update"):
                last[tuple(out["_key"])] = out["value"]
        return last


class MemorySource:
    """In-memory partitions of decoded ``Record``s implementing ``processors.sources.Source``."""

    def __init__(self, topic: str, partitions: int = 1) -> None:
        self.topic = topic
        self.data: dict[int, list[RecordLike]] = {p: [] for p in range(partitions)}
        self.positions: dict[TopicPartition, int] = {}
        self._event = asyncio.Event()

    def append(self, partition: int, value: Any, timestamp: int, key: bytes | None = None) -> None:
        rows = self.data[partition]
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        rows.append(Record(len(rows), timestamp, key, raw, ()))
        self._event.set()

    async def start(self, on_assigned: AssignmentListener, on_revoked: AssignmentListener,
                    on_lost: AssignmentListener | None = None) -> None:
        tps = [(self.topic, p) for p in self.data]
        self.positions = dict.fromkeys(tps, 0)
        await on_assigned(tps)

    async def stop(self) -> None:
        return None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    def end_offset(self, tp: TopicPartition) -> int | None:
        return len(self.data[tp[1]])

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        return None

    async def fetch(self, max_records: int, timeout: float, paused: set[TopicPartition]
                    ) -> list[tuple[TopicPartition, list[RecordLike]]]:
        out = []
        for tp, pos in self.positions.items():
            rows = self.data[tp[1]][pos : pos + max_records]
            if rows and tp not in paused:
                self.positions[tp] = pos + len(rows)
                out.append((tp, rows))
        if not out:
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                pass
        return out


class MemoryCheckpointStore:
    """Checkpoint records kept in a list (a stand-in for the checkpoint topic)."""

    def __init__(self) -> None:
        self.saved: list[CheckpointRecord] = []
        self.codec = CheckpointCodec()

    async def load(self, tps: Collection[TopicPartition] | None = None) -> dict[TopicPartition, PartitionRestore]:
        return self.codec.decode(self.saved)

    async def save(self, records: list[CheckpointRecord]) -> None:
        self.saved.extend(records)


class MemorySink:
    """Collects output records per topic; ``gate`` (an Event) can hold writes to simulate a slow sink."""

    def __init__(self) -> None:
        self.records: list[OutRecord] = []
        self.gate: asyncio.Event | None = None
        self.written = asyncio.Event()

    async def write(self, records: list[OutRecord]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.records.extend(records)
        self.written.set()

    async def flush(self) -> None:
        return None

    async def abort(self) -> None:
        return None

    def topic(self, name: str) -> list[dict[str, Any]]:
        return [decode_output(r) for r in self.records if r.topic == name]
