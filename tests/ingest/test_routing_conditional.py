"""``when_field`` rules and the sensor defaults (``RouteDefaults.sensors_topic``)."""

from __future__ import annotations

from ingest.router import Router
from ingest.routing import RawMessage, Rejected, Routed, RouteDefaults, RouteRule, SourceRef

MQTT = SourceRef("mqtt", "default")
TCP_JSON = SourceRef("tcp", "default", "json")
TCP_INFLUX = SourceRef("tcp", "default", "influx")
NOW_MS = 1_700_000_000_000


def _router(*rules: RouteRule, sensors: str = "") -> Router:
    return Router(list(rules), RouteDefaults(sensors_topic=sensors), clock=lambda: NOW_MS / 1000)


def _topics(results: list[Routed | Rejected]) -> list[str]:
    return [r.topic if isinstance(r, Routed) else f"rejected: {r.reason}" for r in results]


def test_when_field_rule_applies_only_to_payloads_with_the_field() -> None:
    rule = RouteRule.from_mapping({"name": "pumps", "topic": "pumps", "when_field": "rpm", "format": "json"})
    assert rule.to_mapping()["when_field"] == "rpm"
    router = _router(rule, RouteRule("rest", "other", format="raw"))
    assert _topics(router.route(TCP_JSON, RawMessage(b'{"rpm": 3}'))) == ["pumps"]
    assert _topics(router.route(TCP_JSON, RawMessage(b'{"temp": 3}'))) == ["other"]
    assert _topics(router.route(TCP_JSON, RawMessage(b"not json"))) == ["other"]  # unparseable: next rule


def test_when_field_rules_that_do_not_apply_fall_to_the_defaults() -> None:
    router = _router(RouteRule("pumps", "pumps", when_field="rpm"))
    assert _topics(router.route(TCP_JSON, RawMessage(b'{"temp": 3}'))) == ["tcp"]
    assert _topics(router.route(TCP_JSON, RawMessage(b"{bad"))) == [
        _topics(_router().route(TCP_JSON, RawMessage(b"{bad")))[0]
    ]


def test_fan_out_rule_that_applied_still_suppresses_the_defaults() -> None:
    router = _router(RouteRule("copy", "copies", fan_out=True), sensors="sensors")
    assert _topics(router.route(MQTT, RawMessage(b'{"ts": 1}', "sensors/a"))) == ["copies"]


def test_sensor_defaults_are_off_unless_configured() -> None:
    reading = RawMessage(b'{"sensor": "s1", "temp": 1.5, "ts": 1714564800000}', "sensors/s1")
    assert _topics(_router().route(MQTT, reading)) == ["mqtt"]
    assert _topics(_router().route(TCP_JSON, reading)) == ["tcp"]


def test_sensor_defaults_route_readings_keyed_by_sensor_with_event_time_from_ts() -> None:
    router = _router(sensors="sensors")
    (mqtt,) = router.route(MQTT, RawMessage(b'{"temp": 1.5, "ts": 1714564800000}', "sensors/s1", "client-1"))
    assert isinstance(mqtt, Routed)
    assert (mqtt.topic, mqtt.key, mqtt.record.timestamp, mqtt.device) == ("sensors", b"s1", 1714564800000, "client-1")
    (tcp,) = router.route(TCP_JSON, RawMessage(b'{"sensor": "s2", "temp": 1.5, "ts": 1714564800001}'))
    assert isinstance(tcp, Routed)
    assert (tcp.topic, tcp.key, tcp.record.timestamp, tcp.device) == ("sensors", b"s2", 1714564800001, "s2")
    # Other shapes keep their catch-alls.
    assert _topics(router.route(MQTT, RawMessage(b"x", "sensors/a/b"))) == ["mqtt"]
    assert _topics(router.route(MQTT, RawMessage(b"x", "home/lamp"))) == ["mqtt"]
    assert _topics(router.route(TCP_JSON, RawMessage(b'{"device_id": "p"}'))) == ["tcp"]
    assert _topics(router.route(TCP_INFLUX, RawMessage(b"cpu,host=a sensor=1i 1"))) == ["tcp"]
    assert _topics(router.route(SourceRef("file", "f", "json"), RawMessage(b'{"sensor": "s", "ts": 1}'))) == ["file"]
    # A reading on sensors/<id> that cannot be one is a dead letter with the reason, not a silent guess.
    (no_ts,) = router.route(MQTT, RawMessage(b'{"temp": 1.5}', "sensors/s1"))
    assert isinstance(no_ts, Rejected) and "event time field 'ts' is missing" in no_ts.reason
    (raw,) = router.route(MQTT, RawMessage(b"21.5C", "sensors/s1"))
    assert isinstance(raw, Rejected) and raw.reason.startswith("json:")
    # TCP reading with a sensor but no ts: dead letter too (the processor needs event time).
    (tcp_no_ts,) = router.route(TCP_JSON, RawMessage(b'{"sensor": "s2"}'))
    assert isinstance(tcp_no_ts, Rejected) and "'ts'" in tcp_no_ts.reason


def test_configured_rules_come_before_the_sensor_defaults() -> None:
    router = _router(RouteRule("mine", "mine", "mqtt", filter="sensors/#"), sensors="sensors")
    assert _topics(router.route(MQTT, RawMessage(b'{"ts": 1}', "sensors/s1"))) == ["mine"]
