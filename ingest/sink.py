"""The durable append path every device front door writes through.

``IngestSink.write(source, messages)`` routes each message, groups the records per (log topic,
partition) into RecordBatches, appends them through the LogStore (topics are auto-created when the
store allows it) and returns only once every record *and every dead letter* of the call is as
durable as its topic's flush policy promises. Listeners acknowledge devices after that, never before.

Nothing vanishes: a message that cannot be parsed or routed, or whose append the log refuses
(topic limits, unknown topic with auto-creation off), is written to the dead-letter topic with the
headers ``reason``, ``source``, ``device`` and (for MQTT) ``mqtt_topic``, its value the original bytes.
A storage failure (``StorageError``: the disk is full or failing) is not the message's fault: it is
never dead-lettered, and ``write`` raises ``SinkError`` so the caller does not acknowledge and the
device keeps the data and sends it again. The same holds when even the dead-letter append fails.
Records of other partitions that were stored before the failure may then arrive twice (at least once).

Backpressure (backpressure.py): ``write`` first reserves the payload bytes of its messages from a budget
of ``max_pending_bytes`` (bytes accepted but not yet durable) and waits while it is used up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker import native
from broker.errors import BrokerError, StorageError
from broker.log.api import LogStore
from broker.protocol import prepared_records
from broker.protocol.prepared_records import PreparedRecord
from broker.protocol.records import Headers, RecordTuple, encode_headers, encode_key, encode_record_tuples
from ingest.append_journal import journal_appends
from ingest.backpressure import MESSAGE_OVERHEAD, WriteBudget
from ingest.errors import SinkError
from ingest.health import HealthRegistry
from ingest.line_kernels import LineTarget
from ingest.router import RoutedTuple, Router
from ingest.routing import RawMessage, Rejected, SourceRef

if TYPE_CHECKING:
    from ingest.line_writes import LineOutcome

__all__ = ["DEFAULT_MAX_PENDING_BYTES", "DeviceMessage", "IngestSink", "Placement", "WriteOutcome"]

log = logging.getLogger("ingest.sink")
_encode_prepared = native.select(prepared_records).encode_prepared_records  # compiled when built

DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
_MAX_BATCH_BYTES = 512 * 1024  # records per RecordBatch, well below max.message.bytes
_RECORD_OVERHEAD = 32

# One message of a known device, for ``IngestSink.ingest_from``: (subject, payload, arrival ms or -1,
# headers after Sluice's own) — RawMessage's fields as a plain tuple, for callers that hold thousands.
DeviceMessage = tuple[str | None, bytes, int, Headers]


@dataclass(frozen=True, slots=True)
class Placement:
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What became of one message: where its records are, and why parts were dead-lettered."""

    placements: tuple[Placement, ...] = ()
    rejected: tuple[str, ...] = ()  # reasons; each has a dead letter at the same index below
    dead_letters: tuple[Placement, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.rejected


@dataclass(slots=True)
class _Group:
    """Records bound for one (topic, partition), with the index of the message each came from."""

    topic: str
    partition: int
    records: list[RecordTuple] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)
    devices: list[str | None] = field(default_factory=list)


@dataclass(slots=True)
class _LineGroup:
    """``_Group`` for ``ingest_lines``: records with their key and headers encoded, and the line of each."""

    topic: str
    partition: int
    records: list[PreparedRecord] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)


# ingest_from's per-subject target: its group (None: keyless, one per record), encoded key and headers,
# the headers (for messages with their own), the log topic
_PlannedTarget = tuple[_LineGroup | None, bytes, bytes, Headers, str]


@dataclass(slots=True)
class _Letter:
    owner: int
    reason: str
    original: bytes
    device: str | None


class IngestSink(WriteBudget):
    def __init__(
        self,
        store: LogStore,
        router: Router,
        health: HealthRegistry,
        *,
        dead_letter_topic: str = "_dead_letters",
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        clock: Callable[[], float] = time.time,
        coalesce_s: float = 0.0,
    ) -> None:
        super().__init__(health, max_pending_bytes)
        if coalesce_s < 0:
            raise ValueError("coalesce_s must not be negative")
        # Line sources without answers: a small write within this long of the last one waits for it
        # (ingest/line_turns.py; 0: every loop turn writes).
        self.coalesce_s = coalesce_s
        self.store = store
        self.router = router
        self.dead_letter_topic = dead_letter_topic
        self._clock = clock
        self.messages_written = 0
        self.dead_lettered = 0
        self.storage_failures = 0  # writes refused because the log could not store them (never dead-lettered)
        # (topic, partition count, key) -> partition: murmur2 in Python costs more than a dict lookup
        self._partition_cache: dict[tuple[str, int, bytes], int] = {}
        # encoded record headers (source, device, MQTT topic) by value: devices repeat across writes
        self._header_cache: dict[Headers, bytes] = {}
        from ingest.line_turns import LineTurns  # (imports this module)

        self.line_turns = LineTurns(self)  # ingest_lines: one write per source per loop turn

    # -- the write path -------------------------------------------------------------------------

    async def write(self, source: SourceRef, messages: Sequence[RawMessage | Rejected]) -> list[WriteOutcome]:
        """Route, append and wait for durability; one outcome per message, in order.

        A ``Rejected`` among ``messages`` is something the source already knows is bad (a line over
        the length limit, a broken CSV header): it goes straight to the dead-letter topic.
        """
        if not messages:
            return []
        outcomes: list[WriteOutcome] = []
        await self._reserved(source, messages, outcomes)
        return outcomes

    async def ingest(self, source: SourceRef, messages: Sequence[RawMessage | Rejected]) -> None:
        """``write`` without the per-message outcomes, for callers that only need "durable now"
        (MQTT acks, TCP without ack mode): the same records and dead letters, less work per message."""
        if messages:
            await self._reserved(source, messages, None)

    async def ingest_lines(self, source: SourceRef, lines: list[bytes], arrival_ms: int,
                           columns: tuple[str, ...] | None = None) -> None:
        """``ingest`` of ``RawMessage(line, arrival_ms=arrival_ms, columns=columns)`` for each of a line
        source's lines (lines its format skips already removed; ``columns``: a CSV stream's header): the same
        records and dead letters, routed a read at a time where the source's rules allow it
        (``ingest/line_writes.py``), and written together with the source's other reads of the same
        event-loop turn (``ingest/line_turns.py``)."""
        if lines:
            await self.line_turns.submit(source, lines, arrival_ms, sum(map(len, lines)), columns, False)

    async def write_lines(self, source: SourceRef, lines: list[bytes], arrival_ms: int,
                          columns: tuple[str, ...] | None = None) -> LineOutcome:
        """``ingest_lines`` that says what became of the lines (TCP ack mode): which went to the dead-letter
        topic and why, and the last offset written in each partition."""
        if not lines:
            from ingest.line_writes import LineOutcome  # (imports this module)

            return LineOutcome()
        outcome = await self.line_turns.submit(source, lines, arrival_ms, sum(map(len, lines)), columns, True)
        assert outcome is not None
        return outcome

    async def ingest_from(self, source: SourceRef, device: str | None, messages: Sequence[DeviceMessage]) -> None:
        """``ingest`` of messages from one ``device`` (an MQTT client's appends): the same records, dead
        letters and health counts, without a ``RawMessage`` per message when the router has a plan for
        each subject (``SourceRoutes.plan_for``: MQTT's default route); any other case goes through
        ``_write`` message by message."""
        if not messages:
            return
        charge = MESSAGE_OVERHEAD * len(messages) + sum([len(m[1]) for m in messages])
        await self._reserve(source, charge)
        self.health.add_in_flight(source, len(messages))
        try:
            if not await self._write_planned(source, device, messages):
                raw = [RawMessage(payload, subject, device, arrival, None, headers)
                       for subject, payload, arrival, headers in messages]
                await self._write(source, raw, None)
        finally:
            self.health.add_in_flight(source, -len(messages))
            self._release(charge)

    async def _write_planned(self, source: SourceRef, device: str | None, messages: Sequence[DeviceMessage]) -> bool:
        """Route by plans and append; False (nothing appended) when a subject has no plan or its log topic
        cannot be used as it is (``_write`` then routes each message and writes the dead letters). Keys and
        headers are encoded once per subject (``PreparedRecord``); keyless records take a partition each
        (round-robin), as in ``_write``."""
        routes = self.router.for_source(source)
        groups: dict[tuple[str, int], _LineGroup] = {}
        topics: dict[str, int] = {}
        targets: dict[str | None, _PlannedTarget] = {}  # by subject, once per call
        now = -1
        nbytes = 0
        topic = ""
        try:
            for index, (subject, payload, arrival, extra) in enumerate(messages):
                target = targets.get(subject)
                if target is None:
                    plan = routes.plan_for(subject, device, payload)
                    if plan is None:
                        return False
                    topic, key, headers = plan
                    group = None if key is None else self._line_group(groups, topics, topic, key, None)
                    target = targets[subject] = (group, encode_key(key), encode_headers(headers), headers, topic)
                group, key_part, header_part, headers, topic = target
                if group is None:  # keyless
                    group = self._line_group(groups, topics, topic, None, None)
                if arrival < 0:
                    if now < 0:
                        now = int(self._clock() * 1000)
                    arrival = now
                group.records.append(
                    (payload, key_part, encode_headers(headers + extra) if extra else header_part, arrival))
                group.owners.append(index)
                nbytes += len(payload)
        except StorageError as exc:
            raise self._storage_failed(source, topic, exc) from exc
        except BrokerError:
            return False
        self.health.record_batch(source, {device: [len(messages), nbytes]})
        if len(groups) == 1:
            failures = [await self._append_line_group(next(iter(groups.values())))]
        else:
            failures = await asyncio.gather(*(self._append_line_group(group) for group in groups.values()))
        for group, failure in zip(groups.values(), failures, strict=True):
            if isinstance(failure, StorageError):
                raise self._storage_failed(source, group.topic, failure) from failure
        letters = [_Letter(owner, failure, messages[owner][1], device)
                   for group, failure in zip(groups.values(), failures, strict=True) if isinstance(failure, str)
                   for owner in group.owners]  # the log refused these batches: their records become dead letters
        if letters:
            raw = [RawMessage(payload, subject, device, arrival, None, headers)
                   for subject, payload, arrival, headers in messages]
            await self._append_dead_letters(source, raw, letters, {})
            for letter in letters:
                self.health.error(source, letter.device, letter.reason)
            self.dead_lettered += len(letters)
        self.messages_written += len(messages)
        return True

    async def _reserved(
        self, source: SourceRef, messages: Sequence[RawMessage | Rejected], outcomes: list[WriteOutcome] | None
    ) -> None:
        charge = MESSAGE_OVERHEAD * len(messages)
        for m in messages:
            charge += len(m.payload if isinstance(m, RawMessage) else m.original)
        await self._reserve(source, charge)
        self.health.add_in_flight(source, len(messages))
        try:
            await self._write(source, messages, outcomes)
        finally:
            self.health.add_in_flight(source, -len(messages))
            self._release(charge)

    async def _write(
        self, source: SourceRef, given: Sequence[RawMessage | Rejected], outcomes: list[WriteOutcome] | None
    ) -> None:
        """Route every message, append one batch per (topic, partition), then the dead letters.

        ``outcomes`` (when given) receives one ``WriteOutcome`` per message.
        """
        routes = self.router.for_source(source)
        groups: dict[tuple[str, int], _Group] = {}
        keyed: dict[tuple[str, bytes], _Group] = {}  # (topic, key) -> its group, looked up once per call
        letters: list[_Letter] = []
        messages: list[RawMessage] = []
        seen: dict[str | None, list[int]] = {}  # device -> [messages, bytes], for one health update
        for index, item in enumerate(given):
            results: list[RoutedTuple | Rejected]
            if isinstance(item, Rejected):
                message = RawMessage(item.original, device=item.device)
                results = [item]
            else:
                message = item
                results = routes.route(message)
            messages.append(message)
            device = message.device
            for result in results:
                if isinstance(result, Rejected):
                    letters.append(_Letter(index, result.reason, result.original, result.device or message.device))
                    device = device or result.device
                    continue
                topic, routed_device, record = result
                device = device or routed_device
                key = record[1]
                group = keyed.get((topic, key)) if key is not None else None
                if group is None:
                    try:
                        group = self._group_for(groups, topic, key)
                    except StorageError as exc:
                        raise self._storage_failed(source, topic, exc) from exc
                    except BrokerError as exc:
                        letters.append(_Letter(index, f"log refused topic {topic!r}: {exc}", message.payload,
                                               routed_device))
                        continue
                    if key is not None:
                        keyed[(topic, key)] = group
                group.records.append(record)
                group.owners.append(index)
                group.devices.append(routed_device)
            counts = seen.get(device)
            if counts is None:
                seen[device] = [1, len(message.payload)]
            else:
                counts[0] += 1
                counts[1] += len(message.payload)
        self.health.record_batch(source, seen)

        placements: list[list[Placement]] | None = [[] for _ in given] if outcomes is not None else None
        if groups:
            if len(groups) == 1:  # the common case (one device, one partition): no task, no extra loop turns
                failures = [await self._append_group(next(iter(groups.values())), placements)]
            else:
                failures = await asyncio.gather(
                    *(self._append_group(group, placements) for group in groups.values())
                )
            for group, failure in zip(groups.values(), failures, strict=True):
                if isinstance(failure, StorageError):
                    raise self._storage_failed(source, group.topic, failure) from failure
            for group, failure in zip(groups.values(), failures, strict=True):
                if not isinstance(failure, str):
                    continue
                # The log refused the batch: every record of it becomes a dead letter.
                for owner, device in zip(group.owners, group.devices, strict=True):
                    letters.append(_Letter(owner, failure, messages[owner].payload, device))

        dead: dict[int, list[Placement]] = {}  # by message index; only messages with dead letters
        reasons: dict[int, list[str]] = {}
        if letters:
            await self._append_dead_letters(source, messages, letters, dead)
            for letter in letters:
                reasons.setdefault(letter.owner, []).append(letter.reason)
                self.health.error(source, letter.device, letter.reason)
            self.dead_lettered += len(letters)
        self.messages_written += len(messages)
        if outcomes is not None and placements is not None:
            outcomes.extend(
                WriteOutcome(tuple(placements[i]), tuple(reasons.get(i, ())), tuple(dead.get(i, ())))
                for i in range(len(messages))
            )

    def _line_group(
        self,
        groups: dict[tuple[str, int], _LineGroup],
        topics: dict[str, int],
        topic: str,
        key: bytes | None,
        target: LineTarget | None,
    ) -> _LineGroup:
        """The group for a record of ``topic`` with ``key`` (``_group_for`` with a target's cached partition)."""
        partition = self._line_partition(topics, topic, key, target)
        group = groups.get((topic, partition))
        if group is None:
            group = groups[(topic, partition)] = _LineGroup(topic, partition)
        return group

    def _line_partition(self, topics: dict[str, int], topic: str, key: bytes | None, target: LineTarget | None) -> int:
        """The partition of a record of ``topic`` with ``key`` (``topics``: partition counts looked up in this
        call); caches it on ``target`` for the line kernels (ingest/line_kernels.bucket_lines)."""
        partitions = topics.get(topic)
        if partitions is None:
            partitions = topics[topic] = self.store.ensure_topic(topic).partitions
        if key is None:
            return self.store.partition_for(topic, None)
        if target is not None and target.partitions == partitions:
            return target.partition
        cache_key = (topic, partitions, key)
        cached = self._partition_cache.get(cache_key)
        if cached is None:
            if len(self._partition_cache) >= 100_000:
                self._partition_cache.clear()
            cached = self._partition_cache[cache_key] = self.store.partition_for(topic, key)
        if target is not None:
            target.partition, target.partitions, target.slot = cached, partitions, (topic, cached)
        return cached

    async def _append_line_group(self, group: _LineGroup) -> str | StorageError | None:
        """``_append_group`` for a ``_LineGroup`` (no placements: ``ingest_lines`` reports none)."""
        try:
            records = group.records
            whole = _encode_prepared(records)
            if len(whole) <= _MAX_BATCH_BYTES:
                await self.store.append(group.topic, group.partition, whole)
            else:
                for start, end in _prepared_chunks(records):
                    await self.store.append(group.topic, group.partition, _encode_prepared(records[start:end]))
        except BrokerError as exc:  # StorageError included
            return _append_failure(group.topic, group.partition, exc)
        return None

    def _group_for(self, groups: dict[tuple[str, int], _Group], topic: str, key: bytes | None) -> _Group:
        info = self.store.ensure_topic(topic)
        if key is None:
            partition = self.store.partition_for(topic, None)
        else:
            cache_key = (topic, info.partitions, key)
            cached = self._partition_cache.get(cache_key)
            if cached is None:
                if len(self._partition_cache) >= 100_000:
                    self._partition_cache.clear()
                cached = self._partition_cache[cache_key] = self.store.partition_for(topic, key)
            partition = cached
        group = groups.get((topic, partition))
        if group is None:
            group = groups[(topic, partition)] = _Group(topic, partition)
        return group

    def _storage_failed(self, source: SourceRef, topic: str, exc: StorageError) -> SinkError:
        self.storage_failures += 1
        log.error("storage failure: the ingest write is not stored and not acknowledged",
                  extra={"source": source.label, "topic": topic, "error": str(exc)})
        return SinkError(f"storage failure, nothing acknowledged (send again): {exc}")

    async def _append_group(
        self, group: _Group, placements: list[list[Placement]] | None
    ) -> str | StorageError | None:
        """Append one group's records in batches; returns why the log refused them, the storage failure
        (not the records' fault: the caller raises), or None."""
        try:
            for start, end, batch in self._batches(group.records):
                journal_appends(self.store, [(group.topic, group.partition, group.owners[start:end])])
                result = await self.store.append(group.topic, group.partition, batch)
                if placements is not None:
                    for offset, owner in enumerate(group.owners[start:end], start=result.base_offset):
                        placements[owner].append(Placement(group.topic, group.partition, offset))
        except BrokerError as exc:  # StorageError included
            return _append_failure(group.topic, group.partition, exc)
        return None

    def _batches(self, records: Sequence[RecordTuple]) -> list[tuple[int, int, bytes]]:
        """``(start, end, batch)`` RecordBatches holding ``records[start:end]``, each at most about
        ``_MAX_BATCH_BYTES``. Encodes once and splits only when that came out too big (rare: a write
        call holds one socket read or one MQTT append window), so the common case skips ``_chunks``."""
        cache = self._header_cache
        if len(cache) >= 100_000:
            cache.clear()
        whole = encode_record_tuples(records, header_cache=cache)
        if len(whole) <= _MAX_BATCH_BYTES:
            return [(0, len(records), whole)]
        return [
            (start, end, encode_record_tuples(records[start:end], header_cache=cache))
            for start, end in _chunks(records)
        ]

    async def _append_dead_letters(
        self,
        source: SourceRef,
        messages: Sequence[RawMessage] | Mapping[int, RawMessage],
        letters: list[_Letter],
        dead: dict[int, list[Placement]],
    ) -> None:
        topic = self.dead_letter_topic
        now = int(self._clock() * 1000)
        try:
            info = self.store.ensure_topic(topic)
            limit = info.config.max_message_bytes - 4096
            by_partition: dict[int, list[tuple[_Letter, RecordTuple]]] = {}
            for letter in letters:
                message = messages[letter.owner]
                original = letter.original
                # A device name can hold a lone surrogate (a JSON "\ud800" escape): not UTF-8, so replaced.
                device = letter.device.encode("utf-8", "replace") if letter.device is not None else None
                headers: list[tuple[str, bytes | None]] = [
                    ("reason", letter.reason.encode()),
                    ("source", source.label.encode()),
                    ("device", device),
                ]
                if message.subject is not None:
                    headers.append(("mqtt_topic", message.subject.encode()))
                if len(original) > limit:
                    headers.append(("truncated_from", str(len(original)).encode()))
                    original = original[:limit]
                key = device
                timestamp = message.arrival_ms if message.arrival_ms >= 0 else now
                partition = self.store.partition_for(topic, key)
                spec: RecordTuple = (original, key, tuple(headers), timestamp)
                by_partition.setdefault(partition, []).append((letter, spec))
            for partition, items in by_partition.items():
                for start, end, batch in self._batches([spec for _, spec in items]):
                    journal_appends(self.store, [(topic, partition, [letter.owner for letter, _ in items[start:end]])])
                    result = await self.store.append(topic, partition, batch)
                    for offset, (letter, _) in enumerate(items[start:end], start=result.base_offset):
                        dead.setdefault(letter.owner, []).append(Placement(topic, partition, offset))
        except BrokerError as exc:
            log.error("dead-letter append failed", extra={"topic": topic, "error": str(exc)})
            raise SinkError(f"cannot write to the dead-letter topic {topic!r}: {exc}") from exc
        for letter in letters:
            log.debug("dead letter", extra={"source": source.label, "device": letter.device, "reason": letter.reason})


def _append_failure(topic: str, partition: int, exc: BrokerError) -> str | StorageError:
    """What a failed group append means: a storage failure as it is (not the records' fault: the caller
    raises it), or why the log refused the records (they go to the dead-letter topic with it)."""
    if isinstance(exc, StorageError):
        return exc
    log.warning("log refused an ingest append; records go to the dead-letter topic",
                extra={"topic": topic, "partition": partition, "error": str(exc)})
    return f"log refused append to {topic}-{partition}: {exc}"


def _chunks(records: Sequence[RecordTuple]) -> list[tuple[int, int]]:
    """Split records into runs of at most ``_MAX_BATCH_BYTES`` (estimated)."""
    spans: list[tuple[int, int]] = []
    header_sizes: dict[int, int] = {}  # by id(): records of one device share their headers tuple
    start = 0
    size = 0
    for i, (value, key, headers, _) in enumerate(records):
        hsize = header_sizes.get(id(headers))
        if hsize is None:
            hsize = header_sizes[id(headers)] = sum(len(hkey) + len(hvalue or b"") + 4 for hkey, hvalue in headers)
        est = _RECORD_OVERHEAD + len(value or b"") + len(key or b"") + hsize
        if size and size + est > _MAX_BATCH_BYTES:
            spans.append((start, i))
            start, size = i, 0
        size += est
    spans.append((start, len(records)))
    return spans


def _prepared_chunks(records: Sequence[PreparedRecord]) -> list[tuple[int, int]]:
    """``_chunks`` for prepared records (their key and headers already encoded)."""
    spans: list[tuple[int, int]] = []
    start = 0
    size = 0
    for i, (value, key, headers, _) in enumerate(records):
        est = _RECORD_OVERHEAD + len(value) + len(key) + len(headers)
        if size and size + est > _MAX_BATCH_BYTES:
            spans.append((start, i))
            start, size = i, 0
        size += est
    spans.append((start, len(records)))
    return spans
