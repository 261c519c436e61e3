"""The journal (``ingest/mqtt/journal.py``): its own RecordBatch encoder (``journal_batch.py``, compiled
and pure) gives the bytes of the generic
``records.encode_batch`` for the same records (tombstones, empty values, lengths and offset deltas past
its small-varint table); under flush=always an fsync is asked for by whoever waits (rule 2)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import ModuleType

import pytest

from broker import native
from broker.log.config import FlushPolicy
from broker.log.segment import SegmentLogStore
from broker.log.segment_partition import SegmentPartitionLog
from broker.protocol.records import RecordSpec, decode_records, encode_batch
from ingest.mqtt import journal_batch
from ingest.mqtt.journal import Journal

# the build journal.py runs (compiled where it was built) and the pure source: both give the same bytes
BUILDS = [native.select(journal_batch), native.pure("ingest.mqtt.journal_batch")]

STAMP = 1_764_000_000_123


def _records(rng: random.Random, count: int) -> list[tuple[bytes, bytes | None]]:
    sizes = (0, 5, 150, 20_000) if count < 100 else (0, 5, 150)  # 17,000 x 20 KB would be slow
    out: list[tuple[bytes, bytes | None]] = []
    for _ in range(count):
        key = rng.randbytes(rng.choice((1, 3, 40, 300)))
        value = None if rng.random() < 0.3 else rng.randbytes(rng.choice(sizes))
        out.append((key, value))
    return out


@pytest.mark.parametrize("build", BUILDS, ids=lambda m: "compiled" if native.is_compiled(m) else "pure")
@pytest.mark.parametrize("count", [1, 2, 64, 17_000])
def test_same_bytes_as_encode_batch(count: int, build: ModuleType) -> None:
    records = _records(random.Random(count), count)
    ours = build.encode_journal_batch(records, STAMP)
    assert ours == encode_batch([RecordSpec(value, key, (), STAMP) for key, value in records])
    decoded = decode_records(ours)
    assert [(r.key, r.value) for r in decoded] == records
    assert {r.timestamp for r in decoded} == {STAMP}


async def test_flush_always_fsyncs_when_somebody_waits_and_covers_every_earlier_write(tmp_path: Path) -> None:
    """Writes nobody waits for (a subscriber's PUBACK removing its copy) start no fsync of their own; the
    first ``durable()`` after them gets one that covers them all, and a write after it a new one."""
    store = SegmentLogStore(tmp_path / "logs")
    await store.start()
    try:
        journal = Journal(store, "__journal_test")
        for turn in range(5):  # five loop turns: five appended batches
            journal.put(b"m%d" % turn, b"copy")
            await asyncio.sleep(0)
        plog = store.partition("__journal_test", 0)
        assert plog.config.flush is FlushPolicy.ALWAYS and plog.log_end_offset == 5
        assert isinstance(plog, SegmentPartitionLog)
        before = plog.flusher.syncs
        await asyncio.sleep(0.05)
        assert plog.flusher.syncs == before  # nobody waited: no fsync round started
        waited = journal.durable()
        assert waited is not None
        await waited
        assert plog.flusher.syncs == before + 1 and plog.is_durable(plog.write_mark())
        assert journal.durable() is None  # nothing written since
        journal.put(b"m5", None)
        again = journal.durable()
        assert again is not None and again is not waited
        await again
        assert plog.flusher.syncs == before + 2
    finally:
        await store.close()
