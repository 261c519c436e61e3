"""A light MQTT 5 load generator for ``bench_mqtt``: raw sockets, pre-encoded packets, acks in bulk.

    python -m bench.mqtt_loadgen pub HOST PORT --connections 4 --messages 25000 --qos 1 [--window 1000]
    python -m bench.mqtt_loadgen sub HOST PORT --count 100000 --qos 1 [--filter bench/#]

Why: ``mosquitto_pub`` spends ~8 µs of CPU per QoS 1 message (libmosquitto's per-message bookkeeping),
about twice what the broker it measures spends, so on a 2-core machine it, not the broker, set the
QoS 1 rate. This generator does per-*chunk* work, not per-message work, and is used the same way for
every broker:

* **pub**: each connection (MQTT 5, clean start) gets its whole stream of PUBLISH packets encoded before
  the clock starts (distinct 100 B payloads, packet ids 1..65535 in turn). After ``go`` on stdin it
  sends slices of that stream, as much as the socket takes; at QoS 1 never more than ``window``
  messages beyond the last PUBACK, where ``window`` = min(``--window``, the Receive Maximum the broker's
  CONNACK advertises). PUBACKs are checked in bulk: the broker's bytes are compared with the PUBACKs
  expected (4-byte PUBACK, success, the packet ids in order) with one slice comparison per read; any
  other form (a reason code byte, properties) is decoded packet by packet, and a failure reason code,
  an id out of order or a DISCONNECT stops the run with an error. At the end: DISCONNECT, then wait for
  the broker to close the socket (so every byte was read by the broker).
* **sub**: one connection (MQTT 5, Receive Maximum 65535) subscribes to ``--filter`` at ``--qos`` and
  counts PUBLISH packets until ``--count``; at QoS 1 it answers each read's PUBLISHes with one write of
  their PUBACKs. Runs of equal-sized PUBLISH packets (one topic length, no properties) are taken apart
  with slices; anything else is decoded packet by packet.

Protocol with the parent: the child prints ``ready`` once connected (and subscribed), waits for a
``go`` line (pub only), and prints one JSON line when done: messages, seconds from ``go`` (pub) or from
the first PUBLISH (sub) to the last PUBACK / PUBLISH, and its own CPU seconds (user + system) over that
time, so the generator's cost per message is reported next to the broker's.
"""

from __future__ import annotations

import argparse
import json
import resource
import selectors
import socket
import sys
import time
from dataclasses import dataclass

from ingest.mqtt.codec import Decoder, encode
from ingest.mqtt.packets import (
    MQTT_5,
    Connack,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)

__all__ = ["Publisher", "encode_stream", "expected_acks", "main", "payload"]

SEND_CHUNK = 256 * 1024
RECV_SIZE = 256 * 1024
DISCONNECT = b"\xe0\x00"


def payload(tag: int, index: int, size: int) -> bytes:
    """The ``index``-th payload of publisher ``tag``: distinct, ``size`` bytes (as ``bench_mqtt.make_lines``)."""
    return f"p{tag:02d}-{index:08d}-".ljust(size, "x").encode()


def packet_id(index: int) -> int:
    return index % 65535 + 1


def encode_stream(topic: str, tag: int, count: int, qos: int, size: int) -> tuple[bytes, int]:
    """Every PUBLISH of one connection, MQTT 5 (no properties), and the size of one packet."""
    t = topic.encode()
    first = bytes((0x30 | (qos << 1),))
    parts: list[bytes] = []
    for i in range(count):
        pid = packet_id(i).to_bytes(2, "big") if qos else b""
        body = len(t).to_bytes(2, "big") + t + pid + b"\x00" + payload(tag, i, size)
        parts.append(first + _varint(len(body)) + body)
    return b"".join(parts), len(parts[0]) if parts else 0


def expected_acks(count: int) -> bytes:
    """The PUBACKs a broker sends for ``count`` QoS 1 messages of one stream in the shortest form."""
    return b"".join(b"\x40\x02" + packet_id(i).to_bytes(2, "big") for i in range(count))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, byte = n >> 7, n & 0x7F
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class BrokerError(RuntimeError):
    """The broker refused, failed or broke the stream."""


def _read_packet(sock: socket.socket, decoder: Decoder, want: type) -> object:
    while True:
        data = sock.recv(65536)
        if not data:
            raise BrokerError(f"closed while waiting for {want.__name__}")
        for packet in decoder.feed(data):
            if isinstance(packet, want):
                return packet
            raise BrokerError(f"expected {want.__name__}, got {packet!r}")


def _connect(host: str, port: int, client_id: str) -> tuple[socket.socket, Connack]:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(encode(Connect(client_id, MQTT_5, True, 600, properties=Properties(receive_maximum=65535)), MQTT_5))
    connack = _read_packet(sock, Decoder(MQTT_5), Connack)
    assert isinstance(connack, Connack)
    if connack.reason_code:
        raise BrokerError(f"CONNACK 0x{connack.reason_code:02x}")
    return sock, connack


@dataclass
class Publisher:
    """One publishing connection's progress through its pre-encoded stream (bytes, not messages)."""

    sock: socket.socket
    stream: memoryview
    packet_size: int
    count: int
    qos: int
    window: int
    acks: bytes  # the PUBACKs expected, in order (QoS 1)
    sent: int = 0  # bytes of ``stream`` sent
    acked: int = 0  # bytes of ``acks`` matched = 4 x messages acknowledged
    writing: bool = True
    slow: Decoder | None = None  # the broker's acks took another form: decoded one by one from here on
    finished: bool = False
    done_at: float = 0.0

    def limit(self) -> int:
        if not self.qos:
            return len(self.stream)
        return min(len(self.stream), (self.acked // 4 + self.window) * self.packet_size)

    def send(self) -> None:
        end = min(self.limit(), self.sent + SEND_CHUNK)
        if end > self.sent:
            try:
                self.sent += self.sock.send(self.stream[self.sent:end])
            except BlockingIOError:
                pass

    def received(self, data: bytes) -> None:
        """Acks (QoS 1) or a broker's DISCONNECT."""
        if self.slow is None and self.qos:
            end = self.acked + len(data)
            if self.acks[self.acked:end] == data:
                self.acked = end
                return
            # not the shortest form: decode from the start of the ack that did not match
            partial = self.acked % 4
            self.acked -= partial
            data = self.acks[self.acked:self.acked + partial] + data
            self.slow = Decoder(MQTT_5)
        decoder = self.slow
        if decoder is None:
            decoder = self.slow = Decoder(MQTT_5)
        for packet in decoder.feed(data):
            if isinstance(packet, Puback):
                index = self.acked // 4
                if packet.reason_code >= 0x80 or packet.packet_id != packet_id(index):
                    raise BrokerError(f"PUBACK {packet!r}, expected id {packet_id(index)} with success")
                self.acked += 4
            elif isinstance(packet, Disconnect):
                raise BrokerError(f"DISCONNECT 0x{packet.reason_code:02x} {packet.properties.reason_string}")
            else:
                raise BrokerError(f"unexpected {packet!r}")

    def all_acked(self) -> bool:
        return self.sent == len(self.stream) and (not self.qos or self.acked // 4 == self.count)


def run_publishers(args: argparse.Namespace) -> dict[str, object]:
    pubs: list[Publisher] = []
    advertised: list[int] = []
    for c in range(args.connections):
        tag = args.first_tag + c
        stream, size = encode_stream(args.topic.format(tag), tag, args.messages, args.qos, args.payload)
        sock, connack = _connect(args.host, args.port, f"loadgen-pub-{tag}")
        receive_max = connack.properties.receive_maximum or 65535
        advertised.append(receive_max)
        sock.setblocking(False)
        pubs.append(Publisher(sock, memoryview(stream), size, args.messages, args.qos,
                              min(args.window, receive_max), expected_acks(args.messages) if args.qos else b""))
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("no go")
    cpu0, start = _cpu(), time.perf_counter()
    sel = selectors.DefaultSelector()
    for p in pubs:
        sel.register(p.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, p)
    open_ = len(pubs)
    while open_:
        if args.batch_wait:  # let acks gather: each read and send then covers many messages
            time.sleep(args.batch_wait)
        for key, events in sel.select():
            p = key.data
            if events & selectors.EVENT_READ:
                data = p.sock.recv(RECV_SIZE)
                if not data:
                    if not p.finished:
                        raise BrokerError(f"connection closed after {p.sent} bytes, {p.acked // 4} acks")
                    sel.unregister(p.sock)
                    p.sock.close()
                    open_ -= 1
                    continue
                p.received(data)
            if not p.finished:
                if events & selectors.EVENT_WRITE:
                    p.send()
                wants_write = p.sent < p.limit()
                if p.all_acked():
                    p.done_at = time.perf_counter()
                    p.finished = True
                    p.sock.setblocking(True)
                    p.sock.sendall(DISCONNECT)
                    p.sock.setblocking(False)
                    p.sock.shutdown(socket.SHUT_WR)
                    wants_write = False
                if wants_write != p.writing:
                    p.writing = wants_write
                    sel.modify(p.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if wants_write else 0), p)
    cpu = _cpu() - cpu0
    total = args.connections * args.messages
    return {"role": "pub", "messages": total, "seconds": max(p.done_at for p in pubs) - start, "cpu_s": cpu,
            "window": min(p.window for p in pubs), "receive_maximum": min(advertised),
            "slow_acks": sum(p.slow is not None for p in pubs)}


# -------------------------------------------------------------------------------------------- subscriber
def _bulk_publishes(buf: bytes | memoryview, pos: int, size: int, header: bytes, id_at: int, acks: bytearray) -> int:
    """How many whole PUBLISH packets of ``size`` bytes, each starting with ``header``, lie at ``pos`` (all or
    none of a run: 0 when one differs); their PUBACKs are appended to ``acks`` when ``id_at`` >= 0."""
    n = (len(buf) - pos) // size
    if n == 0:
        return 0
    end = pos + n * size
    h = len(header)
    for k in range(h):  # the fixed header and topic length of every packet, one slice comparison per byte
        if bytes(buf[pos + k:end:size]) != header[k:k + 1] * n:
            return 0
    if id_at >= 0:
        ack = bytearray(4 * n)
        ack[0::4] = b"\x40" * n
        ack[1::4] = b"\x02" * n
        ack[2::4] = buf[pos + id_at:end:size]
        ack[3::4] = buf[pos + id_at + 1:end:size]
        acks += ack
    return n


def run_subscriber(args: argparse.Namespace) -> dict[str, object]:
    sock, _ = _connect(args.host, args.port, "loadgen-sub")
    sock.sendall(encode(Subscribe(1, (Subscription(args.filter, args.qos),)), MQTT_5))
    suback = _read_packet(sock, Decoder(MQTT_5), Suback)
    assert isinstance(suback, Suback)
    if suback.reason_codes[0] >= 0x80:
        raise BrokerError(f"SUBACK 0x{suback.reason_codes[0]:02x}")
    print("ready", flush=True)
    topic_len = len(args.topic.format(0).encode())
    body = 2 + topic_len + (2 if args.qos else 0) + 1 + args.payload
    header = bytes((0x30 | (args.qos << 1),)) + _varint(body) + topic_len.to_bytes(2, "big")
    size = len(header) - 2 + body
    id_at = len(header) + topic_len if args.qos else -1
    received = 0
    buf = b""
    decoder = Decoder(MQTT_5)  # for whatever is not a run of equal-sized PUBLISH packets (fed whole packets)
    first_at = cpu0 = 0.0
    sock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    while received < args.count:
        if not sel.select(args.idle_timeout):
            raise BrokerError(f"nothing for {args.idle_timeout} s after {received} messages")
        if args.batch_wait and first_at:  # let more gather: one read and one ack write cover many messages
            time.sleep(args.batch_wait)
        data = _recv_all(sock)
        if not data:
            raise BrokerError(f"closed after {received} messages")
        if not first_at:
            first_at, cpu0 = time.perf_counter(), _cpu()
        buf = buf + data if buf else data
        acks = bytearray()
        pos = 0
        while pos < len(buf):
            n = _bulk_publishes(buf, pos, size, header, id_at, acks)
            if n:
                received += n
                pos += n * size
                continue
            # one packet the slow way (or the partial tail of a run)
            rest = memoryview(buf)[pos:]
            need = _packet_length(rest)
            if need == 0 or need > len(rest):
                break
            for packet in decoder.feed(bytes(rest[:need])):
                if not isinstance(packet, Publish):
                    raise BrokerError(f"unexpected {packet!r}")
                received += 1
                if packet.qos == 1 and packet.packet_id:
                    acks += b"\x40\x02" + packet.packet_id.to_bytes(2, "big")
            pos += need
        buf = buf[pos:]
        if acks:
            sock.setblocking(True)
            sock.sendall(acks)
            sock.setblocking(False)
    done = time.perf_counter()
    cpu = _cpu() - cpu0
    sock.setblocking(True)
    sock.sendall(DISCONNECT)
    sock.close()
    return {"role": "sub", "messages": received, "seconds": done - first_at, "cpu_s": cpu, "done_at": time.time()}


def _recv_all(sock: socket.socket) -> bytes:
    """What the socket holds now (b"" at EOF)."""
    parts: list[bytes] = []
    while True:
        try:
            data = sock.recv(RECV_SIZE)
        except BlockingIOError:
            break
        if not data:
            if not parts:
                return b""
            break
        parts.append(data)
        if len(data) < RECV_SIZE:
            break
    return b"".join(parts)


def _packet_length(buf: memoryview) -> int:
    """The whole length of the packet at the start of ``buf``, or 0 while its fixed header is incomplete."""
    rl, shift = 0, 0
    for i in range(1, min(len(buf), 5)):
        byte = buf[i]
        rl |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return i + 1 + rl
        shift += 7
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=("pub", "sub"))
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--qos", type=int, choices=(0, 1), default=1)
    parser.add_argument("--payload", type=int, default=100, help="bytes per message")
    parser.add_argument("--topic", default="bench/dev{:03d}/reading", help="format string: publisher number")
    parser.add_argument("--connections", type=int, default=4, help="pub: connections in this process")
    parser.add_argument("--first-tag", type=int, default=0, help="pub: number of this process's first connection")
    parser.add_argument("--messages", type=int, default=25_000, help="pub: per connection")
    parser.add_argument("--window", type=int, default=1000, help="pub: QoS 1 messages in flight per connection")
    parser.add_argument("--batch-wait", type=float, default=0.001,
                        help="seconds to let data gather between reads (0: react to every byte)")
    parser.add_argument("--count", type=int, default=0, help="sub: messages to receive")
    parser.add_argument("--filter", default="bench/#", help="sub: topic filter")
    parser.add_argument("--idle-timeout", type=float, default=20.0, help="sub: give up after this long without data")
    args = parser.parse_args(argv)
    try:
        result = run_publishers(args) if args.role == "pub" else run_subscriber(args)
    except (BrokerError, OSError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        raise SystemExit(1) from exc
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
