"""TCP line front door: NDJSON, InfluxDB line protocol and CSV lines, well-formed, mutated and hostile
(garbage, invalid UTF-8, deep nesting, huge numbers and timestamps, lines past ``max_line_bytes``).

Three listeners run in ack mode (ndjson, influx, csv), three without acks (raw ndjson, raw influx, raw csv:
reads routed together by the default rules, ``ingest/line_routes.py``, ``ingest/csv_lines.py``). On an ack listener
the input is followed by a newline and a sentinel line; the server acknowledges lines in order (``ACK
<line>``), so an ACK covering the sentinel (or a FATAL/close) ends the input; ``ERR`` lines are expected
for bad input. The no-ack listeners get inputs and a close: only the broker log and the probes judge it.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import subprocess
import time
import uuid
from typing import Any

from bench.fuzz.harness import BrokerProcess, Hang, SocketTarget, answer_contains, send_split
from bench.fuzz.mutate import mutate

__all__ = ["LISTENERS", "ROUTES", "TcpTarget", "hostile_line", "valid_line"]

LISTENERS = [
    {"name": "influx", "port": 0, "format": "influx", "ack": True},
    {"name": "csv", "port": 0, "format": "csv", "ack": True},
    {"name": "raw", "port": 0, "format": "ndjson", "ack": False},
    # no ack and the default rules: reads of InfluxDB lines are routed together (ingest/line_routes.py)
    {"name": "raw-influx", "port": 0, "format": "influx", "ack": False},
    # no ack and the default rules: CSV rows routed a read at a time (ingest/csv_lines.py)
    {"name": "raw-csv", "port": 0, "format": "csv", "ack": False},
]
ROUTES = [
    {"name": "tcp-json", "source": "tcp", "source_name": "default", "topic": "tcp-json", "format": "json",
     "key": "field:device", "time_field": "ts", "time_format": "epoch_ms", "value": "json"},
    {"name": "tcp-influx", "source": "tcp", "source_name": "influx", "topic": "tcp-influx", "key": "series",
     "time_field": "timestamp", "time_format": "epoch_ns"},
    {"name": "tcp-csv", "source": "tcp", "source_name": "csv", "topic": "tcp-csv", "key": "field:device",
     "time_field": "ts", "time_format": "rfc3339"},
]
MAX_LINE = 64 * 1024
ENDPOINTS = {"ndjson": "tcp", "influx": "tcp:influx", "csv": "tcp:csv", "raw": "tcp:raw",
             "raw-influx": "tcp:raw-influx", "raw-csv": "tcp:raw-csv"}
_NO_ACK = ("raw", "raw-influx", "raw-csv")
CSV_HEADER = b"device,ts,temp"
_PIPELINE = 8  # inputs sent before waiting for the ACK that covers them
_SPLIT_SHARE = 0.3  # inputs sent in pieces (lines split across reads, a read ending inside a CR LF)


def valid_line(rng: random.Random, fmt: str) -> bytes:
    fmt = {"raw-influx": "influx", "raw-csv": "csv"}.get(fmt, fmt)
    if fmt in ("ndjson", "raw"):
        doc: dict[str, Any] = {
            "device": rng.choice(("d1", "d2", "pump-7")),
            "ts": 1_700_000_000_000 + rng.randrange(10**6),
            "temp": rng.uniform(-40, 60),
        }
        if rng.random() < 0.3:
            doc["nested"] = {"a": [1, 2, {"b": None}], "s": "\u00e9\u4e2d"}
        if rng.random() < 0.5:  # the default rules' fields: key (device_id) and the sensors topic (sensor)
            doc["device_id"] = rng.choice(("pump-7", "d\u00e9", "", 7, None, "x" * 300))
        if rng.random() < 0.2:
            doc["sensor"] = rng.choice(("sensor_1", "s2", 3, {"x": 1}))
        return json.dumps(doc).encode()
    if fmt == "influx":
        ts = rng.choice(("", " 1700000000000000000", f" {1_700_000_000_000_000_000 + rng.randrange(10**9)}"))
        tags = rng.choice(("", ",station=s1", ",a=b,c=d\\ e"))
        fields = rng.choice(("temp=21.5", "temp=21i,ok=true", 'msg="hi \\"there\\""', "a=1u,b=-2.5e3"))
        return f"weather{tags} {fields}{ts}".encode()
    ts = rng.choice(("2024-05-01T10:00:00Z", "2024-05-01T10:00:00.123+02:00", "2024-05-01"))
    return f"{rng.choice(('d1', 'd2'))},{ts},{rng.uniform(-40, 60):.2f}".encode()


def hostile_line(rng: random.Random, fmt: str) -> bytes:
    common = [
        b"\xff\xfe\xfd", b"\x00" * 10, b"", b"#comment", b" " * 100, b"\r", rng.randbytes(rng.choice((1, 50, 500))),
        b"x" * rng.choice((MAX_LINE - 1, MAX_LINE, MAX_LINE + 1, 200_000)),
    ]
    per_format = {
        "ndjson": [b"[" * 30000, b"{" * 30000, b'{"a":' * 5000, b'{"ts": 1e400}', b'{"ts": 99999999999999999999999}',
                   b'{"ts": -1}', b'{"ts": "2024"}', b'{"device": {"x": 1}}', b"123", b'"str"', b"null", b"[]",
                   b'{"ts": 1700000000000, "device": null}', b'{"a": "\\ud800"}', b'{"a": 1}{"b": 2}',
                   b'{"ts": ' + b"9" * 5000 + b"}", b'{"device": "' + b"d" * 60000 + b'"}'],
        "influx": [b"m", b"m f", b"m f=", b"m,=x f=1", b"m f=1 99999999999999999999999999",
                   b"m f=1 -9223372036854775809", b"m f=1i 9223372036854775808", b"m f=1e400",
                   b'm f="unterminated', b"\\" * 1000, b"m,t=a\\ f=1",
                   b"m f=1," * 3000, b",t=1 f=1", b"m f=99999999999999999999999i", b"m f=nan", b"m f=1 1e9"],
        "csv": [b'"unterminated', b",,,,,,,,", b"a," * 10000, b'"a""b",c', b"d1,not-a-time,1",
                b"d1,9999-99-99T99:99:99Z,x", b"d1,2024-05-01T10:00:00Z", b"d1,2024-05-01T10:00:00Z,1,extra",
                b"\x00,\x00,\x00",
                b"d1,+275760-09-13T00:00:00Z,1"],
    }
    return rng.choice(common + per_format[{"raw": "ndjson", "raw-influx": "influx", "raw-csv": "csv"}.get(fmt, fmt)])


class TcpTarget(SocketTarget):
    name = "tcp"

    def __init__(self, deadline: float = 10.0) -> None:
        super().__init__(deadline)
        self.fmt = "ndjson"
        self.lines = 0  # newlines sent on this connection
        self.buffer = b""  # answers not yet consumed
        self.conn_budget = 0
        self.unacked = 0  # inputs sent since the last ACK wait
        self.corpus: list[bytes] = []

    def broker_env(self) -> dict[str, str]:
        return {"SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ACK": "true", "SLUICE_TCP__FORMAT": "ndjson",
                "SLUICE_TCP__LISTENERS": json.dumps(LISTENERS), "SLUICE_INGEST__ROUTES": json.dumps(ROUTES)}

    def attach(self, broker: BrokerProcess, rng: random.Random) -> None:
        self.broker = broker
        if not self.corpus:
            self.corpus = [valid_line(rng, f) for f in ("ndjson", "influx", "csv") for _ in range(50)]

    def next_input(self, rng: random.Random) -> bytes:
        roll = rng.random()
        if roll < 0.30:
            lines = [valid_line(rng, self.fmt) for _ in range(rng.choice((1, 1, 2, 10, 100)))]
        elif roll < 0.55:
            lines = [hostile_line(rng, self.fmt)]
        elif roll < 0.85:
            lines = [mutate(valid_line(rng, self.fmt), rng, self.corpus)]
        elif roll < 0.90:  # valid lines around a hostile one: the neighbours must survive
            lines = [valid_line(rng, self.fmt), hostile_line(rng, self.fmt), valid_line(rng, self.fmt)]
        elif roll < 0.95:  # one read of many lines, valid, hostile and mutated mixed (the whole-read routes)
            makers = (valid_line, valid_line, valid_line, hostile_line,
                      lambda r, f: mutate(valid_line(r, f), r, self.corpus))
            lines = [rng.choice(makers)(rng, self.fmt) for _ in range(rng.choice((5, 30, 200)))]
        else:
            return rng.randbytes(rng.choice((1, 100, 5000)))
        if rng.random() < 0.7:
            end = rng.choice((b"\n", b"\n", b"\r\n"))
            return end.join(lines) + end
        # a CR/LF mix: each line its own ending, stray CRs before and after the LF
        return b"".join(line + rng.choice((b"\n", b"\r\n", b"\r\r\n", b"\n\r", b"\r\n\r\n")) for line in lines)

    def step(self, rng: random.Random) -> None:
        if self.sock is None or self.conn_budget <= 0:
            self._drop()
            assert self.broker is not None
            self.fmt = rng.choice(("ndjson", "ndjson", "influx", "csv", "raw", "raw-influx", "raw-csv"))
            self.sock = self._open(ENDPOINTS[self.fmt])
            self.conn_budget = rng.choice((1, 10, 100, 1000))
            self.lines = 0
            self.unacked = 0
            self.buffer = b""
            if self.fmt in ("csv", "raw-csv") and rng.random() < 0.9:
                self._send(CSV_HEADER + b"\n")
        self.conn_budget -= 1
        data = self.next_input(rng)
        sentinel = b"\n" + valid_line(rng, self.fmt) + b"\n"
        if not self._send(data + sentinel, rng):
            return
        if self.fmt in _NO_ACK:
            if self.conn_budget <= 0 or rng.random() < 0.05:
                self._drop()
            return
        self.unacked += 1
        if self.unacked >= _PIPELINE or self.conn_budget <= 0:
            self.flush()

    def flush(self) -> None:
        """Wait for the ACK that covers every line sent (or FATAL / the close)."""
        if self.sock is None or not self.unacked:
            return
        count, self.unacked = self.unacked, 0
        if not self._await_ack(self.lines):
            raise Hang(f"no ACK {self.lines} and no close within {self.deadline:.1f} s ({self.fmt}, {count} inputs)")

    def _send(self, data: bytes, rng: random.Random | None = None) -> bool:
        assert self.sock is not None
        self.sent.append(data)
        self.lines += data.count(b"\n")
        try:
            if rng is not None and rng.random() < _SPLIT_SHARE:
                send_split(self.sock, data, rng)
            else:
                self.sock.sendall(data)
            return True
        except OSError:
            self._drop()
            return False

    def _await_ack(self, line: int) -> bool:
        assert self.sock is not None
        end = time.monotonic() + self.deadline
        try:
            while True:
                while b"\n" in self.buffer:
                    answer, self.buffer = self.buffer.split(b"\n", 1)
                    if answer.startswith(b"ACK ") and int(answer[4:]) >= line:
                        return True
                    if answer.startswith(b"FATAL"):
                        self._drop()
                        return True
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                self.sock.settimeout(remaining)
                chunk = self.sock.recv(65536)
                if not chunk:
                    self._drop()
                    return True
                self.buffer += chunk
        except TimeoutError:
            return False
        except OSError:
            self._drop()
            return True

    def _open(self, endpoint: str) -> socket.socket:
        """A new connection to a line listener (``tls.py`` opens it through TLS)."""
        assert self.broker is not None
        return socket.create_connection(self.broker.endpoints[endpoint], timeout=self.deadline)

    def kcat_options(self) -> list[str]:
        return []

    def send_line(self, line: bytes) -> bytes:
        """A real client's round trip on the ndjson listener: nc sends ``line`` and prints the answers."""
        assert self.broker is not None
        host, port = self.broker.endpoints["tcp"]
        sent = subprocess.run(["nc", "-q", "5", host, str(port)], input=line, capture_output=True, timeout=30)
        return sent.stdout + sent.stderr

    def probe(self) -> bool:
        assert self.broker is not None
        return answer_contains(self.broker.endpoints["tcp"], b'{"device": "probe", "ts": 1700000000000}\n',
                               b"ACK 1", self.deadline)

    def client_check(self) -> list[str]:
        """nc sends a line in ack mode; kcat finds it in the topic its route names."""
        assert self.broker is not None
        marker = uuid.uuid4().hex
        line = json.dumps({"device": "check", "ts": 1_700_000_000_000, "marker": marker}).encode() + b"\n"
        failures = []
        answer = self.send_line(line)
        if b"ACK 1" not in answer:
            failures.append(f"the line client got {answer[:300]!r} instead of ACK 1")
        khost, kport = self.broker.endpoints["kafka"]
        with contextlib.suppress(subprocess.TimeoutExpired):
            read = subprocess.run(["kcat", "-b", f"{khost}:{kport}", *self.kcat_options(), "-C", "-t", "tcp-json",
                                   "-o", "-2000", "-e", "-q"], capture_output=True, timeout=60)
            if marker.encode() not in read.stdout:
                failures.append(f"kcat did not find the nc line in tcp-json: {read.stderr.decode()[-300:]}")
        return failures
