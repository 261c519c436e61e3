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
the newest record per key). The attached stores also trim: a checkpoint is one batch covering every
partition, and after each save the log start moves up (``delete_records``) to the first record the
newest checkpoint of every partition needs (its head, or an incremental checkpoint's base:
``AnchorOffsets``); the topic holds about one checkpoint (plus, incremental, the deltas since the
oldest base). Readers step over the offsets compaction removed (batch last offsets).

With keyed state in spill stores (``state_max_keys``) checkpoints are incremental: a base now and then,
and per checkpoint the keys changed since it (version 3, ``processors.checkpoint_delta``).
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
from processors.checkpoint_delta import BaseRef, DeltaTracker, Increment, incremental_stores
from processors.errors import CheckpointError, PipelineDefinitionError
from processors.executor import Executor, TopicPartition
from processors.time import NO_TIME

__all__ = [
    "Checkpoint",
    "CheckpointCodec",
    "CheckpointRecord",
    "CheckpointStore",
    "AnchorOffsets",
    "LogCheckpointStore",
    "PartitionRestore",
    "PartitionState",
    "checkpoint_topic",
    "load_from_tail",
    "restore_executor",
    "take_checkpoint",
]

VERSION = 2
DELTA_VERSION = 3  # an incremental checkpoint's head and base chunks (``processors.checkpoint_delta``)
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
    increments: dict[TopicPartition, Increment] | None = None  # incremental (``checkpoint_delta``): not ``ops``


@dataclass
class PartitionRestore:
    tp: TopicPartition
    created: int
    state: PartitionState
    ops: dict[str, list[list[Any]]]
    extras: dict[str, Any] = field(default_factory=dict)
    base: BaseRef | None = None  # an incremental checkpoint's base
    touched: dict[str, list[Any]] = field(default_factory=dict)  # and the keys its delta covers

    @property
    def offset(self) -> int:
        return self.state.offset


# -- executor <-> checkpoint --------------------------------------------------------------------


def take_checkpoint(pipeline: str, ex: Executor, positions: Mapping[TopicPartition, int], now: int,
                    delta: DeltaTracker | None = None) -> Checkpoint:
    """The executor's state for ``positions`` (tp -> next offset) as of now, between batches; with
    ``delta`` and keyed state in spill stores, incremental (``processors.checkpoint_delta``)."""
    parts = {}
    extras = {}
    for tp, offset in positions.items():
        max_ts, heartbeat, floor, quiet = ex.partition_checkpoint(tp, now)
        parts[tp] = PartitionState(offset, max_ts, heartbeat, floor, quiet)
        if ex.extensions:
            extras[tp] = ex.partition_extras(tp)
    stores = None if delta is None else incremental_stores(ex)
    if delta is not None and stores is not None:
        return Checkpoint(pipeline, now, ex.watermark, parts, {}, extras, delta.increments(stores, set(positions)))
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
        try:
            ex.restore_partition(tp, now, max_ts=s.max_ts, heartbeat=s.heartbeat, floor=s.floor,
                                 quiet_ms=s.quiet_ms, ops=r.ops, extras=r.extras)
        except PipelineDefinitionError as exc:  # another pipeline's state under this group: say the way out
            topic = checkpoint_topic(ex.pipeline.name)
            raise PipelineDefinitionError(
                f"{exc}: {topic} was written by another pipeline (or an older shape of this one) under the same "
                f"group. Give this pipeline a group of its own (Pipeline.source(..., group=...)), or, to start its "
                f"state afresh, stop it and delete the checkpoints: sluice topics delete {topic} --yes") from exc
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
        self._base_chunks: dict[tuple[TopicPartition, int], int] = {}  # base chunks last in a slot
        self.delta = DeltaTracker()  # incremental checkpoints: bases and keys touched since
        # per partition, the index (in the last ``encode``'s records) of the first record its newest
        # checkpoint needs: its base's first chunk, or its head when self-contained; trimming stores
        # keep the log from the oldest of these (``anchor_offsets``)
        self.anchors: dict[TopicPartition, int] = {}
        self.written: list[TopicPartition] = []  # the partitions of the last ``encode``
        self.missing: set[TopicPartition] = set()  # last ``decode``: heads whose chunks or base were not read

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
        self.anchors = {}
        self.written = list(cp.parts)
        for tp, s in cp.parts.items():
            doc: dict[str, Any] = {
                "v": VERSION, "pipeline": cp.pipeline, "created": cp.created, "watermark": cp.watermark,
                "part": [tp[0], tp[1], s.offset, s.max_ts, s.heartbeat, s.floor, s.quiet_ms], "ops": owned[tp]}
            inc = None if cp.increments is None else cp.increments.get(tp)
            if inc is not None:
                if inc.base is not None:
                    self.anchors[tp] = len(out)
                    out += self._base_records(tp, inc.base, cp.pipeline)
                ref = self.delta.bases[tp]
                doc.update(v=DELTA_VERSION, ops=inc.ops, gone=inc.gone,
                           base=[ref.ident, ref.slot, ref.chunks, ref.keys])
            else:
                self.anchors[tp] = len(out)
            if cp.extras.get(tp):
                doc["x"] = cp.extras[tp]  # the executor's partition extensions (e.g. repartition sequences)
            data = _pack(doc, cp.pipeline)
            if len(data) <= self.chunk_bytes:
                out.append((_tp_key(tp), data))
            else:
                out += self._chunked(tp, data)
        return out

    def _base_records(self, tp: TopicPartition, base: dict[str, list[list[Any]]],
                      pipeline: str) -> list[CheckpointRecord]:
        """A new base of ``tp`` in the slot its current base is not in (``processors.checkpoint_delta``)."""
        current = self.delta.bases.get(tp)
        slot = 1 - (current.slot if current is not None else 1)
        data = _pack(base, pipeline)
        ident = uuid.uuid4().hex
        n = max(-(-len(data) // self.chunk_bytes), 1)
        prefix = f"{tp[0]}:{tp[1]}:b{slot}:"
        out: list[CheckpointRecord] = [
            ((prefix + str(i)).encode(),
             msgpack.packb({"v": DELTA_VERSION, "base": [ident, i, n],
                            "data": data[i * self.chunk_bytes : (i + 1) * self.chunk_bytes]}, use_bin_type=True))
            for i in range(n)
        ]
        out += [((prefix + str(i)).encode(), None) for i in range(n, self._base_chunks.get((tp, slot), 0))]
        self._base_chunks[(tp, slot)] = n
        self.delta.based(tp, BaseRef(ident, slot, n, sum(len(entries) for entries in base.values())))
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
        self.missing = set()
        chunks: dict[str, dict[int, bytes]] = {}
        bases: dict[str, dict[int, bytes]] = {}
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
            if "base" in doc and "data" in doc:  # a chunk of an incremental checkpoint's base
                ident, i, _n = doc["base"]
                bases.setdefault(ident, {})[int(i)] = doc["data"]
                topic, partition, slot, _ = key.decode().split(":")
                where = ((topic, int(partition)), int(slot[1:]))
                self._base_chunks[where] = max(self._base_chunks.get(where, 0), int(i) + 1)
                continue
            if doc.get("v") == DELTA_VERSION:
                restore = _with_base(doc, bases)
                if restore is None:  # its base is not among the records: read further back
                    self._missing(key, latest)
                    continue
                latest[restore.tp] = restore
                self.missing.discard(restore.tp)
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
                if len(parts) != n:  # written before its head: not among the records, read further back
                    self._missing(key, latest)
                    continue
                doc = _unpack(b"".join(parts[k] for k in range(n)))
                found = _with_base(doc, bases) if doc.get("v") == DELTA_VERSION else _partition_restore(doc)
                if found is None:
                    self._missing(key, latest)
                    continue
                self._slot[found.tp] = int(slot)
                latest[found.tp] = found
                self.missing.discard(found.tp)
                continue
            restore = _partition_restore(doc)
            latest[restore.tp] = restore
        return latest


    def _missing(self, key: bytes, latest: dict[TopicPartition, PartitionRestore]) -> None:
        """The newest head of a partition needs records before those read: an older checkpoint must not
        stand in for it (under exactly-once its results are committed already)."""
        topic, _, partition = key.decode().rpartition(":")
        tp = (topic, int(partition))
        latest.pop(tp, None)
        self.missing.add(tp)


def _with_base(doc: dict[str, Any], bases: dict[str, dict[int, bytes]]) -> PartitionRestore | None:
    """An incremental head with its base applied (None when the base's chunks are not all there)."""
    ident, slot, n, keys = doc["base"]
    parts = bases.get(ident, {})
    if len(parts) != n:
        return None
    base = _unpack(b"".join(parts[i] for i in range(n)))
    ops: dict[str, list[list[Any]]] = {}
    touched: dict[str, list[Any]] = {}
    for op in set(base) | set(doc.get("ops", {})) | set(doc.get("gone", {})):
        merged = {_hashable_key(e[0]): e for e in base.get(op, [])}
        delta = doc.get("ops", {}).get(op, [])
        gone = doc.get("gone", {}).get(op, [])
        for e in delta:
            merged[_hashable_key(e[0])] = e
        for k in gone:
            merged.pop(_hashable_key(k), None)
        ops[op] = list(merged.values())
        touched[op] = [e[0] for e in delta] + list(gone)
    restore = _partition_restore({**doc, "ops": ops})
    restore.base = BaseRef(str(ident), int(slot), int(n), int(keys))
    restore.touched = touched
    return restore


def _hashable_key(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable_key(v) for v in value)
    return value


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
        wanted = codec.missing if tps is None else codec.missing & set(tps)
        if lo <= start:
            if wanted:
                raise CheckpointError(f"the newest checkpoint of {sorted(wanted)} needs records the checkpoint "
                                      "topic no longer holds (its chunks or its base)")
            return found
        if tps is not None and set(tps) <= found.keys() and not wanted:
            return found
        span *= 4


class CheckpointStore(Protocol):
    codec: CheckpointCodec

    async def load(self, tps: Collection[TopicPartition] | None = None) -> dict[TopicPartition, PartitionRestore]:
        """The newest complete checkpoint of each partition in ``tps`` (None = all) that has one."""

    async def save(self, records: list[CheckpointRecord]) -> None:
        """Store one checkpoint's records (``codec.encode``), durably, in order."""


class AnchorOffsets:
    """For stores that trim their log (the attached ones): per partition, the offset of the first
    record its newest checkpoint needs (its head, or an incremental checkpoint's base)."""

    def __init__(self) -> None:
        self.offsets: dict[TopicPartition, int] = {}

    def saved(self, codec: CheckpointCodec, base_offset: int) -> int | None:
        """The records of ``codec``'s last encode were appended from ``base_offset``: the offset below
        which nothing is needed, or None when a partition's anchor is not known yet."""
        for tp, index in codec.anchors.items():
            self.offsets[tp] = base_offset + index
        wanted = [self.offsets.get(tp) for tp in codec.written]
        if not wanted or any(o is None for o in wanted):
            return None
        return min(o for o in wanted if o is not None)


class LogCheckpointStore:
    """Checkpoints in a topic of an in-process ``LogStore`` (the attached runner), trimmed after every
    save to what the newest checkpoint needs (see the module docstring)."""

    def __init__(self, store: LogStore, pipeline: str) -> None:
        self.store = store
        self.topic = checkpoint_topic(pipeline)
        self.codec = CheckpointCodec()
        self.anchors = AnchorOffsets()

    async def _ensure(self) -> None:
        # one attached runner writes every partition in each checkpoint (one batch): ``save`` trims
        # the log to what the newest checkpoint needs (no retention of its own)
        if not self.store.has_topic(self.topic):
            self.store.create_topic(self.topic, 1, self._trimmed(self.store.default_config), internal=True)
            return
        config = self.store.topic(self.topic).config
        if config != self._trimmed(config):  # created by an older version: trim from now on
            await self.store.alter_topic_config(self.topic, self._trimmed(config))

    @staticmethod
    def _trimmed(config: TopicConfig) -> TopicConfig:
        return config.with_kafka_configs({"max.message.bytes": str(MAX_CHECKPOINT_BYTES), "retention.bytes": "-1",
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
            before = self.anchors.saved(self.codec, result.base_offset)
            if before is not None:  # what no partition's newest checkpoint needs any more
                await self.store.partition(self.topic, 0).delete_records(before)
        except BrokerError as exc:
            raise CheckpointError(f"cannot write {self.topic}: {exc}") from exc

    def size_bytes(self) -> int:
        return self.store.partition(self.topic, 0).size_bytes if self.store.has_topic(self.topic) else 0
