"""Shared subscriptions (MQTT 5.0 §4.8.2): ``$share/<group>/<filter>``, each message to one member.

Rules
-----
1. A shared filter is ``$share/`` + a non-empty group name without ``/``, ``+`` or ``#`` + ``/`` + a valid
   topic filter. Anything else starting with ``$share/`` is an invalid topic filter (SUBACK 0x8F), unless
   the whole filter breaks the topic filter syntax (a wildcard not a whole level): then the SUBSCRIBE is
   malformed (``subscribe.py`` rule 2). No Local on a shared subscription is a protocol error (§3.8.3.1,
   DISCONNECT 0x82).
2. A group is keyed by (group name, filter); its members are sessions, each with its own granted QoS and
   subscription identifier. Each message goes to one member, taking turns (round robin), preferring a
   member whose client is connected; with none connected, the next member's session queues it.
   The QoS sent is min(published, that member's granted QoS).
3. Retained messages are not sent when a shared subscription is made.
4. A member's session that ends (clean disconnect, expiry, clean start, unsubscribe of the group with
   messages still unacknowledged) gives its unacknowledged and queued messages of that group to the
   other members (§4.8.2: "the Server SHOULD send the Application Message to another Client").
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Final

from ingest.mqtt.packets import Subscription
from ingest.mqtt.subscriptions import valid_filter

if TYPE_CHECKING:
    from ingest.mqtt.session_state import SessionState

__all__ = ["SHARE_PREFIX", "Granted", "SharedGroup", "parse_shared"]

SHARE_PREFIX: Final = "$share/"
# What a subscription holds in the subscription tree: the options and its identifier (0: none).
Granted = tuple[Subscription, int]


def parse_shared(topic_filter: str) -> tuple[str, str] | None:
    """(group, filter) of a valid shared filter; None when ``topic_filter`` is not one (rule 1)."""
    rest = topic_filter[len(SHARE_PREFIX):]
    group, sep, inner = rest.partition("/")
    if not sep or not group or "+" in group or "#" in group or not valid_filter(inner):
        return None
    return group, inner


class SharedGroup(Hashable):
    """The members of one ``$share/<group>/<filter>``; hashed by identity (one object per group)."""

    __slots__ = ("members", "name", "topic_filter", "_turn")

    def __init__(self, name: str, topic_filter: str) -> None:
        self.name = name
        self.topic_filter = topic_filter
        self.members: dict[SessionState, Granted] = {}
        self._turn = 0

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def choose(self, exclude: SessionState | None = None) -> tuple[SessionState, Granted] | None:
        """The member whose turn it is (rule 2), skipping ``exclude``; None when there is nobody."""
        members = [m for m in self.members.items() if m[0] is not exclude]
        if not members:
            return None
        start = self._turn % len(members)
        self._turn += 1
        for i in range(len(members)):
            session, granted = members[(start + i) % len(members)]
            if session.connection is not None:
                return session, granted
        return members[start]
