"""Device helpers: sensors that send readings to Sluice's TCP and MQTT front doors."""

from typing import TYPE_CHECKING

from clients.devices.base import BufferedDevice, DeviceStats, Overflow, encode_payload
from clients.devices.tcp import AckProtocolError, TcpDevice, parse_answer

if TYPE_CHECKING:  # imported lazily at run time (below); type checkers see the real class
    from clients.devices.mqtt import MqttDevice

__all__ = [
    "AckProtocolError",
    "BufferedDevice",
    "DeviceStats",
    "MqttDevice",
    "Overflow",
    "TcpDevice",
    "encode_payload",
    "parse_answer",
]


def __getattr__(name: str) -> object:  # MqttDevice needs aiomqtt; TcpDevice needs nothing
    if name == "MqttDevice":
        from clients.devices.mqtt import MqttDevice

        return MqttDevice
    raise AttributeError(name)
