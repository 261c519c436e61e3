"""Log-compaction benchmark: cleaner throughput and its effect on append latency.

Run: ``python -m bench.bench_cleaner`` (``--mb`` partition size, ``--seconds`` per latency run,
``--dir`` to pick the disk).

- Throughput: a compacted partition of ``--mb`` MiB (100-record batches of 200 B values; 70 % of the
  keys distinct, so most bytes survive and are rewritten) is cleaned in one pass; MB/s = bytes read
  per second of the pass (map building, rewriting, fsyncs, swaps). Side by side, the I/O ceiling of the
  same process: reading and writing the same bytes without looking at records (copy + fsync).
- Append latency: one appender at a fixed rate (1-record batches, ``flush=os`` so the figure is the
  event loop's delay, and ``flush=always``) on another topic, with the cleaner idle vs cleaning the
  big partition back to back (state reset before each pass so every pass has the whole partition
  to do). Runs alternate (idle, cleaning, idle, cleaning …) and report p50/p99/max.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from broker.log.cleaner import CLEANER_STATE, LogCleaner
from broker.log.config import TopicConfig
from broker.log.segment import SegmentLogStore, SegmentPartitionLog
from broker.protocol.records import RecordSpec, encode_batch

MiB = 1 << 20
COMPACT = TopicConfig().with_kafka_configs(
    {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0", "flush.policy": "os"})


async def fill(store: SegmentLogStore, mb: int) -> None:
    """``mb`` MiB of 100-record batches; 7 in 10 records have a key of their own, 3 share 1,000 keys."""
    segment_bytes = min(8 * MiB, mb * MiB // 8)  # 8 MiB segments; at least 8 of them for small --mb
    store.create_topic("big", 1, COMPACT.with_kafka_configs({"segment.bytes": str(segment_bytes)}))
    plog = store.partition("big", 0)
    value = b"v" * 200
    i = 0
    while plog.size_bytes < mb * MiB:
        keys = [b"key-%d" % (n if n % 10 < 7 else n % 1000) for n in range(i, i + 100)]
        await store.append("big", 0, encode_batch([RecordSpec(value, key=key) for key in keys]))
        i += 100
    await store.flush()


def copy_ceiling(plog: SegmentPartitionLog, scratch: Path) -> float:
    """Seconds to read every closed segment and write + fsync a copy (what cleaning cannot beat)."""
    started = time.perf_counter()
    for seg in plog.cleanable_segments():
        data = seg.log_path.read_bytes()
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - started


def reset_state(plog: SegmentPartitionLog) -> None:
    (plog.directory / CLEANER_STATE).unlink(missing_ok=True)


async def throughput(root: Path, mb: int) -> None:
    store = SegmentLogStore(root / "tp")
    await store.start()
    await fill(store, mb)
    plog = store.partition("big", 0)
    assert isinstance(plog, SegmentPartitionLog)
    size = sum(s.size for s in plog.cleanable_segments())
    rows = []
    for _ in range(2):
        ceiling = copy_ceiling(plog, root / "copy.tmp")
        reset_state(plog)
        cleaner = LogCleaner(store)
        started = time.perf_counter()
        stats = await cleaner.clean_once()
        seconds = time.perf_counter() - started
        rows.append((size / MiB / seconds, size / MiB / ceiling, stats[0].bytes_after / max(stats[0].bytes_before, 1),
                     size))
        size = sum(s.size for s in plog.cleanable_segments())
    print("| pass | input MiB | cleaner MB/s | copy+fsync MB/s | cleaner ÷ copy | bytes kept |")
    print("|---|---|---|---|---|---|")
    for n, (mbs, ceiling_mbs, kept, input_size) in enumerate(rows, 1):
        ratio = mbs / ceiling_mbs
        print(f"| {n} | {input_size / MiB:.1f} | {mbs:.1f} | {ceiling_mbs:.1f} | {ratio:.2f} | {kept:.0%} |")
    await store.close()


async def latency(root: Path, mb: int, seconds: float, rate: int) -> None:
    store = SegmentLogStore(root / "lat")
    await store.start()
    await fill(store, mb)
    big = store.partition("big", 0)
    assert isinstance(big, SegmentPartitionLog)
    results: dict[tuple[str, str], list[float]] = {}
    for flush in ("os", "always"):
        store.create_topic(f"hot-{flush}", 1, TopicConfig().with_kafka_configs({"flush.policy": flush}))
    batch = encode_batch([RecordSpec(b"x" * 100, key=b"k")])
    for _round in range(2):
        for flush in ("os", "always"):
            for mode in ("idle", "cleaning"):
                stop = asyncio.Event()
                passes = 0

                async def clean_loop(stop: asyncio.Event = stop) -> None:
                    nonlocal passes
                    while not stop.is_set():
                        reset_state(big)
                        await LogCleaner(store).clean_once()
                        passes += 1

                task = asyncio.create_task(clean_loop()) if mode == "cleaning" else None
                samples: list[float] = []
                interval = 1 / rate
                deadline = time.perf_counter() + seconds
                next_at = time.perf_counter()
                while time.perf_counter() < deadline:
                    next_at += interval
                    started = time.perf_counter()
                    await store.append(f"hot-{flush}", 0, batch)
                    samples.append((time.perf_counter() - started) * 1000)
                    # scheduled sends: a late append counts its wait too (no coordinated omission)
                    await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                stop.set()
                if task is not None:
                    await task
                results.setdefault((flush, mode), []).extend(samples)
                if mode == "cleaning":
                    print(f"  ({flush}: {passes} cleaner passes during the run)")
    print("| flush | cleaner | appends | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for (flush, mode), samples in results.items():
        samples.sort()
        p99 = samples[int(len(samples) * 0.99) - 1]
        p50 = statistics.median(samples)
        print(f"| {flush} | {mode} | {len(samples)} | {p50:.3f} | {p99:.3f} | {samples[-1]:.1f} |")
    await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=int, default=1000, help="appends per second in the latency runs")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-cleaner-", dir=args.dir))
    try:
        import uvloop

        uvloop.run(throughput(root, args.mb))
        uvloop.run(latency(root, args.mb, args.seconds, args.rate))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
