"""Idempotent-producer state: expiry of idle producer ids (Kafka's producer.id.expiration.ms, swept
every producer.id.expiration.check.interval.ms) and its removal with a deleted topic, on a fake clock;
its rebuild from the stored batches."""

from __future__ import annotations

import crc32c

from broker.groups import GroupCoordinator, MemoryOffsetStore
from broker.log.memory import MemoryLogStore
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import ATTR_TRANSACTIONAL, RecordSpec, decode_header, encode_batch
from broker.server.handlers_common import BrokerContext
from broker.server.producer_state import APPEND, ProducerIdAllocator, ProducerStateTable, rebuild
from broker.txn.markers import encode_marker

DAY_MS = 24 * 3600 * 1000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0  # seconds

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000



def test_idle_producer_ids_expire_at_the_first_sweep_after_the_expiration_time() -> None:
    clock = Clock()
    table = ProducerStateTable(expiration_ms=DAY_MS, check_interval_ms=600_000, clock=clock)
    h0 = decode_header(encode_batch([RecordSpec(b"a")], producer_id=7, producer_epoch=0, base_sequence=0))
    table.record("t", 0, h0, 0)
    gap = decode_header(encode_batch([RecordSpec(b"b")], producer_id=7, producer_epoch=0, base_sequence=5))
    clock.advance_ms(DAY_MS - 1)
    assert table.check("t", 0, gap).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # still known
    clock.advance_ms(1)
    assert table.producers("t", 0), "no sweep is due yet: the last one ran a moment ago"
    clock.advance_ms(600_000)
    assert table.check("t", 0, gap) == APPEND, "expired: a new producer may start at any sequence"
    assert table.producers("t", 0) == {}


def test_an_active_producer_does_not_expire() -> None:
    clock = Clock()
    table = ProducerStateTable(expiration_ms=60_000, check_interval_ms=1_000, clock=clock)
    for seq in range(5):
        h = decode_header(encode_batch([RecordSpec(b"a")], producer_id=9, producer_epoch=0, base_sequence=seq))
        assert table.check("t", 0, h) == APPEND
        table.record("t", 0, h, seq)
        clock.advance_ms(50_000)  # 250 s in all, every append within 60 s of the previous one
    assert list(table.producers("t", 0)) == [9]
    clock.advance_ms(60_000)
    assert table.expire() == 1 and table.producers("t", 0) == {}


async def test_state_rebuilt_on_start_counts_as_seen_at_the_start() -> None:
    clock = Clock()
    store = MemoryLogStore()
    store.create_topic("t", 1)
    old = encode_batch([RecordSpec(b"a")], producer_id=11, producer_epoch=0, base_sequence=0, timestamp=1)
    await store.append("t", 0, old)
    table = ProducerStateTable(expiration_ms=60_000, check_interval_ms=1_000, clock=clock)
    rebuild(store, table, ProducerIdAllocator(start=0))
    assert table.expire() == 0, "a record timestamp from 1970 must not expire the producer"
    clock.advance_ms(60_000)
    assert table.expire() == 1


async def test_deleting_a_topic_through_the_store_clears_its_producer_state() -> None:
    store = MemoryLogStore()
    ctx = BrokerContext(store, GroupCoordinator(MemoryOffsetStore()), "127.0.0.1", 9092)
    ctx.producer_state = ProducerStateTable()  # replaced after construction, as the assembly does
    store.create_topic("t", 1)
    store.create_topic("other", 1)
    h = decode_header(encode_batch([RecordSpec(b"a")], producer_id=3, producer_epoch=0, base_sequence=0))
    ctx.producer_state.record("t", 0, h, 0)
    ctx.producer_state.record("other", 0, h, 0)
    await store.delete_topic("t")
    assert ctx.producer_state.producers("t", 0) == {}
    assert list(ctx.producer_state.producers("other", 0)) == [3]


async def test_rebuild_takes_transactional_batches_so_their_retry_is_answered_not_appended() -> None:
    """A transactional producer retries an unanswered batch after a restart like an idempotent one
    (Kafka's loadProducersFromRecords takes every batch with a producer id); only markers are skipped."""
    store = MemoryLogStore()
    store.create_topic("t", 1)
    batch = bytearray(encode_batch([RecordSpec(b"a"), RecordSpec(b"b")], producer_id=21, producer_epoch=3,
                                   base_sequence=0))
    batch[22] |= ATTR_TRANSACTIONAL  # the low byte of the attributes
    batch[17:21] = crc32c.crc32c(bytes(batch[21:])).to_bytes(4, "big")
    await store.append("t", 0, bytes(batch))
    await store.append("t", 0, encode_marker(21, 3, False, timestamp_ms=1))
    table = ProducerStateTable()
    rebuild(store, table, ProducerIdAllocator(start=0))
    assert table.producers("t", 0) == {21: (3, [(0, 1, 0)])}
    assert table.check("t", 0, decode_header(bytes(batch))).duplicate_of == 0
    follow_up = decode_header(encode_batch([RecordSpec(b"c")], producer_id=21, producer_epoch=3, base_sequence=2))
    assert table.check("t", 0, follow_up) == APPEND
