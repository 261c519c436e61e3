"""Applying the routes of ``routing.py`` (which defines them and their semantics) to device messages.

``Router`` holds the rules (changeable at runtime) and hands out one ``SourceRoutes`` per source. A
``SourceRoutes`` routes that source's messages and caches what depends only on the rules and the source:
the rules that may apply to each subject (MQTT topic name), the log topic a template gives, the headers
for each (device, MQTT topic), and per (subject, device) a plan (log topic, key, headers) when one raw-payload
rule decides it all, so that most messages are routed without parsing. Changing the rules drops them all.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from broker.errors import InvalidTopicError
from broker.log.config import validate_topic_name
from broker.protocol.records import Headers, RecordSpec, RecordTuple
from ingest.errors import ConfigError, PayloadError, RouteError
from ingest.formats import Parsed, parse_payload
from ingest.mqtt.subscriptions import topic_matches
from ingest.routing import (
    KeySpec,
    RawMessage,
    Rejected,
    Routed,
    RouteDefaults,
    RouteRule,
    SourceRef,
    TimeSpec,
    event_time_ms,
)

__all__ = ["RoutedTuple", "Router", "SourceRoutes"]

_DEVICE_TAGS = ("device_id", "device", "host")


class Router:
    """Applies rules to messages. Rules can be replaced at runtime (``add_rule``/``remove_rule``).

    The work is done by one ``SourceRoutes`` per source (``for_source``), which caches decisions
    that only depend on the rules; changing the rules drops them all.
    """

    def __init__(
        self,
        rules: Iterable[RouteRule] = (),
        defaults: RouteDefaults | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._rules: list[RouteRule] = []
        self.defaults = defaults or RouteDefaults()
        self._clock = clock
        self._sources: dict[SourceRef, SourceRoutes] = {}
        for rule in rules:
            self.add_rule(rule)

    @property
    def rules(self) -> list[RouteRule]:
        return list(self._rules)

    def add_rule(self, rule: RouteRule, *, index: int | None = None, replace: bool = False) -> None:
        """Add a rule (at the end, or at ``index``); ``replace`` swaps a rule of the same name."""
        self._sources.clear()  # cached decisions came from the old rules
        for i, existing in enumerate(self._rules):
            if existing.name == rule.name:
                if not replace:
                    raise ConfigError(f"a route named {rule.name!r} already exists")
                self._rules[i] = rule
                return
        if index is None:
            self._rules.append(rule)
        else:
            self._rules.insert(index, rule)

    def remove_rule(self, name: str) -> RouteRule:
        for i, rule in enumerate(self._rules):
            if rule.name == name:
                self._sources.clear()
                return self._rules.pop(i)
        raise ConfigError(f"no route named {name!r}")

    def for_source(self, source: SourceRef) -> SourceRoutes:
        """The routing of one source under the current rules (valid until the rules change)."""
        routes = self._sources.get(source)
        if routes is None:
            defaults = self.defaults.rules_for(source)
            routes = self._sources[source] = SourceRoutes(source, self._rules, defaults, self._clock)
        return routes

    def route(self, source: SourceRef, message: RawMessage) -> list[Routed | Rejected]:
        return [
            r if isinstance(r, Rejected) else Routed(r[0], r[2][1], RecordSpec(*r[2]), r[1])
            for r in self.for_source(source).route(message)
        ]

    def to_mapping(self) -> dict[str, Any]:
        return {
            "rules": [rule.to_mapping() for rule in self._rules],
            "defaults": dataclasses.asdict(self.defaults),
        }


# (log topic, device, (value, key, headers, event time ms)): a ``Routed`` as plain tuples, for the
# ingest sink's hot path (no dataclass per message; the record goes to encode_record_tuples as is).
RoutedTuple = tuple[str, str | None, RecordTuple]
_CACHE_MAX = 100_000  # entries per cache; cleared when full (devices and MQTT topics repeat)
_UNPLANNED: Any = object()  # SourceRoutes._plans: not looked at yet (None: no plan, route each message)
_RAW_PARSED = parse_payload("raw", b"")  # what every raw payload parses to


class SourceRoutes:
    """The rules as they apply to one source, with the per-message work that repeats cached.

    Cached: which rules match each MQTT topic name (or ``None`` for sources without one), the log
    topic a template gives for a topic name, and the headers tuple for each (device, MQTT topic)
    with the constant ``source`` header encoded once. All of it depends only on the rules, the
    source and those keys, and the ``Router`` builds a fresh ``SourceRoutes`` when rules change.
    """

    __slots__ = ("_by_subject", "_clock", "_defaults", "_headers", "_mqtt", "_plans", "_rules", "_source_header",
                 "_topics", "line_plan", "source")

    def __init__(
        self,
        source: SourceRef,
        rules: Sequence[RouteRule],
        defaults: RouteRule | Sequence[RouteRule],
        clock: Callable[[], float],
    ) -> None:
        self.source = source
        # Only rules whose source part matches; their topic filters are checked per topic name.
        self._rules = [
            r for r in rules
            if r.source_kind in ("*", source.kind) and r.source_name in ("*", source.name)
        ]
        self._defaults = (defaults,) if isinstance(defaults, RouteRule) else tuple(defaults)
        self._clock = clock
        self._mqtt = source.kind in ("mqtt", "bridge")
        self._source_header = ("source", source.label.encode())
        self._by_subject: dict[str | None, tuple[tuple[RouteRule, ...], tuple[RouteRule, ...]]] = {}
        self._topics: dict[tuple[str, str | None], str] = {}
        self._headers: dict[tuple[str | None, str | None], Headers] = {}
        # (subject, device) -> (log topic, key, headers) when one raw-payload rule decides it all (``_plan``)
        self._plans: dict[tuple[str | None, str | None], tuple[str, bytes | None, Headers] | None] = {}
        self.line_plan: Any = _UNPLANNED  # ingest.line_routes.line_plan's cache: a LinePlan, or None

    def rules_for(self, subject: str | None) -> tuple[tuple[RouteRule, ...], tuple[RouteRule, ...]]:
        """(configured, default) rules that may apply, in order, each list up to its first rule that
        always applies and stops (no ``continue``, no ``when_field``). The defaults are tried only
        when no configured rule applied to the message."""
        found = self._by_subject.get(subject)
        if found is None:
            if len(self._by_subject) >= _CACHE_MAX:
                self._by_subject.clear()
            found = self._by_subject[subject] = (_chain(self._rules, subject), _chain(self._defaults, subject))
        return found

    def route(self, message: RawMessage) -> list[RoutedTuple | Rejected]:
        plan = self._plans.get((message.subject, message.device), _UNPLANNED)
        if plan is _UNPLANNED:
            plan = self.plan_for(message.subject, message.device, message.payload)
        if plan is None:
            return self.route_each(message)
        topic, key, headers = plan
        if message.headers:
            headers += message.headers
        arrival = message.arrival_ms if message.arrival_ms >= 0 else int(self._clock() * 1000)
        return [(topic, message.device, (message.payload, key, headers, arrival))]

    def plan_for(
        self, subject: str | None, device: str | None, payload: bytes
    ) -> tuple[str, bytes | None, Headers] | None:
        """(log topic, key, headers) of every message with this subject and device, or None when each must
        be routed by itself (``route_each``); worked out from the first such message (``payload``), then
        cached. A message's own headers go after these; its record time is its arrival time."""
        cache_key = (subject, device)
        plan = self._plans.get(cache_key, _UNPLANNED)
        if plan is _UNPLANNED:
            plan = self._plan(RawMessage(payload, subject, device))
            if len(self._plans) >= _CACHE_MAX:
                self._plans.clear()
            self._plans[cache_key] = plan
        return plan

    def _plan(self, message: RawMessage) -> tuple[str, bytes | None, Headers] | None:
        """What ``route_each`` gives every message with this subject and device, when that depends on
        nothing else: the one rule that applies (not fan-out, no ``when_field``) takes the payload as raw
        bytes (so nothing is parsed), the device from the message, a key that is not read from the payload
        and the arrival time. None otherwise, or when the rule rejects the message (``route_each`` then
        routes each message itself)."""
        configured, defaults = self.rules_for(message.subject)
        chain = configured or defaults
        if len(chain) != 1:
            return None
        rule = chain[0]
        if (
            rule.fan_out or rule.when_field is not None or rule.device is not None
            or (rule.format or self.source.format or "raw") != "raw"
            or rule.key.kind not in ("default", "none", "topic", "level", "device")
            or rule.time.field not in ("arrival", "default")
        ):
            return None
        try:  # as route_each routes it, without the message's own headers (added per message)
            topic, _, (_, key, headers, _) = self._apply(
                rule, RawMessage(message.payload, message.subject, message.device), _RAW_PARSED, 0)
        except Exception:
            return None
        return topic, key, headers

    def route_each(self, message: RawMessage) -> list[RoutedTuple | Rejected]:
        """Every rule that applies, tried in order on this message (``route`` without its plans)."""
        arrival = message.arrival_ms if message.arrival_ms >= 0 else int(self._clock() * 1000)
        out: list[RoutedTuple | Rejected] = []
        parsed_by_format: dict[str, Parsed | PayloadError] = {}
        source_format = self.source.format
        configured, defaults = self.rules_for(message.subject)
        for chain in (configured, defaults):
            for rule in chain:
                fmt = rule.format or source_format or "raw"
                parsed = parsed_by_format.get(fmt)
                if parsed is None:
                    try:
                        parsed = parse_payload(fmt, message.payload, message.columns)
                    except PayloadError as exc:
                        parsed = exc
                    parsed_by_format[fmt] = parsed
                if rule.when_field is not None and (
                    isinstance(parsed, PayloadError) or parsed.lookup(rule.when_field) is None
                ):
                    continue  # not this rule's kind of payload: the next rule decides
                self._route_one(rule, message, parsed, fmt, arrival, out)
                if not rule.fan_out:
                    return out
            if out:
                return out  # configured fan-out rules applied: no default
        return out

    def _route_one(
        self,
        rule: RouteRule,
        message: RawMessage,
        parsed: Parsed | PayloadError,
        fmt: str,
        arrival: int,
        out: list[RoutedTuple | Rejected],
    ) -> None:
        if isinstance(parsed, PayloadError):
            out.append(Rejected(f"{fmt}: {parsed}", message.payload, message.device))
            return
        try:
            out.append(self._apply(rule, message, parsed, arrival))
        except PayloadError as exc:
            device = message.device or _default_device(parsed)
            out.append(Rejected(f"route {rule.name}: {exc}", message.payload, device))
        except Exception as exc:  # hostile input past the parser (e.g. re-encoding a deep document)
            reason = f"route {rule.name}: cannot use the payload ({type(exc).__name__}: {str(exc)[:80]})"
            out.append(Rejected(reason, message.payload, message.device))

    def _apply(self, rule: RouteRule, message: RawMessage, parsed: Parsed, arrival: int) -> RoutedTuple:
        topic = rule.topic if "{" not in rule.topic else self._topic(rule, message)
        device = _device(rule.device, message, parsed) if rule.device else message.device or _default_device(parsed)
        key = _key(rule.key, message, parsed, device)
        timestamp = _event_time(rule.time, parsed, arrival)
        value = message.payload if rule.value == "original" or parsed.format == "raw" else parsed.to_json_bytes()
        headers = self._headers_for(device, message.subject if self._mqtt else None)
        if message.headers:
            headers += message.headers
        return topic, device, (value, key, headers, timestamp)

    def _topic(self, rule: RouteRule, message: RawMessage) -> str:
        cache_key = (rule.topic, message.subject)
        topic = self._topics.get(cache_key)
        if topic is None:
            if len(self._topics) >= _CACHE_MAX:
                self._topics.clear()
            topic = self._topics[cache_key] = _topic_for(rule, message)  # errors are not cached
        return topic

    def _headers_for(self, device: str | None, mqtt_topic: str | None) -> Headers:
        """``source``, then ``device`` when known, then ``mqtt_topic`` for MQTT sources."""
        cache_key = (device, mqtt_topic)
        headers = self._headers.get(cache_key)
        if headers is None:
            headers = (self._source_header,)
            if device is not None:
                headers += (("device", device.encode()),)
            if mqtt_topic is not None:
                headers += (("mqtt_topic", mqtt_topic.encode()),)
            if len(self._headers) >= _CACHE_MAX:
                self._headers.clear()
            self._headers[cache_key] = headers
        return headers


def _chain(rules: Iterable[RouteRule], subject: str | None) -> tuple[RouteRule, ...]:
    """The rules whose filter matches ``subject``, up to the first that always applies and stops."""
    chosen: list[RouteRule] = []
    for rule in rules:
        if rule.filter is None or (subject is not None and topic_matches(rule.filter, subject)):
            chosen.append(rule)
            if not rule.fan_out and rule.when_field is None:
                break
    return tuple(chosen)


def _topic_for(rule: RouteRule, message: RawMessage) -> str:
    levels = (message.subject or "").split("/")
    try:
        topic = rule.topic.format(*levels)
    except (IndexError, KeyError, ValueError):
        raise RouteError(
            f"log topic template {rule.topic!r} needs more MQTT topic levels than {message.subject!r} has"
        ) from None
    try:
        validate_topic_name(topic)
    except InvalidTopicError as exc:
        raise RouteError(f"log topic {topic!r} from template {rule.topic!r} is invalid: {exc}") from None
    return topic


def _scalar_text(value: Any) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _default_device(parsed: Parsed) -> str | None:
    if parsed.point is not None:
        for name in _DEVICE_TAGS:
            tag = parsed.tag(name)
            if tag is not None:
                return tag
        return None
    if parsed.format in ("json", "csv"):
        return _scalar_text(parsed.lookup("device_id"))
    return None


def _device(spec: KeySpec, message: RawMessage, parsed: Parsed) -> str | None:
    key = _key(spec, message, parsed, message.device)
    return key.decode("utf-8", "replace") if key is not None else None


def _key(spec: KeySpec, message: RawMessage, parsed: Parsed, device: str | None) -> bytes | None:
    kind = spec.kind
    if kind == "default":
        if parsed.point is not None:
            return parsed.point.series_key().encode()
        if parsed.format in ("json", "csv"):
            text = _scalar_text(parsed.lookup("device_id"))
            return text.encode() if text is not None else None
        return None
    if kind == "none":
        return None
    if kind == "topic":
        return message.subject.encode() if message.subject is not None else None
    if kind == "level":
        if message.subject is None:
            raise RouteError("key from an MQTT topic level, but the message has no topic")
        levels = message.subject.split("/")
        index = int(spec.arg)
        if index >= len(levels):
            raise RouteError(f"key level {index} but topic {message.subject!r} has {len(levels)} levels")
        return levels[index].encode()
    if kind == "field":
        if parsed.format == "raw":
            raise RouteError(f"key field {spec.arg!r} needs a structured payload (json, csv, influx)")
        text = _scalar_text(parsed.lookup(spec.arg))
        if text is None:
            raise RouteError(f"key field {spec.arg!r} is missing or not a scalar")
        return text.encode()
    if kind == "tag":
        tag = parsed.tag(spec.arg)
        if tag is None:
            raise RouteError(f"key tag {spec.arg!r} is missing (needs an InfluxDB line with that tag)")
        return tag.encode()
    if kind == "series":
        if parsed.point is None:
            raise RouteError("key 'series' needs an InfluxDB line protocol payload")
        return parsed.point.series_key().encode()
    # device
    return device.encode() if device is not None else None


def _event_time(spec: TimeSpec, parsed: Parsed, arrival: int) -> int:
    name = spec.field
    if name == "arrival":
        return arrival
    if name in ("default", "timestamp") and parsed.point is not None:
        if parsed.point.timestamp is None:
            return arrival
        fmt = spec.format if name == "timestamp" else "epoch_ns"
        return event_time_ms(parsed.point.timestamp, fmt)
    if name == "default":
        return arrival
    if parsed.format == "raw":
        raise RouteError(f"event time field {name!r} needs a structured payload (json, csv, influx)")
    value = parsed.lookup(name)
    if value is None:
        raise RouteError(f"event time field {name!r} is missing")
    return event_time_ms(value, spec.format)

