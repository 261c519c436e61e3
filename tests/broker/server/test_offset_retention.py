"""Committed offsets expire on a real ``sluice serve`` as on Kafka (offsets.retention.minutes, issue 17):
a consumer group whose members all left loses its offsets once it has been Empty for the retention,
and a consumer joining it again starts per its auto.offset.reset; a group that stays Stable keeps its
offsets however old; offsets survive a restart while not expired, and once expired stay gone.

Real clients: librdkafka (confluent-kafka) and aiokafka. Before the change offsets were kept for ever."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import OFFSET_INVALID, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker.server.conftest import SluiceProcess

pytestmark = pytest.mark.slow
TOPIC = "retention"
RECORDS = 3
RETENTION_S = 3.0  # short, so the test is quick; long enough to see the offset before it expires


def start_server(data_dir: Path, retention_minutes: float) -> SluiceProcess:
    sluice = SluiceProcess(data_dir, env={"SLUICE_KAFKA__OFFSETS_RETENTION_MINUTES": str(retention_minutes),
                                          "SLUICE_KAFKA__OFFSETS_RETENTION_CHECK_INTERVAL_MS": "200"})
    sluice.start()
    return sluice


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SluiceProcess]:
    sluice = start_server(tmp_path / "data", RETENTION_S / 60)
    produce(sluice.bootstrap)
    yield sluice
    sluice.stop()


def produce(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(RECORDS):
        producer.produce(TOPIC, b"r%d" % i, partition=0)
    assert producer.flush(30) == 0


def member(bootstrap: str, group: str) -> Consumer:
    """A subscribed consumer that has read every record and committed its position (RECORDS)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "session.timeout.ms": 30_000})
    consumer.subscribe([TOPIC])
    assert len(read_all(consumer)) == RECORDS
    consumer.commit(asynchronous=False)
    return consumer


def read_all(consumer: Consumer) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < RECORDS:
        assert time.monotonic() < deadline, f"read only {values}"
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            values.append(msg.value() or b"")
    return values


def committed(bootstrap: str, group: str) -> int:
    """The group's committed offset of partition 0 (OffsetFetch; OFFSET_INVALID when none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return int(consumer.committed([TopicPartition(TOPIC, 0)], timeout=30)[0].offset)
    finally:
        consumer.close()


def wait_until_expired(bootstrap: str, group: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while committed(bootstrap, group) != OFFSET_INVALID:
        assert time.monotonic() < deadline, f"{group}'s committed offset never expired"
        time.sleep(0.2)


def test_an_empty_groups_offsets_expire_and_a_stable_groups_stay(server: SluiceProcess) -> None:
    stays = member(server.bootstrap, "stays")  # committed first: its commit is the older one
    try:
        leaves = member(server.bootstrap, "leaves")
        assert leaves.committed([TopicPartition(TOPIC, 0)], timeout=30)[0].offset == RECORDS
        left = time.monotonic()
        leaves.close()  # LeaveGroup: the group is Empty from now
        wait_until_expired(server.bootstrap, "leaves")
        assert time.monotonic() - left >= RETENTION_S, "expired before the group was Empty for the retention"
        # the removal is visible to OffsetFetch before the cleanup round logs it (the round goes on to the
        # other groups first): wait for the line, a read right after the expiry may come a turn early
        deadline = time.monotonic() + 30
        while "expired offsets removed" not in server.log_text():
            assert time.monotonic() < deadline, "no 'expired offsets removed' in the broker's log"
            time.sleep(0.05)
        # The Stable group's commit is older than the retention, and kept.
        assert committed(server.bootstrap, "stays") == RECORDS
        assert stays.assignment() == [TopicPartition(TOPIC, 0)]
    finally:
        stays.close()
    # A consumer joining the group again finds no committed offset and starts per auto.offset.reset.
    again = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "leaves", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
    again.subscribe([TOPIC])
    try:
        assert read_all(again) == [b"r%d" % i for i in range(RECORDS)]
    finally:
        again.close()


async def aiokafka_commit_and_leave(bootstrap: str, group: str) -> None:
    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        got = 0
        async with asyncio.timeout(60):
            while got < RECORDS:
                got += sum(len(v) for v in (await consumer.getmany(timeout_ms=200)).values())
        await consumer.commit()
    finally:
        await consumer.stop()  # leaves the group


def test_offsets_survive_a_restart_until_they_expire(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_server(data, 10_080)  # Kafka's default: nothing expires during the test
    try:
        produce(server.bootstrap)
        asyncio.run(aiokafka_commit_and_leave(server.bootstrap, "app"))
        server.stop()
        server.start()
        assert committed(server.bootstrap, "app") == RECORDS, "not expired: kept across the restart"
        server.stop()
        # The same data with a retention the Empty group has outlived: gone at the first cleanup round.
        server.env["SLUICE_KAFKA__OFFSETS_RETENTION_MINUTES"] = str(0.5 / 60)
        server.start()
        wait_until_expired(server.bootstrap, "app")
        server.stop()
        server.env["SLUICE_KAFKA__OFFSETS_RETENTION_MINUTES"] = "10080"
        server.start()
        assert committed(server.bootstrap, "app") == OFFSET_INVALID, "an expired offset came back after a restart"
    finally:
        server.stop()


def test_a_deleted_topics_offsets_go_with_it(tmp_path: Path) -> None:
    """Kafka's handleDeletedPartitions: deleting a topic removes every group's offsets of it, so a topic
    created again under that name starts without them (a consumer would otherwise resume at an old
    offset), and a group left Empty without offsets is deleted. (Retention: Kafka's 7 days.)"""
    server = start_server(tmp_path / "data", 10_080)
    try:
        produce(server.bootstrap)
        deleted_topic_offsets_go(server)
    finally:
        server.stop()


def deleted_topic_offsets_go(server: SluiceProcess) -> None:
    solo = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "solo", "enable.auto.commit": False})
    solo.commit(offsets=[TopicPartition(TOPIC, 0, 2)], asynchronous=False)  # assign()-style, no membership
    solo.close()
    member(server.bootstrap, "members").close()
    assert committed(server.bootstrap, "solo") == 2 and committed(server.bootstrap, "members") == RECORDS
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    for future in admin.delete_topics([TOPIC], operation_timeout=30).values():
        future.result(30)
    for future in admin.create_topics([NewTopic(TOPIC, 1)], operation_timeout=30).values():
        future.result(30)
    assert committed(server.bootstrap, "solo") == OFFSET_INVALID
    assert committed(server.bootstrap, "members") == OFFSET_INVALID
    deadline = time.monotonic() + 30
    while {g.group_id for g in admin.list_consumer_groups().result(30).valid} & {"solo", "members"}:
        assert time.monotonic() < deadline, "the groups left without offsets were not deleted"
        time.sleep(0.1)
