"""Topic configs through confluent-kafka's AdminClient (librdkafka) against a real Sluice process:
CreateTopics / DescribeConfigs / AlterConfigs / IncrementalAlterConfigs round-trip every config."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

from broker.log.config import KAFKA_CONFIG_NAMES
from broker.log.config_defs import CONFIG_DEFS, LONG_MAX
from tests.broker.server.conftest import SluiceProcess

# A valid value other than the default for every config Kafka documents.
NON_DEFAULT = {
    "cleanup.policy": "compact,delete",
    "compression.type": "zstd",
    "compression.gzip.level": "5",
    "compression.lz4.level": "12",
    "compression.zstd.level": "7",
    "delete.retention.ms": "1000",
    "file.delete.delay.ms": "5",
    "flush.messages": "1",
    "flush.ms": "250",
    "follower.replication.throttled.replicas": "0:0,1:0",
    "index.interval.bytes": "1024",
    "leader.replication.throttled.replicas": "*",
    "local.retention.bytes": "1000000",
    "local.retention.ms": "60000",
    "max.compaction.lag.ms": "3600000",
    "max.message.bytes": "2000000",
    "message.downconversion.enable": "false",
    "message.format.version": "2.8",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "7200000",
    "message.timestamp.difference.max.ms": "86400000",
    "message.timestamp.type": "LogAppendTime",
    "min.cleanable.dirty.ratio": "0.25",
    "min.compaction.lag.ms": "100",
    "min.insync.replicas": "2",
    "preallocate": "true",
    "remote.log.copy.disable": "true",
    "remote.log.delete.on.disable": "true",
    "remote.storage.enable": "true",
    "retention.bytes": "10000000",
    "retention.ms": "600000",
    "segment.bytes": "1048576",
    "segment.index.bytes": "4096",
    "segment.jitter.ms": "10",
    "segment.ms": "3600000",
    "unclean.leader.election.enable": "true",
}


def _describe(admin: AdminClient, resource: ConfigResource) -> dict[str, ConfigEntry]:
    result: dict[str, ConfigEntry] = next(iter(admin.describe_configs([resource]).values())).result(10)
    return result


def _error_of(future: object) -> str:
    try:
        future.result(10)  # type: ignore[attr-defined]
    except KafkaException as exc:
        return str(exc.args[0].name())
    raise AssertionError("the request was expected to fail")


pytestmark = pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")


@pytest.fixture
def admin(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> tuple[AdminClient, SluiceProcess]:
    server = sluice_factory(tmp_path / "data")
    server.start()
    return AdminClient({"bootstrap.servers": server.bootstrap}), server


def test_every_kafka_config_is_served() -> None:
    assert set(NON_DEFAULT) == set(CONFIG_DEFS), "the test sets every config Kafka documents"
    assert set(KAFKA_CONFIG_NAMES) == {*CONFIG_DEFS, "flush.policy"}


def test_create_and_describe_every_config(admin: tuple[AdminClient, SluiceProcess]) -> None:
    client, _ = admin
    client.create_topics([NewTopic("all-set", 1, 1, config=NON_DEFAULT)])["all-set"].result(10)
    client.create_topics([NewTopic("defaults", 1, 1)])["defaults"].result(10)

    described = _describe(client, ConfigResource(ConfigResource.Type.TOPIC, "all-set"))
    for name, value in NON_DEFAULT.items():
        entry = described[name]
        assert entry.value == value, name
        assert entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, name
        assert not entry.is_read_only
    assert described["flush.policy"].value == "always"  # flush.messages=1 wins over flush.ms

    defaults = _describe(client, ConfigResource(ConfigResource.Type.TOPIC, "defaults"))
    assert set(defaults) == set(KAFKA_CONFIG_NAMES)
    assert defaults["cleanup.policy"].value == "delete"
    assert defaults["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    # The test server runs SLUICE_STORAGE__FLUSH=os and 64 MiB segments: broker settings, reported as such.
    assert defaults["segment.bytes"].value == str(64 * 1024 * 1024)
    assert defaults["segment.bytes"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert defaults["flush.policy"].value == "os"
    assert defaults["flush.messages"].value == str(LONG_MAX)
    # Synonyms, most specific first as Kafka lists them (librdkafka keys them by name, so of the static
    # and the default log.segment.bytes only the last, Kafka's default, survives in its dict).
    synonyms = defaults["segment.bytes"].synonyms
    assert [(s.name, s.source, s.value) for s in synonyms.values()] == [
        ("log.segment.bytes", ConfigSource.DEFAULT_CONFIG.value, str(1024**3))]
    retention = described["retention.ms"].synonyms
    assert [(s.name, s.source) for s in retention.values()] == [
        ("retention.ms", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        ("log.retention.ms", ConfigSource.DEFAULT_CONFIG.value)]

    broker = _describe(client, ConfigResource(ConfigResource.Type.BROKER, "0"))
    assert broker["log.segment.bytes"].value == str(64 * 1024 * 1024)
    assert broker["log.segment.bytes"].is_read_only
    assert broker["log.cleanup.policy"].value == "delete"


def test_alter_configs_round_trips_and_replaces_the_set(admin: tuple[AdminClient, SluiceProcess]) -> None:
    client, _ = admin
    client.create_topics([NewTopic("altered", 1, 1)])["altered"].result(10)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "altered", set_config=NON_DEFAULT)
    next(iter(client.alter_configs([resource]).values())).result(10)
    described = _describe(client, ConfigResource(ConfigResource.Type.TOPIC, "altered"))
    assert {name: described[name].value for name in NON_DEFAULT} == NON_DEFAULT

    # Feeding back everything DescribeConfigs said changes nothing.
    everything = {name: entry.value for name, entry in described.items() if entry.value is not None}
    again = ConfigResource(ConfigResource.Type.TOPIC, "altered", set_config=everything)
    next(iter(client.alter_configs([again]).values())).result(10)
    assert {n: e.value for n, e in _describe(client, ConfigResource(ConfigResource.Type.TOPIC, "altered")).items()} \
        == everything

    # AlterConfigs is not incremental: what it does not name goes back to the default.
    only = ConfigResource(ConfigResource.Type.TOPIC, "altered", set_config={"retention.ms": "1234"})
    next(iter(client.alter_configs([only]).values())).result(10)
    described = _describe(client, ConfigResource(ConfigResource.Type.TOPIC, "altered"))
    assert described["retention.ms"].value == "1234"
    assert described["cleanup.policy"].value == "delete"
    assert described["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value


def test_incremental_alter_configs(admin: tuple[AdminClient, SluiceProcess]) -> None:
    client, _ = admin
    client.create_topics([NewTopic("inc", 1, 1, config={"retention.ms": "5000"})])["inc"].result(10)
    topic = ConfigResource.Type.TOPIC

    def alter(*entries: ConfigEntry, validate_only: bool = False) -> None:
        resource = ConfigResource(topic, "inc", incremental_configs=list(entries))
        next(iter(client.incremental_alter_configs([resource], validate_only=validate_only).values())).result(10)

    alter(ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND))
    alter(ConfigEntry("min.cleanable.dirty.ratio", "0.1", incremental_operation=AlterConfigOpType.SET))
    described = _describe(client, ConfigResource(topic, "inc"))
    assert described["cleanup.policy"].value == "delete,compact"
    assert described["retention.ms"].value == "5000"  # untouched
    alter(ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT),
          ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE))
    described = _describe(client, ConfigResource(topic, "inc"))
    assert described["cleanup.policy"].value == "compact"
    assert described["retention.ms"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    alter(ConfigEntry("segment.ms", "60000", incremental_operation=AlterConfigOpType.SET), validate_only=True)
    assert _describe(client, ConfigResource(topic, "inc"))["segment.ms"].value == str(7 * 24 * 3600 * 1000)


def test_refusals_are_answered_and_logged(admin: tuple[AdminClient, SluiceProcess]) -> None:
    client, server = admin
    bad = client.create_topics([NewTopic("bad", 1, 1, config={"segment.bytes": "10"})])["bad"]
    assert _error_of(bad) == "INVALID_CONFIG"
    unknown = client.create_topics([NewTopic("unknown", 1, 1, config={"no.such.config": "1"})])["unknown"]
    assert _error_of(unknown) == "INVALID_CONFIG"
    client.create_topics([NewTopic("ok", 1, 1)])["ok"].result(10)
    out_of_range = ConfigResource(ConfigResource.Type.TOPIC, "ok", set_config={"min.cleanable.dirty.ratio": "1.5"})
    assert _error_of(next(iter(client.alter_configs([out_of_range]).values()))) == "INVALID_CONFIG"
    append_to_long = ConfigResource(ConfigResource.Type.TOPIC, "ok", incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND)])
    assert _error_of(next(iter(client.incremental_alter_configs([append_to_long]).values()))) == "INVALID_CONFIG"
    broker = ConfigResource(ConfigResource.Type.BROKER, "0", set_config={"log.retention.ms": "1"})
    assert _error_of(next(iter(client.alter_configs([broker]).values()))) == "INVALID_REQUEST"
    log_text = server.log_text()
    for needle in ("configuration segment.bytes", "Unknown topic config name: no.such.config",
                   "configuration min.cleanable.dirty.ratio", "append is not allowed", "broker configs are static"):
        assert needle in log_text, needle


def test_log_append_time_topics_stamp_append_times(admin: tuple[AdminClient, SluiceProcess]) -> None:
    from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Consumer, Message, Producer

    client, server = admin
    for name, kind in (("appended", "LogAppendTime"), ("created", "CreateTime")):
        client.create_topics([NewTopic(name, 1, 1, config={"message.timestamp.type": kind})])[name].result(10)
    reports: list[tuple[str, int, int]] = []

    def report(err: object, msg: Message) -> None:
        assert err is None, err
        reports.append((msg.topic(), *msg.timestamp()))

    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0})
    before = int(time.time() * 1000)
    for topic in ("appended", "created"):
        producer.produce(topic, key=b"k", value=b"v", timestamp=1_000_000, on_delivery=report)
    assert producer.flush(10) == 0
    after = int(time.time() * 1000)
    stamped = {topic: (kind, ts) for topic, kind, ts in reports}
    assert stamped["appended"][0] == TIMESTAMP_LOG_APPEND_TIME and before <= stamped["appended"][1] <= after
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "ts", "auto.offset.reset": "earliest"})
    consumer.subscribe(["appended", "created"])
    seen: dict[str, tuple[int, int]] = {}
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            seen[msg.topic()] = msg.timestamp()
    consumer.close()
    assert seen["appended"] == (TIMESTAMP_LOG_APPEND_TIME, stamped["appended"][1])
    assert seen["created"] == (TIMESTAMP_CREATE_TIME, 1_000_000)


async def test_create_topics_v5_answers_the_configs_it_created_with(
    admin: tuple[AdminClient, SluiceProcess]
) -> None:
    from broker.protocol.kafka import ApiKey
    from tests.broker.server.raw_client import RawClient

    _, server = admin
    client = await RawClient.connect(server.port)
    try:
        body = {"topics": [{"name": "v5", "num_partitions": 3, "replication_factor": -1, "assignments": [],
                            "configs": [{"name": "cleanup.policy", "value": "compact"}]}],
                "timeout": 5000, "validate_only": False}
        response = await client.request(ApiKey.CREATE_TOPICS, 5, body)
    finally:
        await client.close()
    [topic] = response.topics
    assert topic.error_code == 0 and topic.num_partitions == 3 and topic.replication_factor == 1
    configs = {c.name: (c.value, c.config_source) for c in topic.configs}
    assert set(configs) == set(KAFKA_CONFIG_NAMES)
    assert configs["cleanup.policy"] == ("compact", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert configs["retention.ms"] == (str(7 * 24 * 3600 * 1000), ConfigSource.DEFAULT_CONFIG.value)


def test_alter_configs_with_a_key_twice_names_that_key(admin: tuple[AdminClient, SluiceProcess]) -> None:
    """librdkafka 2.0's AlterConfigs sends a read-back key and its new value both (its test 0092 does):
    Kafka (KRaft) refuses the resource with INVALID_REQUEST, and so does Sluice, naming the repeated key."""
    import asyncio

    from broker.protocol.kafka import ApiKey
    from tests.broker.server.raw_client import RawClient

    client, server = admin
    client.create_topics([NewTopic("twice", 1, 1)])["twice"].result(10)
    configs = [{"name": "retention.ms", "value": "1000"}, {"name": "segment.ms", "value": "60000"},
               {"name": "retention.ms", "value": "2000"}]
    body = {"resources": [{"resource_type": 2, "resource_name": "twice", "configs": configs}], "validate_only": False}

    async def alter() -> object:
        raw = await RawClient.connect(server.port)
        try:
            return await raw.request(ApiKey.ALTER_CONFIGS, 1, body)
        finally:
            await raw.close()

    response = asyncio.run(alter())
    (result,) = response.responses  # type: ignore[attr-defined]
    assert result.error_code == 42  # INVALID_REQUEST
    assert result.error_message == "Error due to duplicate config keys: ['retention.ms']"
