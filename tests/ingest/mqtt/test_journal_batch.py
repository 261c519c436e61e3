"""The journal's own RecordBatch encoder (``journal.encode_journal_batch``) gives the bytes of the generic
``records.encode_batch`` for the same records: tombstones, empty values, and lengths and offset deltas
past the encoder's small-varint table."""

from __future__ import annotations

import random

import pytest

from broker.protocol.records import RecordSpec, decode_records, encode_batch
from ingest.mqtt.journal import encode_journal_batch

STAMP = 1_764_000_000_123


def _records(rng: random.Random, count: int) -> list[tuple[bytes, bytes | None]]:
    sizes = (0, 5, 150, 20_000) if count < 100 else (0, 5, 150)  # 17,000 x 20 KB would be slow
    out: list[tuple[bytes, bytes | None]] = []
    for _ in range(count):
        key = rng.randbytes(rng.choice((1, 3, 40, 300)))
        value = None if rng.random() < 0.3 else rng.randbytes(rng.choice(sizes))
        out.append((key, value))
    return out


@pytest.mark.parametrize("count", [1, 2, 64, 17_000])
def test_same_bytes_as_encode_batch(count: int) -> None:
    records = _records(random.Random(count), count)
    ours = encode_journal_batch(records, STAMP)
    assert ours == encode_batch([RecordSpec(value, key, (), STAMP) for key, value in records])
    decoded = decode_records(ours)
    assert [(r.key, r.value) for r in decoded] == records
    assert {r.timestamp for r in decoded} == {STAMP}
