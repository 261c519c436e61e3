"""A connection reads ahead of its dispatcher by a bounded number of bytes, whatever the request size limit.

With the bound at ``max_request_bytes`` (100 MiB by default) a pipelining producer had up to 64 requests
of 1 MB read and held per connection: more than the listener's ``FramePool`` keeps, so each further
request took fresh pages (page faults and unmapping were a third of the broker's CPU at 1 KiB records,
bench/RESULTS.md). A real socket, 24 requests of 1 MiB, nobody dispatching them.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from broker.server.kafka_connection import READ_AHEAD_BYTES, KafkaStreamProtocol

FRAME = 1 << 20
FRAMES = 24


class _WatchedProtocol(KafkaStreamProtocol):
    paused: asyncio.Event

    def _pause_reading(self) -> None:
        super()._pause_reading()
        self.paused.set()


async def test_reading_pauses_after_the_read_ahead_bound_and_every_frame_still_arrives() -> None:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Queue[tuple[KafkaStreamProtocol, asyncio.StreamWriter]] = asyncio.Queue()

    async def on_client(stream: KafkaStreamProtocol, writer: asyncio.StreamWriter) -> None:
        await accepted.put((stream, writer))  # held: a StreamWriter closes its transport when collected

    def protocol() -> KafkaStreamProtocol:
        made = _WatchedProtocol(on_client, 100 * 1024 * 1024, loop)
        made.paused = asyncio.Event()
        return made

    server = await loop.create_server(protocol, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    payload = b"".join(struct.pack(">i", FRAME) + bytes([i]) * FRAME for i in range(FRAMES))
    sending = asyncio.create_task(asyncio.to_thread(client.sendall, payload))
    try:
        stream, _writer = await asyncio.wait_for(accepted.get(), 10)
        assert isinstance(stream, _WatchedProtocol)
        await asyncio.wait_for(stream.paused.wait(), 10)
        held = await stream.read_frames()
        assert sum(map(len, held)) <= READ_AHEAD_BYTES + FRAME
        while len(held) < FRAMES:
            held += await stream.read_frames()
        assert [bytes(frame[:1]) for frame in held] == [bytes([i]) for i in range(FRAMES)]
        await sending
    finally:
        client.close()
        server.close()
