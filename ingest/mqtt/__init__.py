"""MQTT 3.1.1 / 5.0 front door: sans-IO codec, per-connection session state machine, asyncio listener."""

__all__: list[str] = []
