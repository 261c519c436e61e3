"""A TCP proxy between Kafka clients and a broker that can lose one Produce answer (tests only).

The broker advertises the proxy's port (``SLUICE_KAFKA__ADVERTISED_PORT``), so a client reaches it only
through here. ``withhold_produce_answers(n)`` keeps the next ``n`` Produce responses from their clients
and freezes each such connection: the broker has appended the batch, the client
has no answer — the window a ``kill -9`` of the broker hits in production. A connection ends when either
side closes (a dead broker closes its side), and the client then retries on a new connection. The
broker's port is asked for at each new connection, so a restarted broker may listen elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import Callable

__all__ = ["AckProxy"]

PRODUCE = 0


class AckProxy:
    def __init__(self, broker_port: Callable[[], int]) -> None:
        self._broker_port = broker_port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._to_withhold = 0
        self._withheld = 0
        self._links: set[asyncio.StreamWriter] = set()
        self.answers_withheld = threading.Event()  # set once the Produce answers asked for were kept
        self.port = 0

    def start(self) -> None:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._links):
                writer.close()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def withhold_produce_answers(self, count: int) -> None:
        self._to_withhold, self._withheld = count, 0
        self.answers_withheld.clear()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            broker_reader, broker_writer = await asyncio.open_connection("127.0.0.1", self._broker_port())
        except OSError:
            client_writer.close()  # the broker is down: the client retries later
            return
        self._links |= {client_writer, broker_writer}
        produce_ids: set[int] = set()  # correlation ids of the Produce requests on this connection
        frozen = asyncio.Event()

        async def requests() -> None:
            while not frozen.is_set():
                size, = struct.unpack(">i", await client_reader.readexactly(4))
                frame = await client_reader.readexactly(size)
                if frozen.is_set():
                    return
                api_key, _version, correlation_id = struct.unpack(">hhi", frame[:8])
                if api_key == PRODUCE:
                    produce_ids.add(correlation_id)
                broker_writer.write(struct.pack(">i", size) + frame)

        async def responses() -> None:
            while True:
                size, = struct.unpack(">i", await broker_reader.readexactly(4))
                frame = await broker_reader.readexactly(size)
                correlation_id, = struct.unpack(">i", frame[:4])
                if self._withheld < self._to_withhold and correlation_id in produce_ids:
                    self._withheld += 1
                    frozen.set()  # nothing more either way until the broker's side closes
                    if self._withheld == self._to_withhold:
                        self.answers_withheld.set()
                    await broker_reader.read()  # until EOF: the broker died
                    return
                if not frozen.is_set():
                    client_writer.write(struct.pack(">i", size) + frame)

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(responses())]
        with contextlib.suppress(asyncio.IncompleteReadError, OSError):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, asyncio.IncompleteReadError, OSError):
                await task
        for writer in (client_writer, broker_writer):
            self._links.discard(writer)
            writer.close()
