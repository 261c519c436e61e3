"""Topic config rules: Kafka's ranges, the flush mapping, persistence of overrides."""

from __future__ import annotations

import pytest

from broker.errors import InvalidConfigError
from broker.log.config import FlushPolicy, TopicConfig
from broker.log.config_defs import LONG_MAX


@pytest.mark.parametrize(("configs", "policy", "interval"), [
    ({"flush.messages": "1"}, FlushPolicy.ALWAYS, 1000),
    ({"flush.ms": "0"}, FlushPolicy.ALWAYS, 0),
    ({"flush.ms": "250"}, FlushPolicy.INTERVAL, 250),
    ({"flush.messages": "10000"}, FlushPolicy.INTERVAL, 1000),
    ({"flush.messages": str(LONG_MAX), "flush.ms": str(LONG_MAX)}, FlushPolicy.OS, 1000),
    ({"flush.policy": "os", "flush.messages": "1"}, FlushPolicy.OS, 1000),
    ({"retention.ms": "5"}, FlushPolicy.INTERVAL, 1000),  # no flush setting: the broker default stays
])
def test_kafka_flush_configs_map_onto_the_flush_policy(
    configs: dict[str, str | None], policy: FlushPolicy, interval: int
) -> None:
    broker = TopicConfig(flush=FlushPolicy.INTERVAL, flush_interval_ms=1000)
    config = broker.with_kafka_configs(configs)
    assert (config.flush, config.flush_interval_ms) == (policy, interval)
    # What is reported maps back onto the same policy.
    again = broker.from_overrides({n: config.kafka_value(n) for n in ("flush.policy", "flush.messages", "flush.ms")})
    assert again.flush == policy


@pytest.mark.parametrize(("name", "value", "reason"), [
    ("segment.bytes", "13", "at least 14"),
    ("segment.bytes", "2147483648", "type INT"),
    ("retention.ms", "-2", "at least -1"),
    ("min.cleanable.dirty.ratio", "1.01", "no more than 1"),
    ("cleanup.policy", "compact,forever", "forever"),
    ("compression.type", "brotli", "one of"),
    ("message.timestamp.type", "createtime", "one of"),
    ("unclean.leader.election.enable", "1", "true or false"),
    ("compression.gzip.level", "0", "-1 or between 1 and 9"),
    ("leader.replication.throttled.replicas", "0:x", "partitionId"),
    ("max.compaction.lag.ms", "0", "at least 1"),
    ("no.such", "1", "Unknown topic config name"),
])
def test_out_of_range_values_are_refused_with_kafkas_reason(name: str, value: str, reason: str) -> None:
    with pytest.raises(InvalidConfigError, match=reason):
        TopicConfig().with_kafka_configs({name: value})


def test_values_are_normalized_and_overrides_persist() -> None:
    config = TopicConfig().with_kafka_configs({"cleanup.policy": " compact , delete ", "preallocate": "TRUE",
                                               "min.cleanable.dirty.ratio": "0.10"})
    assert config.compact and config.delete
    assert config.kafka_value("cleanup.policy") == "compact,delete"
    assert config.kafka_value("preallocate") == "true"
    assert config.min_cleanable_dirty_ratio == 0.1
    assert TopicConfig.from_dict(config.to_dict()) == config
    assert not TopicConfig().with_kafka_configs({"cleanup.policy": "compact"}).delete
