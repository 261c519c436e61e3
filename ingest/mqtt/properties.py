"""MQTT 5 message properties: which travel with a message, how they are kept as record headers, expiry.

Rules
-----
1. Forwarded (MQTT 5.0 §3.3.2.3): Payload Format Indicator, Message Expiry Interval, Content Type,
   Response Topic, Correlation Data and User Properties (in order, repeats kept) go to every subscriber,
   for live, queued, retained and will messages. Topic Alias and Subscription Identifier belong to one
   connection and are never forwarded; a will's Will Delay Interval is not a PUBLISH property.
2. Record headers (what a Kafka consumer of the log sees), after Sluice's own ``source``, ``device`` and
   ``mqtt_topic``:
   ``mqtt.payload_format_indicator`` (``0``/``1``), ``mqtt.message_expiry_interval`` (decimal seconds, as
   published), ``mqtt.content_type``, ``mqtt.response_topic`` (UTF-8), ``mqtt.correlation_data`` (the raw
   bytes), then each User Property as its own header ``key = value`` (UTF-8). A user property whose key
   is one of Sluice's header names (``source``, ``device``, ``mqtt_topic``, ``reason``, or starting with
   ``mqtt.``) is stored as ``mqtt.user.<key>`` so it can be told apart and restored.
3. Headers back to properties (``from_headers``, for records produced over Kafka): the reverse of rule 2;
   every other header whose name and value are UTF-8 becomes a User Property (a header without a value:
   an empty one); a header that cannot be one (not UTF-8, or too long for an MQTT string) is skipped and
   counted by the caller.
4. Expiry (§3.3.2.3.3): a message with an interval expires that many seconds after the server received
   it; an expired message is dropped from offline queues and the retained store (never sent), and a
   message sent later carries the remaining seconds, rounded (at least 1). A message sent the moment it
   arrives carries the interval unchanged; one already in flight is not expired (it was delivered).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from broker.protocol.records import Headers
from ingest.mqtt.packets import NO_PROPERTIES, Properties, Publish

__all__ = [
    "HEADER_CONTENT_TYPE",
    "HEADER_CORRELATION_DATA",
    "HEADER_EXPIRY",
    "HEADER_PAYLOAD_FORMAT",
    "HEADER_RESPONSE_TOPIC",
    "USER_PREFIX",
    "expires_at",
    "for_delivery",
    "forwarded",
    "from_headers",
    "to_headers",
]

HEADER_PAYLOAD_FORMAT: Final = "mqtt.payload_format_indicator"
HEADER_EXPIRY: Final = "mqtt.message_expiry_interval"
HEADER_CONTENT_TYPE: Final = "mqtt.content_type"
HEADER_RESPONSE_TOPIC: Final = "mqtt.response_topic"
HEADER_CORRELATION_DATA: Final = "mqtt.correlation_data"
USER_PREFIX: Final = "mqtt.user."
_SLUICE_HEADERS: Final = frozenset({"source", "device", "mqtt_topic", "reason"})
_MAX_FIELD: Final = 65_535  # bytes in an MQTT string or binary field


def forwarded(props: Properties) -> Properties:
    """The properties of a received PUBLISH (or will) that go on to subscribers (rule 1)."""
    if props is NO_PROPERTIES:
        return props
    if (props.topic_alias is None and not props.subscription_identifier and props.will_delay_interval is None):
        return props
    kept = Properties(
        payload_format_indicator=props.payload_format_indicator,
        message_expiry_interval=props.message_expiry_interval,
        content_type=props.content_type,
        response_topic=props.response_topic,
        correlation_data=props.correlation_data,
        user_property=props.user_property,
    )
    return NO_PROPERTIES if kept == NO_PROPERTIES else kept


def expires_at(props: Properties, received: float) -> float | None:
    """When (on the clock of ``received``) a message with these properties expires; None: never."""
    interval = props.message_expiry_interval
    return None if interval is None else received + interval


def for_delivery(packet: Publish, expiry: float | None, now: float) -> Publish | None:
    """``packet`` as it is sent at ``now``: None when it has expired, else with the remaining interval."""
    if expiry is None:
        return packet
    remaining = expiry - now
    if remaining <= 0:
        return None
    seconds = max(1, round(remaining))
    if seconds == packet.properties.message_expiry_interval:
        return packet
    return replace(packet, properties=replace(packet.properties, message_expiry_interval=seconds))


def to_headers(props: Properties) -> Headers:
    """Record headers for a message's forwarded properties (rule 2); () when it has none."""
    if props is NO_PROPERTIES:
        return ()
    out: list[tuple[str, bytes | None]] = []
    if props.payload_format_indicator is not None:
        out.append((HEADER_PAYLOAD_FORMAT, str(props.payload_format_indicator).encode()))
    if props.message_expiry_interval is not None:
        out.append((HEADER_EXPIRY, str(props.message_expiry_interval).encode()))
    if props.content_type is not None:
        out.append((HEADER_CONTENT_TYPE, props.content_type.encode()))
    if props.response_topic is not None:
        out.append((HEADER_RESPONSE_TOPIC, props.response_topic.encode()))
    if props.correlation_data is not None:
        out.append((HEADER_CORRELATION_DATA, props.correlation_data))
    for key, value in props.user_property:
        name = USER_PREFIX + key if key in _SLUICE_HEADERS or key.startswith("mqtt.") else key
        out.append((name, value.encode()))
    return tuple(out)


def from_headers(headers: Headers) -> tuple[Properties, int]:
    """Properties from a record's headers (rule 3) and how many headers could not become one."""
    values: dict[str, object] = {}
    users: list[tuple[str, str]] = []
    skipped = 0
    for name, raw in headers:
        if name in _SLUICE_HEADERS:
            continue
        if len(name.encode()) > _MAX_FIELD or (raw is not None and len(raw) > _MAX_FIELD):  # too long for MQTT
            skipped += 1
            continue
        if name == HEADER_CORRELATION_DATA:
            values["correlation_data"] = raw or b""
            continue
        try:
            text = (raw or b"").decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        if "\x00" in text or "\x00" in name:
            skipped += 1
        elif name == HEADER_PAYLOAD_FORMAT and text in ("0", "1"):
            values["payload_format_indicator"] = int(text)
        elif name == HEADER_EXPIRY and text.isascii() and text.isdigit() and int(text) <= 0xFFFFFFFF:
            # isascii: "²" is a digit to isdigit, not to int()
            values["message_expiry_interval"] = int(text)
        elif name == HEADER_CONTENT_TYPE:
            values["content_type"] = text
        elif name == HEADER_RESPONSE_TOPIC and text and "+" not in text and "#" not in text:
            values["response_topic"] = text
        elif name.startswith(USER_PREFIX):
            users.append((name[len(USER_PREFIX):], text))
        elif name.startswith("mqtt."):
            skipped += 1  # one of ours with a value that is not valid for it
        else:
            users.append((name, text))
    if users:
        values["user_property"] = tuple(users)
    if not values:
        return NO_PROPERTIES, skipped
    return Properties(**values), skipped  # type: ignore[arg-type]
