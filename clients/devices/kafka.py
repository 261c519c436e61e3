"""``KafkaDevice``: a sensor that produces its readings to a Kafka topic (Sluice or any Kafka cluster).

The same buffered, reconnecting device as ``TcpDevice``/``MqttDevice``, but the link is a shared
``AsyncProducer``: many devices (one per sensor) share one producer and its batches. Each reading is
keyed by the device name, so a device's readings stay in order in one partition; a reading leaves the
device's buffer once the broker acknowledged it (acks=all).
"""

from __future__ import annotations

import asyncio

from clients.devices.base import BufferedDevice, Overflow
from clients.errors import ClientError
from clients.producer import AsyncProducer

__all__ = ["KafkaDevice"]


class KafkaDevice(BufferedDevice):
    def __init__(
        self,
        producer: AsyncProducer,
        topic: str,
        *,
        key: str | None = None,
        buffer_size: int = 10_000,
        overflow: Overflow = "block",
        max_batch: int = 500,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        name: str | None = None,
    ) -> None:
        """``producer`` must be started by the caller (it is shared, so devices never stop it)."""
        super().__init__(
            buffer_size=buffer_size,
            overflow=overflow,
            max_batch=max_batch,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            name=name or key or f"kafka:{topic}",
        )
        self.producer = producer
        self.topic = topic
        self.key = key if key is not None else self.name
        self._link_errors = (*BufferedDevice._link_errors, ClientError)

    async def _open(self) -> None:
        return None  # the shared producer connects (and reconnects) on its own

    async def _deliver(self, items: list[bytes]) -> None:
        futures = [await self.producer.send_nowait(self.topic, item, key=self.key) for item in items]
        await asyncio.gather(*futures)

    async def _drop_connection(self) -> None:
        return None
