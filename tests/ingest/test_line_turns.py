"""Reads of one source in one event-loop turn share one write (ingest/line_turns.py): one RecordBatch per
partition for all of them; each caller still returns only once its lines are durable, learns what became of
its own lines (ack mode), keeps its arrival time, and gets the write's failure when the log fails."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.log.api import LogStore, TopicInfo
from broker.log.memory import MemoryLogStore
from broker.log.partition_log import PartitionLog
from broker.protocol.records import iter_batches
from ingest.errors import SinkError
from ingest.health import HealthRegistry
from ingest.line_turns import SMALL_WRITE_BYTES, SMALL_WRITE_LINES
from ingest.line_writes import LineOutcome
from ingest.router import Router
from ingest.routing import RawMessage, RouteDefaults, SourceRef
from ingest.sink import IngestSink
from ingest.tcp.framing import LineFramer
from ingest.tcp.lines import LineStream
from ingest.tcp.listener import ack_lines, line_acks
from tests.ingest.conftest import GatedLogStore, read_all
from tests.ingest.test_line_appends import _BrokenPartition

SOURCE = SourceRef("tcp", "default", "json")
ARRIVAL = 1_700_000_000_000


def _line(device: int, n: int) -> bytes:
    return json.dumps({"device_id": f"dev-{device}", "n": n}).encode()


def _batches(store: LogStore, topic: str) -> int:
    return sum(len(list(iter_batches(log.read(log.log_start_offset, 1 << 30), verify=False)))
               for log in store.partitions(topic))


async def test_reads_in_one_turn_share_one_batch_per_partition() -> None:
    store = MemoryLogStore(default_partitions=4)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    await asyncio.gather(*(sink.ingest_lines(SOURCE, [_line(d, 0)], ARRIVAL) for d in range(100)))
    stored = read_all(store, "tcp")
    assert sum(map(len, stored.values())) == 100 and sink.messages_written == 100
    assert _batches(store, "tcp") == sum(1 for recs in stored.values() if recs) <= 4  # not 100
    for recs in stored.values():  # each device's line in its key's partition, in the order they came
        assert [json.loads(r.value or b"")["device_id"] for r in recs] == [(r.key or b"").decode() for r in recs]
    assert sink.health.snapshot()[0]["messages"] == 100


async def test_each_caller_returns_once_its_lines_are_durable() -> None:
    store = GatedLogStore(default_partitions=4)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    calls = [asyncio.create_task(sink.ingest_lines(SOURCE, [_line(d, 0), _line(d, 1)], ARRIVAL)) for d in range(20)]
    for _ in range(10):
        await asyncio.sleep(0)
    assert _batches(store, "tcp") > 0 and not any(call.done() for call in calls)  # written, not yet durable
    assert sink.pending_bytes > 0
    store.gate.set()
    await asyncio.gather(*calls)
    assert sink.pending_bytes == 0 and sink.messages_written == 40


async def test_each_read_keeps_its_arrival_time() -> None:
    store = MemoryLogStore(default_partitions=1)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    await asyncio.gather(*(sink.ingest_lines(SOURCE, [_line(d, d)], ARRIVAL + d // 3) for d in range(9)))
    (recs,) = read_all(store, "tcp").values()
    assert _batches(store, "tcp") == 1
    assert [(json.loads(r.value or b"")["n"], r.timestamp) for r in recs] == [(d, ARRIVAL + d // 3) for d in range(9)]


async def test_outcomes_are_each_callers_own() -> None:
    store = MemoryLogStore(default_partitions=3)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    reads = [[_line(d, 0), b"not json", _line(d + 1, 1), b'{"device_id": %d, "n": 3}' % d if d % 2 else _line(d, 2)]
             for d in range(6)]
    outcomes = await asyncio.gather(*(sink.write_lines(SOURCE, lines, ARRIVAL) for lines in reads))
    assert _batches(store, "tcp") <= 3
    where = {(r.value, r.key): (p, r.offset) for p, recs in read_all(store, "tcp").items() for r in recs}
    for lines, outcome in zip(reads, outcomes, strict=True):
        assert [index for index, _ in outcome.rejected] == [1]
        assert outcome.rejected[0][1].startswith("json: invalid JSON")
        last: dict[tuple[str, int], int] = {}
        for line in lines:
            found = [spot for (value, _), spot in where.items() if value == line]
            for partition, offset in found:
                last[("tcp", partition)] = max(last.get(("tcp", partition), -1), offset)
        assert outcome.last_offsets == last


async def test_a_storage_failure_fails_every_read_of_the_turn() -> None:
    class OneBroken(MemoryLogStore):
        def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
            if info.name == "tcp" and partition == 1:
                return _BrokenPartition(info.name, partition, info.config)
            return super()._open_partition(info, partition)

    store = OneBroken(default_partitions=2)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    results = await asyncio.gather(*(sink.write_lines(SOURCE, [_line(d, 0)], ARRIVAL) for d in range(10)),
                                   return_exceptions=True)
    assert all(isinstance(result, SinkError) for result in results)
    assert sink.storage_failures == 1 and sink.pending_bytes == 0 and not store.has_topic("_dead_letters")
    await sink.ingest_lines(SOURCE, [b"not json"], ARRIVAL)  # the sink goes on: later turns are written
    assert sink.dead_lettered == 1


async def test_a_small_write_soon_after_another_waits_for_the_reads_that_come_meanwhile() -> None:
    """Coalescing: after a small write, the source's next reads wait (up to coalesce_s) and share one write; a
    read that asks for its outcome (ack mode) joining them has the write made at once."""
    store = MemoryLogStore(default_partitions=1)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry(), coalesce_s=3600.0)
    await sink.ingest_lines(SOURCE, [_line(0, 0)], ARRIVAL)  # the source's first write: at once
    waiting = [asyncio.create_task(sink.ingest_lines(SOURCE, [_line(d, d)], ARRIVAL + d)) for d in (1, 2)]
    for _ in range(10):
        await asyncio.sleep(0)
    assert not any(task.done() for task in waiting) and sink.messages_written == 1  # held for coalescing
    outcome = await asyncio.wait_for(sink.write_lines(SOURCE, [_line(3, 3)], ARRIVAL + 3), 30)
    await asyncio.wait_for(asyncio.gather(*waiting), 30)
    assert outcome.last_offsets == {("tcp", 0): 3}
    assert sink.messages_written == 4 and _batches(store, "tcp") == 2  # the three reads in one batch
    (recs,) = read_all(store, "tcp").values()
    assert [(json.loads(r.value or b"")["n"], r.timestamp) for r in recs] == [(d, ARRIVAL + d) for d in range(4)]


async def test_no_coalescing_after_a_large_write_nor_for_reads_that_want_their_outcome() -> None:
    store = MemoryLogStore(default_partitions=1)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry(), coalesce_s=3600.0)
    await sink.ingest_lines(SOURCE, [_line(d, d) for d in range(SMALL_WRITE_LINES)], ARRIVAL)
    await asyncio.wait_for(sink.ingest_lines(SOURCE, [_line(0, 0)], ARRIVAL), 30)  # after a large write: at once
    await asyncio.wait_for(sink.write_lines(SOURCE, [_line(1, 1)], ARRIVAL), 30)  # an answer is awaited: at once
    long_line = json.dumps({"device_id": "dev-2", "blob": "x" * SMALL_WRITE_BYTES}).encode()
    await asyncio.wait_for(sink.write_lines(SOURCE, [long_line], ARRIVAL), 30)
    await asyncio.wait_for(sink.ingest_lines(SOURCE, [_line(3, 3)], ARRIVAL), 30)  # after one of many bytes: at once
    assert sink.messages_written == SMALL_WRITE_LINES + 4


_JSON_LINES = st.sampled_from([
    b'{"device_id": "a", "ts": 1700000000000}', b'{"device_id": "b"}', b'{"sensor": "s1", "v": 1}', b"",
    b"   ", b"not json", b'{"device_id": ', b"\xff", b'{"device_id": [1]}', b'{"device_id": "c", "ts": "x"}',
    b"x" * 40,
])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reads=st.lists(st.lists(_JSON_LINES, min_size=1, max_size=6), min_size=1, max_size=4))
async def test_ack_answers_are_those_of_the_line_by_line_path(reads: list[list[bytes]]) -> None:
    """The ack answers of reads written together equal those of each read written alone, message by message
    (the ack path before): the same ERR lines in order, the same ACK, OK lines for the same topics."""
    routers = Router([], RouteDefaults(sensors_topic="sensors"))
    stores = [MemoryLogStore(default_partitions=3), MemoryLogStore(default_partitions=3)]
    sinks = [IngestSink(store, routers, HealthRegistry(clock=lambda: 1000.0)) for store in stores]
    connections = [(LineFramer(32), LineStream("ndjson"), LineFramer(32), LineStream("ndjson")) for _ in reads]
    old: list[list[str]] = []
    for (framer, stream, _, _), lines in zip(connections, reads, strict=True):
        items = framer.feed(b"\n".join(lines) + b"\n")
        messages, numbers = stream.messages(items, ARRIVAL)
        outcomes = await sinks[0].write(SOURCE, messages)
        old.append(ack_lines(outcomes, numbers, stream.line_no, "_dead_letters").decode().splitlines())

    async def new_read(framer: LineFramer, stream: LineStream, data: bytes) -> list[str]:
        items = framer.feed(data)
        first = stream.line_no + 1
        lines = stream.lines(items)
        if lines is None:  # a line over the limit: that read goes message by message, as before
            messages, numbers = stream.messages(items, ARRIVAL)
            return ack_lines(await sinks[1].write(SOURCE, messages), numbers, stream.line_no,
                             "_dead_letters").decode().splitlines()
        outcome = await sinks[1].write_lines(SOURCE, lines, ARRIVAL) if lines else LineOutcome()
        line_numbers = None if len(lines) == len(items) else stream.numbers(items, first)
        return line_acks(outcome, line_numbers, first, stream.line_no, "_dead_letters").decode().splitlines()

    new = await asyncio.gather(*(new_read(framer, stream, b"\n".join(lines) + b"\n")
                                 for (_, _, framer, stream), lines in zip(connections, reads, strict=True)))
    for before, after in zip(old, new, strict=True):
        assert [a for a in after if a.startswith("ERR")] == [b for b in before if b.startswith("ERR")]
        assert after[-1] == before[-1]
        # (keyless lines take partitions round-robin from one counter that dead letters advance too, and a
        # read with a line over the limit is written at once, not in the turn: which partitions keyless lines
        # get may differ, the topics do not)
        topics = [{ok.split()[1] for ok in answer if ok.startswith("OK")} for answer in (before, after)]
        assert topics[0] == topics[1]
    assert sinks[1].dead_lettered == sinks[0].dead_lettered
    assert sinks[1].messages_written == sinks[0].messages_written


@pytest.mark.parametrize("fmt", ["ndjson", "influx"])
def test_line_numbers_of_a_read_with_skipped_lines(fmt: str) -> None:
    stream = LineStream(fmt)
    stream.line_no = 4
    items: list[bytes] = [b"a", b"", b"# c" if fmt == "influx" else b"  ", b"b", b"   ", b"c"]
    first = stream.line_no + 1
    assert stream.lines(list(items)) == [b"a", b"b", b"c"]
    assert stream.numbers(list(items), first) == [5, 8, 10]
    messages, numbers = LineStream(fmt).messages(list(items), ARRIVAL)
    assert [m.payload for m in messages if isinstance(m, RawMessage)] == [b"a", b"b", b"c"]
    assert [n + 4 for n in numbers] == [5, 8, 10]


def test_line_numbers_of_a_csv_read_with_its_header() -> None:
    stream = LineStream("csv")
    items: list[bytes] = [b"", b"device_id,v", b"d1,2", b"  ", b"d2,4"]
    assert stream.lines(list(items)) == [b"d1,2", b"d2,4"] and stream.columns == ("device_id", "v")
    assert stream.numbers(list(items), 1) == [3, 5]
    more: list[bytes] = [b"d3,5", b"", b"d4,6"]
    assert stream.lines(list(more)) == [b"d3,5", b"d4,6"]
    assert stream.numbers(list(more), 6) == [6, 8]
