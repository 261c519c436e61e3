"""Repartitioning: a ``key_by`` on a key the input is not partitioned by goes through a topic.

As in Kafka Streams, a standalone pipeline whose ``key_by`` repartitions runs as two stages in
every instance, each a consumer group of its own (``plan_shuffle`` splits the graph):

* the **upstream** stage reads the input topics (group ``<group>``), runs the stateless operators
  before the ``key_by`` (and every branch that does not hang off it) and writes each item to
  ``<group>.repartition.<node id>``, partition ``murmur2(key) % n`` (Kafka's default partitioner,
  ``broker.log.partitioner``): every key is owned by exactly one instance;
* the **downstream** stage reads that topic (group ``<group>.repartition.<node id>``) and runs the
  keyed operators after the ``key_by``; its keyed state belongs to the repartition partition the key
  hashes to, so a rebalance moves state with partitions (checkpoint on revoke, restore on assign).

Repartition records: key = the key as JSON (tuples become lists and come back as tuples), value =
the item as JSON (values crossing a shuffle must be JSON-serializable; a key_by straight on a JSON
source forwards the input value's bytes, which the downstream decodes as the upstream did: no
second encoding), timestamp = event time,
header ``sluice-shuffle-seq: <topic>:<partition>:<n>``: the input partition it came from and its
sequence number among that partition's records sent to this repartition partition.

**Exactly once across the shuffle.** Under exactly-once the upstream writes, its checkpoint and its
input offsets commit in one transaction, and the downstream reads ``read_committed``. Under
at-least-once a crashed upstream instance replays its input from its last checkpoint and writes
records that were already written. The sequence counters are checkpointed with their input
partition, and the pipeline before the shuffle is stateless and deterministic, so a replay writes
the same sequence numbers again; the downstream keeps, per repartition partition, the highest
number seen per input partition (checkpointed with that partition's keyed state) and drops any
record at or below it. Records from one input partition reach one repartition partition in order
(one owner at a time, one producer, one request in flight per broker), so that is exact.

**Watermarks across the shuffle (the rule).** Each upstream instance publishes marks (header
``sluice-shuffle-mark``, an empty value) to every repartition partition: its operator watermark, the
input partitions it owns and the partition count of each input topic. It publishes after the
records they cover (same producer, same partition: in order), when its watermark moves (at most
every 100 ms), and every second or after an ownership change on its tick. The downstream keeps,
per repartition partition, a watermark per *input partition*: the highest mark naming it (marks
only ever raise it: a restarted owner's older marks come with replayed records that are
duplicates). The repartition partition's watermark is the minimum over *all* input partitions,
and stays unknown (holding time) until every input partition has been named. So:

* a gone or killed upstream instance holds nothing for long: after the group's session timeout its
  input partitions are assigned to other instances, which restore them and publish for them;
* an idle upstream input partition is handled where it is read: the pipeline's own idle timeout
  and all-idle policy move the owner's watermark past it, and the owner's marks carry that on;
* an upstream that is stalled (alive, owning partitions, not progressing) holds the downstream
  watermark, exactly as the same partitions would hold a single instance's.

The downstream stage never applies an idle timeout of its own: every repartition partition receives
marks while any upstream instance lives. Marks seen are checkpointed with their partition, so a
partition moving downstream keeps its time.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.log.partitioner import partition_for_key
from broker.native import select
from processors import jsonvalues, shuffle_kernels
from processors.errors import PipelineDefinitionError
from processors.executor import (
    _SLICE,
    Executor,
    KeyedStateFactory,
    OutBatch,
    OutRecord,
    RecordLike,
    TopicPartition,
    _first,
    _Node,
)
from processors.fastdecode import SourceRecord
from processors.kafka_records import RawRecords, RawSegment
from processors.pipeline import NodeSpec, Pipeline, SourceConfig
from processors.serde import to_json
from processors.time import NO_TIME
from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness

__all__ = [
    "HEADER_SHUFFLE_MARK",
    "HEADER_SHUFFLE_SEQ",
    "RepartitionConfig",
    "ShufflePlan",
    "ShuffleReader",
    "ShuffleWriter",
    "decode_key",
    "encode_key",
    "plan_shuffle",
    "repartition_topic",
]

HEADER_SHUFFLE_SEQ = "sluice-shuffle-seq"
HEADER_SHUFFLE_MARK = "sluice-shuffle-mark"
if TYPE_CHECKING:
    from processors.shuffle_kernels import Finished
_KERNELS = select(shuffle_kernels)  # the compiled build of the per-record loops when there is one
MARK_MIN_INTERVAL_MS = 100  # marks on watermark moves, at most this often
MARK_REFRESH_MS = 1_000  # and at least this often (ticks), or after an ownership change
# one encoder for every record (json.dumps builds one per call when given options); no fallback: a
# value JSON cannot carry is dead-lettered rather than turned into something else
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
_STATELESS = ("map", "filter", "flat_map")
log = logging.getLogger("processors.repartition")


def repartition_topic(group: str, node_id: int) -> str:
    return f"{group}.repartition.{node_id}"


def encode_key(key: Any) -> bytes:
    return json.dumps(key, separators=(",", ":")).encode()


def decode_key(raw: bytes | None) -> Hashable:
    return _hashable(json.loads(raw)) if raw is not None else None


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


# -- the plan -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RepartitionConfig:
    """The upstream stage's end: key items by ``fn`` and write them to ``topic``."""

    topic: str
    fn: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class ShufflePlan:
    upstream: Pipeline
    downstream: Pipeline
    topic: str
    partitions: int | None  # None: the most partitions of any input topic


def plan_shuffle(pipeline: Pipeline) -> ShufflePlan | None:
    """Split ``pipeline`` at its repartitioning ``key_by`` (None when it has none)."""
    shuffles = [n for n in pipeline.nodes if n.kind == "key_by" and n.config.repartition is not False]
    if not shuffles:
        return None
    if len(shuffles) > 1:
        raise PipelineDefinitionError(
            f"pipeline {pipeline.name!r}: one repartitioning key_by per pipeline (nodes "
            f"{[n.id for n in shuffles]}); mark the others repartition=False or chain two pipelines")
    key_by = shuffles[0]
    by_id = {n.id: n for n in pipeline.nodes}
    parent = key_by.parent
    while parent is not None:  # replays must write the same items again: only stateless steps before it
        if by_id[parent].kind not in _STATELESS:
            raise PipelineDefinitionError(
                f"pipeline {pipeline.name!r}: a repartitioning key_by must follow only map/filter/flat_map "
                f"(node {parent} is {by_id[parent].kind!r})")
        parent = by_id[parent].parent
    below: set[int] = set()
    for n in pipeline.nodes:  # definition order: a parent comes before its children
        if n.parent == key_by.id or n.parent in below:
            below.add(n.id)
    src = pipeline.source_config
    topic = repartition_topic(src.group, key_by.id)
    upstream = Pipeline(src)
    for n in pipeline.nodes:
        if n.id == key_by.id:
            upstream.nodes.append(NodeSpec(n.id, "repartition", RepartitionConfig(topic, n.config.fn), n.parent))
        elif n.id not in below:
            upstream.nodes.append(n)
    downstream = Pipeline(SourceConfig(
        topics=(topic,), group=topic, event_time=None,
        # time comes from the marks only; no idleness of its own (see the module rules)
        watermarks=BoundedOutOfOrderness(0, None), all_idle=AllIdlePolicy.HOLD,
        deserializer="raw", dead_letter_topic=src.dead_letter_topic))
    renumber: dict[int, int] = {}
    for n in pipeline.nodes:
        if n.id in below:
            renumber[n.id] = len(downstream.nodes)
            new_parent = None if n.parent == key_by.id else renumber[n.parent]  # type: ignore[index]
            downstream.nodes.append(NodeSpec(renumber[n.id], n.kind, n.config, new_parent, n.keyed, n.late_topic))
    upstream.validate()
    downstream.validate()
    return ShufflePlan(upstream, downstream, topic, key_by.config.partitions)


# -- upstream ---------------------------------------------------------------------------------------


class _SequenceCounters:
    """Per input partition: the next sequence number for each repartition partition."""

    name = "shuffle-seq"

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.next: dict[TopicPartition, list[int]] = {}

    def of(self, tp: TopicPartition) -> list[int]:
        counters = self.next.get(tp)
        if counters is None:
            counters = self.next[tp] = [0] * self.partitions
        return counters

    def snapshot(self, tp: TopicPartition) -> Any:
        return self.next.get(tp)

    def restore(self, tp: TopicPartition, state: Any) -> None:
        if state is None:
            self.next.pop(tp, None)
            return
        counters = [int(c) for c in state]
        if len(counters) != self.partitions:
            raise PipelineDefinitionError(
                f"the checkpoint of {tp[0]}/{tp[1]} counts {len(counters)} repartition partitions, the topic "
                f"has {self.partitions}: a repartition topic's partition count cannot change under a pipeline")
        self.next[tp] = counters

    def drop(self, tp: TopicPartition) -> None:
        self.next.pop(tp, None)


def _encode_value(value: Any) -> bytes:
    return _ENCODE(value).encode()


class _RepartitionNode(_Node):
    """Writes keyed items into the repartition partitions' batches (``processors.shuffle_kernels``)."""

    def __init__(self, spec: NodeSpec, ex: ShuffleWriter) -> None:
        super().__init__(spec, ex)
        self.writer = ex
        self.topic: str = spec.config.topic
        self.fn = spec.config.fn
        self.where: dict[Any, tuple[bytes, int]] = {}  # key -> (encoded key, partition): murmur2 is Python
        self.builders = [_KERNELS.RecordsBuilder(p) for p in range(ex.partitions)]
        self.finished: list[Finished] = []  # builders finished when full, not taken yet

    def _locate(self, key: Any) -> tuple[bytes, int]:
        raw = encode_key(key)
        return raw, partition_for_key(raw, self.writer.partitions)

    def _write(self, items: list[tuple[int, Any]], raws: list[bytes | None] | None, reason: str) -> None:
        ex = self.writer
        tp = ex.current_tp
        assert isinstance(tp, tuple)
        failures: list[tuple[int, Any, Exception]] = []
        _KERNELS.write_items(items, raws, self.fn, self.where, self._locate, _encode_value, self.builders,
                             ex.counters.of(tp), f"{tp[0]}:{tp[1]}:".encode(), self.finished, failures)
        for ts, value, exc in failures:
            ex.dead_letter(value, ts, f"{reason}: {exc!r}")

    def push(self, items: list[Any]) -> None:
        self._write(items, None, "key_by failed (the key, or a value a repartition topic cannot carry as JSON)")

    def push_forwarding(self, items: list[tuple[int, Any]], raws: list[bytes | None]) -> None:
        """``push`` for a key_by straight on a JSON source: each item's value goes out as the bytes it
        came in (the downstream decodes them with the same decoder, so it sees the same value)."""
        self._write(items, raws, "key_by failed")

    def mark(self, mark: bytes, now: int) -> None:
        for builder in self.builders:  # after the records it covers, in each partition
            builder.add_mark(mark, now)

    def take(self, out: list[OutRecord]) -> None:
        """Every record written so far, as one ``OutBatch`` per partition (more when one filled up)."""
        finished = self.finished
        for builder in self.builders:
            last = builder.finish()
            if last is not None:
                finished.append(last)
        topic = self.topic
        for p, records, count, base_ts, max_ts in finished:
            out.append(OutBatch(topic, None, records, (), base_ts, p, count, max_ts))
        finished.clear()

    def watermark(self, wm: int, now: int) -> None:
        if now - self.writer.marked_at >= MARK_MIN_INTERVAL_MS:
            self.writer.publish_marks(now)

    def tick(self, now: int, wm: int) -> None:
        w = self.writer
        if now - w.marked_at >= MARK_REFRESH_MS or (wm, sorted(w.owned())) != w.last_mark:
            w.publish_marks(now)


class ShuffleWriter(Executor):
    """The upstream stage's executor: ``repartition`` nodes write keyed items and marks."""

    def __init__(self, pipeline: Pipeline, now: int, *, partitions: int,
                 partition_counts: Callable[[], dict[str, int]], keyed_state: KeyedStateFactory | None = None) -> None:
        self.partitions = partitions
        self.partition_counts = partition_counts  # input topic -> partition count (the marks name them)
        self.counters = _SequenceCounters(partitions)
        self.writers: list[_RepartitionNode] = []
        self.marked_at = NO_TIME
        self.last_mark: tuple[int, list[Hashable]] = (NO_TIME, [])
        self.marks_sent = 0
        super().__init__(pipeline, now, keyed_state=keyed_state)  # keyed branches not under the key_by
        self.extensions.append(self.counters)
        # key_by straight on a JSON source, nothing else reading the source: values are forwarded as
        # their input bytes, not decoded and encoded again
        only = self.root.children[0] if len(self.root.children) == 1 else None
        self._forwarding = only if self._json and isinstance(only, _RepartitionNode) else None

    def process(self, tp: TopicPartition, records: Sequence[RecordLike], now: int) -> None:
        node = self._forwarding
        if node is None:
            super().process(tp, records, now)
            return
        self.now = now
        max_ts = NO_TIME
        for i in range(0, len(records), _SLICE):
            raws: list[bytes | None] = []
            items = self._decode(tp, records[i : i + _SLICE], now, raws)
            if items:
                self.records_in += len(items)
                self.current_tp = tp
                node.push_forwarding(items, raws)
                max_ts = max(max_ts, max(map(_first, items)))
        self.tracker.observe(tp, max_ts, now)
        self.advance(now)

    def _build(self, spec: NodeSpec) -> _Node:
        if spec.kind == "repartition":
            node = _RepartitionNode(spec, self)
            self.writers.append(node)
            return node
        return super()._build(spec)

    def owned(self) -> list[TopicPartition]:
        return [tp for tp in self.tracker.partitions if isinstance(tp, tuple)]

    def publish_marks(self, now: int) -> None:
        """Tell every repartition partition this instance's watermark and the input partitions it owns."""
        owned = sorted(self.owned())
        self.marked_at = now
        self.last_mark = (self.watermark, list(owned))
        if not owned:
            return
        mark = to_json({"wm": self.watermark, "parts": owned, "of": self.partition_counts()})
        for node in self.writers:
            node.mark(mark, now)
        self.marks_sent += 1

    def take_outputs(self) -> list[OutRecord]:
        """The outputs, with the repartition records written so far as ``OutBatch``es: the runner takes
        them after every batch, tick and assignment, so a checkpoint never covers records still here."""
        for node in self.writers:
            node.take(self.outputs)
        return super().take_outputs()


# -- downstream ------------------------------------------------------------------------------------


class _PartitionIn:
    """What one repartition partition has seen: the last sequence number per input partition, the
    newest mark per input partition, and how many partitions each input topic has."""

    __slots__ = ("marks", "of", "seqs")

    def __init__(self) -> None:
        self.seqs: dict[str, int] = {}
        self.marks: dict[str, int] = {}
        self.of: dict[str, int] = {}

    def mark(self, doc: dict[str, Any]) -> None:
        wm = int(doc["wm"])
        for topic, partition in doc["parts"]:
            origin = f"{topic}:{int(partition)}"
            if wm > self.marks.get(origin, NO_TIME) or origin not in self.marks:
                self.marks[origin] = wm
        for topic, count in doc["of"].items():
            self.of[topic] = max(self.of.get(topic, 0), int(count))

    def watermark(self) -> int:
        """The minimum over every input partition; NO_TIME until each has been named by a mark."""
        if not self.of:
            return NO_TIME
        marks = self.marks
        low: int | None = None
        for topic, count in self.of.items():
            for p in range(count):
                wm = marks.get(f"{topic}:{p}")
                if wm is None:
                    return NO_TIME
                if low is None or wm < low:
                    low = wm
        return NO_TIME if low is None else low


class _ShuffleInputs:
    name = "shuffle-in"

    def __init__(self) -> None:
        self.parts: dict[TopicPartition, _PartitionIn] = {}

    def of(self, tp: TopicPartition) -> _PartitionIn:
        part = self.parts.get(tp)
        if part is None:
            part = self.parts[tp] = _PartitionIn()
        return part

    def snapshot(self, tp: TopicPartition) -> Any:
        part = self.parts.get(tp)
        return None if part is None else {"seqs": part.seqs, "marks": part.marks, "of": part.of}

    def restore(self, tp: TopicPartition, state: Any) -> None:
        part = self.parts[tp] = _PartitionIn()
        if state:
            part.seqs = {str(k): int(v) for k, v in state.get("seqs", {}).items()}
            part.marks = {str(k): int(v) for k, v in state.get("marks", {}).items()}
            part.of = {str(k): int(v) for k, v in state.get("of", {}).items()}

    def drop(self, tp: TopicPartition) -> None:
        self.parts.pop(tp, None)


class ShuffleReader(Executor):
    """The downstream stage's executor: decodes repartition records into keyed items, drops replayed
    duplicates, and takes each partition's watermark from the marks (see the module rules)."""

    def __init__(self, pipeline: Pipeline, now: int, *, keyed_state: KeyedStateFactory | None = None) -> None:
        super().__init__(pipeline, now, keyed_state=keyed_state)  # the state bound holds here too
        self.inputs = _ShuffleInputs()
        self.extensions.append(self.inputs)
        self.duplicates = 0
        self._keys: dict[bytes, Hashable] = {}  # encoded key -> key: few keys, many records
        self._origins: dict[bytes, str] = {}  # b"<topic>:<partition>" -> its text

    def process(self, tp: TopicPartition, records: Sequence[RecordLike], now: int) -> None:
        self.now = now
        part = self.inputs.of(tp)
        marks: list[RecordLike] = []
        bad: list[tuple[RecordLike, Exception]] = []
        duplicates = 0
        # in slices, as Executor.process: a slice's values die before the next is decoded, so the
        # garbage collector's youngest generation is not filled with live values and rescanned
        dedupe = _KERNELS.SeqFilter(part.seqs, self._origins)
        for piece in records.parts if type(records) is RawRecords else [records]:
            if isinstance(piece, RawSegment):  # read where they lie in the fetched bytes (processors.kafka_records)
                data, pos, offset, left = piece.data, piece.pos, piece.offset, piece.count
                while left:
                    n = min(left, _SLICE)
                    items, dropped, pos = _KERNELS.read_raw(data, pos, n, offset, piece.base_ts, dedupe, self._keys,
                                                            decode_key, jsonvalues.loads, SourceRecord, marks, bad)
                    offset += n
                    left -= n
                    duplicates += dropped
                    self._push(tp, items)
                continue
            for i in range(0, len(piece), _SLICE):
                items, dropped = _KERNELS.read_records(piece[i : i + _SLICE], dedupe, self._keys, decode_key,
                                                       jsonvalues.loads, marks, bad)
                duplicates += dropped
                self._push(tp, items)
        dedupe.close()
        for r in marks:
            try:
                raw = next(value for name, value in r.headers if name == HEADER_SHUFFLE_MARK)
                part.mark(json.loads(raw or b""))
            except (ValueError, KeyError, TypeError) as exc:
                self._undecodable(tp, r, exc)
        for r, error in bad:
            self._undecodable(tp, r, error)
        if duplicates:
            self.duplicates += duplicates
            log.info("dropped records a replaying upstream instance wrote again",
                     extra={"partition": f"{tp[0]}/{tp[1]}", "dropped": duplicates,
                            "dropped_total": self.duplicates})
        self.tracker.observe(tp, NO_TIME, now)
        wm = part.watermark()
        if wm != NO_TIME:
            self.tracker.heartbeat(tp, wm, now)
        self.advance(now)

    def _push(self, tp: TopicPartition, items: list[tuple[int, Any, Any]]) -> None:
        self.records_in += len(items)
        if items:
            self.current_tp = tp
            self.root.push(items)
