"""Device front doors: MQTT, the MQTT bridge, TCP line protocols, files, routing and health."""

__all__: list[str] = []
