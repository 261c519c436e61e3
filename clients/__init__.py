"""The Python client library: producer, consumer, admin and device helpers."""

__all__: list[str] = []
