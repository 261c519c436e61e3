"""Subscribe to an external MQTT broker and move its messages into the log, acked only once durable."""

from ingest.bridge.bridge import BridgeConfig, BridgeStatus, MqttBridge

__all__ = ["BridgeConfig", "BridgeStatus", "MqttBridge"]
