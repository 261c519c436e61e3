"""MQTT 3.1.1 and 5.0 control packets as frozen, slotted dataclasses.

One class per control packet type (MQTT 5.0 §2.1.2). Fields that exist only in MQTT 5 (reason codes on
acknowledgements, properties) have defaults that encode to nothing under 3.1.1, so one class serves
both versions; the codec takes the version when encoding. ``Properties`` holds every MQTT 5 property
(§2.2.2.2) as an optional field; ``PROPERTY_SPECS`` gives each one's identifier and wire type, and
``ALLOWED_PROPERTIES`` which packets may carry it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from ingest.fastinit import fast_frozen_init

__all__ = [
    "ALLOWED_PROPERTIES",
    "MQTT_311",
    "MQTT_5",
    "NO_PROPERTIES",
    "PROPERTY_SPECS",
    "REPEATABLE",
    "Auth",
    "Connack",
    "Connect",
    "Disconnect",
    "Packet",
    "PacketType",
    "Pingreq",
    "Pingresp",
    "Properties",
    "PropType",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "Reason",
    "Suback",
    "Subscribe",
    "Subscription",
    "Unsuback",
    "Unsubscribe",
    "Will",
]

MQTT_311: Final = 4
MQTT_5: Final = 5


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class Reason(IntEnum):
    """MQTT 5.0 reason codes (§2.4) used by this package; 3.1.1 CONNACK codes are mapped by the session."""

    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_ID_NOT_VALID = 0x85
    BAD_USERNAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_ID_IN_USE = 0x91
    PACKET_ID_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    QUOTA_EXCEEDED = 0x97
    PAYLOAD_FORMAT_INVALID = 0x99
    QOS_NOT_SUPPORTED = 0x9B
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    SUBSCRIPTION_IDS_NOT_SUPPORTED = 0xA1


class PropType(IntEnum):
    BYTE = 1
    TWO = 2
    FOUR = 4
    VARINT = 5
    UTF8 = 6
    BINARY = 7
    PAIR = 8


@dataclass(frozen=True, slots=True)
class Properties:
    """MQTT 5 properties; ``None`` (or an empty tuple) means absent."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifier: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_property: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None


NO_PROPERTIES: Final = Properties()

# identifier -> (field name, wire type); MQTT 5.0 §2.2.2.2 table 2-4.
PROPERTY_SPECS: Final[dict[int, tuple[str, PropType]]] = {
    0x01: ("payload_format_indicator", PropType.BYTE),
    0x02: ("message_expiry_interval", PropType.FOUR),
    0x03: ("content_type", PropType.UTF8),
    0x08: ("response_topic", PropType.UTF8),
    0x09: ("correlation_data", PropType.BINARY),
    0x0B: ("subscription_identifier", PropType.VARINT),
    0x11: ("session_expiry_interval", PropType.FOUR),
    0x12: ("assigned_client_identifier", PropType.UTF8),
    0x13: ("server_keep_alive", PropType.TWO),
    0x15: ("authentication_method", PropType.UTF8),
    0x16: ("authentication_data", PropType.BINARY),
    0x17: ("request_problem_information", PropType.BYTE),
    0x18: ("will_delay_interval", PropType.FOUR),
    0x19: ("request_response_information", PropType.BYTE),
    0x1A: ("response_information", PropType.UTF8),
    0x1C: ("server_reference", PropType.UTF8),
    0x1F: ("reason_string", PropType.UTF8),
    0x21: ("receive_maximum", PropType.TWO),
    0x22: ("topic_alias_maximum", PropType.TWO),
    0x23: ("topic_alias", PropType.TWO),
    0x24: ("maximum_qos", PropType.BYTE),
    0x25: ("retain_available", PropType.BYTE),
    0x26: ("user_property", PropType.PAIR),
    0x27: ("maximum_packet_size", PropType.FOUR),
    0x28: ("wildcard_subscription_available", PropType.BYTE),
    0x29: ("subscription_identifier_available", PropType.BYTE),
    0x2A: ("shared_subscription_available", PropType.BYTE),
}

# Properties that may repeat in one packet (everything else twice is a protocol error).
REPEATABLE: Final = frozenset({0x26, 0x0B})

_WILL: Final = "will"  # key for the will properties inside CONNECT's payload
_PUBLISH_PROPS = frozenset({0x01, 0x02, 0x03, 0x08, 0x09, 0x0B, 0x23, 0x26})
_ACK_PROPS = frozenset({0x1F, 0x26})
ALLOWED_PROPERTIES: Final[dict[PacketType | str, frozenset[int]]] = {
    PacketType.CONNECT: frozenset({0x11, 0x15, 0x16, 0x17, 0x19, 0x21, 0x22, 0x26, 0x27}),
    _WILL: frozenset({0x01, 0x02, 0x03, 0x08, 0x09, 0x18, 0x26}),
    PacketType.CONNACK: frozenset(
        {0x11, 0x12, 0x13, 0x15, 0x16, 0x1A, 0x1C, 0x1F, 0x21, 0x22, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A}
    ),
    PacketType.PUBLISH: _PUBLISH_PROPS,
    PacketType.PUBACK: _ACK_PROPS,
    PacketType.PUBREC: _ACK_PROPS,
    PacketType.PUBREL: _ACK_PROPS,
    PacketType.PUBCOMP: _ACK_PROPS,
    PacketType.SUBSCRIBE: frozenset({0x0B, 0x26}),
    PacketType.SUBACK: _ACK_PROPS,
    PacketType.UNSUBSCRIBE: frozenset({0x26}),
    PacketType.UNSUBACK: _ACK_PROPS,
    PacketType.DISCONNECT: frozenset({0x11, 0x1C, 0x1F, 0x26}),
    PacketType.AUTH: frozenset({0x15, 0x16, 0x1F, 0x26}),
}


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    protocol_level: int = MQTT_311
    clean_start: bool = True  # "Clean Session" in 3.1.1
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES
    protocol_name: str = "MQTT"
    packet_type = PacketType.CONNECT


@dataclass(frozen=True, slots=True)
class Connack:
    session_present: bool = False
    reason_code: int = 0  # 3.1.1: the return code 0..5; 5.0: a reason code
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.CONNACK


@fast_frozen_init  # decoded once per message on the ingest hot path
@dataclass(frozen=True, slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.PUBLISH


@dataclass(frozen=True, slots=True)
class Puback:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.PUBACK


@dataclass(frozen=True, slots=True)
class Pubrec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.PUBREC


@dataclass(frozen=True, slots=True)
class Pubrel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.PUBREL


@dataclass(frozen=True, slots=True)
class Pubcomp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.PUBCOMP


@dataclass(frozen=True, slots=True)
class Subscription:
    topic_filter: str
    qos: int = 0
    no_local: bool = False  # MQTT 5 subscription options (§3.8.3.1); always False under 3.1.1
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.SUBSCRIBE


@dataclass(frozen=True, slots=True)
class Suback:
    packet_id: int
    reason_codes: tuple[int, ...]  # 3.1.1 return codes 0, 1, 2 or 0x80
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.SUBACK


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.UNSUBSCRIBE


@dataclass(frozen=True, slots=True)
class Unsuback:
    packet_id: int
    reason_codes: tuple[int, ...] = field(default=())  # MQTT 5 only; 3.1.1 UNSUBACK has no payload
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.UNSUBACK


@dataclass(frozen=True, slots=True)
class Pingreq:
    packet_type = PacketType.PINGREQ


@dataclass(frozen=True, slots=True)
class Pingresp:
    packet_type = PacketType.PINGRESP


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.DISCONNECT


@dataclass(frozen=True, slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    packet_type = PacketType.AUTH


Packet = (
    Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe | Suback | Unsubscribe
    | Unsuback | Pingreq | Pingresp | Disconnect | Auth
)
