"""``SourceRoutes.route`` answers messages whose routing depends only on their subject and device from a
plan made once per (subject, device) (``SourceRoutes._plan``): it must give exactly what routing each
message through its rules gives (``route_each``), for every kind of rule, including the ones it does not
plan for, rules that reject, and messages that carry their own headers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.router import Router
from ingest.routing import KeySpec, RawMessage, RouteDefaults, RouteRule, SourceRef, TimeSpec

SOURCES = [SourceRef("mqtt", "default"), SourceRef("bridge", "b1"), SourceRef("tcp", "t1", "json"),
           SourceRef("tcp", "t2"), SourceRef("file", "f1", "raw")]
SUBJECTS = [None, "sensors/d1/temp", "sensors/d2", "a/b", "x", "sensors/d1/temp/extra"]
PAYLOADS = [b'{"device_id": "dev-1", "t": 1700000000123, "sensor": "s1"}', b"{broken", b"plain", b""]

rules = st.builds(
    RouteRule,
    name=st.sampled_from(["r1", "r2", "r3"]),
    topic=st.sampled_from(["out", "by-{1}", "s-{0}-{2}"]),
    source_kind=st.sampled_from(["*", "mqtt", "tcp", "file"]),
    filter=st.sampled_from([None, "sensors/+/temp", "sensors/#", "#", "a/b"]),
    key=st.sampled_from([KeySpec(), KeySpec("topic"), KeySpec("level", "1"), KeySpec("level", "5"),
                         KeySpec("field", "device_id"), KeySpec("device"), KeySpec("none"), KeySpec("series")]),
    time=st.sampled_from([TimeSpec(), TimeSpec("default"), TimeSpec("timestamp"), TimeSpec("t", "epoch_ms")]),
    format=st.sampled_from([None, "json", "raw"]),
    value=st.sampled_from(["original", "json"]),
    device=st.sampled_from([None, KeySpec("field", "device_id"), KeySpec("level", "1")]),
    fan_out=st.booleans(),
    when_field=st.sampled_from([None, None, "sensor"]),
)
messages = st.builds(
    RawMessage,
    payload=st.sampled_from(PAYLOADS),
    subject=st.sampled_from(SUBJECTS),
    device=st.sampled_from([None, "client-a", "client-b"]),
    arrival_ms=st.sampled_from([1_700_000_000_000, -1]),
    headers=st.sampled_from([(), (("mqtt.content_type", b"text/plain"),), (("k", None),)]),
)


@settings(max_examples=400, deadline=None)
@given(rule_list=st.lists(rules, max_size=3, unique_by=lambda r: r.name), source=st.sampled_from(SOURCES),
       msgs=st.lists(messages, min_size=1, max_size=12), sensors=st.sampled_from(["", "sensors"]))
def test_planned_routes_equal_routing_each_message(rule_list: list[RouteRule], source: SourceRef,
                                                   msgs: list[RawMessage], sensors: str) -> None:
    router = Router(rule_list, RouteDefaults(sensors_topic=sensors), clock=lambda: 1_800_000_000.0)
    routes = router.for_source(source)
    for _ in range(2):  # the second pass from the plans made by the first
        for message in msgs:
            assert routes.route(message) == routes.route_each(message), (message, rule_list)


def test_the_default_mqtt_route_is_planned() -> None:
    """The case the plans are for: MQTT's default rule (raw payload, key = the topic name)."""
    routes = Router([], RouteDefaults()).for_source(SourceRef("mqtt", "default"))
    message = RawMessage(b"21.5", "plant/pump-7/temp", "pump-7", 1_700_000_000_000)
    assert routes.route(message) == routes.route_each(message)
    assert routes._plans[("plant/pump-7/temp", "pump-7")] is not None


def test_rules_a_plan_cannot_stand_for_route_each_message() -> None:
    """Each reason not to plan, alone: a rule that looks at the payload (when_field, JSON, a device or key
    from a field) or lets later rules apply (fan-out)."""
    payload = b'{"device_id": "dev-9", "sensor": "s", "t": 1700000000000}'
    cases = [
        RouteRule("w", "out", format="raw", when_field="sensor"),
        RouteRule("j", "out", format="json"),
        RouteRule("f", "out", format="raw", fan_out=True),
        RouteRule("d", "out", format="json", device=KeySpec("field", "device_id")),
        RouteRule("k", "out", format="json", key=KeySpec("field", "device_id")),
        RouteRule("t", "out", format="json", time=TimeSpec("t", "epoch_ms")),
    ]
    for rule in cases:
        routes = Router([rule], RouteDefaults()).for_source(SourceRef("mqtt", "default"))
        message = RawMessage(payload, "a/b", "client", 1)
        for _ in range(2):
            assert routes.route(message) == routes.route_each(message), rule
        assert routes._plans[("a/b", "client")] is None, rule
