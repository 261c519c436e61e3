"""``python -m bench.fuzz.tcp_turns --rounds R --connections K --seed S``: many TCP connections sending in the
same event-loop turn, some of them garbage, against one ``sluice serve``: the shared per-turn write of line
ingest (``ingest/line_turns.py``: the reads of a source that arrive together are one write).

Each round opens ``K`` connections to an ack-mode NDJSON listener and ``K/2`` to an ack-mode CSV listener,
then sends on every connection back to back (so that their reads land in the same loop turns) and only
then reads the answers. About a third of the connections are hostile: their valid lines are mixed with the
TCP campaign's hostile lines (``bench/fuzz/tcp.py``: invalid UTF-8, NULs, lines past the limit, deep
nesting, bad quotes, CR mixes) and, on CSV, a hostile header now and then (quotes, CR, invalid UTF-8, a
repeated or empty column, a BOM). Every line carries a unique marker.

Checks: every connection gets its ``ACK`` (or ``FATAL`` and a close) within the deadline; a clean
connection gets no ``ERR`` and an ``ACK`` of exactly its last line; on a hostile connection no valid line is
answered ``ERR`` (after a valid header); every valid line an ``ACK`` covered is read back from its topic
byte-identical, exactly once (confluent-kafka, from the beginning); the broker log holds no ERROR/CRITICAL
record or traceback. Exit code 1 on a finding.
"""

from __future__ import annotations

import argparse
import json
import random
import select
import socket
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.fuzz.harness import BrokerProcess
from bench.fuzz.tcp import hostile_line

__all__ = ["Conn", "main"]

LISTENERS = [
    {"name": "turns-json", "port": 0, "format": "ndjson", "ack": True},
    {"name": "turns-csv", "port": 0, "format": "csv", "ack": True},
]
ROUTES = [
    {"name": "turns-json", "source": "tcp", "source_name": "turns-json", "topic": "turns-json",
     "key": "field:device"},
    {"name": "turns-csv", "source": "tcp", "source_name": "turns-csv", "topic": "turns-csv", "key": "field:device"},
]
CSV_HEADER = b"device,marker,temp"
HOSTILE_HEADERS = (b'"device,marker,temp', b"device,device,temp", b"device,,temp", b"\xef\xbb\xbfdevice,marker,temp",
                   b"dev\xffice,marker,temp", b"device,marker\r,temp", b'"dev""ice",marker,temp', b"", b",",
                   b"device\x00,marker,temp", b"a" * 70_000)


@dataclass
class Conn:
    fmt: str  # "ndjson" | "csv"
    hostile: bool
    sock: socket.socket
    valid: dict[int, bytes] = field(default_factory=dict)  # line number -> line (without its ending)
    last_line: int = 0
    header_ok: bool = True
    buffer: bytes = b""
    acked: int = 0
    errs: list[int] = field(default_factory=list)
    fatal: bytes = b""
    closed: bool = False


def _valid(fmt: str, marker: str, rng: random.Random) -> bytes:
    device = rng.choice(("d1", "d2", "pump-7", "d\u00e9"))
    if fmt == "ndjson":
        return json.dumps({"device": device, "marker": marker, "temp": rng.uniform(-40, 60)}).encode()
    return f"{device},{marker},{rng.uniform(-40, 60):.2f}".encode()


def _payload(conn: Conn, rng: random.Random, round_: int, index: int) -> bytes:
    """The bytes one connection sends in a round; records its valid lines by number."""
    parts: list[bytes] = []
    line = 0
    if conn.fmt == "csv":
        header = CSV_HEADER
        if conn.hostile and rng.random() < 0.3:
            header = rng.choice(HOSTILE_HEADERS)
            conn.header_ok = False
        parts.append(header + b"\n")
        line += 1
    for i in range(rng.choice((1, 2, 5, 20, 60))):
        line += 1
        if conn.hostile and rng.random() < 0.4:
            bad = hostile_line(rng, conn.fmt).replace(b"\n", b" ")
            # a bare CR ends a hostile line now and then: the next line must not inherit it
            parts.append(bad + rng.choice((b"\n", b"\r\n", b"\r\r\n")))
            continue
        good = _valid(conn.fmt, f"r{round_}-c{index}-l{i}", rng)
        conn.valid[line] = good
        parts.append(good + b"\n")
    conn.last_line = line
    return b"".join(parts)


def _read_answers(conns: list[Conn], deadline: float) -> None:
    """Read every connection's answers until its ACK of its last line, a FATAL, a close or the deadline."""
    waiting = [c for c in conns if not c.closed]
    while waiting and time.monotonic() < deadline:
        ready, _, _ = select.select([c.sock for c in waiting], [], [], 0.2)
        for conn in waiting:
            if conn.sock not in ready:
                continue
            try:
                chunk = conn.sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                conn.closed = True
                continue
            conn.buffer += chunk
            while b"\n" in conn.buffer:
                answer, conn.buffer = conn.buffer.split(b"\n", 1)
                if answer.startswith(b"ACK "):
                    conn.acked = max(conn.acked, int(answer[4:]))
                elif answer.startswith(b"ERR "):
                    conn.errs.append(int(answer.split(b" ", 2)[1]))
                elif answer.startswith(b"FATAL"):
                    conn.fatal = answer
        waiting = [c for c in waiting if not c.closed and c.acked < c.last_line]


def _judge(conns: list[Conn], expected: Counter[bytes]) -> list[str]:
    """Per connection what the answers must show; adds the acknowledged valid lines to ``expected``."""
    failures = []
    for i, conn in enumerate(conns):
        label = f"{conn.fmt} connection {i} ({'hostile' if conn.hostile else 'clean'})"
        if conn.acked < conn.last_line and not conn.fatal and not conn.closed:
            failures.append(f"{label}: no ACK {conn.last_line} (last ACK {conn.acked}) and no close: a hang")
        if not conn.hostile and (conn.errs or conn.fatal or conn.acked != conn.last_line):
            failures.append(f"{label}: ERR {conn.errs[:5]} FATAL {conn.fatal[:100]!r} ACK {conn.acked} "
                            f"of {conn.last_line} lines, all valid")
        if conn.header_ok:
            wrong = sorted(set(conn.errs) & set(conn.valid))
            if wrong:
                failures.append(f"{label}: valid lines {wrong[:5]} answered ERR: {conn.valid[wrong[0]][:100]!r}")
            for number, line in conn.valid.items():
                if number <= conn.acked and number not in conn.errs:
                    expected[line] += 1
    return failures


def _read_back(broker: BrokerProcess, topics: list[str], expected: Counter[bytes]) -> list[str]:
    """Every acknowledged valid line must be in its topic exactly once, byte for byte."""
    from confluent_kafka import Consumer, TopicPartition

    host, port = broker.endpoints["kafka"]
    consumer = Consumer({"bootstrap.servers": f"{host}:{port}", "group.id": "turns-check",
                         "enable.auto.commit": False})
    stored: Counter[bytes] = Counter()
    try:
        metadata = consumer.list_topics(timeout=30)
        parts = [TopicPartition(t, p, 0) for t in topics if t in metadata.topics for p in metadata.topics[t].partitions]
        ends = {}
        for tp in parts:
            _, high = consumer.get_watermark_offsets(tp, timeout=30)
            ends[(tp.topic, tp.partition)] = high
        consumer.assign(parts)
        remaining = {k for k, v in ends.items() if v > 0}
        deadline = time.monotonic() + 120
        while remaining and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                if message.error():
                    continue
                stored[message.value()] += 1
                if message.offset() + 1 >= ends[(message.topic(), message.partition())]:
                    remaining.discard((message.topic(), message.partition()))
    finally:
        consumer.close()
    failures = []
    missing = [line for line in expected if stored[line] == 0]
    twice = [line for line, n in expected.items() if stored[line] > n]
    if missing:
        failures.append(f"{len(missing)} acknowledged lines not read back, e.g. {missing[0][:120]!r}")
    if twice:
        failures.append(f"{len(twice)} acknowledged lines stored more than once, e.g. {twice[0][:120]!r}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz.tcp_turns", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--connections", type=int, default=64, help="NDJSON connections per round (CSV: half)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--deadline", type=float, default=30.0, help="seconds a round's answers may take")
    parser.add_argument("--out", type=Path, default=None, help="work directory (broker log and data)")
    args = parser.parse_args(argv)
    work = args.out or Path(tempfile.mkdtemp(prefix="sluice-fuzz-turns-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    broker = BrokerProcess({"SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ACK": "true",
                            "SLUICE_TCP__LISTENERS": json.dumps(LISTENERS),
                            "SLUICE_INGEST__ROUTES": json.dumps(ROUTES)}, work)
    broker.start()
    failures: list[str] = []
    expected: Counter[bytes] = Counter()
    lines = 0
    try:
        for round_ in range(args.rounds):
            conns = [Conn(fmt, rng.random() < 0.35, socket.create_connection(broker.endpoints[f"tcp:turns-{key}"]))
                     for fmt, key, n in (("ndjson", "json", args.connections), ("csv", "csv", args.connections // 2))
                     for _ in range(n)]
            payloads = [_payload(c, rng, round_, i) for i, c in enumerate(conns)]
            for conn, payload in zip(conns, payloads, strict=True):  # back to back: the same loop turns
                try:
                    conn.sock.sendall(payload)
                except OSError:
                    conn.closed = True
            _read_answers(conns, time.monotonic() + args.deadline)
            failures += [f"round {round_}: {f}" for f in _judge(conns, expected)]
            lines += sum(c.last_line for c in conns)
            for conn in conns:
                conn.sock.close()
            if broker.exited() is not None:
                failures.append(f"round {round_}: the broker exited with {broker.exited()}")
                break
        if broker.exited() is None:
            failures += _read_back(broker, ["turns-json", "turns-csv"], expected)
        failures += [f"broker log: {r[:1500]}" for r in broker.new_log_findings(final=True)]
    finally:
        broker.stop()
    for failure in failures[:20]:
        print(failure, flush=True)
    print(f"{args.rounds} rounds x {args.connections + args.connections // 2} connections, {lines} lines, "
          f"{sum(expected.values())} acknowledged valid lines checked, seed {args.seed}: {len(failures)} findings; "
          f"broker log {broker.log_path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
