"""MQTT over WebSockets (``mqtt.ws_port``): hostile HTTP upgrades, hostile WebSocket frames, and the MQTT
campaign's packets inside well-formed binary frames.

Frames are encoded here from RFC 6455 (not with the ``websockets`` library, which is what the broker runs).
A connection starts with an HTTP upgrade request: mostly well-formed (with the ``mqtt``/``mqttv3.1``
subprotocol, a list holding it, or none), else one the broker must refuse (a missing or bad
Sec-WebSocket-Key, a wrong version, only foreign subprotocols, no Upgrade header, POST, HTTP/1.0; a 101 to
one of those is a ``mismatch`` finding), one of oversized headers, a mutation, raw MQTT, or a request cut
short before EOF. After a 101 the first frame carries the CONNECT (``mqtt.py``'s generator). Every later
input is frames: MQTT packets (``mqtt.py``'s generators) in one binary frame, fragmented over continuation
frames, with pings and pongs between the fragments; or a frame RFC 6455 says fails the connection (a
reserved opcode, an unmasked client frame, reserved bits, a length over the broker's frame limit or a
64-bit length with the top bit, a control frame over 125 bytes or fragmented, a continuation without a
start, a new message inside a fragmented one, a text frame, a close frame with a bad code, a short payload
or a reason that is not UTF-8) or a well-formed close; or mutated frames. Each input ends with a PINGREQ in
a binary frame (a continuation when a fragmented message is open): its PINGRESP or the close ends the input;
a PINGRESP after a frame that must fail the connection is a ``mismatch``. The probe is a fresh upgrade +
CONNECT + PINGREQ; the real client afterwards is paho-mqtt's websockets transport (3.1.1 and 5.0).
"""

from __future__ import annotations

import base64
import random
import socket
import threading
import time
import uuid
from typing import Any

from bench.fuzz.harness import BrokerProcess, Hang, Mismatch, answer_contains, closes_after_eof, send_split
from bench.fuzz.mqtt import PINGREQ, MqttTarget, connect, packet_state
from bench.fuzz.mutate import mutate

__all__ = ["MqttWsTarget", "client_stream", "close_frame", "frames_state", "pings_in", "upgrade_request", "ws_frame"]

MAX_FRAME = 2 * (1024 * 1024 + 1024)  # the broker's max_frame_bytes: twice mqtt.max_packet_bytes
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
GOOD_KEY = "dGhlIHNhbXBsZSBub25jZQ=="
# Verdicts of an input: "ok" must be served (PINGRESP), "fail" must close, "any" may do either.
OK, FAIL, ANY = "ok", "fail", "any"


def ws_frame(opcode: int, payload: bytes, rng: random.Random | None = None, *, fin: bool = True, rsv: int = 0,
             masked: bool = True, length: int | None = None, length_bytes: int | None = None) -> bytes:
    """One frame as a client sends it (masked unless told otherwise). ``length`` lies about the payload size;
    ``length_bytes`` (0, 2 or 8) forces a length form, minimal or not."""
    size = len(payload) if length is None else length
    form = length_bytes if length_bytes is not None else (0 if size < 126 else 2 if size < 65536 else 8)
    head = bytes(((0x80 if fin else 0) | (rsv << 4) | opcode,))
    mask_bit = 0x80 if masked else 0
    if form == 0:
        head += bytes((mask_bit | size,))
    elif form == 2:
        head += bytes((mask_bit | 126,)) + size.to_bytes(2, "big")
    else:
        head += bytes((mask_bit | 127,)) + size.to_bytes(8, "big")
    if not masked:
        return head + payload
    key = rng.randbytes(4) if rng is not None else b"\x37\xfa\x21\x3d"
    if not payload:
        return head + key
    stream = (key * (len(payload) // 4 + 1))[: len(payload)]
    masked_payload = (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(len(payload), "big")
    return head + key + masked_payload


def close_frame(rng: random.Random, code: int | None, reason: bytes = b"") -> bytes:
    return ws_frame(CLOSE, b"" if code is None else code.to_bytes(2, "big") + reason, rng)


def client_stream(data: bytes) -> tuple[str, bytes]:
    """What the broker makes of client frames, and the MQTT bytes their binary frames carry: "incomplete" (it
    waits for more bytes: a frame or, inside the payloads, an MQTT packet cut short), "whole", or "broken"
    (it must close: a frame length over the limit, or an MQTT remaining length over the packet limit)."""
    pos, payloads = 0, bytearray()
    while pos < len(data):
        if len(data) < pos + 2:
            return "incomplete", bytes(payloads)
        first, second = data[pos], data[pos + 1]
        size, pos = second & 0x7F, pos + 2
        if size >= 126:
            width = 2 if size == 126 else 8
            if len(data) < pos + width:
                return "incomplete", bytes(payloads)
            size, pos = int.from_bytes(data[pos:pos + width], "big"), pos + width
        if size > MAX_FRAME:
            return "broken", bytes(payloads)
        key = b""
        if second & 0x80:
            if len(data) < pos + 4:
                return "incomplete", bytes(payloads)
            key, pos = data[pos:pos + 4], pos + 4
        if len(data) < pos + size:
            return "incomplete", bytes(payloads)
        payload = data[pos:pos + size]
        pos += size
        if first & 0x0F in (CONT, BINARY) and key and payload:
            stream = (key * (size // 4 + 1))[:size]
            payloads += (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(size, "big")
    state = packet_state(bytes(payloads))
    return "broken" if state == "bad-length" else state, bytes(payloads)


def frames_state(data: bytes) -> str:
    return client_stream(data)[0]


def pings_in(mqtt: bytes) -> int:
    """PINGREQs among the whole MQTT packets of ``mqtt``: the PINGRESPs a broker serving them all sends."""
    pos, pings = 0, 0
    while pos < len(mqtt):
        first, pos = mqtt[pos], pos + 1
        length, mult = 0, 1
        for _ in range(4):
            if pos >= len(mqtt):
                return pings
            byte, pos = mqtt[pos], pos + 1
            length += (byte & 0x7F) * mult
            mult *= 128
            if not byte & 0x80:
                break
        pos += length
        if pos <= len(mqtt) and first == 0xC0:
            pings += 1
    return pings


def upgrade_request(rng: random.Random, *, protocols: str | None = "mqtt", key: str | None = GOOD_KEY,
                    version: str | None = "13", method: str = "GET", http: str = "HTTP/1.1",
                    upgrade: str | None = "websocket", extra: str = "") -> bytes:
    lines = [f"{method} {rng.choice(('/mqtt', '/', '/ws', '/mqtt?x=1'))} {http}", "Host: localhost"]
    if upgrade is not None:
        lines += [f"Upgrade: {upgrade}", "Connection: Upgrade"]
    if key is not None:
        lines.append(f"Sec-WebSocket-Key: {key}")
    if version is not None:
        lines.append(f"Sec-WebSocket-Version: {version}")
    if protocols is not None:
        lines.append(f"Sec-WebSocket-Protocol: {protocols}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode("latin-1")


def _good_upgrade(rng: random.Random) -> bytes:
    protocols = rng.choice(("mqtt", "mqtt", "mqttv3.1", "chat, mqtt", None))
    extra = rng.choice(("", "", "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n",
                        "Origin: http://example.com\r\nUser-Agent: fuzz\r\n"))
    return upgrade_request(rng, protocols=protocols, key=base64.b64encode(rng.randbytes(16)).decode(), extra=extra)


def _refused_upgrade(rng: random.Random) -> bytes:
    """A request RFC 6455 (or our subprotocol rule) refuses: a 101 to it is a finding."""
    return rng.choice((
        lambda: upgrade_request(rng, key=None),
        lambda: upgrade_request(rng, key="not base64!"),
        lambda: upgrade_request(rng, key=base64.b64encode(rng.randbytes(rng.choice((0, 8, 15, 17, 32)))).decode()),
        lambda: upgrade_request(rng, version=rng.choice((None, "8", "12", "14", "x"))),
        lambda: upgrade_request(rng, protocols=rng.choice(("chat", "chat, superchat", "MQTT", "mqttv5", "mqtt5"))),
        lambda: upgrade_request(rng, upgrade=None),
        lambda: upgrade_request(rng, upgrade="h2c"),
        lambda: upgrade_request(rng, method=rng.choice(("POST", "PUT", "HEAD", "CONNECT"))),
        lambda: upgrade_request(rng, http="HTTP/1.0"),
        lambda: upgrade_request(rng, extra=f"Sec-WebSocket-Key: {GOOD_KEY}\r\n"),  # two keys
    ))()


def _hostile_upgrade(rng: random.Random, corpus: list[bytes]) -> bytes:
    """Oversized or malformed requests: any answer but a traceback, as long as the broker answers or closes."""
    roll = rng.random()
    if roll < 0.2:
        return upgrade_request(rng, extra="X-Big: " + "a" * rng.choice((8000, 8200, 70000)) + "\r\n")
    if roll < 0.3:
        return upgrade_request(rng, extra="".join(f"X-H{i}: v\r\n" for i in range(rng.choice((120, 129, 1000)))))
    if roll < 0.4:
        return b"GET /" + b"m" * rng.choice((8200, 100000)) + b" HTTP/1.1\r\n\r\n"
    if roll < 0.5:
        return upgrade_request(rng, extra=rng.choice(("Content-Length: 5\r\n", "Transfer-Encoding: chunked\r\n",
                                                      "X-Nul: a\x00b\r\n", "X-Hi: \xff\xfe\r\n", "Bad Header\r\n",
                                                      " folded: x\r\n", "Sec-WebSocket-Protocol: \r\n")))
    if roll < 0.55:
        return connect(rng, 4)  # raw MQTT on the WebSocket port
    if roll < 0.6:
        return rng.randbytes(rng.choice((1, 16, 300)))
    return mutate(rng.choice(corpus), rng, corpus)


class _Reader:
    """The broker's side of one connection: the HTTP answer, then frames (unmasked, from a server)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.mqtt = bytearray()  # MQTT bytes from binary frames, not yet parsed into packets

    def _fill(self, end: float) -> bool:
        """Read more; False when the peer closed. socket.timeout (TimeoutError) past ``end``."""
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            return False
        if not chunk:
            return False
        self.buf += chunk
        return True

    def http_status(self, end: float) -> int | None:
        """The status code of the handshake answer, or None when the broker closed first."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill(end):
                return None
        head, _, rest = bytes(self.buf).partition(b"\r\n\r\n")
        self.buf = bytearray(rest)
        try:
            return int(head.split(b" ", 2)[1])
        except (IndexError, ValueError):
            return -1

    def frame(self, end: float) -> tuple[int, bytes] | None:
        """The next frame (opcode, payload), or None when the broker closed first."""
        while True:
            buf = self.buf
            if len(buf) >= 2:
                size, at = buf[1] & 0x7F, 2
                if size == 126:
                    size, at = (int.from_bytes(buf[2:4], "big"), 4) if len(buf) >= 4 else (-1, 0)
                elif size == 127:
                    size, at = (int.from_bytes(buf[2:10], "big"), 10) if len(buf) >= 10 else (-1, 0)
                if size >= 0 and len(buf) >= at + size:
                    opcode, payload = buf[0] & 0x0F, bytes(buf[at:at + size])
                    del buf[:at + size]
                    return opcode, payload
            if not self._fill(end):
                return None

    def mqtt_packet(self) -> int | None:
        """The first byte of the next whole MQTT packet in the binary frames received, if there is one."""
        data = self.mqtt
        if len(data) < 2:
            return None
        length, mult, pos = 0, 1, 1
        while True:
            if pos >= len(data):
                return None
            byte = data[pos]
            pos += 1
            length += (byte & 0x7F) * mult
            mult *= 128
            if not byte & 0x80 or pos > 4:
                break
        if len(data) < pos + length:
            return None
        first = data[0]
        del data[:pos + length]
        return first


class MqttWsTarget(MqttTarget):
    name = "mqtt-ws"
    endpoint = "mqtt-ws"

    def __init__(self, deadline: float = 10.0) -> None:
        super().__init__(deadline)
        self.reader: _Reader | None = None
        self.fragment_open = False  # a binary message was started (fin=0) and not finished
        self.upgrades: list[bytes] = []

    def broker_env(self) -> dict[str, str]:
        return {**super().broker_env(), "SLUICE_MQTT__WEBSOCKETS": "true", "SLUICE_MQTT__WS_PORT": "0"}

    def attach(self, broker: BrokerProcess, rng: random.Random) -> None:
        super().attach(broker, rng)
        if not self.upgrades:
            self.upgrades = [_good_upgrade(rng) for _ in range(20)] + [_refused_upgrade(rng) for _ in range(20)]

    def _open(self) -> socket.socket:
        assert self.broker is not None
        sock = socket.create_connection(self.broker.endpoints[self.endpoint], timeout=self.deadline)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _drop(self) -> None:
        super()._drop()
        self.reader = None
        self.fragment_open = False

    # ------------------------------------------------------------------ inputs

    def _mqtt_frames(self, rng: random.Random, data: bytes) -> bytes:
        """MQTT bytes in binary frames: one frame, or fragments (control frames between them) and now and then
        a fragment left open for the next input."""
        opcode = CONT if self.fragment_open else BINARY
        roll = rng.random()
        if roll < 0.6 or len(data) < 2:
            self.fragment_open = False
            return ws_frame(opcode, data, rng)
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.choice((1, 2, 5)))))
        out = bytearray()
        start = 0
        for i, cut in enumerate([*cuts, len(data)]):
            last = cut == len(data)
            out += ws_frame(opcode if i == 0 else CONT, data[start:cut], rng, fin=last and roll < 0.9)
            if not last and rng.random() < 0.3:
                out += ws_frame(rng.choice((PING, PONG)), rng.randbytes(rng.choice((0, 4, 125))), rng)
            start = cut
        self.fragment_open = roll >= 0.9
        return bytes(out)

    def _bad_frame(self, rng: random.Random) -> tuple[bytes, str]:
        """A frame with its verdict: most must fail the connection, some are well-formed oddities."""
        opcode = CONT if self.fragment_open else BINARY
        payload = PINGREQ
        choices: list[tuple[bytes, str]] = [
            (ws_frame(rng.choice((3, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF)), payload, rng), FAIL),
            (ws_frame(opcode, payload, rng, masked=False), FAIL),
            (ws_frame(opcode, payload, rng, rsv=rng.choice((1, 2, 4, 7))), FAIL),
            (ws_frame(opcode, b"", rng, length=rng.choice((MAX_FRAME + 1, 1 << 40, (1 << 63) - 1))), FAIL),
            (ws_frame(opcode, b"", rng, length=1 << 63, length_bytes=8), FAIL),  # top bit set: not allowed
            (ws_frame(rng.choice((PING, PONG)), rng.randbytes(126), rng), FAIL),
            (ws_frame(PING, b"x", rng, fin=False), FAIL),
            (ws_frame(TEXT, b"CONNECT", rng), FAIL),
            (close_frame(rng, rng.choice((0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535))), FAIL),
            (ws_frame(CLOSE, b"\x03", rng), FAIL),  # a one-byte close payload
            (close_frame(rng, 1000, b"\xff\xfe"), FAIL),  # the reason is not UTF-8
            (close_frame(rng, rng.choice((None, 1000, 1001, 1011, 3000, 4999)), rng.choice((b"", b"bye"))), FAIL),
            (ws_frame(PING, rng.randbytes(rng.choice((0, 1, 125))), rng), OK),
            (ws_frame(PONG, rng.randbytes(rng.choice((0, 1, 125))), rng), OK),
            (ws_frame(opcode, b"", rng), ANY),
            (ws_frame(opcode, b"", rng, length_bytes=rng.choice((2, 8))), ANY),  # a non-minimal length
        ]
        if self.fragment_open:
            choices.append((ws_frame(BINARY, payload, rng), FAIL))  # a new message inside a fragmented one
        else:
            choices.append((ws_frame(CONT, payload, rng), FAIL))  # a continuation without a start
        return rng.choice(choices)

    def _frames_input(self, rng: random.Random) -> tuple[bytes, str]:
        """One input on an open WebSocket, sentinel included, and its verdict ("incomplete": no sentinel)."""
        roll = rng.random()
        if roll < 0.6:
            data = self._packet_input(rng)
            state = packet_state(data)
            frames = self._mqtt_frames(rng, data)
            if state == "incomplete":
                if rng.random() < 0.5:  # the client closes the WebSocket in the middle of a packet
                    frames += close_frame(rng, 1000)
                return frames, "incomplete"
            if state == "bad-length":
                return frames, ANY  # the broker must close; its sentinel would be inside the packet
            return frames + self._sentinel(rng), ANY
        if roll < 0.85:
            frame, verdict = self._bad_frame(rng)
            if verdict != OK:  # the frame ended a fragmented message, or the connection
                self.fragment_open = False
            return frame + self._sentinel(rng), verdict
        if roll < 0.95:  # mutated frames: the broker may be left waiting for the rest of a frame or packet
            frames = self._mqtt_frames(rng, self._packet_input(rng))
            self.fragment_open = False
            mutated = mutate(frames, rng, self.corpus)
            state = frames_state(mutated)
            if state == "incomplete":
                return mutated, "incomplete"
            return mutated + (ws_frame(BINARY, PINGREQ, rng) if state == "whole" else b""), ANY
        head = ws_frame(BINARY, rng.randbytes(10), rng, length=rng.choice((100, 70000)))  # announced, never sent
        return head, "incomplete"

    def _sentinel(self, rng: random.Random) -> bytes:
        opcode = CONT if self.fragment_open else BINARY
        self.fragment_open = False
        return ws_frame(opcode, PINGREQ, rng)

    def _upgrade_input(self, rng: random.Random) -> tuple[bytes, str]:
        roll = rng.random()
        if roll < 0.8:
            return _good_upgrade(rng), OK
        if roll < 0.9:
            return _refused_upgrade(rng), FAIL
        if roll < 0.97:
            request = _hostile_upgrade(rng, self.upgrades)
            # without the blank line that ends the head the broker waits for the rest (until its timeout)
            return request, ANY if b"\r\n\r\n" in request else "incomplete"
        request = _good_upgrade(rng)
        return request[: rng.randrange(1, len(request) - 1)], "incomplete"

    # ------------------------------------------------------------------ connections

    def step(self, rng: random.Random) -> None:
        if self.sock is None or self.reader is None or self.conn_budget <= 0:
            self._drop()
            self._start_connection(rng)
            return
        self.conn_budget -= 1
        data, verdict = self._frames_input(rng)
        self._send_and_judge(rng, data, verdict)

    def _start_connection(self, rng: random.Random) -> None:
        assert self.broker is not None
        self.sock = self._open()
        self.reader = _Reader(self.sock)
        self.conn_budget = rng.choice((1, 10, 100, 1000))
        request, verdict = self._upgrade_input(rng)
        self.sent.append(request)
        try:
            self._send(rng, request)
        except OSError:
            self._drop()
            return
        if verdict == "incomplete":
            if not closes_after_eof(self.sock, self.deadline):
                raise Hang(f"no close within {self.deadline:.1f} s after EOF in the middle of an HTTP upgrade")
            self._drop()
            return
        end = time.monotonic() + self.deadline
        try:
            status = self.reader.http_status(end)
        except TimeoutError:
            raise Hang(f"no answer to an HTTP upgrade and no close within {self.deadline:.1f} s") from None
        except OSError:
            self._drop()
            return
        if status != 101:
            if verdict == OK:
                raise Mismatch(f"a well-formed upgrade was refused: HTTP {status}")
            if status is not None and not closes_after_eof(self.sock, self.deadline):
                raise Hang(f"no close within {self.deadline:.1f} s after a refused upgrade (HTTP {status})")
            self._drop()
            return
        if verdict == FAIL:
            raise Mismatch(f"HTTP 101 to an upgrade that must be refused: {request[:300]!r}")
        # the CONNECT (usually well-formed) in the first binary frame, then the sentinel
        data = self._connect_input(rng)
        state = packet_state(data)
        frames = self._mqtt_frames(rng, data)
        if state == "incomplete":
            self._send_and_judge(rng, frames, "incomplete")
        elif state == "bad-length":
            self._send_and_judge(rng, frames, ANY)
        else:
            self._send_and_judge(rng, frames + self._sentinel(rng), ANY)

    def _send(self, rng: random.Random, data: bytes) -> None:
        assert self.sock is not None
        if rng.random() < 0.3:
            send_split(self.sock, data, rng)
        else:
            self.sock.sendall(data)

    def _send_and_judge(self, rng: random.Random, data: bytes, verdict: str) -> None:
        """Send one input; wait for the PINGRESP to each PINGREQ it carries (the sentinel last), or the close.
        A frame that must fail the connection waits for the close alone (PINGRESPs do not count)."""
        assert self.sock is not None
        self.sent.append(data)
        try:
            self._send(rng, data)
        except OSError:
            self._drop()
            return
        if verdict == "incomplete":
            if not closes_after_eof(self.sock, self.deadline):
                raise Hang(f"no close within {self.deadline:.1f} s after EOF in the middle of a frame or packet")
            self._drop()
            return
        state, mqtt = client_stream(data)
        pings = pings_in(mqtt) if verdict != FAIL and state == "whole" else 0
        answered, close_code = self._await_pingresps(pings, self.deadline)
        if answered is None:
            raise Hang(f"{'no PINGRESP and ' if pings else ''}no close within {self.deadline:.1f} s "
                       f"(frames input, verdict {verdict})")
        if not answered and verdict == OK and close_code not in (None, 1000, 1001):
            raise Mismatch(f"close {close_code} after well-formed frames: {data[:40].hex()}")

    def _await_pingresps(self, pings: int, limit: float) -> tuple[bool | None, int | None]:
        """(True, None): ``pings`` PINGRESPs came (0: never, the close is awaited); (False, code): the broker
        closed (after its close frame with that code, or its DISCONNECT, at our EOF); (None, None): neither
        within ``limit``."""
        assert self.sock is not None and self.reader is not None
        end = time.monotonic() + limit
        reader = self.reader
        try:
            while True:
                while (first := reader.mqtt_packet()) is not None:
                    if first == 0xD0:
                        pings -= 1
                        if pings == 0:
                            return True, None
                    elif first == 0xE0:  # the server's DISCONNECT: it closes at our EOF
                        return self._closed(end), None
                got = reader.frame(end)
                if got is None:
                    self._drop()
                    return False, None
                opcode, payload = got
                if opcode in (BINARY, CONT):
                    reader.mqtt += payload
                elif opcode == CLOSE:
                    code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
                    return self._closed(end), code
        except TimeoutError:
            return None, None
        except OSError:
            self._drop()
            return False, None

    def _closed(self, end: float) -> bool | None:
        assert self.sock is not None
        closed = closes_after_eof(self.sock, max(end - time.monotonic(), 0.001))
        self._drop()
        return False if closed else None

    def probe(self) -> bool:
        assert self.broker is not None
        rng = random.Random(0)
        request = (upgrade_request(rng) + ws_frame(BINARY, connect(rng, 4, "probe"), rng)
                   + ws_frame(BINARY, PINGREQ, rng))
        return answer_contains(self.broker.endpoints[self.endpoint], request, b"\x82\x02\xd0\x00", self.deadline)

    def client_check(self) -> list[str]:
        """paho-mqtt over WebSockets (3.1.1 and 5.0): subscribe, publish at QoS 1, receive it."""
        assert self.broker is not None
        failures: list[str] = []
        for version in (4, 5):
            try:
                failures += self._paho_round(version)
            except Exception as exc:  # any client failure is what this check reports
                failures.append(f"paho websockets v{version}: {exc!r}")
        return failures

    def _paho_client(self, client_id: str, version: int) -> Any:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, transport="websockets",
                             protocol=paho.MQTTv5 if version == 5 else paho.MQTTv311)
        client.ws_set_options(path="/mqtt")
        return client

    def _paho_round(self, version: int) -> list[str]:
        assert self.broker is not None
        host, port = self.broker.endpoints[self.endpoint]
        topic = f"check/ws/{uuid.uuid4().hex[:8]}"
        client = self._paho_client(f"check-ws-{version}-{uuid.uuid4().hex[:6]}", version)
        connected, subscribed, received = threading.Event(), threading.Event(), threading.Event()
        got: list[bytes] = []
        client.on_connect = lambda *args: connected.set()
        client.on_subscribe = lambda *args: subscribed.set()

        def on_message(_client: Any, _userdata: Any, message: Any) -> None:
            got.append(message.payload)
            received.set()

        client.on_message = on_message
        client.connect(host, port, keepalive=30)
        client.loop_start()
        try:
            if not connected.wait(30):
                return [f"paho websockets v{version}: no CONNACK"]
            client.subscribe(topic, 1)
            if not subscribed.wait(30):
                return [f"paho websockets v{version}: no SUBACK"]
            client.publish(topic, b"after-fuzz", qos=1).wait_for_publish(30)
            if not received.wait(30) or got != [b"after-fuzz"]:
                return [f"paho websockets v{version} got {got[:3]!r}"]
            return []
        finally:
            client.disconnect()
            client.loop_stop()
