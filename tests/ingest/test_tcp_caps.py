"""Connection storms: the TCP line listeners share one cap on open connections (in total and per client
address); connections beyond it are closed at accept (ack mode first gets a FATAL line), counted, and
logged without flooding. (MQTT: tests/ingest/mqtt/test_connection_caps.py.)"""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker.log.memory import MemoryLogStore
from ingest.admission import Admission, ConnectionLimits
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import RouteDefaults
from ingest.sink import IngestSink
from ingest.tcp.listener import TcpLineListener, TcpListenerConfig
from tests.ingest.conftest import records
from tests.ingest.mqtt.conftest import wait_until


async def open_from(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def test_tcp_caps_are_shared_by_the_listeners(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryLogStore()
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    admission = Admission("TCP", ConnectionLimits(max_connections=3, max_connections_per_address=2))
    plain = TcpLineListener(TcpListenerConfig(name="plain", port=0), sink, sink.health, admission=admission)
    acked = TcpLineListener(TcpListenerConfig(name="acked", port=0, ack=True), sink, sink.health, admission=admission)
    await plain.start()
    await acked.start()
    try:
        conns = [await open_from(plain.port, "127.0.0.1"), await open_from(acked.port, "127.0.0.1")]
        await wait_until(lambda: admission.open == 2, what="two connections")
        with caplog.at_level(logging.WARNING):
            reader, writer = await open_from(acked.port, "127.0.0.1")  # per address, across both listeners
            assert await asyncio.wait_for(reader.read(), 10) == b"FATAL too many connections " \
                b"(max_connections_per_address reached)\n"
            writer.close()
            conns.append(await open_from(plain.port, "127.0.0.2"))
            await wait_until(lambda: admission.open == 3, what="three connections")
            reader, writer = await open_from(plain.port, "127.0.0.3")  # the total; plain mode: just closed
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
        assert admission.refused == {"max_connections_per_address": 1, "max_connections": 1}
        assert len([r for r in caplog.records if "refused TCP connection" in r.getMessage()]) == 2
        # the admitted ones work
        _, writer = conns[0]
        writer.write(b'{"device_id": "ok"}\n')
        await writer.drain()
        await wait_until(lambda: len(records(store, "tcp")) == 1, what="a line from an admitted connection")
        for _, writer in conns:
            writer.close()
        await wait_until(lambda: admission.open == 0, what="slots released")
    finally:
        await plain.stop()
        await acked.stop()
