"""Checkpoints: operator state together with the input offsets it reflects, stored in Sluice.

The unit of restore is a source partition. A checkpoint writes, for each partition it covers, one
record keyed ``<topic>:<partition>`` on the single-partition topic ``_checkpoints.<pipeline>``::

    {"v": 2, "pipeline": name, "created": ms, "watermark": ms,
     "part": [topic, partition, next_offset, max_event_ts, heartbeat_watermark, floor, quiet_ms],
                                   (next_offset -1: assigned, nothing read yet)
     "ops": {operator_id: [[key, [topic, partition], state], ...]}}   (the keys that partition owns)

``floor`` is the watermark that partition's records were judged against and ``quiet_ms`` the
processing time since it was last heard of: restoring both keeps a record that was late before a
restart late after it, and an idle partition idle.

A record larger than ``CHUNK_BYTES`` is written as chunks keyed ``<topic>:<partition>:<slot>:<i>``
(``{"v": 2, "chunk": [id, i, n], "data": …}``), then a head ``{"v": 2, "chunks": [id, slot, n]}``
under the partition's key. Slots alternate between 0 and 1, so the chunks of the newest complete
checkpoint are never overwritten by the next one; chunk indices a shorter checkpoint no longer
uses get tombstones. Hence with ``cleanup.policy=compact`` the topic keeps exactly the newest
complete checkpoint of every partition (plus the other slot), and a crash in the middle of a
write leaves the previous one in force.

Checkpoint topics are created with ``cleanup.policy=compact`` (Sluice's cleaner, or Kafka's, keeps
the newest record per key). The attached store also trims (``compact,delete``): a checkpoint is one
batch covering every partition, so the topic has ``retention.bytes=0`` and tiny segments, and
retention (which always keeps the newest batch / active segment) runs after each save: the topic
holds about one checkpoint. Readers step over the offsets compaction removed (batch last offsets).
Restoring a partition uses the newest complete record for it, so scaled-out instances each write
their own partitions and a partition moving to another instance takes exactly its own keys along.
Output is written before the checkpoint that covers it: after a crash the input after the
checkpoint is replayed (at-least-once, with deterministic output keys).

Version 1 (one unkeyed record per checkpoint, every partition in it) is still read.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from broker.errors import BrokerError
from broker.log.api import LogStore
from broker.log.config import TopicConfig
from broker.protocol.records import RecordSpec, decode_records, iter_batches
from processors.errors import CheckpointError
from processors.executor import Executor, TopicPartition
from processors.time import NO_TIME

__all__ = [
    "Checkpoint",
    "CheckpointCodec",
    "CheckpointRecord",
    "CheckpointStore",
    "LogCheckpointStore",
    "PartitionRestore",
    "PartitionState",
    "checkpoint_topic",
    "load_from_tail",
    "restore_executor",
    "take_checkpoint",
]

VERSION = 2
MAX_CHECKPOINT_BYTES = 256 * 1024 * 1024
CHUNK_BYTES = 512 * 1024
TRIM_SEGMENT_BYTES = 1024  # attached checkpoint topic: (almost) every checkpoint batch starts a segment

CheckpointRecord = tuple[bytes, bytes | None]  # (key, value); a None value is a tombstone


def checkpoint_topic(pipeline: str) -> str:
    return f"_checkpoints.{pipeline}"


@dataclass(frozen=True, slots=True)
class PartitionState:
    offset: int  # the next offset to read; -1: assigned, nothing read yet
    max_ts: int = NO_TIME
    heartbeat: int = NO_TIME
    floor: int = NO_TIME  # the watermark its records were judged against
    quiet_ms: int = 0  # processing time since it was last heard of


@dataclass
class Checkpoint:
    pipeline: str
    created: int
    watermark: int
    parts: dict[TopicPartition, PartitionState]
    ops: dict[str, list[list[Any]]] = field(default_factory=dict)  # op id -> [[key, owner tp, state], …]
    extras: dict[TopicPartition, dict[str, Any]] = field(default_factory=dict)  # Executor.partition_extras


@dataclass
class PartitionRestore:
    tp: TopicPartition
    created: int
    state: PartitionState
    ops: dict[str, list[list[Any]]]
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def offset(self) -> int:
        return self.state.offset


# -- executor <-> checkpoint --------------------------------------------------------------------


def take_checkpoint(pipeline: str, ex: Executor, positions: Mapping[TopicPartition, int], now: int) -> Checkpoint:
    """The executor's state for ``positions`` (tp -> next offset) as of now, between batches."""
    parts = {}
    extras = {}
    for tp, offset in positions.items():
        max_ts, heartbeat, floor, quiet = ex.partition_checkpoint(tp, now)
        parts[tp] = PartitionState(offset, max_ts, heartbeat, floor, quiet)
        if ex.extensions:
            extras[tp] = ex.partition_extras(tp)
    return Checkpoint(pipeline, now, ex.watermark, parts, ex.snapshot(set(positions)), extras)


def restore_executor(ex: Executor, restores: Iterable[tuple[TopicPartition, PartitionRestore | None]],
                     now: int) -> None:
    """Add partitions to ``ex``: fresh (None) or as their checkpoint left them, then move time on.
    A partition behind the operator watermark (taken over from an instance that was behind, or never
    checkpointed) rewinds it to its floor (``Executor.rewind``), so its replayed records are on time."""
    restores = list(restores)
    lowest = min((NO_TIME if r is None else r.state.floor for _, r in restores), default=None)
    if lowest is not None and lowest < ex.watermark:
        ex.rewind(lowest)
    for tp, r in restores:
        if r is None:
            ex.add_partition(tp, now)
            continue
        s = r.state
        ex.restore_partition(tp, now, max_ts=s.max_ts, heartbeat=s.heartbeat, floor=s.floor, quiet_ms=s.quiet_ms,
                             ops=r.ops, extras=r.extras)
    ex.advance(now)


# -- records -------------------------------------------------------------------------------------


def _tp_key(tp: TopicPartition) -> bytes:
    return f"{tp[0]}:{tp[1]}".encode()


def _pack(doc: Any, pipeline: str) -> bytes:
    try:
        return msgpack.packb(doc, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise CheckpointError(f"pipeline {pipeline!r}: state is not serializable: {exc}") from exc


def _unpack(raw: bytes) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:
        raise CheckpointError(f"cannot decode checkpoint record: {exc!r}") from exc


class CheckpointCodec:
    """Checkpoints to keyed records and back. Remembers, per partition, the chunk slot of its
    newest checkpoint and how many chunks each slot holds (learnt from writes and reads), so the
    next large checkpoint goes to the other slot and stale chunks get tombstones."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._slot: dict[TopicPartition, int] = {}  # slot of the newest chunked checkpoint
        self._chunks: dict[tuple[TopicPartition, int], int] = {}  # chunks last written to a slot

    def encode(self, cp: Checkpoint) -> list[CheckpointRecord]:
        owned: dict[TopicPartition, dict[str, list[list[Any]]]] = {tp: {} for tp in cp.parts}
        for op, entries in cp.ops.items():
            for tp in owned:
                owned[tp][op] = []
            for entry in entries:
                owner = entry[1]
                if owner is not None and (owner[0], owner[1]) in owned:
                    owned[(owner[0], owner[1])][op].append(entry)
        out: list[CheckpointRecord] = []
        for tp, s in cp.parts.items():
            doc = {"v": VERSION, "pipeline": cp.pipeline, "created": cp.created, "watermark": cp.watermark,
                   "part": [tp[0], tp[1], s.offset, s.max_ts, s.heartbeat, s.floor, s.quiet_ms], "ops": owned[tp]}
            if cp.extras.get(tp):
                doc["x"] = cp.extras[tp]  # the executor's partition extensions (e.g. repartition sequences)
            data = _pack(doc, cp.pipeline)
            if len(data) <= self.chunk_bytes:
                out.append((_tp_key(tp), data))
            else:
                out += self._chunked(tp, data)
        return out

    def _chunked(self, tp: TopicPartition, data: bytes) -> list[CheckpointRecord]:
        slot = 1 - self._slot.get(tp, 1)  # never the slot the newest complete checkpoint lives in
        ident = uuid.uuid4().hex
        n = -(-len(data) // self.chunk_bytes)
        base = f"{tp[0]}:{tp[1]}:{slot}:"
        out: list[CheckpointRecord] = [
            ((base + str(i)).encode(),
             msgpack.packb({"v": VERSION, "chunk": [ident, i, n],
                            "data": data[i * self.chunk_bytes : (i + 1) * self.chunk_bytes]}, use_bin_type=True))
            for i in range(n)
        ]
        out += [((base + str(i)).encode(), None) for i in range(n, self._chunks.get((tp, slot), 0))]
        out.append((_tp_key(tp), msgpack.packb({"v": VERSION, "chunks": [ident, slot, n]}, use_bin_type=True)))
        self._slot[tp] = slot
        self._chunks[(tp, slot)] = n
        return out

    def decode(self, records: Iterable[CheckpointRecord]) -> dict[TopicPartition, PartitionRestore]:
        """For each partition, its newest complete checkpoint among ``records`` (in log order)."""
        latest: dict[TopicPartition, PartitionRestore] = {}
        chunks: dict[str, dict[int, bytes]] = {}
        v1_chunks: dict[str, dict[int, bytes]] = {}
        for key, raw in records:
            if raw is None:
                continue
            doc = _unpack(raw)
            if not isinstance(doc, dict):
                raise CheckpointError(f"checkpoint record {key!r} is not a map")
            if doc.get("v") == 1:
                for r in _decode_v1(doc, raw, v1_chunks):
                    latest[r.tp] = r
                continue
            if doc.get("v") != VERSION:
                raise CheckpointError(f"unknown checkpoint version {doc.get('v')!r}")
            if "chunk" in doc:
                ident, i, n = doc["chunk"]
                chunks.setdefault(ident, {})[int(i)] = doc["data"]
                topic, partition, slot, _ = key.decode().split(":")  # topic names have no ':'
                where = ((topic, int(partition)), int(slot))
                self._chunks[where] = max(self._chunks.get(where, 0), int(i) + 1)
                continue
            if "chunks" in doc:
                ident, slot, n = doc["chunks"]
                parts = chunks.get(ident, {})
                if len(parts) != n:
                    continue  # incomplete (a crash mid-write): the previous checkpoint stays in force
                doc = _unpack(b"".join(parts[k] for k in range(n)))
                restore = _partition_restore(doc)
                self._slot[restore.tp] = int(slot)
                latest[restore.tp] = restore
                continue
            restore = _partition_restore(doc)
            latest[restore.tp] = restore
        return latest


def _partition_restore(doc: dict[str, Any]) -> PartitionRestore:
    try:
        t, p, off, mts, hb, floor, quiet = doc["part"]
        return PartitionRestore((t, int(p)), int(doc["created"]),
                                PartitionState(int(off), int(mts), int(hb), int(floor), int(quiet)), doc.get("ops", {}),
                                doc.get("x", {}))
    except Exception as exc:
        raise CheckpointError(f"cannot decode checkpoint: {exc!r}") from exc


def _decode_v1(doc: dict[str, Any], raw: bytes, pending: dict[str, dict[int, bytes]]) -> list[PartitionRestore]:
    """A version-1 record (or a chunk of one): every partition of that checkpoint."""
    chunk = doc.get("chunk")
    if chunk is not None:
        ident, i, n = chunk
        parts = pending.setdefault(ident, {})
        parts[int(i)] = doc["data"]
        if len(parts) != n:
            return []
        doc = _unpack(b"".join(parts.pop(k) for k in range(n)))
        del pending[ident]
    try:
        out = []
        for t, p, off, mts, hb in doc["parts"]:
            tp = (t, int(p))
            ops = {op: [e for e in entries if e[1] is not None and (e[1][0], e[1][1]) == tp]
                   for op, entries in doc.get("ops", {}).items()}
            state = PartitionState(int(off), int(mts), int(hb), int(doc["watermark"]), 0)
            out.append(PartitionRestore(tp, int(doc["created"]), state, ops))
        return out
    except Exception as exc:
        raise CheckpointError(f"cannot decode checkpoint: {exc!r}") from exc


async def load_from_tail(read: Callable[[int, int], Awaitable[list[CheckpointRecord]]], start: int, end: int,
                         tps: Collection[TopicPartition] | None,
                         codec: CheckpointCodec) -> dict[TopicPartition, PartitionRestore]:
    """Checkpoints from the end of the checkpoint log: read ``[lo, end)`` with ``lo`` moving back
    (64, 256, … records) until every partition in ``tps`` has one, or the log start is reached.
    Restarts cost what the recent checkpoints cost, not the whole history."""
    span = 64
    while True:
        lo = max(start, end - span)
        found = codec.decode(await read(lo, end))
        if lo <= start or (tps is not None and set(tps) <= found.keys()):
            return found
        span *= 4


class CheckpointStore(Protocol):
    codec: CheckpointCodec

    async def load(self, tps: Collection[TopicPartition] | None = None) -> dict[TopicPartition, PartitionRestore]:
        """The newest complete checkpoint of each partition in ``tps`` (None = all) that has one."""

    async def save(self, records: list[CheckpointRecord]) -> None:
        """Store one checkpoint's records (``codec.encode``), durably, in order."""


class LogCheckpointStore:
    """Checkpoints in a topic of an in-process ``LogStore`` (the attached runner), trimmed to about
    the newest checkpoint after every save (see the module docstring)."""

    def __init__(self, store: LogStore, pipeline: str) -> None:
        self.store = store
        self.topic = checkpoint_topic(pipeline)
        self.codec = CheckpointCodec()

    async def _ensure(self) -> None:
        # one attached runner writes every partition in each checkpoint (one batch): retention may
        # drop everything but the newest batch / active segment
        if not self.store.has_topic(self.topic):
            self.store.create_topic(self.topic, 1, self._trimmed(self.store.default_config), internal=True)
            return
        config = self.store.topic(self.topic).config
        if config != self._trimmed(config):  # created by an older version: trim from now on
            await self.store.alter_topic_config(self.topic, self._trimmed(config))

    @staticmethod
    def _trimmed(config: TopicConfig) -> TopicConfig:
        return config.with_kafka_configs({"max.message.bytes": str(MAX_CHECKPOINT_BYTES), "retention.bytes": "0",
                                          "retention.ms": "-1", "segment.bytes": str(TRIM_SEGMENT_BYTES),
                                          "cleanup.policy": "compact,delete"})

    async def load(self, tps: Collection[TopicPartition] | None = None) -> dict[TopicPartition, PartitionRestore]:
        try:
            await self._ensure()
            log = self.store.partition(self.topic, 0)

            async def read(lo: int, hi: int) -> list[CheckpointRecord]:
                values: list[CheckpointRecord] = []
                offset = max(lo, log.log_start_offset)
                while offset < hi:
                    data = log.read(offset, 4 * 1024 * 1024)
                    if not data:
                        break
                    view = memoryview(data)
                    for pos, header in iter_batches(view, verify=False):
                        batch = view[pos : pos + header.size]
                        values.extend((r.key or b"", r.value) for r in decode_records(batch, header)
                                      if offset <= r.offset < hi)
                        offset = header.last_offset + 1  # compaction may have emptied a batch: step over it
                return values

            return await load_from_tail(read, log.log_start_offset, log.high_watermark, tps, self.codec)
        except BrokerError as exc:
            raise CheckpointError(f"cannot read {self.topic}: {exc}") from exc

    async def save(self, records: list[CheckpointRecord]) -> None:
        try:
            await self._ensure()
            specs = [RecordSpec(value, key) for key, value in records]
            result = await self.store.append_records(self.topic, specs, partition=0)
            log = self.store.partition(self.topic, 0)
            log.enforce_retention(result.log_append_time)
        except BrokerError as exc:
            raise CheckpointError(f"cannot write {self.topic}: {exc}") from exc

    def size_bytes(self) -> int:
        return self.store.partition(self.topic, 0).size_bytes if self.store.has_topic(self.topic) else 0
