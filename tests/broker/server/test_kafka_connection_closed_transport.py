"""An answer that becomes ready after the peer reset the connection is dropped quietly (uvloop).

Found by ``python -m bench.fuzz kafka --connections 4`` on main 7500c4a: a client that closed with unread
data (an RST) while its request was pending made the sender write to the closed transport; uvloop raises
``RuntimeError: unable to perform operation on <TCPTransport closed=True ...>`` (asyncio drops such
writes), and the connection logged it at ERROR with a traceback. The broker runs on uvloop by default, so
this test does too: a real socket reset by its client, then an answer for it on the sender's queue.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import pytest
import uvloop

from broker.protocol.kafka import RequestHeader
from broker.server.handlers_common import ConnectionInfo
from broker.server.kafka_connection import Frame, KafkaConnection, KafkaStreamProtocol, Response
from broker.server.stats import KafkaStats


async def _scenario(caplog: pytest.LogCaptureFixture) -> None:
    """The sender's side of the race, made deterministic: the transport is already closed (as uvloop closes
    it on an RST) when an answer comes off the queue."""
    accepted: asyncio.Queue[tuple[KafkaStreamProtocol, asyncio.StreamWriter]] = asyncio.Queue()

    async def on_client(stream: KafkaStreamProtocol, writer: asyncio.StreamWriter) -> None:
        await accepted.put((stream, writer))

    async def dispatch(frame: Frame, conn: ConnectionInfo) -> Response:
        raise AssertionError("not used")

    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: KafkaStreamProtocol(on_client, 1 << 20, loop), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    stream, writer = await asyncio.wait_for(accepted.get(), 5)
    connection = KafkaConnection(stream, writer, ConnectionInfo("127.0.0.1", 0), dispatch=dispatch,
                                 stats=KafkaStats(), max_idle_ms=0)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # linger 0: an RST
    while not writer.transport.is_closing():
        await asyncio.sleep(0.01)
    sending = asyncio.create_task(connection._send_loop())
    answer = {"error_code": 0, "api_keys": [], "throttle_time": 0}
    await connection._responses.put((RequestHeader(18, 0, 1, "t"), answer))
    connection._in_flight = 1
    done, _ = await asyncio.wait({sending}, timeout=1)
    if sending in done and sending.exception() is not None:
        raise sending.exception()  # type: ignore[misc]
    sending.cancel()
    server.close()
    await server.wait_closed()


def test_an_answer_ready_after_the_peer_reset_is_dropped_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = uvloop.new_event_loop()
    try:
        with caplog.at_level(logging.DEBUG, logger="broker.server.kafka"):
            loop.run_until_complete(_scenario(caplog))
    finally:
        loop.close()
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]
