"""``sluice groups seek|delete`` and ``sluice topics config`` against a real Sluice, checked with
confluent-kafka (librdkafka): a consumer of the group starts where seek put it, AdminClient sees the configs.

The reference is ``kafka-consumer-groups --reset-offsets`` / ``--delete`` and ``rpk topic alter-config``:
offsets move only while the group has no active members (also for a dry run), an offset outside a
partition is clamped to its [start, end], a time with no record at or after it gives the end offset.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource
from typer.testing import CliRunner

from sluice.cli import app
from tests.sluice_server import SluiceProcess

runner = CliRunner()
T0 = 1_790_000_000_000  # record i of a partition has timestamp T0 + i s


def sluice(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def name() -> str:
    return f"ga-{uuid.uuid4().hex[:8]}"


def _consumer(server: SluiceProcess, group: str, **extra: object) -> Consumer:
    return Consumer({"bootstrap.servers": server.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, **extra})


def _read_all(consumer: Consumer, want: int) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    while len(got) < want:
        msg = consumer.poll(10)
        assert msg is not None, f"only {got} of {want} records arrived"
        assert msg.error() is None or msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
        if msg.error() is None:
            got.append((msg.partition(), msg.offset()))
    return sorted(got)


@pytest.fixture
def topic_with_history(server: SluiceProcess) -> Iterator[tuple[str, str]]:
    """A 2-partition topic with 5 records a partition (timestamps T0 + i s) and a group that read them all."""
    topic, group = name(), name()
    assert sluice("topics", "create", topic, "-p", "2", "-b", server.bootstrap)[0] == 0
    producer = Producer({"bootstrap.servers": server.bootstrap})
    for partition in (0, 1):
        for i in range(5):
            producer.produce(topic, value=f"{partition}-{i}".encode(), partition=partition, timestamp=T0 + i * 1000)
    assert producer.flush(10) == 0
    consumer = _consumer(server, group)
    consumer.subscribe([topic])
    assert len(_read_all(consumer, 10)) == 10
    consumer.commit(asynchronous=False)
    consumer.close()
    yield topic, group


def _committed(server: SluiceProcess, topic: str, group: str) -> dict[int, int]:
    consumer = _consumer(server, group)
    try:
        found = consumer.committed([KafkaTP(topic, 0), KafkaTP(topic, 1)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def test_seek_moves_committed_offsets_where_a_real_consumer_then_starts(
    server: SluiceProcess, topic_with_history: tuple[str, str]
) -> None:
    topic, group = topic_with_history
    b = ("-b", server.bootstrap)
    assert _committed(server, topic, group) == {0: 5, 1: 5}

    code, out, _ = sluice("groups", "seek", group, "--to", "earliest", "--dry-run", *b)
    assert code == 0 and "dry run, nothing committed" in out and "→ 0" in out
    assert _committed(server, topic, group) == {0: 5, 1: 5}  # a dry run commits nothing

    code, out, _ = sluice("groups", "seek", group, "--to", "2", "--json", *b)
    assert code == 0
    rows = json.loads(out)["partitions"]
    assert sorted((r["partition"], r["current"], r["new"]) for r in rows) == [(0, 5, 2), (1, 5, 2)]
    assert _committed(server, topic, group) == {0: 2, 1: 2}
    consumer = _consumer(server, group)
    consumer.subscribe([topic])
    assert _read_all(consumer, 6) == [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]
    consumer.close()

    code, _, err = sluice("groups", "seek", group, "--to", "99", *b)  # clamped to the end, and said so
    assert code == 0 and "99 became 5" in err
    assert _committed(server, topic, group) == {0: 5, 1: 5}

    at = datetime.fromtimestamp((T0 + 3000) / 1000).isoformat()  # local time, as --to reads it
    code, _, _ = sluice("groups", "seek", group, "--to", at, *b)
    assert code == 0 and _committed(server, topic, group) == {0: 3, 1: 3}
    later = datetime.fromtimestamp((T0 + 60_000) / 1000).isoformat()
    code, _, err = sluice("groups", "seek", group, "--to", later, "--topic", topic, *b)
    assert code == 0 and "no record at or after that time" in err
    assert _committed(server, topic, group) == {0: 5, 1: 5}


def test_seek_a_new_group_needs_the_topic_and_creates_its_offsets(
    server: SluiceProcess, topic_with_history: tuple[str, str]
) -> None:
    topic, _ = topic_with_history
    fresh = name()
    code, _, err = sluice("groups", "seek", fresh, "--to", "latest", "-b", server.bootstrap)
    assert code == 4 and "unknown consumer group" in err
    code, _, _ = sluice("groups", "seek", fresh, "--to", "latest", "--topic", topic, "-b", server.bootstrap)
    assert code == 0 and _committed(server, topic, fresh) == {0: 5, 1: 5}
    code, _, err = sluice("groups", "seek", fresh, "--to", "sometime", "-b", server.bootstrap)
    assert code == 2 and "not earliest, latest, an offset or an ISO 8601 time" in err


def test_seek_and_delete_refuse_while_the_group_has_members(
    server: SluiceProcess, topic_with_history: tuple[str, str]
) -> None:
    topic, group = topic_with_history
    member = _consumer(server, group)
    member.subscribe([topic])
    while not member.assignment():
        member.poll(1)  # librdkafka joins the group inside poll
    try:
        for extra in ([], ["--dry-run"]):  # Kafka refuses a dry run too
            code, _, err = sluice("groups", "seek", group, "--to", "earliest", *extra, "-b", server.bootstrap)
            assert code == 1, err
            assert "has 1 active member (state Stable)" in err and "stop its consumers first" in err
        code, _, err = sluice("groups", "delete", group, "--yes", "-b", server.bootstrap)
        assert code == 1 and "still has members (NON_EMPTY_GROUP)" in err
        assert _committed(server, topic, group) == {0: 5, 1: 5}
    finally:
        member.close()
    code, out, _ = sluice("groups", "delete", group, "--yes", "-b", server.bootstrap)
    assert code == 0 and f"deleted consumer group {group}" in out
    admin = AdminClient({"bootstrap.servers": server.bootstrap})  # held: destroyed, it drops the pending answer
    listed = admin.list_consumer_groups().result(60)
    assert group not in {g.group_id for g in listed.valid}
    code, _, err = sluice("groups", "delete", group, "--yes", "-b", server.bootstrap)
    assert code == 4 and "unknown consumer group" in err


def test_topics_config_sets_and_deletes_what_adminclient_then_describes(server: SluiceProcess) -> None:
    topic = name()
    b = ("-b", server.bootstrap)
    assert sluice("topics", "create", topic, *b)[0] == 0
    admin = AdminClient({"bootstrap.servers": server.bootstrap})

    def described() -> dict[str, tuple[str, int]]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = admin.describe_configs([resource])[resource].result(10)
        return {k: (e.value, e.source) for k, e in entries.items()}

    code, out, err = sluice("topics", "config", topic, "--set", "retention.ms=3600000",
                            "--set", "cleanup.policy=compact", *b)
    assert code == 0 and "set retention.ms=3600000, set cleanup.policy=compact" in err and "retention.ms" in out
    configs = described()
    assert configs["retention.ms"] == ("3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert configs["cleanup.policy"] == ("compact", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)

    code, out, _ = sluice("topics", "config", topic, "--delete", "cleanup.policy", "--json", *b)  # the other stays
    shown = {e["name"]: (e["value"], e["source"]) for e in json.loads(out)["config"]}
    assert code == 0 and shown["cleanup.policy"] == ("delete", "default") and shown["retention.ms"][1] == "topic"
    configs = described()
    assert configs["cleanup.policy"][0] == "delete" and configs["retention.ms"][0] == "3600000"

    code, _, err = sluice("topics", "config", topic, "--set", "retention.ms=soon", *b)
    assert code == 1 and "configs not changed" in err and "INVALID_CONFIG" in err
    assert described()["retention.ms"][0] == "3600000"
    code, _, err = sluice("topics", "config", topic, "--set", "x=1", "--delete", "x", *b)
    assert code == 2 and "name the same config" in err
    code, _, err = sluice("topics", "config", "nope-" + topic, "--set", "retention.ms=1", *b)
    assert code == 4 and "unknown topic" in err
