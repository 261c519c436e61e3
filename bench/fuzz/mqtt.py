"""MQTT front door: CONNECT/PUBLISH/SUBSCRIBE/UNSUBSCRIBE/PINGREQ (3.1.1 and 5.0 with properties),
well-formed and mutated, huge remaining lengths, bad UTF-8, wildcards where they are not allowed.

The packets are encoded here, from the specification (not with Sluice's codec, which is what is under
test). A connection starts with a CONNECT (usually well-formed), then carries packets; after each input
a PINGREQ is the sentinel: its PINGRESP (MQTT answers in order on one connection) or the close ends the
input. An input whose last packet is incomplete gets no sentinel and its connection is dropped; one whose
remaining length exceeds the broker's ``max_packet_bytes`` must be closed at once.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import time
import uuid

from bench.fuzz.harness import (
    BrokerProcess,
    Hang,
    SocketTarget,
    answer_contains,
    closes_after_eof,
    recv_exactly,
    send_split,
)
from bench.fuzz.mutate import mutate

__all__ = ["MqttTarget", "encode_varint", "packet_state", "plain_publish", "publish_run", "seed_packets"]

MAX_PACKET = 1024 * 1024 + 1024  # mqtt.max_packet_bytes default
PINGREQ = b"\xc0\x00"
_SPLIT_SHARE = 0.3  # inputs sent in pieces (a packet split at any byte, a run split between its packets)
ROUTES = [
    {"name": "json", "source": "mqtt", "filter": "json/#", "topic": "mqtt-json", "format": "json",
     "key": "field:device", "time_field": "ts", "time_format": "epoch_ms", "value": "json"},
    {"name": "influx", "source": "mqtt", "filter": "influx/#", "topic": "mqtt-influx", "format": "influx",
     "time_field": "timestamp", "time_format": "epoch_ns", "key": "series"},
    {"name": "csv", "source": "mqtt", "filter": "csv/#", "topic": "mqtt-csv", "format": "csv"},
    {"name": "site", "source": "mqtt", "filter": "site/+/x", "topic": "site.{1}", "format": "raw"},
]
TOPICS = ("json/dev1", "influx/a", "csv/b", "site/s1/x", "raw/t", "a/b/c", "$SYS/x", "", "t/\u00e9")
FILTERS = ("#", "+", "json/#", "a/+/c", "a/#/c", "a#", "+a", "$SYS/#", "", "a/b", "$share/g/t", "\x00")


def encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _s(text: str | bytes) -> bytes:
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def _props(rng: random.Random, kind: str) -> bytes:
    """A v5 property block with a few properties allowed (mostly) for this packet kind."""
    choices: dict[str, list[bytes]] = {
        "connect": [b"\x11" + rng.choice((0, 60, 0xFFFFFFFF)).to_bytes(4, "big"),
                    b"\x21" + rng.choice((1, 10, 65535)).to_bytes(2, "big"),
                    b"\x27" + rng.choice((0, 20, 128, 65536, MAX_PACKET)).to_bytes(4, "big"),
                    b"\x22" + rng.choice((0, 10)).to_bytes(2, "big"),
                    b"\x19\x01", b"\x17\x00", b"\x26" + _s("k") + _s("v"), b"\x15" + _s("SCRAM-SHA-1")],
        "publish": [b"\x01" + bytes((rng.choice((0, 1)),)), b"\x02" + (60).to_bytes(4, "big"),
                    b"\x23" + rng.choice((1, 2, 0, 40)).to_bytes(2, "big"), b"\x08" + _s("resp/t"),
                    b"\x09" + _s(b"\x00\x01"), b"\x26" + _s("k") + _s("v"), b"\x03" + _s("application/json"),
                    b"\x0b\x05"],
        "subscribe": [b"\x0b" + encode_varint(rng.choice((1, 268435455))), b"\x26" + _s("k") + _s("v")],
        "other": [b"\x26" + _s("k") + _s("v"), b"\x1f" + _s("reason")],
    }
    picked = b"".join(rng.sample(choices[kind], k=rng.randint(0, min(3, len(choices[kind])))))
    return encode_varint(len(picked)) + picked


def connect(rng: random.Random, version: int, client_id: str | None = None) -> bytes:
    clean = rng.random() < 0.7
    will = rng.random() < 0.2
    user = rng.random() < 0.2
    flags = (0x02 if clean else 0) | (0x04 | (rng.randrange(3) << 3) if will else 0) | (0xC0 if user else 0)
    body = _s("MQTT") + bytes((version, flags)) + rng.choice((0, 5, 60)).to_bytes(2, "big")
    if version == 5:
        body += _props(rng, "connect")
    cid = client_id if client_id is not None else rng.choice(("", "dev-1", f"fz-{rng.randrange(1000)}", "dev-2"))
    body += _s(cid)
    if will:
        body += (_props(rng, "publish") if version == 5 else b"") + _s(rng.choice(TOPICS)) + _s(b"gone")
    if user:
        body += _s("user") + _s("secret")
    return _packet(0x10, body)


def _payload(rng: random.Random, topic: str) -> bytes:
    if topic.startswith("json"):
        return rng.choice((
            b'{"device":"d1","ts":1700000000000,"temp":21.5}', b"[" * 30000, b'{"ts":"x"}', b"\xff\xfe",
            b'{"device":{"a":1},"ts":1e400}', b"{" * 50 + b"}" * 50, b'{"ts":-99999999999999999999999}',
        ))
    if topic.startswith("influx"):
        return rng.choice((b"w,s=a t=1 1700000000000000000", b"w t=", b"w,=, t=1i 99999999999999999999999",
                           b"\\" * 100, b"w t=1\nw t=2"))
    if topic.startswith("csv"):
        return rng.choice((b"a,b\n1,2", b'"unterminated', b",,,,\n", b"a\n" + b"x" * 70000))
    return rng.randbytes(rng.choice((0, 10, 1000)))


def publish(rng: random.Random, version: int) -> bytes:
    qos = rng.choice((0, 1, 1, 2))
    topic = rng.choice(TOPICS)
    body = _s(topic)
    if qos:
        body += rng.randrange(1, 65536).to_bytes(2, "big")
    if version == 5:
        body += _props(rng, "publish")
    body += _payload(rng, topic)
    return _packet(0x30 | (qos << 1) | (1 if rng.random() < 0.1 else 0) | (8 if rng.random() < 0.05 else 0), body)


def plain_publish(rng: random.Random, version: int, pid: int) -> bytes:
    """The PUBLISH the broker's short loop takes (QoS 0 or 1, no properties, no retain, a valid topic)."""
    qos = rng.choice((0, 1, 1))
    topic = rng.choice(("json/dev1", "raw/t", "a/b/c", "site/s1/x", "t/\u00e9"))
    body = _s(topic) + (pid.to_bytes(2, "big") if qos else b"") + (b"\x00" if version == 5 else b"")
    return _packet(0x30 | (qos << 1), body + _payload(rng, topic)[:200])


def publish_run(rng: random.Random, version: int) -> bytes:
    """A run of plain PUBLISHes broken now and then by another packet (properties, QoS 2, retain, a repeated
    packet id, PINGREQ, SUBSCRIBE, a DISCONNECT): where the short loop hands over to the full rules."""
    pid = rng.randrange(1, 60000)
    out = []
    for _ in range(rng.choice((2, 10, 50, 300))):
        roll = rng.random()
        if roll < 0.8:
            pid += 1
            out.append(plain_publish(rng, version, pid))
        elif roll < 0.85:
            out.append(plain_publish(rng, version, pid))  # the same packet id again
        elif roll < 0.95:
            out.append(publish(rng, version))
        else:
            out.append(rng.choice((PINGREQ, subscribe(rng, version), acks(rng, version), disconnect(rng, version))))
    return b"".join(out)


def subscribe(rng: random.Random, version: int) -> bytes:
    body = rng.randrange(1, 65536).to_bytes(2, "big") + (_props(rng, "subscribe") if version == 5 else b"")
    for _ in range(rng.randint(1, 4)):
        body += _s(rng.choice(FILTERS)) + bytes((rng.choice((0, 1, 2, 3, 0x2C, 0x04, 0x08)),))
    return _packet(0x82, body)


def unsubscribe(rng: random.Random, version: int) -> bytes:
    body = rng.randrange(1, 65536).to_bytes(2, "big") + (_props(rng, "other") if version == 5 else b"")
    for _ in range(rng.randint(1, 3)):
        body += _s(rng.choice(FILTERS))
    return _packet(0xA2, body)


def acks(rng: random.Random, version: int) -> bytes:
    first = rng.choice((0x40, 0x50, 0x62, 0x70))
    body = rng.randrange(1, 65536).to_bytes(2, "big")
    if version == 5 and rng.random() < 0.5:
        body += bytes((rng.choice((0, 0x10, 0x80, 0x92)),)) + _props(rng, "other")
    return _packet(first, body)


def disconnect(rng: random.Random, version: int) -> bytes:
    if version == 5 and rng.random() < 0.7:
        return _packet(0xE0, bytes((rng.choice((0, 4, 0x80)),)) + _props(rng, "other"))
    return b"\xe0\x00"


def auth(rng: random.Random, version: int) -> bytes:
    return _packet(0xF0, bytes((rng.choice((0, 0x18, 0x19)),)) + _props(rng, "connect"))


def seed_packets(rng: random.Random, version: int) -> list[bytes]:
    return [publish(rng, version), subscribe(rng, version), unsubscribe(rng, version), PINGREQ,
            acks(rng, version)]


def packet_state(data: bytes) -> str:
    """"whole", "incomplete" or "bad-length" (remaining length over the limit or a 5-byte varint)."""
    pos = 0
    while pos < len(data):
        pos += 1
        mult, length = 1, 0
        for i in range(4):
            if pos >= len(data):
                return "incomplete"
            byte = data[pos]
            pos += 1
            length += (byte & 0x7F) * mult
            mult *= 128
            if not byte & 0x80:
                break
            if i == 3:
                return "bad-length"
        if length > MAX_PACKET:
            return "bad-length"
        if pos + length > len(data):
            return "incomplete"
        pos += length
    return "whole"


class MqttTarget(SocketTarget):
    name = "mqtt"

    def __init__(self, deadline: float = 10.0) -> None:
        super().__init__(deadline)
        self.version = 4
        self.corpus: list[bytes] = []
        self.conn_budget = 0

    def broker_env(self) -> dict[str, str]:
        return {"SLUICE_TCP__ENABLED": "false",
                "SLUICE_INGEST__ROUTES": json.dumps(ROUTES)}

    def attach(self, broker: BrokerProcess, rng: random.Random) -> None:
        self.broker = broker
        if not self.corpus:
            for _ in range(200):
                v = rng.choice((4, 5))
                self.corpus += [connect(rng, v), *seed_packets(rng, v), disconnect(rng, v), auth(rng, v)]

    # ------------------------------------------------------------------ inputs

    def _connect_input(self, rng: random.Random) -> bytes:
        self.version = rng.choice((4, 5))
        roll = rng.random()
        if roll < 0.75:
            return connect(rng, self.version)
        if roll < 0.95:
            return mutate(connect(rng, self.version), rng, self.corpus)
        if roll < 0.97:  # a huge remaining length, honest or not
            lengths = (b"\xff\xff\xff\x7f", b"\xff\xff\xff\xff\x7f", encode_varint(MAX_PACKET + 1))
            return bytes((0x10,)) + rng.choice(lengths)
        if roll < 0.98:
            return bytes((0x10,)) + rng.choice((b"\x03", b"\x0c")) + b"\x00\x04MQTT\x06\x02\x00\x3c\x00\x00"[:3]
        return rng.randbytes(rng.choice((1, 2, 16, 200)))  # garbage before CONNECT

    def _packet_input(self, rng: random.Random) -> bytes:
        roll = rng.random()
        makers = (publish, publish, publish, subscribe, subscribe, unsubscribe, acks, disconnect, auth)
        if roll < 0.40:
            return rng.choice(makers)(rng, self.version)
        if roll < 0.50:
            return publish_run(rng, self.version)
        if roll < 0.90:
            return mutate(rng.choice(makers)(rng, self.version), rng, self.corpus)
        if roll < 0.93:
            return rng.choice((0x30, 0x82, 0xA2, 0xC0)).to_bytes(1, "big") + rng.choice(
                (b"\xff\xff\xff\x7f", encode_varint(MAX_PACKET + 1), b"\x80\x80\x80\x80\x01"))
        if roll < 0.96:  # a second CONNECT on a connection: a protocol error
            return connect(rng, self.version)
        if roll < 0.98:  # bad UTF-8 / null in a topic name
            return _packet(0x30, _s(rng.choice((b"\xc3\x28", b"a\x00b", b"\xed\xa0\x80", b"a/+/b", b"#"))) + b"x")
        body = rng.randbytes(rng.choice((0, 2, 8, 100)))
        return bytes((rng.randrange(256),)) + encode_varint(len(body)) + body

    # ------------------------------------------------------------------ connections

    def step(self, rng: random.Random) -> None:
        if self.sock is None or self.conn_budget <= 0:
            self._drop()
            assert self.broker is not None
            self.sock = self._open()
            self.conn_budget = rng.choice((1, 10, 100, 1000))
            data = self._connect_input(rng)
        else:
            data = self._packet_input(rng)
        self.conn_budget -= 1
        self.sent.append(data)
        state = packet_state(data)
        if state == "incomplete":
            try:
                self.sock.sendall(data)
            except OSError:
                self._drop()
                return
            if not closes_after_eof(self.sock, self.deadline):
                raise Hang(f"no close within {self.deadline:.1f} s after EOF in the middle of a packet")
            self._drop()
            return
        try:
            if rng.random() < _SPLIT_SHARE:
                send_split(self.sock, data + (PINGREQ if state == "whole" else b""), rng)
            else:
                self.sock.sendall(data + (PINGREQ if state == "whole" else b""))
        except OSError:
            self._drop()
            return
        if not self._await_pingresp(self.deadline):
            raise Hang(f"no PINGRESP and no close within {self.deadline:.1f} s ({state} input)")

    def _open(self) -> socket.socket:
        """A new fuzzing connection (plain MQTT here; ``mqtt_tls.py`` opens it through TLS)."""
        assert self.broker is not None
        sock = socket.create_connection(self.broker.endpoints["mqtt"], timeout=self.deadline)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _await_pingresp(self, limit: float) -> bool:
        assert self.sock is not None
        end = time.monotonic() + limit
        try:
            while True:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                self.sock.settimeout(remaining)
                first = recv_exactly(self.sock, 1)
                if first is None:
                    self._drop()
                    return True
                length, mult = 0, 1
                for _ in range(4):
                    b = recv_exactly(self.sock, 1)
                    if b is None:
                        self._drop()
                        return True
                    length += (b[0] & 0x7F) * mult
                    mult *= 128
                    if not b[0] & 0x80:
                        break
                body = recv_exactly(self.sock, length) if length else b""
                if body is None:
                    self._drop()
                    return True
                if first[0] == 0xD0:
                    return True
                if first[0] == 0xE0:
                    # the server's DISCONNECT: a client closes now; the server, lingering so that the
                    # DISCONNECT is read rather than reset, must then close at our EOF
                    closed = closes_after_eof(self.sock, max(end - time.monotonic(), 0.001))
                    self._drop()
                    return closed
        except TimeoutError:
            return False
        except OSError:
            self._drop()
            return True

    def flush(self) -> None:
        """Every input is answered before step returns: nothing pending."""

    def probe(self) -> bool:
        assert self.broker is not None
        return answer_contains(self.broker.endpoints["mqtt"], connect(random.Random(0), 4, "probe") + PINGREQ,
                               b"\xd0\x00", self.deadline)

    def client_check(self) -> list[str]:
        assert self.broker is not None
        host, port = self.broker.endpoints["mqtt"]
        topic = f"check/{uuid.uuid4().hex[:8]}"
        failures: list[str] = []
        for version in ("mqttv311", "mqttv5"):
            sub = subprocess.Popen(
                ["mosquitto_sub", "-h", host, "-p", str(port), "-V", version, "-t", topic, "-C", "1", "-W", "30",
                 "-q", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
            # mosquitto_sub prints nothing when subscribed; publish (retained) until it receives one
            got = b""
            for _ in range(20):
                pub = subprocess.run(
                    ["mosquitto_pub", "-h", host, "-p", str(port), "-V", version, "-t", topic, "-q", "1",
                     "-m", "after-fuzz"], capture_output=True, timeout=30,
                )
                if pub.returncode != 0:
                    failures.append(f"mosquitto_pub {version} failed: {pub.stderr.decode()[-300:]}")
                    break
                try:
                    got, err = sub.communicate(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    continue
            if sub.poll() is None:
                sub.kill()
                got, err = sub.communicate()
            if got.strip() != b"after-fuzz":
                failures.append(f"mosquitto_sub {version} got {got[:200]!r}")
        return failures
