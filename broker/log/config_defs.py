"""Kafka's topic-level configs: names, types, defaults, validators and broker synonyms (sans-IO).

The table follows Kafka 3.9's ``LogConfig`` (``storage/.../log/LogConfig.java``) and ``TopicConfig``:
the same names, the same types (as DescribeConfigs v3+ reports them), the same defaults and the same
ranges, so a value Kafka refuses is refused here with Kafka's wording ("Invalid value X for
configuration Y: ..."), and a value Kafka accepts is accepted. Kafka 3.x configs that 4.0 dropped
(``message.format.version``, ``message.timestamp.difference.max.ms``, ``message.downconversion.enable``)
are still accepted because 3.x clients and tools send them.

``parse_config(name, raw)`` is the one place a raw string becomes a validated value; the HTTP API
and the Kafka handlers both come through it (via ``TopicConfig.with_kafka_configs``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

from broker.errors import InvalidConfigError

__all__ = [
    "CONFIG_DEFS",
    "INT_MAX",
    "LONG_MAX",
    "SLUICE_CONFIGS",
    "ConfigDef",
    "ConfigType",
    "Effect",
    "normalize",
    "parse_config",
]

LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
INT_MAX = 2**31 - 1
INT_MIN = -(2**31)

Value = int | float | bool | str | tuple[str, ...]
Effect = Literal["honoured", "single-node", "accepted"]


class ConfigType(IntEnum):
    """Kafka's DescribeConfigs ``config_type`` codes."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


Check = Callable[[Value], str | None]  # a reason the value is refused, or None


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: ConfigType
    default: str  # Kafka's default, spelled as Kafka reports it
    check: Check | None
    broker_synonyms: tuple[str, ...] = ()  # broker-level names, the one Kafka reads first first
    effect: Effect = "honoured"  # honoured here / meaningless on one node / stored and reported only


def at_least(low: int) -> Check:
    return lambda v: None if isinstance(v, int | float) and v >= low else f"Value must be at least {low}"


def between(low: float, high: float) -> Check:
    return lambda v: (None if isinstance(v, int | float) and low <= v <= high
                      else f"Value must be no more than {high}" if isinstance(v, int | float) and v > high
                      else f"Value must be at least {low}")


def one_of(*allowed: str) -> Check:
    return lambda v: None if v in allowed else f"String must be one of: {', '.join(allowed)}"


def list_of(*allowed: str) -> Check:
    def check(v: Value) -> str | None:
        assert isinstance(v, tuple)
        bad = [item for item in v if item not in allowed]
        return f"Invalid value {bad[0]!s} in list; valid values are {allowed}" if bad else None
    return check


def gzip_level(v: Value) -> str | None:
    return None if v == -1 or (isinstance(v, int) and 1 <= v <= 9) else "Value must be -1 or between 1 and 9"


_REPLICA = re.compile(r"^\d+:\d+$")


def throttled_replicas(v: Value) -> str | None:
    """Kafka's ThrottledReplicaListValidator: ``*`` alone, or ``partition:broker`` pairs."""
    assert isinstance(v, tuple)
    if v == ("*",) or all(_REPLICA.match(item) for item in v):
        return None
    return "must be the literal '*' or a list of replicas in the following format: [partitionId]:[brokerId],..."


_DAY = 24 * 3600 * 1000
L, INT, D, B, S, LS = ConfigType.LONG, ConfigType.INT, ConfigType.DOUBLE, ConfigType.BOOLEAN, ConfigType.STRING, \
    ConfigType.LIST

CONFIG_DEFS: dict[str, ConfigDef] = {d.name: d for d in (
    ConfigDef("cleanup.policy", LS, "delete", list_of("compact", "delete"), ("log.cleanup.policy",)),
    ConfigDef("compression.type", S, "producer",
              one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"), ("compression.type",)),
    ConfigDef("compression.gzip.level", INT, "-1", gzip_level, ("compression.gzip.level",), "accepted"),
    ConfigDef("compression.lz4.level", INT, "9", between(1, 17), ("compression.lz4.level",), "accepted"),
    ConfigDef("compression.zstd.level", INT, "3", between(-131072, 22), ("compression.zstd.level",), "accepted"),
    ConfigDef("delete.retention.ms", L, str(_DAY), at_least(0), ("log.cleaner.delete.retention.ms",)),
    ConfigDef("file.delete.delay.ms", L, "60000", at_least(0), ("log.segment.delete.delay.ms",), "accepted"),
    ConfigDef("flush.messages", L, str(LONG_MAX), at_least(1), ("log.flush.interval.messages",)),
    ConfigDef("flush.ms", L, str(LONG_MAX), at_least(0), ("log.flush.interval.ms",)),
    ConfigDef("follower.replication.throttled.replicas", LS, "", throttled_replicas, (), "single-node"),
    ConfigDef("index.interval.bytes", INT, "4096", at_least(0), ("log.index.interval.bytes",)),
    ConfigDef("leader.replication.throttled.replicas", LS, "", throttled_replicas, (), "single-node"),
    ConfigDef("local.retention.bytes", L, "-2", at_least(-2), ("log.local.retention.bytes",), "single-node"),
    ConfigDef("local.retention.ms", L, "-2", at_least(-2), ("log.local.retention.ms",), "single-node"),
    ConfigDef("max.compaction.lag.ms", L, str(LONG_MAX), at_least(1), ("log.cleaner.max.compaction.lag.ms",)),
    ConfigDef("max.message.bytes", INT, str(1024 * 1024 + 12), at_least(0), ("message.max.bytes",)),
    ConfigDef("message.downconversion.enable", B, "true", None, ("log.message.downconversion.enable",),
              "single-node"),
    ConfigDef("message.format.version", S, "3.0-IV1", None, ("log.message.format.version",), "accepted"),
    ConfigDef("message.timestamp.after.max.ms", L, str(LONG_MAX), at_least(0),
              ("log.message.timestamp.after.max.ms",), "accepted"),
    ConfigDef("message.timestamp.before.max.ms", L, str(LONG_MAX), at_least(0),
              ("log.message.timestamp.before.max.ms",), "accepted"),
    ConfigDef("message.timestamp.difference.max.ms", L, str(LONG_MAX), at_least(0),
              ("log.message.timestamp.difference.max.ms",), "accepted"),
    ConfigDef("message.timestamp.type", S, "CreateTime", one_of("CreateTime", "LogAppendTime"),
              ("log.message.timestamp.type",)),
    ConfigDef("min.cleanable.dirty.ratio", D, "0.5", between(0, 1), ("log.cleaner.min.cleanable.ratio",)),
    ConfigDef("min.compaction.lag.ms", L, "0", at_least(0), ("log.cleaner.min.compaction.lag.ms",)),
    ConfigDef("min.insync.replicas", INT, "1", at_least(1), ("min.insync.replicas",), "single-node"),
    ConfigDef("preallocate", B, "false", None, ("log.preallocate",), "accepted"),
    ConfigDef("remote.log.copy.disable", B, "false", None, (), "single-node"),
    ConfigDef("remote.log.delete.on.disable", B, "false", None, (), "single-node"),
    ConfigDef("remote.storage.enable", B, "false", None, (), "single-node"),
    ConfigDef("retention.bytes", L, "-1", None, ("log.retention.bytes",)),
    ConfigDef("retention.ms", L, str(7 * _DAY), at_least(-1),
              ("log.retention.ms", "log.retention.minutes", "log.retention.hours")),
    ConfigDef("segment.bytes", INT, str(1024 * 1024 * 1024), at_least(14), ("log.segment.bytes",)),
    ConfigDef("segment.index.bytes", INT, str(10 * 1024 * 1024), at_least(4), ("log.index.size.max.bytes",),
              "accepted"),
    ConfigDef("segment.jitter.ms", L, "0", at_least(0), ("log.roll.jitter.ms", "log.roll.jitter.hours"),
              "accepted"),
    ConfigDef("segment.ms", L, str(7 * _DAY), at_least(1), ("log.roll.ms", "log.roll.hours")),
    ConfigDef("unclean.leader.election.enable", B, "false", None, ("unclean.leader.election.enable",),
              "single-node"),
)}

# Sluice's own topic config (not Kafka's): the flush policy by name, beside Kafka's flush.messages/flush.ms.
SLUICE_CONFIGS: dict[str, ConfigDef] = {
    "flush.policy": ConfigDef("flush.policy", S, "always", one_of("always", "interval", "os"),
                              ("sluice.storage.flush",)),
}

_ALL = {**CONFIG_DEFS, **SLUICE_CONFIGS}
_RANGES = {ConfigType.INT: (INT_MIN, INT_MAX), ConfigType.LONG: (LONG_MIN, LONG_MAX),
           ConfigType.SHORT: (-(2**15), 2**15 - 1)}


def _invalid(name: str, raw: str, reason: str) -> InvalidConfigError:
    return InvalidConfigError(f"Invalid value {raw} for configuration {name}: {reason}")


def parse_config(name: str, raw: str | None) -> Value:
    """The typed, validated value of topic config ``name``; InvalidConfigError (Kafka's wording) if not."""
    definition = _ALL.get(name)
    if definition is None:
        raise InvalidConfigError(f"Unknown topic config name: {name}")
    if raw is None:
        raise InvalidConfigError(f"Invalid value null for configuration {name}: the value must not be null")
    text = raw.strip()
    value: Value
    kind = definition.type
    if kind in _RANGES:
        low, high = _RANGES[kind]
        try:
            value = int(text)
        except ValueError:
            raise _invalid(name, raw, f"Not a number of type {kind.name}") from None
        if not low <= value <= high:
            raise _invalid(name, raw, f"Not a number of type {kind.name}")
    elif kind is ConfigType.DOUBLE:
        try:
            value = float(text)
        except ValueError:
            raise _invalid(name, raw, "Not a number of type DOUBLE") from None
    elif kind is ConfigType.BOOLEAN:
        if text.lower() not in ("true", "false"):
            raise _invalid(name, raw, "Expected value to be either true or false")
        value = text.lower() == "true"
    elif kind is ConfigType.LIST:
        value = tuple(item.strip() for item in text.split(",")) if text else ()
    else:
        value = text
    if definition.check is not None:
        reason = definition.check(value)
        if reason is not None:
            raise _invalid(name, raw, reason)
    return value


def normalize(name: str, raw: str) -> str:
    """``raw`` validated and spelled the way DescribeConfigs reports it."""
    value = parse_config(name, raw)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)
