"""A size prefix costs the broker memory only for the bytes that actually came.

Found by ``python -m bench.fuzz kafka-tls`` on main 76ff192 (broker RSS 240 -> 740 MiB within 20,000
inputs): since the listener reads large requests into buffers of their own (FrameAssembler, a99c052), a
buffer of the announced size was allocated and zero-filled as soon as the 4-byte size prefix was read. Eight
connections that each sent a prefix of 95 MiB and four bytes, and nothing more, took 760 MiB of the broker's
memory (before any login); a few hundred such connections (``kafka.max_connections`` is 1000) take the
broker down. Kafka allocates on the prefix too, but on a fixed heap; here the untouched part of a large
buffer must not be resident memory at all.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import uvloop

from broker.protocol.kafka import FramePool
from broker.server.kafka_connection import KafkaStreamProtocol

_ANNOUNCED = 95 * 1024 * 1024
_CLIENTS = 4


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def _scenario() -> float:
    streams: list[KafkaStreamProtocol] = []
    release = asyncio.get_running_loop().create_future()

    async def on_client(stream: KafkaStreamProtocol, writer: asyncio.StreamWriter) -> None:
        streams.append(stream)
        await release  # the connection stays open and never completes its request

    loop = asyncio.get_running_loop()
    pool = FramePool()
    server = await loop.create_server(lambda: KafkaStreamProtocol(on_client, 100 * 1024 * 1024, loop, pool),
                                      "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    before = _rss_mib()
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(_CLIENTS)]
    try:
        for client in clients:
            client.sendall(struct.pack(">i", _ANNOUNCED) + b"\x00\x00\x00\x12")  # a Produce header's start
        async with asyncio.timeout(10):  # every connection has read its prefix and the four bytes
            while len(streams) < _CLIENTS or any(s.pending_bytes < 4 for s in streams):
                await asyncio.sleep(0.01)
        return _rss_mib() - before
    finally:
        release.set_result(None)
        for client in clients:
            client.close()
        server.close()
        await server.wait_closed()


def test_connections_announcing_huge_requests_cost_no_memory_they_did_not_send() -> None:
    growth = uvloop.run(_scenario())
    # before the fix: +380 MiB (the four announced buffers, zero-filled); after: the few pages written
    assert growth < 48, f"RSS grew by {growth:.0f} MiB for {_CLIENTS} connections that sent 8 bytes each"
