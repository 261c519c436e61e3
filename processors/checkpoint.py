"""Checkpoints: operator state together with the input offsets it reflects, stored in Sluice.

A checkpoint is one msgpack record on the single-partition topic ``_checkpoints.<pipeline>``::

    {"v": 1, "pipeline": name, "created": ms, "watermark": ms,
     "parts": [[topic, partition, next_offset, max_event_ts, heartbeat_watermark], ...],
                                   (next_offset -1: assigned, nothing read yet)
     "ops": {operator_id: [[key, [topic, partition], state], ...]}}

A checkpoint larger than ``CHUNK_BYTES`` is written as several records ``{"v": 1, "chunk": [id, i, n],
"data": …}`` (brokers cap record sizes); it counts only once all ``n`` chunks are read, so a crash in
the middle of writing one leaves the previous checkpoint in force.

Every keyed state entry names the source partition whose records created it, so instances of a
scaled-out pipeline each write checkpoints for the partitions they own and a partition moving to
another instance takes exactly its own keys along. Restoring a partition uses the newest
checkpoint that lists it. Output is written before the checkpoint that covers it, so after a
crash the input after the checkpoint is replayed: at-least-once, with deterministic output keys.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from broker.errors import BrokerError
from broker.log.api import LogStore
from broker.protocol.records import RecordSpec, decode_all
from processors.errors import CheckpointError
from processors.executor import TopicPartition

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "LogCheckpointStore",
    "PartitionRestore",
    "checkpoint_records",
    "checkpoint_topic",
    "checkpoints_from_records",
    "decode_checkpoint",
    "encode_checkpoint",
    "latest_per_partition",
    "load_from_tail",
]

VERSION = 1
MAX_CHECKPOINT_BYTES = 256 * 1024 * 1024
CHUNK_BYTES = 512 * 1024


def checkpoint_topic(pipeline: str) -> str:
    return f"_checkpoints.{pipeline}"


@dataclass
class Checkpoint:
    pipeline: str
    created: int
    watermark: int
    parts: dict[TopicPartition, tuple[int, int, int]]  # tp -> (next offset, max event ts, heartbeat watermark)
    ops: dict[str, list[list[Any]]] = field(default_factory=dict)


@dataclass
class PartitionRestore:
    tp: TopicPartition
    offset: int
    max_ts: int
    heartbeat: int
    ops: dict[str, list[list[Any]]]


def encode_checkpoint(cp: Checkpoint) -> bytes:
    doc = {
        "v": VERSION,
        "pipeline": cp.pipeline,
        "created": cp.created,
        "watermark": cp.watermark,
        "parts": [[t, p, off, mts, hb] for (t, p), (off, mts, hb) in cp.parts.items()],
        "ops": cp.ops,
    }
    try:
        return msgpack.packb(doc, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise CheckpointError(f"pipeline {cp.pipeline!r}: state is not serializable: {exc}") from exc


def decode_checkpoint(data: bytes) -> Checkpoint:
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if doc.get("v") != VERSION:
            raise CheckpointError(f"unknown checkpoint version {doc.get('v')!r}")
        parts = {(t, int(p)): (int(off), int(mts), int(hb)) for t, p, off, mts, hb in doc["parts"]}
        return Checkpoint(doc["pipeline"], doc["created"], doc["watermark"], parts, doc.get("ops", {}))
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"cannot decode checkpoint: {exc!r}") from exc


def checkpoint_records(data: bytes, chunk_bytes: int = CHUNK_BYTES) -> list[bytes]:
    """The record values that store one encoded checkpoint (one, or chunks of it)."""
    if len(data) <= chunk_bytes:
        return [data]
    ident = uuid.uuid4().hex
    n = -(-len(data) // chunk_bytes)
    return [
        msgpack.packb({"v": VERSION, "chunk": [ident, i, n], "data": data[i * chunk_bytes : (i + 1) * chunk_bytes]},
                      use_bin_type=True)
        for i in range(n)
    ]


def checkpoints_from_records(values: Iterable[bytes]) -> list[Checkpoint]:
    """Checkpoints in log order from the record values of the checkpoint topic (incomplete chunked
    ones are ignored)."""
    out: list[Checkpoint] = []
    pending: dict[str, dict[int, bytes]] = {}
    for raw in values:
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:
            raise CheckpointError(f"cannot decode checkpoint record: {exc!r}") from exc
        chunk = doc.get("chunk") if isinstance(doc, dict) else None
        if chunk is None:
            out.append(decode_checkpoint(raw))
            continue
        ident, i, n = chunk
        parts = pending.setdefault(ident, {})
        parts[int(i)] = doc["data"]
        if len(parts) == n:
            out.append(decode_checkpoint(b"".join(parts[k] for k in range(n))))
            del pending[ident]
    return out


def latest_per_partition(checkpoints: Iterable[Checkpoint]) -> dict[TopicPartition, PartitionRestore]:
    """For each partition, its offset and keyed state from the newest checkpoint (in log order)
    that lists it."""
    latest: dict[TopicPartition, Checkpoint] = {}
    for cp in checkpoints:
        for tp in cp.parts:
            latest[tp] = cp
    out: dict[TopicPartition, PartitionRestore] = {}
    for tp, cp in latest.items():
        offset, max_ts, heartbeat = cp.parts[tp]
        ops = {
            op: [e for e in entries if e[1] is not None and (e[1][0], e[1][1]) == tp]
            for op, entries in cp.ops.items()
        }
        out[tp] = PartitionRestore(tp, offset, max_ts, heartbeat, ops)
    return out


async def load_from_tail(read: Callable[[int, int], Awaitable[list[bytes]]], start: int, end: int,
                         tps: Collection[TopicPartition] | None) -> list[Checkpoint]:
    """Checkpoints from the end of the checkpoint log: read ``[lo, end)`` with ``lo`` moving back
    (64, 256, … records) until every partition in ``tps`` has one, or the log start is reached.
    Restarts cost what the recent checkpoints cost, not the whole history."""
    span = 64
    while True:
        lo = max(start, end - span)
        found = checkpoints_from_records(await read(lo, end))
        if lo <= start:
            return found
        if tps is not None and set(tps) <= latest_per_partition(found).keys():
            return found
        span *= 4


class CheckpointStore(Protocol):
    async def load(self, tps: Collection[TopicPartition] | None = None) -> list[Checkpoint]:
        """Checkpoints in log order; enough of them to cover ``tps`` (None = all)."""

    async def save(self, data: bytes) -> None: ...


class LogCheckpointStore:
    """Checkpoints in a topic of an in-process ``LogStore`` (the attached runner)."""

    def __init__(self, store: LogStore, pipeline: str) -> None:
        self.store = store
        self.topic = checkpoint_topic(pipeline)

    def _ensure(self) -> None:
        if not self.store.has_topic(self.topic):
            config = dataclasses.replace(self.store.default_config, max_message_bytes=MAX_CHECKPOINT_BYTES)
            self.store.create_topic(self.topic, 1, config, internal=True)

    async def load(self, tps: Collection[TopicPartition] | None = None) -> list[Checkpoint]:
        try:
            self._ensure()
            log = self.store.partition(self.topic, 0)

            async def read(lo: int, hi: int) -> list[bytes]:
                values: list[bytes] = []
                offset = lo
                while offset < hi:
                    records = [r for r in decode_all(log.read(offset, 4 * 1024 * 1024)) if offset <= r.offset < hi]
                    if not records:
                        break
                    values.extend(r.value for r in records if r.value)
                    offset = records[-1].offset + 1
                return values

            return await load_from_tail(read, log.log_start_offset, log.high_watermark, tps)
        except BrokerError as exc:
            raise CheckpointError(f"cannot read {self.topic}: {exc}") from exc

    async def save(self, data: bytes) -> None:
        try:
            self._ensure()
            specs = [RecordSpec(value) for value in checkpoint_records(data)]
            await self.store.append_records(self.topic, specs, partition=0)
        except BrokerError as exc:
            raise CheckpointError(f"cannot write {self.topic}: {exc}") from exc
