"""``MqttDevice``: a sensor that publishes readings to Sluice's MQTT listener (or any MQTT broker).

Built on aiomqtt, with the behaviour of ``TcpDevice``: a bounded local buffer while disconnected,
reconnect with backoff, and an ack mode — QoS 1, where Sluice sends PUBACK only after the durable
append, so a reading leaves the buffer only once it is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

import aiomqtt

from clients.devices.base import BufferedDevice, Overflow

__all__ = ["MqttDevice"]


class MqttDevice(BufferedDevice):
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 1883,
        *,
        topic: str,
        client_id: str | None = None,
        ack: bool = True,
        keepalive: int = 30,
        timeout: float = 10.0,
        username: str | None = None,
        password: str | None = None,
        buffer_size: int = 10_000,
        overflow: Overflow = "block",
        max_batch: int = 100,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        name: str | None = None,
        tls_context: ssl.SSLContext | None = None,  # MQTT over TLS (Sluice's mqtt.tls_port, 8883)
    ) -> None:
        super().__init__(
            buffer_size=buffer_size,
            overflow=overflow,
            max_batch=max_batch,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            name=name or client_id or f"mqtt:{topic}",
        )
        self.host = host
        self.port = port
        self.topic = topic
        self.client_id = client_id
        self.qos = 1 if ack else 0
        self.keepalive = keepalive
        self.timeout = timeout
        self.username = username
        self.password = password
        self.tls_context = tls_context
        self._client: aiomqtt.Client | None = None
        self._link_errors = (*BufferedDevice._link_errors, aiomqtt.MqttError, TimeoutError)

    async def _open(self) -> None:
        client = aiomqtt.Client(
            self.host,
            self.port,
            identifier=self.client_id,
            keepalive=self.keepalive,
            timeout=self.timeout,
            username=self.username,
            password=self.password,
            tls_context=self.tls_context,
        )
        await client.__aenter__()
        self._client = client

    async def _deliver(self, items: list[bytes]) -> None:
        client = self._client
        if client is None:
            raise ConnectionError("not connected")
        # aiomqtt does not fail a pending QoS 1 publish when the link drops (it waits for its timeout);
        # race each publish against the client's disconnection future so a dead link is noticed at once.
        disconnected: asyncio.Future[None] | None = getattr(client, "_disconnected", None)
        for item in items:
            publish = asyncio.ensure_future(client.publish(self.topic, item, qos=self.qos, timeout=self.timeout))
            if disconnected is None:
                await publish
                continue
            try:
                await asyncio.wait([publish, disconnected], return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # the device is stopping: the publish goes with it, not on alone
                publish.cancel()
                raise
            if not publish.done():
                publish.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                    await publish
                exc = disconnected.exception() if not disconnected.cancelled() else None
                raise aiomqtt.MqttError(f"connection lost: {exc}")
            publish.result()

    async def _drop_connection(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.__aexit__(None, None, None)

    async def send_reading(self, **fields: Any) -> None:
        await self.send(fields)
