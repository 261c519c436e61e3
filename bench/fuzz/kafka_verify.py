"""Kafka: acknowledged Produce data must read back byte-identical.

The listener reads requests into pooled, reused buffers and stores batches straight from them (a
vectored write). A buffer handed back to the pool while a stored batch, a pending answer or the log still
refers to it would corrupt data silently: no traceback, just other bytes on disk. So now and then a
connection pipelines many Produce requests of very different sizes (small ones, ones past the pool's
buffer sizes), mixed with other well-formed requests, sent in pieces cut at random places; every batch
acknowledged without error is then fetched on a second connection and compared byte for byte (all of
the batch but the base offset and the partition leader epoch, which the broker assigns).
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable

from bench.fuzz.harness import Hang, Mismatch, recv_exactly, send_split
from broker.protocol.kafka import ApiKey, RequestHeader, decode_response_body, encode_request
from broker.protocol.kafka.fetch import FetchPartition, FetchRequest, FetchTopic
from broker.protocol.kafka.produce import ProducePartition, ProduceRequest, ProduceTopic
from broker.protocol.records import Compression, RecordSpec, encode_batch

__all__ = ["VERIFY_CORR_BASE", "verified_pipeline"]

VERIFY_CORR_BASE = 0x7E000000
_FETCH_BYTES = 8 * 1024 * 1024
_SIZES = (0, 16, 200, 4000, 40_000, 70_000, 300_000)


def _batch(rng: random.Random) -> bytes:
    size = rng.choice(_SIZES)
    records = [RecordSpec(value=rng.randbytes(size), key=rng.randbytes(rng.choice((0, 8))) or None)
               for _ in range(rng.choice((1, 1, 3, 10)) if size < 40_000 else 1)]
    return encode_batch(records, compression=rng.choice((Compression.NONE, Compression.NONE, Compression.GZIP)))


def _produce(topic: str, batch: bytes, corr: int, version: int, rng: random.Random) -> bytes:
    body = ProduceRequest(None, rng.choice((1, -1)), 5000, (ProduceTopic(topic, (ProducePartition(0, batch),)),))
    return encode_request(RequestHeader(ApiKey.PRODUCE, version, corr, "fuzz-verify"), body)


def _read_frames(sock: socket.socket, wanted: set[int], end: float) -> dict[int, bytes] | None:
    """Response payloads by correlation id until every wanted one came (None: the broker closed first)."""
    got: dict[int, bytes] = {}
    while not wanted <= got.keys():
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise Hang(f"{len(wanted - got.keys())} of {len(wanted)} verified Produce requests unanswered")
        sock.settimeout(remaining)
        try:
            head = recv_exactly(sock, 4)
            payload = recv_exactly(sock, int.from_bytes(head, "big")) if head is not None else None
        except TimeoutError:
            continue
        if payload is None:
            return got if got else None
        got[int.from_bytes(payload[:4], "big")] = payload
    return got


def _batches(records: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos + 12 <= len(records):
        size = 12 + int.from_bytes(records[pos + 8 : pos + 12], "big")
        if pos + size > len(records):
            break  # a partial batch at the end of a fetch answer
        out.append((int.from_bytes(records[pos : pos + 8], "big"), records[pos : pos + size]))
        pos += size
    return out


def _fetch_all(connect: Callable[[], socket.socket], topic: str, first: int, last: int) -> dict[int, bytes]:
    """The batches of partition 0 of ``topic`` from offset ``first`` on, by base offset, through ``last``."""
    found: dict[int, bytes] = {}
    offset, corr = first, 1
    with connect() as sock:
        while offset <= last:
            part = FetchPartition(0, offset, _FETCH_BYTES)
            request = FetchRequest(-1, 0, 0, _FETCH_BYTES, 0, (FetchTopic(topic, (part,)),))
            sock.sendall(encode_request(RequestHeader(ApiKey.FETCH, 4, corr, "fuzz-verify"), request))
            head = recv_exactly(sock, 4)
            payload = recv_exactly(sock, int.from_bytes(head, "big")) if head is not None else None
            if payload is None:
                raise Mismatch(f"the broker closed the verifying Fetch connection at offset {offset}")
            _, response = decode_response_body(ApiKey.FETCH, 4, payload, False)
            records = response.topics[0].partitions[0].records or b""
            batches = _batches(records)
            if not batches:
                break
            for base, batch in batches:
                found[base] = batch
                offset = base + int.from_bytes(batch[23:27], "big") + 1
            corr += 1
    return found


def verified_pipeline(
    sock: socket.socket, connect: Callable[[], socket.socket], topic: str, others: list[bytes],
    rng: random.Random, deadline: float,
) -> int:
    """Pipeline Produce requests (mixed with ``others``, requests answered at once) on ``sock``, then check
    every acknowledged batch reads back intact on a second connection (``connect()``). Returns how many
    were checked; raises Mismatch."""
    count = rng.choice((2, 4, 16, 64))
    sent: dict[int, bytes] = {}
    versions: dict[int, int] = {}
    chunks: list[bytes] = []
    for i in range(count):
        corr = VERIFY_CORR_BASE + i
        sent[corr], versions[corr] = _batch(rng), rng.randint(3, 8)
        chunks.append(_produce(topic, sent[corr], corr, versions[corr], rng))
        if others and rng.random() < 0.2:
            chunks.append(rng.choice(others))
    try:
        send_split(sock, b"".join(chunks), rng)
    except OSError:
        return 0
    answers = _read_frames(sock, set(sent), time.monotonic() + deadline * 3)
    if answers is None:
        return 0
    acked: dict[int, bytes] = {}
    for corr, payload in answers.items():
        if corr not in sent:
            continue
        _, response = decode_response_body(ApiKey.PRODUCE, versions[corr], payload, False)
        part = response.topics[0].partitions[0]
        if part.error_code == 0:
            if part.base_offset in acked:
                raise Mismatch(f"two acknowledged batches were given base offset {part.base_offset} in {topic}")
            acked[part.base_offset] = sent[corr]
    if not acked:
        return 0
    stored = _fetch_all(connect, topic, min(acked), max(acked))
    for base, batch in sorted(acked.items()):
        got = stored.get(base)
        if got is None:
            raise Mismatch(f"acknowledged batch at offset {base} of {topic} ({len(batch)} bytes) not found")
        if got[8:12] != batch[8:12] or got[16:] != batch[16:]:
            differ = next((i for i in range(16, min(len(got), len(batch))) if got[i] != batch[i]), -1)
            raise Mismatch(f"acknowledged batch at offset {base} of {topic} reads back different: "
                           f"{len(batch)} bytes sent, {len(got)} stored, first difference at byte {differ}")
    return len(acked)
