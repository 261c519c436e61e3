"""SUBSCRIBE (MQTT 5.0 §3.8): what each filter is granted, and which subscriptions get retained messages.

Rules
-----
1. One Subscription Identifier per packet, 1..268,435,455 (§3.8.2.1.2); 0 or more than one is a protocol
   error (DISCONNECT 0x82). It applies to every filter of the packet.
2. A filter that breaks the topic filter syntax (empty; ``+`` or ``#`` not a whole level; ``#`` not last;
   §4.7.1, §4.7.3), also inside ``$share/``, makes the packet malformed: DISCONNECT 0x81 (3.1.1: the
   connection is closed) and none of its filters is subscribed. Mosquitto answers so (its broker test
   13-malformed-subscribe-v5, "Bad topic"); SUBACK 0x8F is for a filter that is "correctly formed but
   not allowed" (§3.9.3).
3. Per filter: ``$share/<group>/<filter>`` joins a shared subscription (``shared.py``; no group or no
   filter after it: 0x8F; No Local on it: protocol error 0x82, §3.8.3.1); one the ACLs refuse
   (``may_subscribe``) gets 0x87 (3.1.1: 0x80), as Mosquitto answers; a granted filter gets its
   requested QoS. The SUBACK lists the codes in order.
4. Retain Handling (§3.3.1.3): 0 sends the matching retained messages after the SUBACK, 1 only when the
   subscription is new, 2 never; shared subscriptions never get them (§4.8.2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ingest.mqtt.errors import MalformedPacket, ProtocolError
from ingest.mqtt.packets import Reason, Suback, Subscribe, Subscription
from ingest.mqtt.shared import SHARE_PREFIX, parse_shared
from ingest.mqtt.subscriptions import filter_error

if TYPE_CHECKING:
    from ingest.mqtt.hub import Hub
    from ingest.mqtt.session_state import SessionState

__all__ = ["apply_subscribe"]

_MAX_SUBSCRIPTION_ID = 268_435_455


def apply_subscribe(hub: Hub, session: SessionState, packet: Subscribe, v5: bool,
                    may_subscribe: Callable[[str], bool] | None = None) -> tuple[Suback, list[Subscription], int]:
    """Subscribe ``session`` per the rules; returns the SUBACK, the subscriptions that get retained
    messages after it, and the subscription identifier (0: none). Raises ``ProtocolError`` (rules 1-3)."""
    ids = packet.properties.subscription_identifier
    if len(ids) > 1 or (ids and not 1 <= ids[0] <= _MAX_SUBSCRIPTION_ID):
        raise ProtocolError("bad subscription identifier", Reason.PROTOCOL_ERROR)
    sub_id = ids[0] if ids else 0
    for sub in packet.subscriptions:
        why = filter_error(sub.topic_filter)
        if why is not None:
            raise MalformedPacket(why)
    invalid = Reason.TOPIC_FILTER_INVALID if v5 else 0x80
    codes: list[int] = []
    retained: list[Subscription] = []
    for sub in packet.subscriptions:
        topic_filter = sub.topic_filter
        shared = topic_filter.startswith(SHARE_PREFIX)
        if shared:
            if parse_shared(topic_filter) is None:
                codes.append(invalid)
                continue
            if sub.no_local:
                raise ProtocolError("No Local on a shared subscription", Reason.PROTOCOL_ERROR)
        if may_subscribe is not None and not may_subscribe(topic_filter):
            codes.append(Reason.NOT_AUTHORIZED if v5 else 0x80)
            continue
        new = hub.subscribe(session, sub, sub_id)
        codes.append(sub.qos)
        if not shared and (sub.retain_handling == 0 or (sub.retain_handling == 1 and new)):
            retained.append(sub)
    return Suback(packet.packet_id, tuple(codes)), retained, sub_id
