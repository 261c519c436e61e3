"""Kafka front door: random frames, valid length + random body, and mutations of well-formed requests.

Well-formed requests come from two places: frames captured from real clients (kcat, confluent-kafka,
aiokafka, kafka-python) by ``python -m bench.fuzz.capture`` into ``corpus/kafka-clients.bin``, and
requests of every API and version the broker serves, drawn by hypothesis from kio's dataclasses (the
official Kafka schemas) with valid RecordBatches in the record fields.

One input is one or more frames. After a well-framed input the fuzzer sends an ApiVersions request (the
sentinel) and reads responses until the sentinel's answer or the close: Kafka answers in request order,
so the sentinel's answer proves every frame of the input was dealt with (acks=0 Produce answers nothing).
An input whose last frame is incomplete gets no sentinel (the broker rightly waits for the rest); the
connection is closed. Requests that may legitimately wait (Fetch ``max_wait``, JoinGroup/SyncGroup
rebalances) are given their declared wait; when that is longer than the deadline the connection is parked
(kept open a while, then closed), which exercises the close-while-pending path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import random
import socket
import struct
import subprocess
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from bench.fuzz.harness import BrokerProcess, Hang, SocketTarget, closes_after_eof, recv_exactly, send_split
from bench.fuzz.kafka_verify import verified_pipeline
from bench.fuzz.mutate import mutate
from broker.protocol.kafka import (
    SUPPORTED_APIS,
    ApiKey,
    MalformedRequestError,
    RequestHeader,
    UnsupportedRequestError,
    decode_request,
    encode_request,
    is_flexible,
)
from broker.protocol.records import Compression, RecordSpec, encode_batch

__all__ = ["KafkaTarget", "generated_requests", "load_captured"]

CORPUS = Path(__file__).resolve().parent / "corpus" / "kafka-clients.bin"
TOPICS = ("fuzz", "fuzz-b", "t")
GROUPS = ("fuzz-g", "g2")
_SENTINEL_BASE = 0x7F000000
_MAX_REQUEST = 100 * 1024 * 1024  # kafka.max_request_bytes default: longer lengths must be refused
_PARK_SECONDS = 5.0
_MAX_PARKED = 64
_LONG_WAIT_GRACE = 0.5
_PIPELINE = 16  # decodable requests sent before the sentinel
_PIPELINE_MAX_WAIT = 1.0  # requests that may wait longer are sent one at a time
_VERIFY_SHARE = 0.02  # inputs that are a verified Produce pipeline (kafka_verify.py)
_SPLIT_SHARE = 0.2  # inputs sent in pieces, each piece its own read


def load_captured(path: Path = CORPUS) -> list[bytes]:
    """The frames (size prefix included) in a capture file: concatenated Kafka request frames."""
    if not path.exists():
        return []
    data = path.read_bytes()
    frames: list[bytes] = []
    pos = 0
    while pos + 4 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        frames.append(data[pos : pos + 4 + size])
        pos += 4 + size
    return frames


def _batches(rng: random.Random) -> bytes:
    out = []
    for _ in range(rng.choice((1, 1, 1, 2))):
        records = [
            RecordSpec(
                value=rng.randbytes(rng.choice((0, 4, 64, 300))) if rng.random() < 0.9 else None,
                key=rng.choice((None, b"k", rng.randbytes(8))),
                headers=(("h", b"v"),) if rng.random() < 0.2 else (),
            )
            for _ in range(rng.choice((1, 1, 2, 5, 20)))
        ]
        idempotent = rng.random() < 0.2
        out.append(
            encode_batch(
                records,
                compression=rng.choice(list(Compression)),
                producer_id=rng.randrange(1000) if idempotent else -1,
                producer_epoch=0 if idempotent else -1,
                base_sequence=rng.randrange(100) if idempotent else -1,
            )
        )
    return b"".join(out)


def generated_requests(per_version: int, seed: int) -> list[bytes]:
    """Hypothesis-drawn requests of every supported API and version, encoded as frames."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from kio.index import load_request_schema
    from kio.schema.types import GroupId, TopicName
    from kio.static.primitive import Records

    rng = random.Random(seed)
    st.register_type_strategy(Records, st.builds(lambda s: Records(_batches(random.Random(s))), st.integers()))
    st.register_type_strategy(TopicName, st.one_of(st.sampled_from(TOPICS), st.text(max_size=20)))
    st.register_type_strategy(GroupId, st.one_of(st.sampled_from(GROUPS), st.text(max_size=20)))
    frames: list[bytes] = []
    for key, spec in sorted(SUPPORTED_APIS.items()):
        for version in range(spec.min_version, spec.max_version + 1):
            cls = load_request_schema(key, version)
            drawn: list[Any] = []
            draw_into = drawn.append

            @hseed(seed * 1000 + key * 50 + version)
            @settings(
                max_examples=per_version,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.generate],
            )
            @given(st.from_type(cls))
            def collect(entity: Any) -> None:
                draw_into(entity)  # noqa: B023 (called right here, in this iteration)

            collect()
            for entity in drawn:
                entity = _tame(entity, rng)
                header = RequestHeader(key, version, rng.randrange(1 << 20), rng.choice(("fuzz", None, "")),
                                       is_flexible(key, version))
                with contextlib.suppress(Exception):  # a drawn value kio cannot write (out of range)
                    frames.append(encode_request(header, entity))
    return frames


@functools.cache
def _generated(per_version: int) -> list[bytes]:
    """Drawn once per process: every connection of a campaign mutates the same well-formed requests."""
    return generated_requests(per_version, seed=1)


def _tame(entity: Any, rng: random.Random) -> Any:
    """Mostly short waits, so the campaign does not spend its time in long polls (mutations undo this)."""
    changes: dict[str, Any] = {}
    for name in ("max_wait", "timeout"):
        if hasattr(entity, name) and rng.random() < 0.9:
            changes[name] = datetime.timedelta(milliseconds=rng.choice((0, 1, 10, 100)))
    for name in ("session_timeout", "rebalance_timeout"):
        if hasattr(entity, name) and rng.random() < 0.9:
            changes[name] = datetime.timedelta(milliseconds=rng.choice((6000, 10000)))
    return dataclasses.replace(entity, **changes) if changes else entity


def _sentinel(corr: int) -> bytes:
    return encode_request(RequestHeader(ApiKey.API_VERSIONS, 0, corr, "fuzz-sentinel"), {})


def _declared_wait(frame: bytes) -> tuple[float, bool]:
    """(seconds the broker may rightly hold this request before answering, whether it decodes at all)."""
    try:
        request = decode_request(frame[4:])
    except (MalformedRequestError, UnsupportedRequestError, Exception):
        return 0.0, False
    body = request.body
    key = request.header.api_key

    def seconds(value: Any) -> float:
        if isinstance(value, datetime.timedelta):
            return max(0.0, value.total_seconds())
        return max(0.0, float(value) / 1000) if isinstance(value, int) else 0.0

    if key == ApiKey.FETCH:
        return seconds(getattr(body, "max_wait", 0)), True
    if key == ApiKey.PRODUCE:
        return seconds(getattr(body, "timeout", 0)), True
    if key in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP):
        # a join waits for the rebalance (bounded by the members' timeouts); a sync for the leader
        longest = max(seconds(getattr(body, "rebalance_timeout", 0)), seconds(getattr(body, "session_timeout", 0)))
        return 3.0 + max(longest, 30.0), True
    return 0.0, True


def split_frames(data: bytes) -> tuple[list[bytes], str]:
    """(complete frames, state) where state is "whole", "incomplete" or "bad-length"."""
    frames: list[bytes] = []
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            return frames, "incomplete"
        size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
        if size < 0 or size > _MAX_REQUEST:
            return frames, "bad-length"
        if pos + 4 + size > len(data):
            return frames, "incomplete"
        frames.append(data[pos : pos + 4 + size])
        pos += 4 + size
    return frames, "whole"


class KafkaTarget(SocketTarget):
    name = "kafka"

    def __init__(self, deadline: float = 10.0, per_version: int = 12) -> None:
        super().__init__(deadline)
        self.per_version = per_version
        self.seeds: list[bytes] = []
        self.parked: deque[tuple[float, socket.socket]] = deque()
        self.corr = 0
        self.conn_budget = 0
        self.pending = 0  # pipelined requests sent since the last sentinel
        self.pending_wait = 0.0
        self.verify_topic = ""
        self.answered_at_once: list[bytes] = []  # seeds the broker answers without waiting
        self.verified = 0  # acknowledged batches read back intact

    def broker_env(self) -> dict[str, str]:
        return {"SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false"}

    def attach(self, broker: BrokerProcess, rng: random.Random) -> None:
        self.broker = broker
        if not self.seeds:
            self.seeds = load_captured() + _generated(self.per_version)
        if not self.answered_at_once:
            self.answered_at_once = [s for s in self.seeds if _declared_wait(s) == (0.0, True)]
        self.verify_topic = f"verify-{rng.randrange(1 << 32):08x}"

    # ------------------------------------------------------------------ inputs

    def _header_and_random_body(self, rng: random.Random) -> bytes:
        key = rng.choice(list(SUPPORTED_APIS)) if rng.random() < 0.9 else rng.randrange(-5, 80)
        spec = SUPPORTED_APIS.get(key)
        if spec is not None and rng.random() < 0.9:
            version = rng.randint(spec.min_version, spec.max_version)
        else:
            version = rng.randrange(-2, 20)
        flexible = spec is not None and spec.min_version <= version <= spec.max_version and is_flexible(key, version)
        head = struct.pack(">hhi", key, version, rng.randrange(1 << 20)) + b"\x00\x04fuzz"
        head += b"\x00" if flexible else b""  # empty tagged fields of a flexible header
        payload = head + rng.randbytes(rng.choice((0, 1, 4, 16, 100, 1000)))
        return len(payload).to_bytes(4, "big") + payload

    def next_input(self, rng: random.Random) -> bytes:
        roll = rng.random()
        if roll < 0.05:  # random frame: honest length, random bytes
            body = rng.randbytes(rng.choice((0, 1, 2, 8, 64, 512, 4096)))
            return len(body).to_bytes(4, "big") + body
        if roll < 0.15:
            return self._header_and_random_body(rng)
        if roll < 0.18:  # random bytes, no framing at all
            return rng.randbytes(rng.choice((1, 3, 4, 9, 100)))
        seed = rng.choice(self.seeds)
        if roll < 0.40:
            return seed
        if roll < 0.45:  # pipelined well-formed requests
            return b"".join(rng.choice(self.seeds) for _ in range(rng.randint(2, 6)))
        if roll < 0.50:  # a size prefix that lies (short: the rest reads as the next frame; long: a wait)
            lie = rng.choice((-5, -1, 1, 7, 1 << 16, (1 << 31) - 1, -(1 << 31), _MAX_REQUEST + 1))
            size = (len(seed) - 4 + lie) & 0xFFFFFFFF
            return size.to_bytes(4, "big") + seed[4:] + (rng.choice(self.seeds) if rng.random() < 0.5 else b"")
        body = mutate(seed[4:], rng, self.seeds)
        if rng.random() < 0.8:  # keep the length honest: the body's own fields lie instead
            return len(body).to_bytes(4, "big") + body
        return mutate(seed, rng, self.seeds, rounds=1)

    # ------------------------------------------------------------------ connections

    def _connect(self) -> socket.socket:
        assert self.broker is not None
        sock = socket.create_connection(self.broker.endpoints["kafka"], timeout=self.deadline)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _park(self) -> None:
        assert self.sock is not None
        self.parked.append((time.monotonic() + _PARK_SECONDS, self.sock))
        self._retire()
        while self.parked and (len(self.parked) > _MAX_PARKED or self.parked[0][0] < time.monotonic()):
            self.parked.popleft()[1].close()

    def step(self, rng: random.Random) -> None:
        data = self.next_input(rng)
        if self.sock is None or self.conn_budget <= 0:
            self._drop()
            self.sock = self._connect()
            self.conn_budget = rng.choice((1, 10, 100, 1000))
            self.pending, self.pending_wait = 0, 0.0
        self.conn_budget -= 1
        if rng.random() < _VERIFY_SHARE:
            self._verify(rng)
            return
        self.sent.append(data)
        frames, state = split_frames(data)
        classified = [_declared_wait(f) for f in frames]
        wait = max((w for w, _ in classified), default=0.0)
        if state == "incomplete":
            self._flush()
            if self.sock is None:
                return
            try:
                self._send(data, rng)
            except OSError:
                self._drop()
                return
            if rng.random() < 0.1:
                self._park()  # a client that stops mid-frame and stays connected
            elif closes_after_eof(self.sock, self.deadline):
                self._drop()
            else:
                raise Hang(f"no close within {self.deadline:.1f} s after EOF in the middle of a frame")
            return
        if state == "whole" and wait <= _PIPELINE_MAX_WAIT and all(ok for _, ok in classified):
            # requests the broker can decode are pipelined, the sentinel follows every few of them
            try:
                self._send(data, rng)
            except OSError:
                self._drop()
                return
            self.pending += 1
            self.pending_wait += wait
            if self.pending >= _PIPELINE or self.conn_budget <= 0:
                self._flush()
            return
        self._flush()
        if self.sock is None:
            return
        self.corr = (self.corr + 1) % 0xFFFF
        sentinel = _SENTINEL_BASE + self.corr
        try:
            self._send(data + (_sentinel(sentinel) if state == "whole" else b""), rng)
        except OSError:
            self._drop()  # the broker closed on an earlier input of this connection
            return
        # a declared wait longer than the deadline: give it a moment, then park the connection
        limit = self.deadline + wait if wait <= self.deadline else _LONG_WAIT_GRACE
        if not self._await(sentinel if state == "whole" else None, limit):
            if wait > self.deadline:
                self._park()  # a long poll or rebalance wait, declared by the request itself
                return
            raise Hang(f"no answer to {len(frames)} frame(s) ({state}) within {limit:.1f} s")

    def _send(self, data: bytes, rng: random.Random) -> None:
        assert self.sock is not None
        if rng.random() < _SPLIT_SHARE:
            send_split(self.sock, data, rng)
        else:
            self.sock.sendall(data)

    def _verify(self, rng: random.Random) -> None:
        """A verified Produce pipeline on this connection, behind what it has pending (kafka_verify.py)."""
        self._flush()
        if self.sock is None:
            self.sock = self._connect()
        assert self.broker is not None
        self.sent.append(b"<verified Produce pipeline>")
        checked = verified_pipeline(self.sock, self._connect, self.verify_topic, self.answered_at_once, rng,
                                    self.deadline)
        self.verified += checked
        self._drop()  # answers to the mixed-in requests may still be in flight: start afresh

    def _flush(self) -> None:
        """Send the sentinel after the pipelined requests and wait for its answer (or the close)."""
        if self.sock is None or not self.pending:
            return
        count, waits = self.pending, self.pending_wait
        self.pending, self.pending_wait = 0, 0.0
        self.corr = (self.corr + 1) % 0xFFFF
        sentinel = _SENTINEL_BASE + self.corr
        try:
            self.sock.sendall(_sentinel(sentinel))
        except OSError:
            self._drop()
            return
        if not self._await(sentinel, self.deadline + waits):
            raise Hang(f"no answer to {count} pipelined request(s) within {self.deadline + waits:.1f} s")

    def _await(self, sentinel: int | None, limit: float) -> bool:
        """Read responses until the sentinel's answer or the close: True. Deadline passed: False."""
        assert self.sock is not None
        end = time.monotonic() + limit
        try:
            while True:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                self.sock.settimeout(remaining)
                head = recv_exactly(self.sock, 4)
                if head is None:
                    self._drop()
                    return True
                size = int.from_bytes(head, "big", signed=True)
                if size < 4 or size > 256 * 1024 * 1024:
                    raise Hang(f"response frame of size {size}")
                payload = recv_exactly(self.sock, size)
                if payload is None:
                    self._drop()
                    return True
                if sentinel is not None and int.from_bytes(payload[:4], "big") == sentinel:
                    return True
        except TimeoutError:
            return False
        except OSError:
            self._drop()
            return True

    def flush(self) -> None:
        self._flush()

    def close_all(self) -> None:
        self._drop()
        while self.parked:
            self.parked.popleft()[1].close()

    def probe(self) -> bool:
        try:
            with self._connect() as sock:
                sock.sendall(_sentinel(1))
                head = recv_exactly(sock, 4)
                return head is not None and recv_exactly(sock, int.from_bytes(head, "big")) is not None
        except OSError:
            return False

    def kcat_options(self) -> list[str]:
        """How kcat reaches the Kafka port (``tls.py`` adds TLS)."""
        return []

    def client_check(self) -> list[str]:
        assert self.broker is not None
        host, port = self.broker.endpoints["kafka"]
        topic = f"fuzz-check-{uuid.uuid4().hex[:8]}"
        failures = []
        produce = subprocess.run(
            ["kcat", "-b", f"{host}:{port}", *self.kcat_options(), "-P", "-t", topic, "-X",
             "allow.auto.create.topics=true"],
            input=b"after-fuzz\n", capture_output=True, timeout=60,
        )
        if produce.returncode != 0:
            failures.append(f"kcat produce failed: {produce.stderr.decode()[-500:]}")
        consume = subprocess.run(
            ["kcat", "-b", f"{host}:{port}", *self.kcat_options(), "-C", "-t", topic, "-o", "beginning", "-c",
             "1", "-e"],
            capture_output=True, timeout=60,
        )
        if consume.stdout.strip() != b"after-fuzz":
            failures.append(f"kcat consume got {consume.stdout[:200]!r}: {consume.stderr.decode()[-500:]}")
        return failures
