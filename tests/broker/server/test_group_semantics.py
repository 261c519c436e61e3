"""Group rules where Sluice must answer as Kafka does, checked with librdkafka (confluent-kafka) against
a real ``sluice serve``: the initial rebalance delay, a static member's restart without a rebalance,
and OffsetCommit for partitions that do not exist."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.broker.server.conftest import SluiceProcess

TOPIC = "semantics"
PARTITIONS = 2


class Member:
    """A confluent-kafka consumer that writes down every assignment and revocation."""

    def __init__(self, bootstrap: str, group: str, **config: str | int) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False, "session.timeout.ms": 6000,
                                  "heartbeat.interval.ms": 200, **config})
        self.assigned: list[list[int]] = []
        self.revoked: list[list[int]] = []
        self.consumer.subscribe([TOPIC], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        self.assigned.append(sorted(p.partition for p in parts))

    def _on_revoke(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        self.revoked.append(sorted(p.partition for p in parts))


def poll_until(members: list[Member], done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for m in members:
            m.consumer.poll(0.05)


def create_topic(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(PARTITIONS):
        producer.produce(TOPIC, b"x", partition=p)
    assert producer.flush(10) == 0


def start(sluice_factory: type[SluiceProcess], tmp_path: Path, **env: str) -> SluiceProcess:
    server = sluice_factory(tmp_path / "data", partitions=PARTITIONS, env=env)
    server.start()
    create_topic(server.bootstrap)
    return server


def test_initial_rebalance_delay_lets_two_starting_consumers_share_one_generation(
    tmp_path: Path, sluice_factory: type[SluiceProcess]
) -> None:
    server = start(sluice_factory, tmp_path, SLUICE_KAFKA__GROUP_INITIAL_REBALANCE_DELAY_MS="2000")
    a, b = Member(server.bootstrap, "delayed"), Member(server.bootstrap, "delayed")
    try:
        poll_until([a, b], lambda: bool(a.assigned and b.assigned), 30, "both members assigned")
        # Without the delay the first member gets both partitions alone, then gives one back.
        assert a.assigned[0] != [] and b.assigned[0] != []
        assert sorted(a.assigned[0] + b.assigned[0]) == [0, 1]
        assert all(not r for r in a.revoked + b.revoked), f"revoked: {a.revoked} {b.revoked}"
    finally:
        a.consumer.close()
        b.consumer.close()


def test_static_member_restart_keeps_the_group_stable(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    server = start(sluice_factory, tmp_path)
    static = Member(server.bootstrap, "statics", **{"group.instance.id": "worker-1"})
    poll_until([static], lambda: bool(static.assigned), 30, "the static member assigned")
    other = Member(server.bootstrap, "statics")
    poll_until([static, other], lambda: len(static.assigned) >= 2 and bool(other.assigned), 30, "two members")
    mine = static.assigned[-1]
    revocations = len(other.revoked)
    static.consumer.close()  # a static member leaves no LeaveGroup behind: its slot waits for it
    restarted = Member(server.bootstrap, "statics", **{"group.instance.id": "worker-1"})
    try:
        poll_until([restarted, other], lambda: bool(restarted.assigned), 30, "the restarted static member")
        assert restarted.assigned[0] == mine, "the restarted member gets its old partitions back"
        # A rebalance could only have assigned the restarted member after the other one had rejoined,
        # and an eager member revokes (in poll, above) before it rejoins: nothing to wait for here.
        assert len(other.revoked) == revocations, "the other member must not be rebalanced"
        assert other.consumer.assignment() and not restarted.revoked
    finally:
        restarted.consumer.close()
        other.consumer.close()


def test_offset_commit_for_missing_partitions_is_refused(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    server = start(sluice_factory, tmp_path)
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "standalone",
                         "enable.auto.commit": False})
    try:
        with pytest.raises(KafkaException) as info:
            consumer.commit(offsets=[TopicPartition("no-such-topic", 0, 5)], asynchronous=False)
        assert info.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        with pytest.raises(KafkaException) as info:
            consumer.commit(offsets=[TopicPartition(TOPIC, 7, 5)], asynchronous=False)
        assert info.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        committed = consumer.commit(offsets=[TopicPartition(TOPIC, 1, 1)], asynchronous=False)
        assert committed is not None and committed[0].error is None
        got = consumer.committed([TopicPartition(TOPIC, 1), TopicPartition("no-such-topic", 0)], timeout=10)
        assert [tp.offset for tp in got] == [1, -1001]
    finally:
        consumer.close()
