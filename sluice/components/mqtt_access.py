"""The ACLs on the device doors (MQTT, TCP lines): judged by the log topics the ingest routes send data to.

With ``security.auth = required`` the MQTT hub asks this object (``ingest.mqtt.hub.TopicAccess``):
- a PUBLISH (and a CONNECT's will) needs WRITE on every log topic its MQTT topic may be routed to
  (``ingest.route_topics.publish_topics``); a topic routed nowhere is refused;
- a SUBSCRIBE filter needs READ on every log topic its matching MQTT topics may be routed to
  (``subscribe_topics``); a route template whose levels the filter leaves open needs READ on every topic
  (a literal ``*`` grant);
as the principal ``User:<user name>`` (the CONNECT's, or the certificate's Common Name), from the client's
address. Refusals are audited as front door "mqtt". The routes are read at each check: a route added
at runtime applies at once.

A TCP line listener asks ``tcp_writer_check`` once per login: WRITE on every log topic its lines may be
routed to (the rules without a filter; audited as "tcp").
"""

from __future__ import annotations

from collections.abc import Callable

from broker.security import ANONYMOUS, Authorizer, Operation, Principal, ResourceType
from ingest.route_topics import publish_topics, subscribe_topics
from ingest.router import Router
from ingest.routing import SourceRef

__all__ = ["MqttAccess", "tcp_writer_check"]

_DOOR = "mqtt"


class MqttAccess:
    def __init__(self, authorizer: Authorizer, router: Router, source: SourceRef) -> None:
        self.authorizer = authorizer
        self.router = router
        self.source = source

    def may_publish(self, username: str | None, peer: str, topic: str) -> bool:
        principal = Principal(username) if username else ANONYMOUS
        targets = publish_topics(self.router.for_source(self.source), topic)
        if not targets:
            self.authorizer.denied(_DOOR, principal, peer, Operation.WRITE, ResourceType.TOPIC,
                                   f"(no log topic for MQTT topic {topic})")
            return False
        return all(self.authorizer.check(_DOOR, principal, peer, Operation.WRITE, ResourceType.TOPIC, name)
                   for name in sorted(targets))

    def may_subscribe(self, username: str | None, peer: str, topic_filter: str) -> bool:
        principal = Principal(username) if username else ANONYMOUS
        targets = subscribe_topics(self.router.rules, self.router.defaults.rules_for(self.source), topic_filter)
        return all(self.authorizer.check(_DOOR, principal, peer, Operation.READ, ResourceType.TOPIC,
                                         "*" if name is None else name)
                   for name in sorted(targets, key=lambda n: n or ""))


def tcp_writer_check(authorizer: Authorizer, router: Router, source: SourceRef) -> Callable[[Principal, str], bool]:
    """May ``principal`` (logged in from ``peer``) send lines to ``source``: WRITE on every log topic they may
    be routed to."""

    def may_write(principal: Principal, peer: str) -> bool:
        targets = publish_topics(router.for_source(source), None)
        if not targets:
            authorizer.denied("tcp", principal, peer, Operation.WRITE, ResourceType.TOPIC, "(no log topic)")
            return False
        return all(authorizer.check("tcp", principal, peer, Operation.WRITE, ResourceType.TOPIC, name)
                   for name in sorted(targets))

    return may_write
