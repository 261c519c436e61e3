"""OffsetCommit v2-v4's ``retention_time_ms`` on the wire: Kafka gives the offsets an expire time, commit
time + retention (-1 keeps the broker's offsets.retention.minutes; v5+ has no such field), and the next
cleanup round after it removes them, so OffsetFetch answers -1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.groups import FakeClock, GroupCoordinator, MemoryOffsetStore
from broker.log.memory import MemoryLogStore
from broker.protocol.kafka import ApiKey
from broker.server.kafka import KafkaServer, KafkaServerConfig
from tests.broker.server.raw_client import RawClient


@pytest.fixture
async def served() -> AsyncIterator[tuple[KafkaServer, FakeClock]]:
    clock = FakeClock()
    coordinator = GroupCoordinator(MemoryOffsetStore(), clock, tick_interval_s=3600, wall_clock=clock.time)
    await coordinator.start()
    store = MemoryLogStore(default_partitions=4)
    store.create_topic("t", 4)
    server = KafkaServer(store, coordinator, KafkaServerConfig(port=0))
    await server.start()
    try:
        yield server, clock
    finally:
        await server.stop()
        await coordinator.stop()


def commit_body(partition: int, retention_ms: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
                            "topics": [{"name": "t", "partitions": [{"partition_index": partition,
                                                                    "committed_offset": 10 + partition,
                                                                    "committed_metadata": ""}]}]}
    if retention_ms is not None:
        body["retention_time"] = retention_ms
    return body


async def fetched(client: RawClient) -> dict[int, int]:
    r = await client.request(ApiKey.OFFSET_FETCH, 1, {"group_id": "g", "topics": [
        {"name": "t", "partition_indexes": [0, 1, 2, 3]}]})
    return {int(p.partition_index): int(p.committed_offset) for t in r.topics for p in t.partitions}


async def test_a_commit_retention_time_expires_the_offset_from_the_commit(
        served: tuple[KafkaServer, FakeClock]) -> None:
    server, clock = served
    client = await RawClient.connect(server.port)
    try:
        for partition, version, retention in ((0, 2, 5_000), (1, 4, -1), (2, 5, None), (3, 3, 10**14)):
            r = await client.request(ApiKey.OFFSET_COMMIT, version, commit_body(partition, retention))
            assert [int(p.error_code) for t in r.topics for p in t.partitions] == [0]
        stored = server.ctx.coordinator.offsets.fetch("g")
        assert stored[("t", 0)].expire_timestamp_ms == stored[("t", 0)].commit_timestamp_ms + 5_000
        assert stored[("t", 1)].expire_timestamp_ms == -1 and stored[("t", 2)].expire_timestamp_ms == -1
        assert stored[("t", 3)].expire_timestamp_ms == stored[("t", 3)].commit_timestamp_ms + 10**14  # 3,170 years
        clock.advance(4.999)
        assert await server.ctx.coordinator.cleanup_groups() == (0, [])
        clock.advance(0.001)
        assert await server.ctx.coordinator.cleanup_groups() == (1, [])
        assert await fetched(client) == {0: -1, 1: 11, 2: 12, 3: 13}
    finally:
        await client.close()


async def test_any_int64_retention_is_accepted_and_the_connection_stays_open(
        served: tuple[KafkaServer, FakeClock]) -> None:
    # Kafka reads retention_time_ms as a plain int64. 10^16 ms and more used to fail in the request
    # decoder (a timedelta in microseconds overflows) and closed the connection.
    server, clock = served
    client = await RawClient.connect(server.port)
    try:
        for partition, version, retention in ((0, 2, 10**16), (1, 3, 10**18), (2, 4, 2**63 - 1), (3, 4, -2**63)):
            r = await client.request(ApiKey.OFFSET_COMMIT, version, commit_body(partition, retention))
            assert [int(p.error_code) for t in r.topics for p in t.partitions] == [0]
        stored = server.ctx.coordinator.offsets.fetch("g")
        assert stored[("t", 0)].expire_timestamp_ms == stored[("t", 0)].commit_timestamp_ms + 10**16
        assert stored[("t", 2)].expire_timestamp_ms == 2**63 - 1, "held at the int64 maximum, not wrapped"
        # A negative retention other than -1 is an expire time in the past, as in Kafka: gone next round.
        assert await server.ctx.coordinator.cleanup_groups() == (1, [])
        assert await fetched(client) == {0: 10, 1: 11, 2: 12, 3: -1}
    finally:
        await client.close()
