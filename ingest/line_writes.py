"""``IngestSink.ingest_lines``: the sink's write path for a read's worth of lines from a line source.

The same records, dead letters, health counts and failures as ``IngestSink.ingest`` of one
``RawMessage(line, arrival_ms=...)`` per line (tests/ingest/test_line_routes.py compares both):

- the source's ``LinePlan`` (``ingest/line_routes.py``) gives most lines a target; the rest are routed
  by ``SourceRoutes.route`` as ``ingest`` routes them, at their place in the read;
- records go to their (topic, partition) in line order, keyed ones to the partition of their key
  (cached on the target per partition count), keyless ones round-robin one by one, as ``ingest`` does;
- a topic the log refuses, a batch it refuses, a line the rules reject: dead letters with the reason;
  a storage failure raises ``SinkError`` and nothing is acknowledged.

Records are encoded with their target's key and headers encoded once; the per-line loops are
``line_kernels.bucket_lines`` (compiled when built), which puts each line's index in its partition's
``LineGroup`` and leaves to ``resolve`` the lines without a target, keyless ones, and the first line of a
target whose partition is not yet known, and ``line_kernels.encode_line_group``, which writes a group's
RecordBatch from the lines themselves (no record tuple per line).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from broker import native
from broker.errors import BrokerError, StorageError
from broker.protocol.records import encode_headers, encode_key
from ingest import line_kernels
from ingest.line_kernels import LineTarget
from ingest.line_routes import line_plan
from ingest.router import SourceRoutes
from ingest.routing import RawMessage, Rejected, SourceRef
from ingest.sink import _MAX_BATCH_BYTES, _RECORD_OVERHEAD, _Letter

if TYPE_CHECKING:
    from ingest.line_kernels import LineGroup  # (a stale compiled build lacks it: select() then runs the source)
    from ingest.sink import IngestSink

__all__ = ["write_lines"]

_kernels = native.select(line_kernels)
_calls = itertools.count()  # numbers bucket_lines calls (a target's cached group belongs to one)


class _LineBatch:
    """One ``write_lines`` call's state; ``resolve`` is the kernel's callback for the lines it leaves."""

    def __init__(self, sink: IngestSink, source: SourceRef, routes: SourceRoutes, lines: list[bytes],
                 targets: list[LineTarget | None], stamps: list[int] | None, arrival_ms: int,
                 seen: dict[str | None, list[Any]], now: float, columns: tuple[str, ...] | None) -> None:
        self.sink = sink
        self.source = source
        self.routes = routes
        self.lines = lines
        self.targets = targets
        self.stamps = stamps
        self.arrival_ms = arrival_ms
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
            message = self.routed[index] = RawMessage(line, None, None, self.arrival_ms, self.columns)
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

    def batches(self, group: LineGroup) -> list[bytes]:
        """The group's RecordBatches: one, unless that would exceed ``_MAX_BATCH_BYTES``."""
        encode = _kernels.encode_line_group
        end = len(group.owners)
        whole = encode(group, self.lines, self.targets, self.stamps, self.arrival_ms, 0, end)
        if len(whole) <= _MAX_BATCH_BYTES:
            return [whole]
        return [encode(group, self.lines, self.targets, self.stamps, self.arrival_ms, start, stop)
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


async def write_lines(sink: IngestSink, source: SourceRef, lines: Sequence[bytes], arrival_ms: int,
                      nbytes: int, columns: tuple[str, ...] | None = None) -> None:
    """Route, append and wait for durability (``IngestSink._write`` for lines; see the module docstring).
    ``nbytes``: the lines' length in all; ``columns``: a CSV stream's header."""
    routes = sink.router.for_source(source)
    plan = line_plan(routes)
    if plan is None:
        await sink._write(source, [RawMessage(line, None, None, arrival_ms, columns) for line in lines], None)
        return
    listed = lines if isinstance(lines, list) else list(lines)
    targets, stamps = plan.route(listed, arrival_ms, columns)
    seen, now = sink.health.open_counts(source)  # every line is counted there, by the kernel or by resolve
    batch = _LineBatch(sink, source, routes, listed, targets, stamps, arrival_ms, seen, now, columns)
    try:
        _kernels.bucket_lines(listed, targets, batch.partitions, batch.groups, seen, now, batch.resolve,
                              next(_calls))
    finally:  # received, whatever becomes of them (a storage failure creating a topic is raised from here)
        sink.health.counted(source, len(listed), nbytes, now)

    groups = list(batch.groups.values())
    letters = batch.letters
    if groups:
        failures = await sink._append_line_groups([(group.topic, group.partition, batch.batches(group))
                                                   for group in groups])
        for group, failure in zip(groups, failures, strict=True):
            if isinstance(failure, StorageError):
                raise sink._storage_failed(source, group.topic, failure) from failure
        for group, failure in zip(groups, failures, strict=True):
            if isinstance(failure, str):  # the log refused the batch: each record becomes a dead letter
                for owner in group.owners:
                    target = targets[owner]
                    device = target.device if target is not None else batch.devices.get(owner)
                    letters.append(_Letter(owner, failure, listed[owner], device))
    if letters:
        messages = {
            letter.owner: batch.routed.get(letter.owner) or RawMessage(listed[letter.owner], None, None, arrival_ms)
            for letter in letters
        }
        await sink._append_dead_letters(source, messages, letters, {})
        for letter in letters:
            sink.health.error(source, letter.device, letter.reason)
        sink.dead_lettered += len(letters)
    sink.messages_written += len(listed)
