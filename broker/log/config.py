"""Per-topic configuration, with the Kafka config names admin tools use."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from enum import StrEnum

from broker.errors import InvalidTopicError

__all__ = ["KAFKA_CONFIG_NAMES", "FlushPolicy", "TopicConfig", "validate_topic_name"]

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


class FlushPolicy(StrEnum):
    ALWAYS = "always"  # fsync before acknowledging (group commit shares one fsync)
    INTERVAL = "interval"  # fsync every flush_interval_ms
    OS = "os"  # never fsync explicitly; the OS writes back


# Kafka config name -> TopicConfig field
KAFKA_CONFIG_NAMES: dict[str, str] = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "flush.policy": "flush",
    "flush.ms": "flush_interval_ms",
    "max.message.bytes": "max_message_bytes",
    "index.interval.bytes": "index_interval_bytes",
}


@dataclass(frozen=True, slots=True)
class TopicConfig:
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1 keeps forever
    retention_bytes: int = -1  # per partition; -1 is unlimited
    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    flush: FlushPolicy = FlushPolicy.ALWAYS
    flush_interval_ms: int = 1000
    max_message_bytes: int = 1024 * 1024 + 12
    index_interval_bytes: int = 4096

    def with_kafka_configs(self, configs: dict[str, str | None]) -> TopicConfig:
        """A copy with Kafka-named settings applied; unknown names raise ValueError."""
        changes: dict[str, object] = {}
        for name, raw in configs.items():
            attr = KAFKA_CONFIG_NAMES.get(name)
            if attr is None:
                raise ValueError(f"unknown topic config {name!r}; known: {', '.join(sorted(KAFKA_CONFIG_NAMES))}")
            if raw is None:
                continue
            changes[attr] = FlushPolicy(raw) if attr == "flush" else int(raw)
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def to_kafka_configs(self) -> dict[str, str]:
        return {name: str(getattr(self, attr)) for name, attr in KAFKA_CONFIG_NAMES.items()}

    def to_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> TopicConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "flush" in values:
            values["flush"] = FlushPolicy(str(values["flush"]))
        return cls(**values)  # type: ignore[arg-type]


def validate_topic_name(name: str) -> None:
    """Kafka's rules: 1–249 characters of [a-zA-Z0-9._-], not '.' or '..'."""
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME:
        raise InvalidTopicError(f"topic name is {len(name)} characters long; the limit is {MAX_TOPIC_NAME}")
    if not _LEGAL_TOPIC.match(name):
        raise InvalidTopicError(
            f"topic name {name!r} has characters other than ASCII letters, digits, '.', '_' and '-'"
        )
