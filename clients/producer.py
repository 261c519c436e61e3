"""``AsyncProducer``: send records to Sluice (or any Kafka cluster) over the Kafka protocol, on aiokafka."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from aiokafka import AIOKafkaProducer

from clients._kafka import DEFAULT_BOOTSTRAP, translate_errors
from clients.errors import ClientClosedError
from clients.records import RecordMetadata
from clients.security import ClientSecurity
from clients.serializers import SerializerSpec, resolve_serializer

__all__ = ["AsyncProducer", "Headers"]

Headers = Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]]


def _headers(headers: Headers | None) -> list[tuple[str, bytes]] | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in items]


class AsyncProducer:
    """Batched, acknowledged sends. ``send`` waits for the broker's ack; ``send_nowait`` returns a future.

    Records are batched per partition for up to ``linger_ms`` (or ``max_batch_bytes``); keyed records go to
    the partition the key hashes to (murmur2, as every Kafka client does), keyless ones are spread.
    """

    def __init__(
        self,
        bootstrap: str = DEFAULT_BOOTSTRAP,
        *,
        value_serializer: SerializerSpec = "json",
        key_serializer: SerializerSpec = "string",
        acks: Literal[0, 1, "all"] = "all",
        linger_ms: int = 5,
        max_batch_bytes: int = 256 * 1024,
        compression: Literal["gzip", "snappy", "lz4", "zstd"] | None = None,
        idempotent: bool = False,
        client_id: str = "sluice-python",
        request_timeout_ms: int = 30_000,
        security: ClientSecurity | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.value_serializer = resolve_serializer(value_serializer)
        self.key_serializer = resolve_serializer(key_serializer)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks=acks,
            linger_ms=linger_ms,
            max_batch_size=max_batch_bytes,
            compression_type=compression,
            enable_idempotence=idempotent,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            **(security or ClientSecurity.from_env()).kafka_options(),
        )
        self._started = False
        self._closed = False

    async def start(self) -> None:
        if self._closed:
            raise ClientClosedError("producer is closed")
        with translate_errors(self.bootstrap):
            try:
                await self._producer.start()
            except BaseException:
                await self._producer.stop()
                raise
        self._started = True

    async def stop(self) -> None:
        if self._started and not self._closed:
            self._closed = True
            await self._producer.stop()
        self._closed = True

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def send_nowait(
        self,
        topic: str,
        value: Any = None,
        *,
        key: Any = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a record; the returned future resolves once the broker acknowledged it."""
        if self._closed or not self._started:
            raise ClientClosedError("producer is not started (use `async with AsyncProducer(...)`)")
        with translate_errors(self.bootstrap, topic):
            inner = await self._producer.send(
                topic,
                self.value_serializer.serialize(value),
                key=self.key_serializer.serialize(key),
                partition=partition,
                timestamp_ms=timestamp_ms,
                headers=_headers(headers),
            )
        loop = asyncio.get_running_loop()
        outer: asyncio.Future[RecordMetadata] = loop.create_future()

        def done(fut: asyncio.Future[Any]) -> None:
            if outer.done():
                return
            if fut.cancelled():
                outer.cancel()
                return
            exc = fut.exception()
            if exc is not None:
                try:
                    with translate_errors(self.bootstrap, topic):
                        raise exc
                except Exception as translated:
                    outer.set_exception(translated)
                return
            md = fut.result()
            outer.set_result(RecordMetadata(md.topic, md.partition, md.offset, md.timestamp))

        inner.add_done_callback(done)
        return outer

    async def send(
        self,
        topic: str,
        value: Any = None,
        *,
        key: Any = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        """Send one record and wait for the broker's acknowledgement."""
        fut = await self.send_nowait(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        return await fut

    async def send_many(self, topic: str, values: Iterable[Any], *, key: Any = None) -> list[RecordMetadata]:
        """Send several records (batched together) and wait for all acknowledgements."""
        futures = [await self.send_nowait(topic, v, key=key) for v in values]
        return list(await asyncio.gather(*futures))

    async def flush(self) -> None:
        with translate_errors(self.bootstrap):
            await self._producer.flush()
