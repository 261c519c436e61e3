"""Errors raised by the MQTT front door (codec, session, listener).

One root, so callers can catch everything this package raises::

    MqttError
    ├── ProtocolError               the peer broke MQTT; carries the MQTT 5 reason code to answer with
    │   ├── MalformedPacket         bytes that cannot be a packet (0x81)
    │   ├── PacketTooLarge          above the negotiated maximum packet size (0x95)
    │   └── UnsupportedProtocol     CONNECT with a protocol name/level we do not speak (0x84 / 3.1.1 0x01)
    └── EncodeError                 we tried to encode a packet that breaks the spec (our bug)
"""

from __future__ import annotations

__all__ = ["EncodeError", "MalformedPacket", "MqttError", "PacketTooLarge", "ProtocolError", "UnsupportedProtocol"]


class MqttError(Exception):
    """Root of every error the MQTT package raises."""


class ProtocolError(MqttError):
    """The peer sent something MQTT forbids. ``reason_code`` is the MQTT 5 code to send back."""

    reason_code: int = 0x82

    def __init__(self, message: str, reason_code: int | None = None) -> None:
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code


class MalformedPacket(ProtocolError):
    reason_code = 0x81


class PacketTooLarge(ProtocolError):
    reason_code = 0x95


class UnsupportedProtocol(ProtocolError):
    """CONNECT named a protocol level we do not accept; ``level`` says which format to answer in."""

    reason_code = 0x84

    def __init__(self, message: str, level: int) -> None:
        super().__init__(message)
        self.level = level


class EncodeError(MqttError):
    """A packet we built cannot be encoded (field out of range, property not allowed)."""
