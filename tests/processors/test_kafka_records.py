"""Standalone processors read aiokafka's parser records, and a repartition topic's downstream reads raw
batches (processors.kafka_records): the same records, positions and transaction filtering as aiokafka's
own ConsumerRecords, against a real Sluice."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from processors.kafka_records import RawRecords, RawSegment, use_parser_records, use_raw_batches
from tests.broker.server.conftest import SluiceProcess

Seen = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]


@pytest.fixture(scope="module")
def sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    """One broker for the module (starting one takes seconds): each test writes topics of its own."""
    server = SluiceProcess(tmp_path_factory.mktemp("kafka-records") / "data", partitions=1)
    server.start()
    yield server
    server.stop()


async def produce(bootstrap: str, topic: str) -> int:
    """Plain batches with headers, a committed transaction, an aborted one, and more plain batches."""
    plain = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=True)
    txn = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="parser-records-test")
    await plain.start()
    await txn.start()
    count = 0
    try:
        async def burst(tag: str, n: int) -> None:
            nonlocal count
            futures = [await plain.send(topic, f"{tag}-{i}".encode(), key=f"k{i % 3}".encode(),
                                        headers=[("h", str(i).encode())] if i % 2 else [], timestamp_ms=1_000 + i)
                       for i in range(n)]
            for f in futures:
                await f
            count += n

        await burst("a", 50)
        async with txn.transaction():
            for i in range(20):
                await txn.send(topic, f"committed-{i}".encode(), timestamp_ms=2_000 + i)
        count += 20
        await txn.begin_transaction()
        for i in range(20):
            await txn.send(topic, f"aborted-{i}".encode(), timestamp_ms=3_000 + i)
        await txn.flush()
        await txn.abort_transaction()
        await burst("b", 30)
        return count
    finally:
        await plain.stop()
        await txn.stop()


async def read(bootstrap: str, topic: str, isolation: str, *, parser: bool, start: int = 0,
               one_by_one: bool = False, raw: bool = False) -> tuple[list[Seen], list[Any]]:
    """From offset ``start``, 7 records per ``getmany`` (or, ``one_by_one``, ``getone`` and ``getmany`` in
    turn). ``raw``: ``RawRecords`` (each call's records are one), else parser records with ``parser``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation)
    await consumer.start()
    try:
        if raw:
            assert use_raw_batches(consumer)
        elif parser:
            assert use_parser_records(consumer)  # the aiokafka pinned in pyproject.toml has the internals it needs
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, start)
        end = (await consumer.end_offsets([tp]))[tp]
        seen: list[Seen] = []
        taken: list[Any] = []
        while await consumer.position(tp) < end:
            if one_by_one:
                one = await consumer.getone(tp)
                taken.append(one)
                seen.append((one.offset, one.timestamp, one.key, one.value, tuple(one.headers)))
            # 7 at a time: most calls stop inside a batch, so the position must follow each record
            for records in (await consumer.getmany(tp, timeout_ms=1_000, max_records=7)).values():
                taken += [records] if type(records) is RawRecords else records
                seen += [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in records]
        return seen, taken
    finally:
        await consumer.stop()


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
async def test_parser_records_are_the_records_aiokafka_returns(sluice: SluiceProcess, isolation: str) -> None:
    topic = f"parser-records-{isolation}"
    produced = await produce(sluice.bootstrap, topic)
    want, wrapped = await read(sluice.bootstrap, topic, isolation, parser=False)
    got, parsed = await read(sluice.bootstrap, topic, isolation, parser=True)
    assert got == want
    assert all(isinstance(r, ConsumerRecord) for r in wrapped)
    assert parsed and not any(isinstance(r, ConsumerRecord) for r in parsed)  # the parser's own records
    values = [v for _, _, _, v, _ in got]
    aborted = [v for v in values if v is not None and v.startswith(b"aborted-")]
    assert len(aborted) == (0 if isolation == "read_committed" else 20)
    assert len(values) == produced + len(aborted)
    assert len(set(o for o, *_ in got)) == len(got)  # no record twice across the 7-record calls


@pytest.mark.parametrize("start", [0, 23, 57])
async def test_parser_records_from_inside_a_batch_and_through_getone(sluice: SluiceProcess, start: int) -> None:
    """A read that starts inside a batch skips the batch's records before it (offset 23 is inside the
    first burst's batch, 57 inside the committed transaction); getone and getmany in turn share the
    position."""
    topic = f"parser-records-start-{start}"
    await produce(sluice.bootstrap, topic)
    want, _ = await read(sluice.bootstrap, topic, "read_committed", parser=False, start=start, one_by_one=True)
    got, parsed = await read(sluice.bootstrap, topic, "read_committed", parser=True, start=start, one_by_one=True)
    assert got == want and got[0][0] == start
    assert not any(isinstance(r, ConsumerRecord) for r in parsed)


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
async def test_raw_batches_are_the_records_aiokafka_returns(sluice: SluiceProcess, isolation: str) -> None:
    """Through a real consumer's fetches: aborted transactions and their markers skipped read_committed,
    markers skipped read_uncommitted, 7 records per call, and plain batches handed out as byte ranges."""
    topic = f"raw-batches-{isolation}"
    await produce(sluice.bootstrap, topic)
    want, _ = await read(sluice.bootstrap, topic, isolation, parser=False)
    got, taken = await read(sluice.bootstrap, topic, isolation, parser=False, raw=True)
    assert got == want
    assert taken and all(type(t) is RawRecords for t in taken)
    assert sum(isinstance(part, RawSegment) for t in taken for part in t.parts) >= len(got) // 7


@pytest.mark.parametrize("start", [0, 23, 57])
async def test_raw_batches_from_inside_a_batch_and_through_getone(sluice: SluiceProcess, start: int) -> None:
    topic = f"raw-batches-start-{start}"
    await produce(sluice.bootstrap, topic)
    want, _ = await read(sluice.bootstrap, topic, "read_committed", parser=False, start=start, one_by_one=True)
    got, _ = await read(sluice.bootstrap, topic, "read_committed", parser=False, start=start, one_by_one=True, raw=True)
    assert got == want and got[0][0] == start
