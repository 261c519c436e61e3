"""Routing: which log topic, key and event time a device message becomes.

A ``RouteRule`` matches a source (kind and name) and, for MQTT, a topic filter with ``+``/``#``
wildcards; it names the log topic (``{0}``, ``{1}``… insert MQTT topic levels), how to take the
record key, the event time and the payload format. Rules are tried in order; the first match wins
unless it says ``continue`` (then later matches also apply: fan-out). When no rule matches, the
built-in default for the source kind applies:

- ``mqtt`` / ``bridge``: log topic ``mqtt``, key = the MQTT topic name, payload kept raw,
  event time = arrival time.
- ``tcp``: log topic ``tcp``; key = the ``device_id`` field (NDJSON, CSV) or measurement plus
  sorted tag set (InfluxDB line protocol); event time = the line's timestamp (InfluxDB, ns) or
  arrival time.
- ``file``: log topic ``file``, same keys and times as ``tcp`` (file sources usually add a rule).

Before those catch-alls, when ``RouteDefaults.sensors_topic`` is set (``sluice serve`` sets it to
``sensors``), sensor readings go to that topic: MQTT messages on ``sensors/<id>`` (JSON, key = the
``<id>`` level) and TCP lines that are JSON objects with a ``sensor`` field (key = that field); both take
their event time from the ``ts`` field (epoch ms). A message on ``sensors/<id>`` that is not JSON or
has no ``ts`` is a dead letter with that reason; a TCP line without ``sensor`` falls to ``tcp``.

A rule with ``when_field`` applies only to payloads that have that field (JSON/CSV dotted path,
InfluxDB field or tag); for other payloads (or ones its format cannot parse) the next rule is tried.

Every record carries the headers ``source`` (``kind:name``) and ``device`` (when known), and an
event timestamp in ms. Anything that cannot be parsed or routed comes back as ``Rejected`` with
the reason; the sink sends those to the dead-letter topic.

Key specs (``key = "..."``): ``default``, ``none``, ``topic`` (MQTT topic name), ``level:N``
(MQTT topic level, 0-based), ``field:NAME`` (JSON/CSV field, dotted path), ``tag:NAME``
(InfluxDB tag), ``series`` (InfluxDB measurement+tags), ``device``. Time specs: ``time_field =
"arrival"`` (default), ``"timestamp"`` (the InfluxDB line timestamp) or a payload field, with
``time_format`` one of ``epoch_s``, ``epoch_ms``, ``epoch_us``, ``epoch_ns``, ``rfc3339``.

This module defines the routes (rules, defaults, key and time specs, messages and results); ``router.py``
applies them (``Router``, and per source ``SourceRoutes`` with its cached per-subject plans).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.errors import InvalidTopicError
from broker.log.config import validate_topic_name
from broker.protocol.records import Headers, RecordSpec
from ingest.errors import ConfigError, RouteError
from ingest.fastinit import fast_frozen_init
from ingest.formats import FORMATS
from ingest.mqtt.subscriptions import filter_error, topic_matches

__all__ = [
    "SOURCE_KINDS",
    "TIME_FORMATS",
    "KeySpec",
    "RawMessage",
    "Rejected",
    "RouteDefaults",
    "RouteRule",
    "Routed",
    "SourceRef",
    "TimeSpec",
    "event_time_ms",
    "topic_matches",
    "validate_filter",
]

SOURCE_KINDS = ("mqtt", "bridge", "tcp", "file")
TIME_FORMATS = ("epoch_s", "epoch_ms", "epoch_us", "epoch_ns", "rfc3339")
_KEY_KINDS = ("default", "none", "topic", "level", "field", "tag", "series", "device")


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where messages come from: ``kind`` in SOURCE_KINDS, ``name`` of the listener/bridge/file.

    ``format`` is the payload format the source itself declares (a TCP listener's format, a file's
    format); rules without a format of their own use it.
    """

    kind: str
    name: str
    format: str | None = None

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}"


@fast_frozen_init  # built once per device message
@dataclass(frozen=True, slots=True)
class RawMessage:
    """One device message: an MQTT publish, a TCP line, a file line.

    ``subject`` is the MQTT topic name (None for TCP/file lines); ``device`` the client id when the
    source knows it; ``arrival_ms`` the receive time (-1: the router stamps it); ``columns`` the
    CSV header of the stream a CSV row came from; ``headers`` go on the record after Sluice's own.
    """

    payload: bytes
    subject: str | None = None
    device: str | None = None
    arrival_ms: int = -1
    columns: tuple[str, ...] | None = None
    headers: Headers = ()  # more record headers after Sluice's own (MQTT 5 properties: ingest/mqtt/properties)


@dataclass(frozen=True, slots=True)
class Routed:
    topic: str
    key: bytes | None
    record: RecordSpec
    device: str | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: str
    original: bytes
    device: str | None = None


# ---------------------------------------------------------------- MQTT topic filters


def validate_filter(topic_filter: str) -> None:
    """MQTT rules (``ingest.mqtt.subscriptions.filter_error``), broken ones as ``ConfigError``."""
    error = filter_error(topic_filter)
    if error is not None:
        raise ConfigError(error)


# ---------------------------------------------------------------- key and time specs


@dataclass(frozen=True, slots=True)
class KeySpec:
    kind: str = "default"
    arg: str = ""

    @classmethod
    def parse(cls, text: str) -> KeySpec:
        kind, _, arg = text.partition(":")
        kind = kind.strip()
        arg = arg.strip()
        if kind not in _KEY_KINDS:
            raise ConfigError(f"unknown key spec {text!r}; use one of {', '.join(_KEY_KINDS)} (e.g. field:device_id)")
        if kind in ("field", "tag", "level") and not arg:
            raise ConfigError(f"key spec {text!r} needs an argument, e.g. {kind}:{'1' if kind == 'level' else 'id'}")
        if kind == "level" and not (arg.isascii() and arg.isdigit()):  # "²" is isdigit, not int()
            raise ConfigError(f"key spec {text!r}: the level index must be a non-negative integer")
        return cls(kind, arg)

    def __str__(self) -> str:
        return f"{self.kind}:{self.arg}" if self.arg else self.kind


@dataclass(frozen=True, slots=True)
class TimeSpec:
    field: str = "arrival"  # "arrival", "timestamp" (InfluxDB line timestamp) or a payload field
    format: str = "epoch_ms"

    def __post_init__(self) -> None:
        if self.format not in TIME_FORMATS:
            raise ConfigError(f"unknown time_format {self.format!r}; use one of {', '.join(TIME_FORMATS)}")


_EPOCH_SCALE = {"epoch_s": (1000, 1), "epoch_ms": (1, 1), "epoch_us": (1, 1_000), "epoch_ns": (1, 1_000_000)}
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def event_time_ms(value: Any, fmt: str) -> int:
    """A payload's event time field in ms, read as ``fmt`` (one of TIME_FORMATS); ``RouteError`` if it cannot be."""
    if type(value) is int and fmt != "rfc3339":  # the usual case (InfluxDB ns, epoch ms fields), exact
        mul, div = _EPOCH_SCALE[fmt]
        ms = value * mul // div
        if not 0 <= ms < 2**53:
            raise RouteError(f"event time {value!r} ({fmt}) is out of range")
        return ms
    if fmt == "rfc3339":
        if not isinstance(value, str) or not _RFC3339.match(value):
            raise RouteError(f"event time {str(value)[:40]!r} is not RFC 3339 (e.g. 2024-05-01T12:00:00Z)")
        text = value.replace("z", "Z").replace("Z", "+00:00")
        frac = re.search(r"\.(\d+)", text)
        if frac and len(frac.group(1)) > 6:  # Python parses at most microseconds
            text = text.replace(frac.group(0), "." + frac.group(1)[:6])
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RouteError(f"event time {str(value)[:40]!r} is not a number ({fmt})")
    number: int | float
    if isinstance(value, str):
        try:
            number = int(value, 10)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                raise RouteError(f"event time {value[:40]!r} is not a number ({fmt})") from None
    else:
        number = value
    if number != number or number in (float("inf"), float("-inf")):
        raise RouteError(f"event time {value!r} is not a finite number")
    mul, div = _EPOCH_SCALE[fmt]
    ms = number * mul // div if isinstance(number, int) else int(number * mul / div)
    if not 0 <= ms < 2**53:
        raise RouteError(f"event time {value!r} ({fmt}) is out of range")
    return ms


# ---------------------------------------------------------------- rules


@dataclass(frozen=True, slots=True)
class RouteRule:
    name: str
    topic: str
    source_kind: str = "*"
    source_name: str = "*"
    filter: str | None = None  # MQTT topic filter on the message subject; None matches all
    key: KeySpec = KeySpec()
    time: TimeSpec = TimeSpec()
    format: str | None = None  # None: the source's format (raw when it declares none)
    value: str = "original"  # "original" bytes, or "json" (the parsed payload re-encoded)
    device: KeySpec | None = None  # where the device id comes from; None = message or device_id
    fan_out: bool = False  # True: later rules may also match ("continue" in TOML)
    when_field: str | None = None  # applies only to payloads with this field; else the next rule is tried

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a route needs a name")
        if self.source_kind != "*" and self.source_kind not in SOURCE_KINDS:
            raise ConfigError(f"route {self.name!r}: unknown source {self.source_kind!r} ({', '.join(SOURCE_KINDS)})")
        if self.filter is not None:
            validate_filter(self.filter)
        if self.format is not None and self.format not in FORMATS:
            raise ConfigError(f"route {self.name!r}: unknown format {self.format!r} ({', '.join(FORMATS)})")
        if self.value not in ("original", "json"):
            raise ConfigError(f"route {self.name!r}: value must be 'original' or 'json'")
        if "{" not in self.topic:
            try:
                validate_topic_name(self.topic)
            except InvalidTopicError as exc:
                raise ConfigError(f"route {self.name!r}: {exc}") from None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> RouteRule:
        """Build from TOML / JSON (the config file and the HTTP API use the same keys)."""
        known = {
            "name", "topic", "source", "source_name", "filter", "key", "time_field", "time_format",
            "format", "value", "device", "continue", "when_field",
        }
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown route settings {sorted(unknown)}; known: {sorted(known)}")
        if "name" not in data or "topic" not in data:
            raise ConfigError("a route needs at least 'name' and 'topic'")
        device = data.get("device")
        return cls(
            name=str(data["name"]),
            topic=str(data["topic"]),
            source_kind=str(data.get("source") or "*"),
            source_name=str(data.get("source_name") or "*"),
            filter=data.get("filter"),
            key=KeySpec.parse(str(data.get("key") or "default")),
            time=TimeSpec(str(data.get("time_field") or "arrival"), str(data.get("time_format") or "epoch_ms")),
            format=data.get("format"),
            value=str(data.get("value") or "original"),
            device=KeySpec.parse(str(device)) if device else None,
            fan_out=bool(data.get("continue", False)),
            when_field=str(data["when_field"]) if data.get("when_field") else None,
        )

    def to_mapping(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic": self.topic,
            "source": self.source_kind,
            "source_name": self.source_name,
            "filter": self.filter,
            "key": str(self.key),
            "time_field": self.time.field,
            "time_format": self.time.format,
            "format": self.format,
            "value": self.value,
            "device": str(self.device) if self.device else None,
            "continue": self.fan_out,
            "when_field": self.when_field,
        }


@dataclass(frozen=True, slots=True)
class RouteDefaults:
    """Where messages go when no rule matches (see the module docstring)."""

    mqtt_topic: str = "mqtt"
    tcp_topic: str = "tcp"
    file_topic: str = "file"
    sensors_topic: str = ""  # "" = no sensor-reading defaults (sluice serve: "sensors")

    def rules_for(self, source: SourceRef) -> tuple[RouteRule, ...]:
        """The default rules of a source, tried in order: the sensor rule (if any), then the catch-all."""
        catch_all = self.rule_for(source)
        if not self.sensors_topic or source.kind not in ("mqtt", "tcp"):
            return (catch_all,)
        return (*self.sensor_rules(source.kind), catch_all)

    def sensor_rules(self, kind: str) -> tuple[RouteRule, ...]:
        """The sensor-reading rule for ``mqtt`` or ``tcp`` (the sample ``sluice.toml`` spells them out)."""
        ts = TimeSpec("ts", "epoch_ms")
        if kind == "mqtt":
            return (RouteRule("default-sensors-mqtt", self.sensors_topic, "mqtt", filter="sensors/+",
                              key=KeySpec("level", "1"), time=ts, format="json"),)
        if kind == "tcp":
            sensor = KeySpec("field", "sensor")
            return (RouteRule("default-sensors-tcp", self.sensors_topic, "tcp", key=sensor, time=ts,
                              format="json", device=sensor, when_field="sensor"),)
        return ()

    def rule_for(self, source: SourceRef) -> RouteRule:
        """The catch-all for a source kind."""
        if source.kind in ("mqtt", "bridge"):
            return RouteRule(f"default-{source.kind}", self.mqtt_topic, source.kind, key=KeySpec("topic"))
        if source.kind == "file":
            return RouteRule("default-file", self.file_topic, "file", time=TimeSpec("default"))
        return RouteRule(f"default-{source.kind}", self.tcp_topic, source.kind, time=TimeSpec("default"))
