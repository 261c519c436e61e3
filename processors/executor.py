"""Runs a ``Pipeline`` synchronously over batches of records: no I/O, no asyncio.

The async runners feed it ``process(tp, records, now)`` and ``tick(now)`` and take the encoded
output records it collects (``take_outputs``). Per batch: records are decoded (failures go to the
dead-letter topic with the reason), pushed through the operator tree, then the source partition's
watermark is updated and, if the operator watermark moved, it is pushed down the tree so windows
fire and timers run. Keyed operators remember which source partition created each key so state can
be checkpointed, restored and handed over per partition.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Hashable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from broker.errors import CorruptRecordError
from broker.native import select
from processors import record_kernels
from processors.errors import PipelineDefinitionError
from processors.logic import KeyedRuntime, Logic
from processors.pipeline import NodeSpec, Pipeline
from processors.serde import HEADER_ERROR, HEADER_SOURCE, HEADER_WATERMARK, default_serialize, to_json
from processors.time import NO_TIME
from processors.triggers import EarlyEvery
from processors.watermarks import WatermarkTracker

__all__ = ["Executor", "KeyedStateFactory", "OutBatch", "OutRecord", "PartitionExtension", "RecordLike",
           "StoredBatches", "TopicPartition", "output_records"]

TopicPartition = tuple[str, int]
# (operator id, the operator's logic builder) -> the map holding its per-key logics
KeyedStateFactory = Callable[[str, Callable[[Any], Logic]], MutableMapping[Hashable, Logic]]


class RecordLike(Protocol):
    """A source record: ``broker.protocol.records.Record``, an aiokafka record or ``SourceRecord``."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


class StoredBatches(Protocol):
    """Records still in their stored batches (``processors.fastdecode.StoredRecords``)."""

    @property
    def parts(self) -> Sequence[Any]:
        """Lists of record objects, and spans whose ``cursor()`` is a ``record_kernels.StoredCursor``."""

    def records(self) -> Sequence[RecordLike]:
        """Them all decoded into record objects."""


class PartitionExtension(Protocol):
    """Per-source-partition state kept beside the keyed state (the repartition stages' sequence
    numbers and watermarks): checkpointed, restored and dropped with its partition."""

    name: str

    def snapshot(self, tp: TopicPartition) -> Any:
        """JSON/msgpack-ready state of ``tp`` (None: nothing to keep)."""

    def restore(self, tp: TopicPartition, state: Any) -> None: ...

    def drop(self, tp: TopicPartition) -> None: ...


@dataclass(frozen=True, slots=True)
class OutRecord:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int
    partition: int | None = None  # None: the sink's partitioner (murmur2 of the key) chooses


@dataclass(frozen=True, slots=True)
class OutBatch(OutRecord):
    """``count`` records already encoded as the records section of one RecordBatch (Kafka's v2 record
    layout) for ``partition``; ``value`` is that section, ``timestamp`` the first record's. Only the
    repartition stages make these (``processors.repartition``), and only ``KafkaSink`` writes them
    (it adds the batch header): repartitioned stages run standalone only."""

    count: int = 0
    max_timestamp: int = 0


def output_records(outputs: list[OutRecord]) -> int:
    """How many records ``outputs`` hold (an ``OutBatch`` holds ``count``)."""
    n = len(outputs)
    for o in outputs:
        if type(o) is OutBatch:
            n += o.count - 1
    return n


class _Node:
    def __init__(self, spec: NodeSpec | None, ex: Executor) -> None:
        self.spec = spec
        self.ex = ex
        self.children: list[_Node] = []

    def push(self, items: list[Any]) -> None:
        for child in self.children:
            child.push(items)

    def watermark(self, wm: int, now: int) -> None:
        for child in self.children:
            child.watermark(wm, now)

    def tick(self, now: int, wm: int) -> None:
        for child in self.children:
            child.tick(now, wm)

    def eof(self, wm: int, now: int) -> None:
        for child in self.children:
            child.eof(wm, now)


class _Stateless(_Node):
    """map / filter / flat_map / key_by over a batch; a failing item goes to the dead-letter topic."""

    def __init__(self, spec: NodeSpec, ex: Executor) -> None:
        super().__init__(spec, ex)
        self.kind = spec.kind
        self.fn = spec.config.fn

    def _run(self, items: list[Any]) -> list[Any]:
        fn = self.fn
        if self.kind == "map":
            return [(ts, fn(v)) for ts, v in items]
        if self.kind == "filter":
            return [(ts, v) for ts, v in items if fn(v)]
        if self.kind == "key_by":
            return [(ts, fn(v), v) for ts, v in items]
        return [(ts, out) for ts, v in items for out in fn(v)]

    def push(self, items: list[Any]) -> None:
        try:
            out = self._run(items)
        except Exception:
            out = []
            for item in items:
                try:
                    out.extend(self._run([item]))
                except Exception as exc:
                    self.ex.dead_letter(item[1], item[0], f"{self.kind} failed: {exc!r}")
        if out:
            for child in self.children:
                child.push(out)


class _Keyed(_Node):
    """window / process / reduce: per-key logics in a ``KeyedRuntime``; late records to a side sink."""

    def __init__(self, spec: NodeSpec, ex: Executor) -> None:
        super().__init__(spec, ex)
        self.kind = spec.kind
        factory = ex.keyed_state
        self.rt = KeyedRuntime(spec.config, None if factory is None else factory(str(spec.id), spec.config.build))
        self.late_topic = spec.late_topic
        trigger = getattr(spec.config, "trigger", None)
        self.early_ms = trigger.interval_ms if isinstance(trigger, EarlyEvery) else 0
        self.next_early = 0
        self.has_proc = self.kind == "process"

    def _flush(self) -> None:
        rt = self.rt
        if rt.out:
            ex = self.ex
            batch_tp = ex.current_tp
            for owner, out in rt.take_out():
                # emitted by a timer of a key: downstream keys it creates belong to that key's partition
                ex.current_tp = batch_tp if owner is None else owner
                for child in self.children:
                    child.push(out)
            ex.current_tp = batch_tp
        if rt.late_out:
            late, rt.late_out = rt.late_out, []
            self.ex.late_count += len(late)
            for ts, record in late:
                self.ex.emit(self.late_topic or f"{self.ex.pipeline.name}.late", ts, record)

    def push(self, items: list[Any]) -> None:
        ex = self.ex
        tp = ex.current_tp
        # a partition restored from a checkpoint is judged against at least the watermark its keys had seen
        self.rt.on_items(items, max(ex.watermark, ex.tracker.floor(tp)), ex.now, tp)
        if self.rt.errors:
            errors, self.rt.errors = self.rt.errors, []
            for ts, value, reason in errors:
                ex.dead_letter(value, ts, f"{self.kind} failed: {reason}")
        self._flush()

    def watermark(self, wm: int, now: int) -> None:
        self.rt.on_watermark(wm, now)
        self._flush()
        super().watermark(wm, now)

    def tick(self, now: int, wm: int) -> None:
        if self.early_ms and now >= self.next_early:
            self.next_early = now - now % self.early_ms + self.early_ms
            self.rt.on_notify(now, wm)
        elif self.has_proc:
            self.rt.on_notify(now, wm)
        else:
            self.rt.dirty.clear()
        self._flush()
        super().tick(now, wm)

    def eof(self, wm: int, now: int) -> None:
        self.rt.on_eof(wm, now)
        self._flush()
        super().eof(wm, now)


class _Sink(_Node):
    def __init__(self, spec: NodeSpec, ex: Executor) -> None:
        super().__init__(spec, ex)
        self.topic = spec.config.topic
        self.serialize = spec.config.serializer or default_serialize

    def push(self, items: list[Any]) -> None:
        out = self.ex.outputs
        topic = self.topic
        serialize = self.serialize
        for item in items:
            e = serialize(item[-1])
            out.append(OutRecord(topic, e.key, e.value, e.headers, item[0]))


class Executor:
    def __init__(self, pipeline: Pipeline, now: int = 0, *, keyed_state: KeyedStateFactory | None = None) -> None:
        pipeline.validate()
        self.pipeline = pipeline
        self.keyed_state = keyed_state  # None: every key's state in a dict (processors.state_store spills)
        src = pipeline.source_config
        self.tracker = WatermarkTracker(src.watermarks, src.all_idle, src.alignment)
        self.event_time = src.event_time
        self.deserializer: Callable[[RecordLike], Any] = _deserializer(src.deserializer)
        self._json = src.deserializer == "json"
        self._source_key_by: _Stateless | None = None  # set below: see process()
        self.outputs: list[OutRecord] = []
        self.watermark = NO_TIME
        self.now = now
        self.current_tp: Hashable = None
        self.records_in = 0
        self.late_count = 0
        self.dead_letters = 0
        self.root = _Node(None, self)
        self.keyed: dict[int, _Keyed] = {}
        self.extensions: list[PartitionExtension] = []
        built: dict[int | None, _Node] = {None: self.root}
        for spec in pipeline.nodes:
            node = self._build(spec)
            built[spec.id] = node
            built[spec.parent].children.append(node)
        only = self.root.children[0] if len(self.root.children) == 1 else None
        if self._json and type(only) is _Stateless and only.kind == "key_by":
            self._source_key_by = only

    def close(self) -> None:
        """Release what keyed state stores hold (a spill store's files and lock)."""
        for node in self.keyed.values():
            close = getattr(node.rt.logics, "close", None)
            if close is not None:
                close()

    def _build(self, spec: NodeSpec) -> _Node:
        if spec.kind in ("map", "filter", "flat_map", "key_by"):
            return _Stateless(spec, self)
        if spec.kind == "sink":
            return _Sink(spec, self)
        if callable(getattr(spec.config, "build", None)):  # window, process, reduce, custom keyed
            node = _Keyed(spec, self)
            self.keyed[spec.id] = node
            return node
        raise PipelineDefinitionError(f"unknown operator kind {spec.kind!r}")

    # -- input ---------------------------------------------------------------------------------

    def add_partition(self, tp: TopicPartition, now: int, max_ts: int = NO_TIME) -> None:
        self.tracker.add_partition(tp, now, max_ts)

    def remove_partition(self, tp: TopicPartition) -> None:
        self.tracker.remove_partition(tp)

    def partition_checkpoint(self, tp: TopicPartition, now: int) -> tuple[int, int, int, int]:
        """``(max event ts, heartbeat watermark, floor, quiet ms)`` of ``tp`` for a checkpoint: the
        floor is the watermark its records were judged against (the operator's, or a higher
        restored one); quiet ms is processing time since it was last heard of (its idleness)."""
        pw = self.tracker.partitions.get(tp)
        if pw is None:
            return NO_TIME, NO_TIME, self.watermark, 0
        return pw.max_ts, pw.explicit, max(self.watermark, pw.floor), pw.quiet_ms(now)

    def restore_partition(self, tp: TopicPartition, now: int, *, max_ts: int, heartbeat: int, floor: int,
                          quiet_ms: int, ops: dict[str, list[list[Any]]],
                          extras: dict[str, Any] | None = None) -> None:
        """Take over ``tp`` as a checkpoint left it: its event time, idleness, floor, keyed state and
        extensions' state. Call ``advance(now)`` once every restored partition is in."""
        self.tracker.restore_partition(tp, now, max_ts=max_ts, explicit=heartbeat, floor=floor, quiet_ms=quiet_ms)
        self.restore(ops)
        for ext in self.extensions:
            ext.restore(tp, (extras or {}).get(ext.name))

    def partition_extras(self, tp: TopicPartition) -> dict[str, Any]:
        """The extensions' state of ``tp`` for a checkpoint."""
        out = {}
        for ext in self.extensions:
            state = ext.snapshot(tp)
            if state is not None:
                out[ext.name] = state
        return out

    def process(self, tp: TopicPartition, records: Sequence[RecordLike], now: int) -> None:
        self.now = now
        if not self._json:
            self._process_generic(tp, records, now)
            return
        decode = _KERNELS.decode_json
        key_by, targets, punctuation, undecodable = self._json_loop(tp, now)
        max_ts = NO_TIME
        # In slices: the values of a slice die before the next is decoded, so the garbage collector's
        # youngest generation (700 containers) is not filled with live values and rescanned.
        for i in range(0, len(records), _SLICE):
            key_failures: list[tuple[int, Any, Exception]] = []
            items, decoded, slice_max = decode(records[i : i + _SLICE], self.event_time, key_by, punctuation,
                                               undecodable, key_failures)
            max_ts = max(max_ts, self._push_decoded(tp, items, decoded, slice_max, key_failures, targets))
        self.tracker.observe(tp, max_ts, now)
        self.advance(now)

    def process_stored(self, tp: TopicPartition, stored: StoredBatches, now: int) -> None:
        """``process`` over records still in their stored batches (``processors.fastdecode.StoredRecords``):
        a JSON pipeline's values are read from the bytes (``record_kernels.decode_stored_json``), with
        no record object; any other pipeline (or an executor whose ``process`` is its own) gets them
        decoded."""
        if not self._json or type(self).process is not Executor.process:
            self.process(tp, stored.records(), now)
            return
        self.now = now
        decode_stored, decode = _KERNELS.decode_stored_json, _KERNELS.decode_json
        key_by, targets, punctuation, undecodable = self._json_loop(tp, now)
        max_ts = NO_TIME
        for part in stored.parts:
            key_failures: list[tuple[int, Any, Exception]] = []
            if type(part) is list:  # record objects (a batch only a decoder reads): as process() does
                for i in range(0, len(part), _SLICE):
                    items, decoded, slice_max = decode(part[i : i + _SLICE], self.event_time, key_by, punctuation,
                                                       undecodable, key_failures)
                    max_ts = max(max_ts, self._push_decoded(tp, items, decoded, slice_max, key_failures, targets))
                    key_failures = []
                continue
            cursor = part.cursor()
            try:
                while not cursor.done():
                    items, decoded, slice_max = decode_stored(cursor, _SLICE, self.event_time, key_by, punctuation,
                                                              undecodable, key_failures)
                    max_ts = max(max_ts, self._push_decoded(tp, items, decoded, slice_max, key_failures, targets))
                    key_failures = []
            except (ValueError, IndexError) as exc:
                raise CorruptRecordError(f"cannot decode stored records: {exc!r}") from exc
        self.tracker.observe(tp, max_ts, now)
        self.advance(now)

    def _json_loop(self, tp: TopicPartition, now: int) -> tuple[Callable[[Any], Any] | None, list[_Node],
                                                                Callable[[RecordLike], bool],
                                                                Callable[[RecordLike, Exception], None]]:
        """What the JSON decode loop needs: the key_by under the source when it is the source's only
        operator (done in the decode loop), the nodes the items go to, and the callbacks."""
        key_node = self._source_key_by
        key_by = None if key_node is None else key_node.fn
        targets = self.root.children if key_node is None else key_node.children

        def punctuation(r: RecordLike) -> bool:
            return self._punctuation(tp, r, now)

        def undecodable(r: RecordLike, exc: Exception) -> None:
            self._undecodable(tp, r, exc)

        return key_by, targets, punctuation, undecodable

    def _push_decoded(self, tp: TopicPartition, items: list[Any], decoded: int, slice_max: int,
                      key_failures: list[tuple[int, Any, Exception]], targets: list[_Node]) -> int:
        """A decoded slice down the tree; returns its greatest event time (NO_TIME: none decoded)."""
        if not decoded:
            return NO_TIME
        self.records_in += decoded
        self.current_tp = tp
        for ts, value, exc in key_failures:  # as _Stateless.push dead-letters them
            self.dead_letter(value, ts, f"key_by failed: {exc!r}")
        if items:
            for child in targets:
                child.push(items)
        return slice_max

    def _process_generic(self, tp: TopicPartition, records: Sequence[RecordLike], now: int) -> None:
        max_ts = NO_TIME
        for i in range(0, len(records), _SLICE):
            items = self._decode_generic(tp, records[i : i + _SLICE], now)
            if items:
                self.records_in += len(items)
                self.current_tp = tp
                self.root.push(items)
                max_ts = max(max_ts, max(map(_first, items)))
        self.tracker.observe(tp, max_ts, now)
        self.advance(now)

    def _decode(self, tp: TopicPartition, records: Sequence[RecordLike], now: int,
                raws: list[bytes | None] | None = None) -> list[tuple[int, Any]]:
        """JSON values as ``(ts, value)`` items (``processors.record_kernels``). ``raws``: also collect
        the value bytes of each item (a repartition forwards them as they came)."""
        items, _, _ = _KERNELS.decode_json(records, self.event_time, None, lambda r: self._punctuation(tp, r, now),
                                           lambda r, exc: self._undecodable(tp, r, exc), [], raws)
        return items

    def _decode_generic(self, tp: TopicPartition, records: Sequence[RecordLike], now: int) -> list[tuple[int, Any]]:
        deserialize = self.deserializer
        event_time = self.event_time
        items: list[tuple[int, Any]] = []
        for r in records:
            if r.headers and self._punctuation(tp, r, now):
                continue
            try:
                v = deserialize(r)
                items.append((r.timestamp if event_time is None else int(event_time(v)), v))
            except Exception as exc:
                self._undecodable(tp, r, exc)
        return items

    def _punctuation(self, tp: TopicPartition, r: RecordLike, now: int) -> bool:
        mark = next((v for k, v in r.headers if k == HEADER_WATERMARK), None)
        if mark is None:
            return False
        try:
            self.tracker.heartbeat(tp, int(mark), now)
        except ValueError as exc:
            self._undecodable(tp, r, exc)
        return True

    def _undecodable(self, tp: TopicPartition, r: RecordLike, exc: Exception) -> None:
        self.dead_letter(r.value, r.timestamp, f"cannot decode record: {exc!r}",
                         detail=f"{tp[0]}/{tp[1]}/{r.offset}", key=r.key)

    def heartbeat(self, tp: TopicPartition, watermark: int, now: int) -> None:
        """A punctuation: partition ``tp`` will send nothing at or before ``watermark``."""
        self.tracker.heartbeat(tp, watermark, now)
        self.advance(now)

    def rewind(self, floor: int) -> None:
        """Lower the operator watermark to ``floor`` for partitions about to be restored behind it.
        Windows that fired stay fired; the partitions already here keep being judged against the
        watermark they had seen (it becomes their floor), so none of their records turns on time
        again. Without this a partition moving in from an instance that was behind would have its
        replayed records judged late here (rescaling would change results)."""
        for pw in self.tracker.partitions.values():
            pw.floor = max(pw.floor, self.watermark)
        self.tracker.current = min(self.tracker.current, floor)
        self.watermark = min(self.watermark, floor)

    def advance(self, now: int) -> None:
        self.now = now
        wm = self.tracker.advance(now)
        if wm > self.watermark:
            self.watermark = wm
            self.root.watermark(wm, now)

    def tick(self, now: int) -> None:
        """Processing time passed: idle partitions, all-idle policy, early firings, proc timers."""
        self.advance(now)
        self.root.tick(now, self.watermark)

    def eof(self, now: int) -> None:
        """Bounded input ended: close every open window."""
        self.now = now
        self.root.eof(self.watermark, now)

    # -- output ----------------------------------------------------------------------------------

    def emit(self, topic: str, ts: int, item: Any) -> None:
        e = default_serialize(item)
        self.outputs.append(OutRecord(topic, e.key, e.value, e.headers, ts))

    def dead_letter(self, value: Any, ts: int, reason: str, *, detail: str = "", key: bytes | None = None) -> None:
        self.dead_letters += 1
        payload = value if isinstance(value, bytes) or value is None else to_json(value)
        headers: tuple[tuple[str, bytes | None], ...] = ((HEADER_ERROR, reason.encode()),)
        if detail:
            headers += ((HEADER_SOURCE, detail.encode()),)
        topic = self.pipeline.source_config.dead_letter_topic
        self.outputs.append(OutRecord(topic, key, payload, headers, ts if ts != NO_TIME else self.now))

    def take_outputs(self) -> list[OutRecord]:
        out, self.outputs = self.outputs, []
        return out

    # -- checkpoints -------------------------------------------------------------------------------

    def snapshot(self, tps: set[TopicPartition] | None = None) -> dict[str, Any]:
        accept = None if tps is None else (lambda owner: owner in tps or owner is None)
        return {str(nid): node.rt.snapshot(accept) for nid, node in self.keyed.items()}

    def restore(self, ops: dict[str, list[list[Any]]]) -> None:
        for nid, entries in ops.items():
            node = self.keyed.get(int(nid))
            if node is None:
                raise PipelineDefinitionError(f"the checkpoint holds state for keyed operator {nid}, which "
                                              f"pipeline {self.pipeline.name!r} does not have")
            node.rt.restore(entries, self.watermark)

    def drop_partitions(self, tps: set[TopicPartition]) -> None:
        for node in self.keyed.values():
            node.rt.drop(lambda owner: owner in tps)
        for tp in tps:
            self.tracker.remove_partition(tp)
            for ext in self.extensions:
                ext.drop(tp)


_KERNELS = select(record_kernels)  # the compiled build of the per-record loops when there is one (setup.py)
_first = operator.itemgetter(0)
_SLICE = 200  # records per slice in process(): 3 containers each (value, item, keyed item) stay under 700


def _deserializer(spec: str | Callable[[Any], Any]) -> Callable[[RecordLike], Any]:
    if spec == "json":
        loads = json.loads
        return lambda r: loads(r.value) if r.value is not None else None
    if spec == "raw":
        return lambda r: r
    assert callable(spec)
    return spec
