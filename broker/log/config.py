"""Per-topic configuration, with the Kafka config names admin tools use.

A ``TopicConfig`` is the effective config of one topic: typed fields for what Sluice acts on, plus
``overrides``, the Kafka-named values set on the topic itself (normalized strings). Everything else
comes from the broker defaults (``SLUICE_STORAGE__*``), then from Kafka's defaults. The names, types,
ranges and defaults live in ``config_defs.py``.

Flush mapping (Kafka's ``flush.messages``/``flush.ms`` onto Sluice's flush policy), first rule wins:
1. ``flush.policy`` (Sluice's own name) set on the topic: that policy;
2. ``flush.messages=1`` or ``flush.ms=0``: ``always`` (fsync before acknowledging each batch);
3. a finite ``flush.ms``: ``interval`` every ``flush.ms``;
4. a finite ``flush.messages`` > 1: ``interval`` at the broker's flush interval (Sluice does not count);
5. both set to Kafka's "never" (Long.MAX_VALUE): ``os``;
6. otherwise the broker default policy.
Reported the other way round: ``always`` is ``flush.messages=1``, ``interval`` is ``flush.ms=<interval>``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from broker.errors import InvalidConfigError, InvalidTopicError
from broker.log.config_defs import CONFIG_DEFS, LONG_MAX, SLUICE_CONFIGS, normalize
from broker.protocol.records import Compression

__all__ = [
    "KAFKA_CONFIG_NAMES",
    "FlushPolicy",
    "TopicConfig",
    "Visibility",
    "validate_kafka_configs",
    "validate_topic_name",
]

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


class FlushPolicy(StrEnum):
    ALWAYS = "always"  # fsync before acknowledging (group commit shares one fsync)
    INTERVAL = "interval"  # fsync every flush_interval_ms
    OS = "os"  # never fsync explicitly; the OS writes back


class Visibility(StrEnum):
    """When readers see a record written under ``flush=always`` (other policies always show it at once)."""

    DURABLE = "durable"  # once fsynced: the high watermark moves with the fsync (survives a power cut)
    WRITTEN = "written"  # once written to the page cache: lower latency, may vanish in a power cut


# Every topic config name served (Kafka's and Sluice's flush.policy), sorted.
KAFKA_CONFIG_NAMES: tuple[str, ...] = tuple(sorted({*CONFIG_DEFS, *SLUICE_CONFIGS}))

# Kafka config name -> the TopicConfig field it sets directly (flush.* are resolved by the rules above)
_FIELDS: dict[str, str] = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "max.message.bytes": "max_message_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "cleanup.policy": "cleanup_policy",
    "delete.retention.ms": "delete_retention_ms",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
    "compression.type": "compression_type",
    "message.timestamp.type": "message_timestamp_type",
}
_CODECS = {"uncompressed": Compression.NONE, "gzip": Compression.GZIP, "snappy": Compression.SNAPPY,
           "lz4": Compression.LZ4, "zstd": Compression.ZSTD}
_FLUSH_NAMES = ("flush.policy", "flush.messages", "flush.ms")


def validate_kafka_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Each name known and each value in Kafka's range; returns them normalized (None values dropped).

    Raises ``InvalidConfigError`` (also a ``ValueError``) naming the first offending config."""
    out: dict[str, str] = {}
    for name, raw in configs.items():
        if raw is not None:
            out[name] = normalize(name, raw)
        elif name not in CONFIG_DEFS and name not in SLUICE_CONFIGS:
            raise InvalidConfigError(f"Unknown topic config name: {name}")
    return out


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
    cleanup_policy: str = "delete"  # "delete", "compact", "compact,delete" or "" (neither)
    delete_retention_ms: int = 24 * 3600 * 1000  # tombstones stay this long after cleaning reached them
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5
    compression_type: str = "producer"
    message_timestamp_type: str = "CreateTime"
    # Kafka-named values set on this topic (normalized), sorted by name; the rest are defaults.
    overrides: tuple[tuple[str, str], ...] = ()

    # -- what the log does with it -----------------------------------------------------------

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        """Retention by time and size applies (a compact-only topic is never trimmed)."""
        return "delete" in self.cleanup_policy.split(",")

    @property
    def recompress_to(self) -> Compression | None:
        """The codec appends are rewritten in (``compression.type``); None keeps batches as the producer sent."""
        return None if self.compression_type == "producer" else _CODECS[self.compression_type]

    @property
    def max_segment_ms(self) -> int:
        """Roll age: a compacted topic rolls by max.compaction.lag.ms too, so the active segment (never
        cleaned) cannot hold records past that lag (Kafka's LogConfig.maxSegmentMs)."""
        return min(self.segment_ms, self.max_compaction_lag_ms) if self.compact else self.segment_ms

    # -- Kafka names ---------------------------------------------------------------------------

    def with_kafka_configs(self, configs: Mapping[str, str | None]) -> TopicConfig:
        """A copy with Kafka-named settings set on the topic (added to its overrides); None values are
        skipped. Unknown names and out-of-range values raise ``InvalidConfigError`` (a ValueError)."""
        merged = {**dict(self.overrides), **validate_kafka_configs(configs)}
        return self.from_overrides(merged)

    def from_overrides(self, overrides: Mapping[str, str]) -> TopicConfig:
        """This config (the broker defaults) with exactly ``overrides`` set on the topic.

        Fields not overridden keep this config's values, so call it on the broker default config
        to replace a topic's whole set (AlterConfigs) or drop one (IncrementalAlterConfigs DELETE)."""
        clean = validate_kafka_configs(overrides)
        changes: dict[str, object] = {}
        for name, value in clean.items():
            attr = _FIELDS.get(name)
            if attr is not None:
                kind = type(getattr(self, attr))
                changes[attr] = value if kind is str else kind(value)
        flush, interval = _resolve_flush(clean, self.flush, self.flush_interval_ms)
        changes["flush"], changes["flush_interval_ms"] = flush, interval
        changes["overrides"] = tuple(sorted(clean.items()))
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def overridden(self) -> dict[str, str]:
        return dict(self.overrides)

    def kafka_value(self, name: str) -> str:
        """The effective value of one config as DescribeConfigs reports it."""
        overrides = dict(self.overrides)
        if name in overrides:
            return overrides[name]
        attr = _FIELDS.get(name)
        if attr is not None:
            return str(getattr(self, attr))
        if name == "flush.policy":
            return str(self.flush)
        if name == "flush.messages":
            return "1" if self.flush is FlushPolicy.ALWAYS else str(LONG_MAX)
        if name == "flush.ms":
            return str(self.flush_interval_ms) if self.flush is FlushPolicy.INTERVAL else str(LONG_MAX)
        return CONFIG_DEFS[name].default

    def to_kafka_configs(self) -> dict[str, str]:
        """Every served config with its effective value."""
        return {name: self.kafka_value(name) for name in KAFKA_CONFIG_NAMES}

    # -- persistence -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, object]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["overrides"] = dict(self.overrides)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> TopicConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "flush" in values:
            values["flush"] = FlushPolicy(str(values["flush"]))
        overrides = values.get("overrides")
        if isinstance(overrides, dict):
            values["overrides"] = tuple(sorted((str(k), str(v)) for k, v in overrides.items()))
        return cls(**values)  # type: ignore[arg-type]


def _resolve_flush(overrides: Mapping[str, str], policy: FlushPolicy, interval: int) -> tuple[FlushPolicy, int]:
    """The flush policy and interval the rules in the module docstring give."""
    if not any(name in overrides for name in _FLUSH_NAMES):
        return policy, interval
    messages = int(overrides.get("flush.messages", LONG_MAX))
    ms = int(overrides.get("flush.ms", LONG_MAX))
    if ms < LONG_MAX:
        interval = ms
    if "flush.policy" in overrides:
        return FlushPolicy(overrides["flush.policy"]), interval
    if messages == 1 or ms == 0:
        return FlushPolicy.ALWAYS, interval
    if ms < LONG_MAX or messages < LONG_MAX:
        return FlushPolicy.INTERVAL, interval
    return FlushPolicy.OS, interval


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
