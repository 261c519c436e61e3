"""Routing rules and the built-in defaults: filters, keys, event times, topics, rejections."""

from __future__ import annotations

import json

import pytest

from ingest.errors import ConfigError
from ingest.router import Router
from ingest.routing import (
    KeySpec,
    RawMessage,
    Rejected,
    Routed,
    RouteDefaults,
    RouteRule,
    SourceRef,
    TimeSpec,
    topic_matches,
    validate_filter,
)

MQTT = SourceRef("mqtt", "default")
TCP_JSON = SourceRef("tcp", "default", "json")
TCP_INFLUX = SourceRef("tcp", "default", "influx")
NOW_MS = 1_700_000_000_000


def _router(*rules: RouteRule) -> Router:
    return Router(list(rules), RouteDefaults(), clock=lambda: NOW_MS / 1000)


def _one(results: list[Routed | Rejected]) -> Routed:
    assert len(results) == 1, results
    result = results[0]
    assert isinstance(result, Routed), result
    return result


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("sensors/+/temperature", "sensors/dev1/temperature", True),
        ("sensors/+/temperature", "sensors/dev1/humidity", False),
        ("sensors/+/temperature", "sensors/a/b/temperature", False),
        ("sensors/#", "sensors", True),
        ("sensors/#", "sensors/a/b/c", True),
        ("sensors/#", "other/a", False),
        ("#", "anything/at/all", True),
        ("#", "$SYS/broker", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/broker", True),
        ("a/+", "a/", True),
        ("a/+", "a", False),
        ("a/b", "a/b", True),
        ("+/+", "/x", True),
    ],
)
def test_topic_filters(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected


@pytest.mark.parametrize("bad", ["", "a/#/b", "a#", "a/b+", "+a/b"])
def test_invalid_filters_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError):
        validate_filter(bad)


def test_mqtt_default_goes_to_mqtt_keyed_by_topic_name_with_arrival_time() -> None:
    routed = _one(_router().route(MQTT, RawMessage(b"\x00\xffbinary", "sensors/d1/temp", "client-1", 1234)))
    assert routed.topic == "mqtt"
    assert routed.key == b"sensors/d1/temp"
    assert routed.record.value == b"\x00\xffbinary"
    assert routed.record.timestamp == 1234
    headers = dict(routed.record.headers)
    assert headers["source"] == b"mqtt:default"
    assert headers["device"] == b"client-1"
    assert headers["mqtt_topic"] == b"sensors/d1/temp"


def test_tcp_default_json_keyed_by_device_id() -> None:
    line = b'{"device_id": "pump-7", "t": 21.5}'
    routed = _one(_router().route(TCP_JSON, RawMessage(line)))
    assert (routed.topic, routed.key, routed.record.value) == ("tcp", b"pump-7", line)
    assert routed.record.timestamp == NOW_MS  # arrival stamped by the router's clock
    assert dict(routed.record.headers)["device"] == b"pump-7"


def test_tcp_default_json_without_device_id_is_keyless_not_rejected() -> None:
    routed = _one(_router().route(TCP_JSON, RawMessage(b"[1, 2, 3]", arrival_ms=5)))
    assert routed.key is None
    assert "device" not in dict(routed.record.headers)


def test_tcp_default_influx_keyed_by_series_with_line_timestamp() -> None:
    line = b"weather,station=b\\ 2,region=eu temp=21.5,ok=true 1700000000123456789"
    routed = _one(_router().route(TCP_INFLUX, RawMessage(line)))
    assert routed.topic == "tcp"
    assert routed.key == b"weather,region=eu,station=b\\ 2"  # tags sorted, escapes kept
    assert routed.record.timestamp == 1_700_000_000_123


def test_tcp_influx_without_timestamp_uses_arrival() -> None:
    routed = _one(_router().route(TCP_INFLUX, RawMessage(b"cpu,host=a usage=1i", arrival_ms=77)))
    assert routed.record.timestamp == 77
    assert dict(routed.record.headers)["device"] == b"a"  # the host tag names the device


def test_rule_with_topic_filter_level_key_and_template() -> None:
    rule = RouteRule.from_mapping(
        {
            "name": "temps",
            "source": "mqtt",
            "filter": "sensors/+/temperature",
            "topic": "temps.{0}",
            "key": "level:1",
            "format": "json",
            "time_field": "ts",
            "time_format": "epoch_s",
        }
    )
    router = _router(rule)
    routed = _one(router.route(MQTT, RawMessage(b'{"ts": 1700000000.5, "v": 3}', "sensors/dev9/temperature")))
    assert (routed.topic, routed.key, routed.record.timestamp) == ("temps.sensors", b"dev9", 1_700_000_000_500)
    # a topic the filter does not match falls through to the default
    other = _one(router.route(MQTT, RawMessage(b"x", "sensors/dev9/humidity", arrival_ms=1)))
    assert other.topic == "mqtt"


@pytest.mark.parametrize(
    ("fmt", "value", "expected_ms"),
    [
        ("epoch_s", 1700000000, 1_700_000_000_000),
        ("epoch_s", "1700000000.25", 1_700_000_000_250),
        ("epoch_ms", 1700000000123, 1_700_000_000_123),
        ("epoch_us", 1700000000123456, 1_700_000_000_123),
        ("epoch_ns", 1700000000123456789, 1_700_000_000_123),
        ("rfc3339", "2023-11-14T22:13:20Z", 1_700_000_000_000),
        ("rfc3339", "2023-11-14T23:13:20.123456789+01:00", 1_700_000_000_123),
    ],
)
def test_event_time_formats(fmt: str, value: object, expected_ms: int) -> None:
    rule = RouteRule("r", "t", key=KeySpec("field", "id"), time=TimeSpec("at", fmt), format="json")
    payload = json.dumps({"id": 1, "at": value}).encode()
    routed = _one(_router(rule).route(TCP_JSON, RawMessage(payload)))
    assert routed.record.timestamp == expected_ms
    assert routed.key == b"1"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"id": "a"}', "event time field 'at' is missing"),
        (b'{"id": "a", "at": "yesterday"}', "is not RFC 3339"),
        (b'{"at": "2023-11-14T22:13:20Z"}', "key field 'id' is missing"),
        (b'{"id": {"x": 1}, "at": "2023-11-14T22:13:20Z"}', "key field 'id' is missing or not a scalar"),
        (b"{not json", "json: invalid JSON"),
        (b"\xff\xfe", "json: not UTF-8"),
    ],
)
def test_unroutable_messages_are_rejected_with_reason(payload: bytes, reason: str) -> None:
    rule = RouteRule("r", "t", key=KeySpec("field", "id"), time=TimeSpec("at", "rfc3339"), format="json")
    (result,) = _router(rule).route(TCP_JSON, RawMessage(payload))
    assert isinstance(result, Rejected)
    assert reason in result.reason
    assert result.original == payload


def test_first_match_wins_unless_continue() -> None:
    first = RouteRule("all", "everything", source_kind="tcp", fan_out=True, format="raw")
    second = RouteRule("json", "copy", source_kind="tcp", source_name="default", value="json", format="csv")
    third = RouteRule("never", "never", source_kind="tcp")
    results = _router(first, second, third).route(
        TCP_JSON, RawMessage(b"3,x", columns=("device_id", "name"), arrival_ms=1)
    )
    assert [r.topic for r in results if isinstance(r, Routed)] == ["everything", "copy"]
    routed = results[1]
    assert isinstance(routed, Routed)
    assert json.loads(routed.record.value or b"") == {"device_id": 3, "name": "x"}
    assert routed.key == b"3"


def test_runtime_rules_add_replace_remove() -> None:
    router = _router()
    router.add_rule(RouteRule("a", "one", source_kind="tcp"))
    with pytest.raises(ConfigError):
        router.add_rule(RouteRule("a", "two"))
    router.add_rule(RouteRule("a", "two", source_kind="tcp"), replace=True)
    assert _one(router.route(TCP_JSON, RawMessage(b"{}"))).topic == "two"
    router.remove_rule("a")
    assert _one(router.route(TCP_JSON, RawMessage(b"{}"))).topic == "tcp"
    with pytest.raises(ConfigError):
        router.remove_rule("a")
    assert router.to_mapping()["rules"] == []


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "x"},
        {"name": "x", "topic": "bad topic"},
        {"name": "x", "topic": "t", "key": "column:1"},
        {"name": "x", "topic": "t", "key": "level:one"},
        {"name": "x", "topic": "t", "key": "level:²"},  # isdigit, but int() refuses it
        {"name": "x", "topic": "t", "time_format": "epoch_days"},
        {"name": "x", "topic": "t", "format": "xml"},
        {"name": "x", "topic": "t", "source": "udp"},
        {"name": "x", "topic": "t", "colour": "red"},
    ],
)
def test_bad_rules_are_config_errors(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        RouteRule.from_mapping(bad)


def test_rule_round_trips_through_mapping() -> None:
    rule = RouteRule.from_mapping(
        {"name": "x", "topic": "t", "filter": "a/#", "key": "tag:host", "device": "level:1", "continue": True}
    )
    assert RouteRule.from_mapping(rule.to_mapping()) == rule


def test_topic_template_giving_an_invalid_topic_is_rejected() -> None:
    rule = RouteRule("tpl", "s.{1}", source_kind="mqtt")
    (result,) = _router(rule).route(MQTT, RawMessage(b"x", "a/b c"))
    assert isinstance(result, Rejected)
    assert "invalid" in result.reason
    (short,) = _router(rule).route(MQTT, RawMessage(b"x", "a"))
    assert isinstance(short, Rejected)
