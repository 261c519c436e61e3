"""A TCP to MQTT-over-WebSocket bridge, so a suite whose clients speak plain TCP can test a WebSocket door.

    python -m bench.client_suites.ws_bridge LISTEN_PORT ws://127.0.0.1:8083/mqtt

Each accepted TCP connection gets its own WebSocket (subprotocol ``mqtt``, as paho and MQTT.js ask for);
bytes go over unchanged as binary frames (MQTT 5.0 §6: frame boundaries mean nothing). When either side
closes, the other is closed too: a client's shutdown becomes a WebSocket close without an MQTT DISCONNECT,
so the broker sees the connection lost (its will is due), as with a TCP client that shuts its socket.
Prints ``listening`` once the port is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

__all__ = ["bridge", "main"]


async def bridge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, uri: str) -> None:
    try:
        async with connect(uri, subprotocols=[Subprotocol("mqtt")], compression=None, max_size=None) as ws:

            async def tcp_to_ws() -> None:
                while data := await reader.read(65536):
                    await ws.send(data)
                await ws.close()

            async def ws_to_tcp() -> None:
                with contextlib.suppress(ConnectionClosed):
                    async for message in ws:
                        writer.write(message if isinstance(message, bytes) else message.encode())
                        await writer.drain()

            tasks = [asyncio.create_task(tcp_to_ws()), asyncio.create_task(ws_to_tcp())]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    except (OSError, ConnectionClosed):
        pass
    finally:
        writer.close()


async def serve(port: int, uri: str) -> None:
    server = await asyncio.start_server(lambda r, w: bridge(r, w, uri), "127.0.0.1", port)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    asyncio.run(serve(int(sys.argv[1]), sys.argv[2]))


if __name__ == "__main__":
    main()
