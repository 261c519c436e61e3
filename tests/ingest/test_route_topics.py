"""Which log topics an MQTT topic or filter leads to through the routes (the MQTT ACL check's input)."""

from __future__ import annotations

from ingest.route_topics import filters_overlap, publish_topics, subscribe_topics
from ingest.router import Router
from ingest.routing import RouteDefaults, RouteRule, SourceRef

MQTT = SourceRef("mqtt", "default")


def router(*rules: RouteRule) -> Router:
    return Router(rules, RouteDefaults(sensors_topic="sensors"))


def test_publish_follows_the_rule_chain() -> None:
    r = router(RouteRule("dev", "dev-{1}", "mqtt", filter="dev/+/#"),
               RouteRule("copy", "audit", "mqtt", filter="dev/#", fan_out=True))
    routes = r.for_source(MQTT)
    assert publish_topics(routes, "sensors/1") == {"sensors"}  # the default sensor rule stops the chain
    assert publish_topics(routes, "other/x") == {"mqtt"}
    assert publish_topics(routes, "dev/a/b") == {"dev-a"}  # the first rule always applies: the copy never runs
    fan = router(RouteRule("copy", "audit", "mqtt", filter="dev/#", fan_out=True))
    assert publish_topics(fan.for_source(MQTT), "dev/a") == {"audit", "mqtt"}  # fan-out: the defaults too


def test_subscribe_counts_every_rule_a_filter_may_meet() -> None:
    r = router(RouteRule("dev", "dev-{1}", "mqtt", filter="dev/+/#"))
    defaults = r.defaults.rules_for(MQTT)
    assert subscribe_topics(r.rules, defaults, "sensors/+") == {"sensors"}
    assert subscribe_topics(r.rules, defaults, "sensors/#") == {"sensors", "mqtt"}  # "sensors/a/b" is mqtt's
    assert subscribe_topics(r.rules, defaults, "$share/g/sensors/+") == {"sensors"}
    assert subscribe_topics(r.rules, defaults, "dev/a/#") == {"dev-a"}
    assert subscribe_topics(r.rules, defaults, "dev/+/x") == {None}  # the log topic depends on the level
    assert subscribe_topics(r.rules, defaults, "#") == {None, "sensors", "mqtt"}


def test_filters_overlap() -> None:
    assert filters_overlap("a/+/c", "a/b/#")
    assert filters_overlap("#", "x")
    assert not filters_overlap("a/b", "a/c")
    assert not filters_overlap("a/b", "a/b/c")
