"""Shared helpers for the segment-store tests: a reference model of what was appended."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, Unpack

from broker.log.api import PartitionLimits
from broker.log.config import TopicConfig, Visibility
from broker.log.partition_log import PartitionLog
from broker.log.segment import SegmentLogStore
from broker.protocol.records import Record, RecordSpec, decode_all, encode_batch

__all__ = [
    "FakeClock",
    "LogStoreOptions",
    "Model",
    "SegmentStoreOptions",
    "all_records",
    "index_files",
    "open_store",
    "random_batch",
]


class LogStoreOptions(TypedDict, total=False):
    """The keyword parameters of ``LogStore.__init__`` (shared by every store)."""

    default_config: TopicConfig | None
    default_partitions: int
    auto_create_topics: bool
    limits: PartitionLimits | None


class SegmentStoreOptions(LogStoreOptions, total=False):
    """The keyword parameters of ``SegmentLogStore.__init__``."""

    clock: Callable[[], float]
    checkpoint_interval_s: float
    sync_threads: int
    max_open_files: int | None
    visibility: Visibility
    index_cache_bytes: int | None


class FakeClock:
    """Seconds since the epoch, moved by the test."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def open_store(root: Path, **kwargs: Unpack[SegmentStoreOptions]) -> SegmentLogStore:
    store = SegmentLogStore(root, **kwargs)
    await store.start()
    return store


def random_batch(rng: random.Random, tag: int, ts_base: int) -> tuple[bytes, list[bytes], int]:
    """A batch of 1-3 records with varied sizes and jittered (non-monotonic) timestamps."""
    count = rng.randint(1, 3)
    values = [f"{tag}:{i}:".encode() + bytes([65 + tag % 26]) * rng.randint(5, 200) for i in range(count)]
    stamps = [ts_base + rng.randint(-500, 500) for _ in values]
    specs = [RecordSpec(v, key=str(tag).encode(), timestamp=t) for v, t in zip(values, stamps, strict=True)]
    return encode_batch(specs), values, max(stamps)


@dataclass
class Model:
    """What a partition should hold: per batch (base offset, last offset, max timestamp, values)."""

    batches: list[tuple[int, int, int, list[bytes]]] = field(default_factory=list)

    def add(self, base: int, values: list[bytes], max_ts: int) -> None:
        self.batches.append((base, base + len(values) - 1, max_ts, values))

    def values_from(self, offset: int) -> list[tuple[int, bytes]]:
        """(offset, value) of every record from the start of the batch holding ``offset``."""
        out: list[tuple[int, bytes]] = []
        for base, _last, _ts, values in self.batches:
            if _last >= offset:
                out.extend((base + i, v) for i, v in enumerate(values))
        return out

    def offset_for_timestamp(self, ts: int, log_start: int = 0) -> int | None:
        for base, last, max_ts, _ in self.batches:
            if last >= log_start and max_ts >= ts:
                return max(base, log_start)
        return None

    @property
    def end(self) -> int:
        return self.batches[-1][1] + 1 if self.batches else 0


def all_records(log: PartitionLog, start: int | None = None) -> list[Record]:
    """Every record from ``start`` (default: the log start) to the high watermark, read in small steps."""
    offset = log.log_start_offset if start is None else start
    out: list[Record] = []
    while offset < log.high_watermark:
        records = decode_all(log.read(offset, 4096))
        assert records, f"read at {offset} returned nothing below the high watermark {log.high_watermark}"
        out.extend(r for r in records if r.offset >= offset)
        offset = records[-1].offset + 1
    return out


def index_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.suffix in (".index", ".timeindex")}
