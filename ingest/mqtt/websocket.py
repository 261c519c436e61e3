"""MQTT over WebSockets (MQTT 5.0 §6, 3.1.1 §6): the WebSocket framing between a socket and an MQTT connection.

``MqttOverWebSocket`` is the asyncio protocol of a ws/wss port. It runs the sans-IO WebSocket protocol of
the ``websockets`` library (handshake and frames; no I/O of its own) and, once the handshake is done, hands
the MQTT connection a ``WebSocketTransport``: the same small transport interface a TCP socket offers
(write, close, pause/resume reading, peer address and TLS object). So a WebSocket client is served by the
very protocol object and hub a TCP client is, and can take a session over from one (and back).

Rules:
- Handshake: any path (as Mosquitto; paho and MQTT.js ask for ``/mqtt``). The client must offer the
  ``mqtt`` subprotocol (``mqttv3.1`` too, which old clients send); a client offering only others gets HTTP
  400 and the close. A client offering none is accepted without one (as Mosquitto and EMQX's default).
  No extensions are negotiated (permessage-deflate is refused: no decompression bombs). A request that is
  not a WebSocket upgrade gets the library's 4xx answer; a handshake not done within the connect timeout
  closes the socket. Refusals are counted and logged at INFO, never with a traceback. Bytes that come after
  the request head in the same reads (a client sending frames before the answer) are held until the
  request is answered: frames of an accepted connection, dropped with a refused one. (The library would
  parse them as frames while still CONNECTING: a bad one failed the handshake before it was answered.)
- Data: binary frames (and their continuations) carry the MQTT byte stream; frame boundaries mean nothing
  (a packet may span frames, a frame may hold several packets). A text frame breaks the rule "MQTT
  Control Packets MUST be sent in WebSocket binary data frames": the connection is closed with close code
  1003, as the MQTT connection losing its socket (its will is due). A frame larger than
  ``max_frame_bytes`` is closed with 1009.
- Each write of the MQTT connection becomes one binary frame. Pings are answered by the library.
- Closing: the MQTT connection's ``close()`` sends a close frame (1000) and closes the socket; a close frame
  from the client is answered and the socket closed; either way the MQTT connection sees ``connection_lost``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from websockets.exceptions import NegotiationError
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

__all__ = ["SUBPROTOCOLS", "MqttOverWebSocket", "StreamProtocol", "WebSocketStats", "WebSocketTransport",
           "websocket_factory"]

log = logging.getLogger("ingest.mqtt.websocket")
# The library logs every opened and refused connection at INFO; ours says what matters, once.
_library_log = logging.getLogger("ingest.mqtt.websocket.frames")
_library_log.setLevel(logging.WARNING)

SUBPROTOCOLS: tuple[str, ...] = ("mqtt", "mqttv3.1")  # MQTT's registered name first; mqttv3.1: MQTT 3.1 clients


class StreamProtocol(Protocol):
    """What the WebSocket layer drives: an asyncio protocol over a byte stream (``MqttConnection``)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


@dataclass(slots=True)
class WebSocketStats:
    handshakes: int = 0  # WebSocket connections opened
    handshake_refusals: int = 0  # not a WebSocket upgrade, wrong subprotocol, too slow
    text_frames: int = 0  # connections closed for a text frame (MQTT is binary)
    protocol_errors: int = 0  # connections the WebSocket layer failed (bad framing, frame too large)


def _select_subprotocol(protocol: ServerProtocol, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    if not offered:
        return None
    for name in SUBPROTOCOLS:
        if name in offered:
            return Subprotocol(name)
    raise NegotiationError(f"MQTT over WebSocket needs the subprotocol mqtt; offered {', '.join(offered)}")


class WebSocketTransport(asyncio.Transport):
    """The transport the MQTT connection writes to: each write is one binary frame on the socket."""

    def __init__(self, outer: MqttOverWebSocket, raw: asyncio.Transport) -> None:
        super().__init__()
        self._outer = outer
        self._raw = raw
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        self._outer.send_binary(bytes(data))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._outer.close(CloseCode.NORMAL_CLOSURE)

    def abort(self) -> None:
        self._closing = True
        self._raw.abort()

    def is_closing(self) -> bool:
        return self._closing or self._raw.is_closing()

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()

    def is_reading(self) -> bool:
        return self._raw.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._raw.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "websocket_subprotocol":
            return self._outer.subprotocol
        return self._raw.get_extra_info(name, default)


class MqttOverWebSocket(asyncio.Protocol):
    """One ws/wss socket: the WebSocket handshake and frames around one MQTT connection (rules above)."""

    def __init__(self, mqtt: StreamProtocol, *, stats: WebSocketStats, max_frame_bytes: int,
                 handshake_timeout_s: float) -> None:
        self.mqtt = mqtt
        self.stats = stats
        self.subprotocol: str | None = None
        self._ws = ServerProtocol(subprotocols=[Subprotocol(name) for name in SUBPROTOCOLS],
                                  select_subprotocol=_select_subprotocol, max_size=max_frame_bytes,
                                  logger=_library_log)
        self._handshake_timeout_s = handshake_timeout_s
        self._raw: asyncio.Transport | None = None
        self._inner: WebSocketTransport | None = None  # set once the handshake succeeded
        self._timer: asyncio.TimerHandle | None = None
        self._text = False  # the message being received is a text message (refused)
        self._refusal_counted = False
        self._failure_logged = False
        self._head_tail = b""  # the last bytes before the request head's end was found (a split CRLFCRLF)
        self._head_done = False  # the request head's blank line was seen: what follows is frames

    # -- asyncio.Protocol, towards the socket -------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = cast(asyncio.Transport, transport)  # a stream transport (uvloop's are not subclasses)
        self._timer = asyncio.get_running_loop().call_later(self._handshake_timeout_s, self._handshake_expired)

    def data_received(self, data: bytes) -> None:
        held = b""
        if not self._head_done:
            data, held = self._split_at_head_end(data)
        ws = self._ws
        ws.receive_data(data)
        self._handle(ws.events_received())
        self._flush()
        if held and self._inner is not None:  # the frames that came with the request, now it is accepted
            ws.receive_data(held)
            self._handle(ws.events_received())
            self._flush()

    def _split_at_head_end(self, data: bytes) -> tuple[bytes, bytes]:
        """``data`` cut after the blank line ending the HTTP request head: (head bytes, what follows)."""
        window = self._head_tail + data
        end = window.find(b"\r\n\r\n")
        if end < 0:
            self._head_tail = window[-3:]
            return data, b""
        self._head_done = True
        cut = end + 4 - len(self._head_tail)
        return data[:cut], data[cut:]

    def eof_received(self) -> bool | None:
        self._ws.receive_eof()
        self._handle(self._ws.events_received())
        self._flush()
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inner is not None:
            self._inner._closing = True
            self.mqtt.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self.mqtt.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self.mqtt.resume_writing()

    # -- towards the MQTT connection ----------------------------------------------------------
    def send_binary(self, data: bytes) -> None:
        if self._ws.state is State.OPEN:
            self._ws.send_binary(data)
            self._flush()

    def close(self, code: int, reason: str = "") -> None:
        ws = self._ws
        if ws.state is State.OPEN:
            ws.send_close(code, reason)
        self._flush()
        if self._raw is not None and not self._raw.is_closing():
            self._raw.close()  # written data (our close frame) goes out first

    # -- the rules ----------------------------------------------------------------------------
    def _handle(self, events: Sequence[Request | Response | Frame]) -> None:
        for event in events:
            if isinstance(event, Request):
                self._on_request(event)
            elif isinstance(event, Frame):
                self._on_frame(event)

    def _on_request(self, request: Request) -> None:
        ws = self._ws
        response = ws.accept(request)
        ws.send_response(response)
        if response.status_code != 101:
            self._refused(f"HTTP {response.status_code}: {ws.handshake_exc}")
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.subprotocol = response.headers.get("Sec-WebSocket-Protocol")
        self.stats.handshakes += 1
        assert self._raw is not None
        self._flush()  # the 101 goes out before anything the MQTT connection writes
        self._inner = WebSocketTransport(self, self._raw)
        self.mqtt.connection_made(self._inner)

    def _on_frame(self, frame: Frame) -> None:
        if frame.opcode is Opcode.TEXT or (frame.opcode is Opcode.CONT and self._text):
            self._text = True
            self.stats.text_frames += 1
            log.info("closing MQTT WebSocket connection: text frame (MQTT is sent in binary frames)",
                     extra={"peer": self._peer()})
            self._failure_logged = True
            self._ws.fail(CloseCode.UNSUPPORTED_DATA, "MQTT is sent in binary frames")
            return
        inner = self._inner
        if frame.opcode in (Opcode.BINARY, Opcode.CONT) and inner is not None and not inner.is_closing():
            self.mqtt.data_received(frame.data if isinstance(frame.data, bytes) else bytes(frame.data))
        # PING is answered by the library; PONG needs nothing; CLOSE is answered by the library

    def _flush(self) -> None:
        raw = self._raw
        if raw is None:
            return
        ws = self._ws
        for chunk in ws.data_to_send():
            if chunk:
                if not raw.is_closing():
                    raw.write(chunk)
            else:  # end of the stream: a refused handshake, a close frame sent, or a failure
                raw.close()  # what was written goes out first
        if self._inner is None:
            if ws.handshake_exc is not None and not self._refusal_counted:  # not even an HTTP request
                self._refused(str(ws.handshake_exc))
        elif ws.parser_exc is not None and not self._failure_logged:
            self._failure_logged = True
            if not self._text:
                self.stats.protocol_errors += 1
                log.info(f"closing MQTT WebSocket connection: {ws.parser_exc}", extra={"peer": self._peer()})

    def _handshake_expired(self) -> None:
        self._timer = None
        if self._inner is None and self._raw is not None and not self._raw.is_closing():
            self._refused("no WebSocket handshake within the connect timeout")
            self._raw.abort()

    def _refused(self, why: str) -> None:
        self._refusal_counted = True
        self.stats.handshake_refusals += 1
        log.info(f"MQTT WebSocket handshake refused: {why}", extra={"peer": self._peer()})

    def _peer(self) -> Any:
        return self._raw.get_extra_info("peername") if self._raw is not None else None


def websocket_factory(mqtt_factory: Callable[[], StreamProtocol], stats: WebSocketStats, *,
                      max_frame_bytes: int, handshake_timeout_s: float) -> Callable[[], MqttOverWebSocket]:
    """A protocol factory for ``loop.create_server``: one MQTT connection inside each WebSocket."""

    def build() -> MqttOverWebSocket:
        return MqttOverWebSocket(mqtt_factory(), stats=stats, max_frame_bytes=max_frame_bytes,
                                 handshake_timeout_s=handshake_timeout_s)

    return build
