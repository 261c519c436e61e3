"""``IngestSink.ingest_lines`` / ``write_lines``: the sink's write path for lines from a line source (a
loop turn's reads of one source: ``ingest/line_turns.py``), as ``LineWrite``.

The same records, dead letters, health counts and failures as ``IngestSink.ingest`` of one
``RawMessage(line, arrival_ms=...)`` per line (tests/ingest/test_line_routes.py compares both):

- the source's ``LinePlan`` (``ingest/line_routes.py``) gives most lines a target; the rest are routed
  by ``SourceRoutes.route`` as ``ingest`` routes them, at their place in the read;
- records go to their (topic, partition) in line order, keyed ones to the partition of their key
  (cached on the target per partition count), keyless ones round-robin one by one, as ``ingest`` does;
- a topic the log refuses, a batch it refuses, a line the rules reject: dead letters with the reason;
  a storage failure raises ``SinkError`` and nothing is acknowledged;
- each line's default event time and its dead letter's timestamp are its own read's arrival time;
- ``LineWrite.outcome`` gives a caller (TCP ack mode) its lines' dead-letter reasons and, per partition, the
  offset of its last record there: found by bisecting each group's line indexes (no per-line loop).

Records are encoded with their target's key and headers encoded once; the per-line loops are
``line_kernels.bucket_lines`` (compiled when built), which puts each line's index in its partition's
``LineGroup`` and leaves to ``resolve`` the lines without a target, keyless ones, and the first line of a
target whose partition is not yet known, and ``line_kernels.encode_line_group``, which writes a group's
RecordBatch from the lines themselves (no record tuple per line).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker import native
from broker.errors import BrokerError, StorageError
from broker.log.partition_log import PartitionLog
from broker.protocol.records import encode_headers, encode_key
from ingest import line_kernels
from ingest.append_journal import APPEND_JOURNAL, journal_appends
from ingest.line_kernels import LineTarget
from ingest.line_routes import LinePlan, line_plan
from ingest.router import SourceRoutes
from ingest.routing import RawMessage, Rejected, SourceRef
from ingest.sink import _MAX_BATCH_BYTES, _RECORD_OVERHEAD, WriteOutcome, _append_failure, _Letter

if TYPE_CHECKING:
    from ingest.line_kernels import LineGroup  # (a stale compiled build lacks it: select() then runs the source)
    from ingest.sink import IngestSink

__all__ = ["LineOutcome", "LineWrite"]

_kernels = native.select(line_kernels)
_calls = itertools.count()  # numbers bucket_lines calls (a target's cached group belongs to one)


class _LineBatch:
    """One ``write_lines`` call's state; ``resolve`` is the kernel's callback for the lines it leaves."""

    def __init__(self, sink: IngestSink, source: SourceRef, routes: SourceRoutes, lines: list[bytes],
                 targets: list[LineTarget | None], stamps: list[int] | None, arrivals: _Arrivals,
                 seen: dict[str | None, list[Any]], now: float, columns: tuple[str, ...] | None) -> None:
        self.sink = sink
        self.source = source
        self.routes = routes
        self.lines = lines
        self.targets = targets
        self.stamps = stamps
        self.arrivals = arrivals
        self.arrival_ms = arrivals.first  # the encoder's default stamp (``stamps`` is given when reads differ)
        self.columns = columns  # a CSV stream's header (the lines routed alone are parsed against it)
        self.groups: dict[tuple[str, int], LineGroup] = {}
        self.partitions: dict[str, int] = {}  # topic -> partitions, looked up once per call
        self.letters: list[_Letter] = []
        self.routed: dict[int, RawMessage] = {}  # the lines routed one by one
        self.devices: dict[int, str | None] = {}  # their devices, for their records' dead letters
        self.seen = seen  # device -> [lines, bytes, last seen]: the health registry's open bucket
        self.now = now

    def _count(self, device: str | None, line: bytes) -> None:
        counts = self.seen.get(device)
        if counts is None:
            self.seen[device] = [1, len(line), self.now]
        else:
            counts[0] += 1
            counts[1] += len(line)
            counts[2] = self.now

    def resolve(self, index: int) -> None:
        line = self.lines[index]
        target = self.targets[index]
        if target is None:
            message = self.routed[index] = RawMessage(line, None, None, self.arrivals.of(index), self.columns)
            self._count(self._route(message, index), line)
            return
        try:
            group = self._group(target.topic, target.key, target)
        except StorageError as exc:
            raise self.sink._storage_failed(self.source, target.topic, exc) from exc
        except BrokerError as exc:
            self.letters.append(_Letter(index, f"log refused topic {target.topic!r}: {exc}", line, target.device))
            self._count(target.device, line)
            return
        group.owners.append(index)
        self._count(target.device, line)

    def _route(self, message: RawMessage, index: int) -> str | None:
        """One line the plan left to the rules, as ``IngestSink._write`` routes a message; its device."""
        device = None
        for result in self.routes.route(message):
            if isinstance(result, Rejected):
                self.letters.append(_Letter(index, result.reason, result.original, result.device or message.device))
                device = device or result.device
                continue
            topic, routed_device, (value, key, headers, timestamp) = result
            device = device or routed_device
            try:
                group = self._group(topic, key, None)
            except StorageError as exc:
                raise self.sink._storage_failed(self.source, topic, exc) from exc
            except BrokerError as exc:
                self.letters.append(_Letter(index, f"log refused topic {topic!r}: {exc}", message.payload,
                                           routed_device))
                continue
            cache = self.sink._header_cache
            hbytes = cache.get(headers)
            if hbytes is None:
                if len(cache) >= 100_000:
                    cache.clear()
                hbytes = cache[headers] = encode_headers(headers)
            group.add(index, (value if value is not None else b"", encode_key(key), hbytes, timestamp))
            self.devices[index] = routed_device
        return device

    def _group(self, topic: str, key: bytes | None, target: LineTarget | None) -> LineGroup:
        """The group for a record of ``topic`` with ``key``; caches the key's partition on ``target``
        (``IngestSink._line_partition``)."""
        partition = self.sink._line_partition(self.partitions, topic, key, target)
        group = self.groups.get((topic, partition))
        if group is None:
            # The kernels' own class (compiled, when they are): they read its fields directly.
            group = self.groups[(topic, partition)] = _kernels.LineGroup(topic, partition)
        return group

    def batches(self, group: LineGroup) -> list[tuple[int, bytes]]:
        """The group's RecordBatches, each with the index of its first record in the group: one, unless that
        would exceed ``_MAX_BATCH_BYTES``."""
        encode = _kernels.encode_line_group
        end = len(group.owners)
        whole = encode(group, self.lines, self.targets, self.stamps, self.arrival_ms, 0, end)
        if len(whole) <= _MAX_BATCH_BYTES:
            return [(0, whole)]
        return [(start, encode(group, self.lines, self.targets, self.stamps, self.arrival_ms, start, stop))
                for start, stop in self._chunks(group)]

    def _chunks(self, group: LineGroup) -> list[tuple[int, int]]:
        """``sink._prepared_chunks`` for a group (rare: a read bigger than a batch)."""
        spans: list[tuple[int, int]] = []
        start = 0
        size = 0
        for k, owner in enumerate(group.owners):
            record = group.extra.get(k)
            if record is not None:
                est = _RECORD_OVERHEAD + len(record[0]) + len(record[1]) + len(record[2])
            else:
                target = self.targets[owner]
                assert target is not None
                est = _RECORD_OVERHEAD + len(self.lines[owner]) + len(target.key_part) + len(target.header_part)
            if size and size + est > _MAX_BATCH_BYTES:
                spans.append((start, k))
                start, size = k, 0
            size += est
        spans.append((start, len(group.owners)))
        return spans


class _Arrivals:
    """The arrival time of each line of a write: ``spans`` are (first line, arrival ms) of each run of lines
    that arrived in the same millisecond, in line order (one run in the usual write)."""

    __slots__ = ("first", "spans", "starts")

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self.spans = spans
        self.first = spans[0][1]
        self.starts = [start for start, _ in spans]

    def of(self, index: int) -> int:
        if len(self.spans) == 1:
            return self.first
        return self.spans[bisect.bisect_right(self.starts, index) - 1][1]


@dataclass(slots=True)
class LineOutcome:
    """What became of the lines of one ``IngestSink.write_lines`` call, once durable (ack mode's answer):
    ``rejected`` the lines that went to the dead-letter topic, as (index in the call's lines, reason) in line
    order; ``last_offsets`` per (topic, partition) written the last offset its lines got there."""

    rejected: list[tuple[int, str]] = field(default_factory=list)
    last_offsets: dict[tuple[str, int], int] = field(default_factory=dict)


class LineWrite:
    """One write of a source's lines (the lines of every read of the source in one event-loop turn:
    ``ingest/line_turns.py``), as ``IngestSink._write`` writes messages (the module docstring).

    ``start()`` does all that needs no waiting — route, bucket, encode, and append every partition's batches
    without waiting (our encoder made them, so the store does not check their CRC again) — and says whether
    ``finish()`` has anything to await: the durability of a partition whose flush policy makes writes wait
    (``flush=always``), dead letters, or lines the source's rules route one by one (no plan). ``done()`` then
    counts the write; ``outcome(start, end)`` tells a caller what became of its lines ``start`` to ``end`` - 1.
    A storage failure raises ``SinkError`` from ``start`` or ``finish``: nothing of the write is acknowledged.
    """

    def __init__(self, sink: IngestSink, source: SourceRef, lines: list[bytes], arrivals: list[tuple[int, int]],
                 nbytes: int, columns: tuple[str, ...] | None, *, outcomes: bool) -> None:
        self.sink = sink
        self.source = source
        self.lines = lines
        self.arrivals = _Arrivals(arrivals)
        self.nbytes = nbytes
        self.columns = columns  # a CSV stream's header
        self.want_outcomes = outcomes
        self._batch: _LineBatch | None = None
        self._groups: list[LineGroup] = []
        self._bases: list[list[tuple[int, int]]] = []  # per group: (first record, base offset) of each batch
        self._failures: list[str | StorageError | None] = []
        self._waits: list[tuple[int, PartitionLog, int]] = []  # (group, partition, write mark)
        self._routed_alone: list[WriteOutcome] | None = None  # no plan: the messages' outcomes (when wanted)
        self._letters: list[_Letter] = []

    def start(self) -> bool:
        sink = self.sink
        source = self.source
        lines = self.lines
        routes = sink.router.for_source(source)
        plan = line_plan(routes)
        if plan is None:
            return True  # finish() routes each line
        arrivals = self.arrivals
        targets, stamps = (plan.route(lines, arrivals.first, self.columns) if len(arrivals.spans) == 1
                           else self._route(plan))
        seen, now = sink.health.open_counts(source)  # every line is counted there, by the kernel or by resolve
        batch = self._batch = _LineBatch(sink, source, routes, lines, targets, stamps, self.arrivals, seen, now,
                                         self.columns)
        try:
            _kernels.bucket_lines(lines, targets, batch.partitions, batch.groups, seen, now, batch.resolve,
                                  next(_calls))
        finally:  # received, whatever becomes of them (a storage failure creating a topic is raised from here)
            sink.health.counted(source, len(lines), self.nbytes, now)
        self._groups = list(batch.groups.values())
        self._letters = batch.letters
        store = sink.store
        encoded = [batch.batches(group) for group in self._groups]
        if APPEND_JOURNAL.get() is not None:  # a source that resumes exactly (ingest/append_journal.py)
            journal_appends(store, [
                (group.topic, group.partition, group.owners[first:batches[k + 1][0] if k + 1 < len(batches) else None])
                for group, batches in zip(self._groups, encoded, strict=True) for k, (first, _) in enumerate(batches)])
        failures = self._failures
        failed = False
        for index, (group, batches) in enumerate(zip(self._groups, encoded, strict=True)):
            bases: list[tuple[int, int]] = []
            self._bases.append(bases)
            try:
                plog = store.partition(group.topic, group.partition)
                for first, data in batches:
                    bases.append((first, plog.append_nowait(data, verified=True).base_offset))
            except BrokerError as exc:  # StorageError included
                failures.append(_append_failure(group.topic, group.partition, exc))
                failed = True
                continue
            failures.append(None)
            mark = plog.write_mark()
            if not plog.is_durable(mark):
                self._waits.append((index, plog, mark))
        if self._waits:
            return True
        if failed:
            self._refused()
        return bool(self._letters)

    def _route(self, plan: LinePlan) -> tuple[list[LineTarget | None], list[int] | None]:
        """The plan's targets and event times for the lines; each run of lines with its own arrival time is
        routed with it (per line stamps then, so that each line's default event time is its arrival)."""
        spans = self.arrivals.spans
        lines = self.lines
        if len(spans) == 1:
            return plan.route(lines, self.arrivals.first, self.columns)
        targets: list[LineTarget | None] = []
        stamps: list[int] = []
        for k, (start, arrival_ms) in enumerate(spans):
            end = spans[k + 1][0] if k + 1 < len(spans) else len(lines)
            run_targets, run_stamps = plan.route(lines[start:end], arrival_ms, self.columns)
            targets += run_targets
            stamps += run_stamps if run_stamps is not None else [arrival_ms] * (end - start)
        return targets, stamps

    async def finish(self) -> None:
        sink = self.sink
        if self._batch is None:  # no plan: every line routed alone, as ``ingest`` routes messages
            outcomes: list[WriteOutcome] | None = [] if self.want_outcomes else None
            arrivals = self.arrivals
            columns = self.columns
            await sink._write(self.source, [RawMessage(line, None, None, arrivals.of(index), columns)
                                            for index, line in enumerate(self.lines)], outcomes)
            self._routed_alone = outcomes
            return
        waits = self._waits
        if len(waits) == 1:
            index, plog, mark = waits[0]
            try:
                await plog.wait_durable(mark)
            except BrokerError as exc:
                self._failures[index] = _append_failure(plog.topic, plog.partition, exc)
        elif waits:
            done = await asyncio.gather(*(plog.wait_durable(mark) for _, plog, mark in waits), return_exceptions=True)
            for (index, plog, _), result in zip(waits, done, strict=True):
                if isinstance(result, BrokerError):
                    self._failures[index] = _append_failure(plog.topic, plog.partition, result)
                elif isinstance(result, BaseException):
                    raise result
        if waits:
            self._refused()
        letters = self._letters
        if letters:
            batch = self._batch
            arrivals = self.arrivals
            messages = {
                letter.owner: batch.routed.get(letter.owner)
                or RawMessage(self.lines[letter.owner], None, None, arrivals.of(letter.owner), self.columns)
                for letter in letters
            }
            await sink._append_dead_letters(self.source, messages, letters, {})

    def _refused(self) -> None:
        """Raise a storage failure; make the records of every batch the log refused dead letters."""
        for group, failure in zip(self._groups, self._failures, strict=True):
            if isinstance(failure, StorageError):
                raise self.sink._storage_failed(self.source, group.topic, failure) from failure
        batch = self._batch
        assert batch is not None
        for group, failure in zip(self._groups, self._failures, strict=True):
            if isinstance(failure, str):  # the log refused the batch: each record becomes a dead letter
                for owner in group.owners:
                    target = batch.targets[owner]
                    device = target.device if target is not None else batch.devices.get(owner)
                    self._letters.append(_Letter(owner, failure, self.lines[owner], device))

    def done(self) -> None:
        """Count the write (once it is durable, dead letters included)."""
        sink = self.sink
        letters = self._letters
        if letters:
            for letter in letters:
                sink.health.error(self.source, letter.device, letter.reason)
            sink.dead_lettered += len(letters)
        if self._batch is not None:  # (``_write`` counted the lines it wrote itself)
            sink.messages_written += len(self.lines)

    def outcome(self, start: int, end: int) -> LineOutcome:
        """What became of lines ``start`` to ``end`` - 1 (``LineOutcome``; indexes from ``start``)."""
        out = LineOutcome()
        if self._routed_alone is not None:
            for index in range(start, end):
                written = self._routed_alone[index]
                out.rejected.extend((index - start, reason) for reason in written.rejected)
                for placement in written.placements:
                    key = (placement.topic, placement.partition)
                    if placement.offset > out.last_offsets.get(key, -1):
                        out.last_offsets[key] = placement.offset
            return out
        if self._letters:
            mine = [letter for letter in self._letters if start <= letter.owner < end]
            mine.sort(key=lambda letter: letter.owner)  # stable: a line's reasons stay in their order
            out.rejected = [(letter.owner - start, letter.reason) for letter in mine]
        for group, bases, failure in zip(self._groups, self._bases, self._failures, strict=True):
            if failure is not None:
                continue
            owners = group.owners  # in line order
            last = bisect.bisect_left(owners, end) - 1  # the group's last record of these lines
            if last < 0 or owners[last] < start:
                continue
            first, base = bases[bisect.bisect_right(bases, (last, _MAX_OFFSET)) - 1]
            out.last_offsets[(group.topic, group.partition)] = base + last - first
        return out


_MAX_OFFSET = 2**63
