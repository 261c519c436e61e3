"""The WebSocket layer byte by byte (``ingest.mqtt.websocket``): the handshake and client frames fed one byte
at a time reach the MQTT side as the same byte stream; frame boundaries mean nothing; writes become binary
frames. Real clients (paho over ws/wss) are in test_mqtt_tls_ws.py."""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.frames import Frame, Opcode

from ingest.mqtt.websocket import MqttOverWebSocket, WebSocketStats

UPGRADE = (b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
           b"Sec-WebSocket-Protocol: mqtt\r\n\r\n")
CONNECT = b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"


class Socket(asyncio.Transport):
    """The socket side: records what the layer writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default


class Stream:
    """The MQTT side: what it is given."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.received = bytearray()
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...


async def test_handshake_and_frames_fed_one_byte_at_a_time() -> None:
    stream, sock = Stream(), Socket()
    layer = MqttOverWebSocket(stream, stats=WebSocketStats(), max_frame_bytes=1 << 20, handshake_timeout_s=10)
    layer.connection_made(sock)
    # the CONNECT split across two frames, a PING between them, then a frame with two packets' worth
    frames = (Frame(Opcode.BINARY, CONNECT[:5], fin=False).serialize(mask=True, extensions=[])
              + Frame(Opcode.PING, b"hi").serialize(mask=True, extensions=[])
              + Frame(Opcode.CONT, CONNECT[5:]).serialize(mask=True, extensions=[])
              + Frame(Opcode.BINARY, b"\xc0\x00\xc0\x00").serialize(mask=True, extensions=[]))
    for byte in UPGRADE + frames:
        layer.data_received(bytes([byte]))
    assert sock.written.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert b"\r\nSec-WebSocket-Protocol: mqtt\r\n" in sock.written
    assert stream.received == CONNECT + b"\xc0\x00\xc0\x00"
    assert layer.stats.handshakes == 1
    head = bytes(sock.written[sock.written.index(b"\r\n\r\n") + 4:])
    assert head == b"\x8a\x02hi"  # the pong, unmasked from the server
    sock.written.clear()
    assert stream.transport is not None
    stream.transport.write(b"\x20\x02\x00\x00")  # CONNACK: one binary frame
    assert bytes(sock.written) == b"\x82\x04\x20\x02\x00\x00"
    sock.written.clear()
    stream.transport.close()  # the MQTT side closes: a close frame (1000), then the socket
    assert bytes(sock.written) == b"\x88\x02\x03\xe8" and sock.closed


async def test_text_frame_fails_the_connection_with_1003() -> None:
    stream, sock = Stream(), Socket()
    layer = MqttOverWebSocket(stream, stats=WebSocketStats(), max_frame_bytes=1 << 20, handshake_timeout_s=10)
    layer.connection_made(sock)
    layer.data_received(UPGRADE)
    sock.written.clear()
    layer.data_received(Frame(Opcode.TEXT, b"CONNECT").serialize(mask=True, extensions=[]))
    assert bytes(sock.written[:4]) == b"\x88\x1f\x03\xeb"  # close frame, code 1003, then the reason
    assert sock.closed and stream.received == b"" and layer.stats.text_frames == 1
