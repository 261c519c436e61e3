"""Segment-store benchmark: append throughput per flush policy, restart time, and the disk's ceiling.

Run: ``python -m bench.bench_log`` (``--quick`` for a smoke run, ``--dir`` to pick the disk,
``--visibility N`` for only the durable-vs-written visibility comparison, N appends per run).

Everything is measured in one run on one directory, so figures can be compared as ratios:
- the disk ceiling: ``dd if=/dev/zero bs=1M conv=fdatasync`` (sequential MB/s) and
  ``dd bs=4k oflag=dsync`` (synchronous 4 KiB writes per second, the bound for one fsync per append);
- in-process appends (``PartitionLog.append``: validate + CRC check + offset rewrite + write + durability
  wait) for 100 B and 1 KiB records at 1, 100 and 1,000 records per batch, per flush policy, with 1
  appender and, for ``always``, 16 concurrent appenders to show group commit;
- the write path: ``os.write`` in the loop + ``fdatasync`` in a worker thread vs aiofiles;
- the event loop: uvloop vs asyncio on the append path;
- restart time for a 1 GiB log in ~1,000 segments: clean, after SIGKILL, and (for contrast) with the
  recovery checkpoint removed so everything must be scanned; plus a 64 MiB log to show restart time
  does not follow log size.
Appenders yield to the event loop every 16 appends, as a server does between socket reads, so
background fsyncs (interval policy, segment rolls) get to run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from broker.log.config import FlushPolicy, TopicConfig, Visibility
from broker.log.flusher import Flusher
from broker.log.segment import SegmentLogStore, SegmentPartitionLog
from broker.protocol.records import RecordSpec, encode_batch

T = TypeVar("T")
MiB = 1 << 20
REPEATS = 3  # side-by-side comparisons: median of alternating runs


def run(coro: Coroutine[Any, Any, T], loop_kind: str) -> T:
    if loop_kind == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


# ------------------------------------------------------------------ disk ceiling


def dd(path: Path, *args: str) -> tuple[int, float]:
    """Run dd, return (bytes, seconds) from its summary line."""
    out = subprocess.run(["dd", "if=/dev/zero", f"of={path}", *args], capture_output=True, text=True,
                         env={**os.environ, "LC_ALL": "C"}, check=True).stderr
    path.unlink(missing_ok=True)
    match = re.search(r"(\d+) bytes .* copied, ([\d.e-]+) s", out)
    assert match, out
    return int(match.group(1)), float(match.group(2))


def disk_ceiling(directory: Path, mib: int, dsync_writes: int) -> tuple[float, float]:
    """(sequential MB/s with fdatasync, synchronous 4 KiB writes per second)."""
    size, secs = dd(directory / "dd.bin", "bs=1M", f"count={mib}", "conv=fdatasync")
    seq = size / secs / 1e6
    _, secs = dd(directory / "dd4k.bin", "bs=4k", f"count={dsync_writes}", "oflag=dsync")
    return seq, dsync_writes / secs


# ------------------------------------------------------------------ appends


@dataclass
class Cell:
    record_bytes: int
    batch_records: int
    policy: str
    appenders: int
    records_per_s: float
    mb_per_s: float
    appends_per_fsync: float


def batch_pool(record_bytes: int, batch_records: int) -> list[bytes]:
    return [encode_batch([RecordSpec(os.urandom(record_bytes)) for _ in range(batch_records)]) for _ in range(4)]


async def append_cell(root: Path, record_bytes: int, batch_records: int, policy: FlushPolicy, appenders: int,
                      budget_s: float, max_bytes: int) -> Cell:
    store = SegmentLogStore(root)
    await store.start()
    store.create_topic("b", 1, TopicConfig(flush=policy))
    log = store.partition("b", 0)
    assert isinstance(log, SegmentPartitionLog)
    pool = batch_pool(record_bytes, batch_records)
    appends = written = 0
    start = time.perf_counter()
    deadline = start + budget_s

    async def appender(k: int) -> None:
        nonlocal appends, written
        i = k
        while written < max_bytes and time.perf_counter() < deadline:
            data = pool[i % len(pool)]
            await log.append(data)
            appends += 1
            written += len(data)
            i += 1
            if i % 16 == 0:
                await asyncio.sleep(0)

    await asyncio.gather(*(appender(k) for k in range(appenders)))
    elapsed = time.perf_counter() - start
    syncs = log.flusher.syncs
    await store.close()
    return Cell(record_bytes, batch_records, policy.value, appenders, appends * batch_records / elapsed,
                written / elapsed / 1e6, appends / syncs if syncs else float("inf"))


def append_matrix(base: Path, loop_kind: str, budget_s: float, max_bytes: int) -> list[Cell]:
    cells = []
    for policy in (FlushPolicy.ALWAYS, FlushPolicy.INTERVAL, FlushPolicy.OS):
        for record_bytes in (100, 1024):
            for batch_records in (1, 100, 1000):
                for appenders in ((1, 16) if policy is FlushPolicy.ALWAYS else (1,)):
                    root = base / "cell"
                    cells.append(run(append_cell(root, record_bytes, batch_records, policy, appenders, budget_s,
                                                 max_bytes), loop_kind))
                    shutil.rmtree(root)
                    os.sync()  # no writeback from this cell leaks into the next one
    return cells


# ------------------------------------------------------------------ write path


async def write_path(kind: str, path: Path, appenders: int, fsync: bool, ops: int) -> float:
    """Appends per second of 1 KiB blobs to one file, with group-committed fdatasync if ``fsync``."""
    import aiofiles
    import aiofiles.os

    blob = os.urandom(1085)  # a one-record 1 KiB batch
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(1)
    if kind == "thread":
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

        async def write() -> None:
            os.write(fd, blob)

        async def sync() -> None:
            await loop.run_in_executor(executor, os.fdatasync, fd)
    else:
        handle = await aiofiles.open(path, "ab", buffering=0)
        fdatasync = aiofiles.os.wrap(os.fdatasync)
        fd = handle.fileno()

        async def write() -> None:
            await handle.write(blob)

        async def sync() -> None:
            await fdatasync(fd)

    flusher = Flusher(FlushPolicy.ALWAYS, 0, sync, print)

    async def appender() -> None:
        for i in range(ops // appenders):
            await write()
            flusher.note_write()
            if fsync:
                await flusher.wait_durable()
            elif i % 16 == 0:
                await asyncio.sleep(0)

    start = time.perf_counter()
    await asyncio.gather(*(appender() for _ in range(appenders)))
    elapsed = time.perf_counter() - start
    if kind == "thread":
        os.close(fd)
    else:
        await handle.close()
    executor.shutdown()
    path.unlink()
    return (ops // appenders) * appenders / elapsed


def write_path_compare(base: Path, loop_kind: str, quick: bool) -> list[tuple[str, dict[str, float]]]:
    rows = []
    for label, appenders, fsync, ops in (
        ("no fsync, 1 appender", 1, False, 20_000 if quick else 100_000),
        ("fsync each, 1 appender", 1, True, 100 if quick else 400),
        ("fsync, 16 appenders (group commit)", 16, True, 800 if quick else 6_400),
    ):
        samples: dict[str, list[float]] = {"thread": [], "aiofiles": []}
        for _ in range(REPEATS):  # alternate the two so disk noise hits both alike
            for kind in samples:
                samples[kind].append(run(write_path(kind, base / "wp.bin", appenders, fsync, ops), loop_kind))
        rows.append((label, {kind: statistics.median(v) for kind, v in samples.items()}))
    return rows


# ------------------------------------------------------------------ restart


async def build_log(root: Path, total_bytes: int, segment_bytes: int) -> int:
    store = SegmentLogStore(root)
    await store.start()
    store.create_topic("r", 1, TopicConfig(flush=FlushPolicy.OS, segment_bytes=segment_bytes))
    log = store.partition("r", 0)
    pool = batch_pool(1000, 16)  # ~16 KiB batches: 64 per 1 MiB segment
    i = 0
    while log.size_bytes < total_bytes:
        await log.append(pool[i % len(pool)])
        i += 1
        if i % 64 == 0:
            await asyncio.sleep(0)
    segments = log.segment_count if isinstance(log, SegmentPartitionLog) else 0
    await store.close()
    return segments


async def timed_start(root: Path) -> tuple[float, dict[str, int]]:
    start = time.perf_counter()
    store = SegmentLogStore(root)
    await store.start()
    elapsed = time.perf_counter() - start
    stats = dict(store.recovery_stats)
    await store.close()
    return elapsed, stats


def median_start(root: Path, loop_kind: str, runs: int = 3) -> tuple[float, dict[str, int]]:
    results = [run(timed_start(root), loop_kind) for _ in range(runs)]
    return statistics.median(r[0] for r in results), results[-1][1]


def unclean_stop(root: Path, mib: int) -> None:
    """Let a child append ``mib`` MiB to the log, then SIGKILL it."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.bench_log", "--child-append", str(root), str(mib)],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"appended\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


async def child_append(root: Path, mib: int) -> None:
    store = SegmentLogStore(root)
    await store.start()
    log = store.partition("r", 0)
    pool = batch_pool(1000, 16)
    target = log.size_bytes + mib * MiB
    i = 0
    while log.size_bytes < target:
        await log.append(pool[i % len(pool)])
        i += 1
        if i % 16 == 0:
            await asyncio.sleep(0)
    await asyncio.sleep(0.2)  # let roll fsyncs and a checkpoint happen, as in a running server
    os.write(1, b"appended\n")
    await asyncio.sleep(3600)


@dataclass
class Restart:
    label: str
    log_mib: int
    segments: int
    seconds: float
    scanned_mib: float


def restart_times(base: Path, loop_kind: str, big_mib: int, small_mib: int) -> list[Restart]:
    out = []
    for mib in (small_mib, big_mib):
        root = base / f"restart-{mib}"
        segments = run(build_log(root, mib * MiB, MiB), loop_kind)
        os.sync()
        secs, stats = median_start(root, loop_kind)
        out.append(Restart("clean", mib, segments, secs, stats["scanned_bytes"] / MiB))
        if mib == big_mib:
            unclean_stop(root, 8)
            secs, stats = run(timed_start(root), loop_kind)
            out.append(Restart("after SIGKILL (8 MiB appended, flush=os)", mib, segments, secs,
                               stats["scanned_bytes"] / MiB))
            (root / "recovery-checkpoint.json").unlink()
            secs, stats = run(timed_start(root), loop_kind)
            out.append(Restart("no checkpoint (scan everything)", mib, segments, secs, stats["scanned_bytes"] / MiB))
        shutil.rmtree(root)
    return out


# ------------------------------------------------------------------ report


def loop_compare(base: Path, budget_s: float, max_bytes: int) -> list[tuple[str, dict[str, float]]]:
    rows = []
    for record_bytes, batch_records, policy, appenders in (
        (100, 1, FlushPolicy.OS, 1), (1024, 100, FlushPolicy.OS, 1), (100, 1, FlushPolicy.ALWAYS, 16),
    ):
        samples: dict[str, list[float]] = {"asyncio": [], "uvloop": []}
        for _ in range(REPEATS):
            for kind in samples:
                root = base / "loop"
                cell = run(append_cell(root, record_bytes, batch_records, policy, appenders, budget_s, max_bytes),
                           kind)
                shutil.rmtree(root)
                os.sync()
                samples[kind].append(cell.records_per_s)
        rows.append((f"{record_bytes} B x {batch_records}, flush={policy.value}, {appenders} appender(s)",
                     {kind: statistics.median(v) for kind, v in samples.items()}))
    return rows


def timed(label: str, fn: Callable[[], T]) -> T:
    start = time.perf_counter()
    result = fn()
    print(f"  {label}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return result


def report(args: argparse.Namespace) -> str:
    base = Path(tempfile.mkdtemp(prefix="sluice-bench-", dir=args.dir))
    try:
        dd_mib = 64 if args.quick else 256
        first = timed("dd", lambda: [disk_ceiling(base, dd_mib, 100 if args.quick else 300) for _ in range(2)])
        seq, dsync = max(f[0] for f in first), max(f[1] for f in first)
        budget = 0.3 if args.quick else 1.5
        max_bytes = (32 if args.quick else 256) * MiB
        cells = timed("append matrix", lambda: append_matrix(base, args.loop, budget, max_bytes))
        paths = timed("write path", lambda: write_path_compare(base, args.loop, args.quick))
        loops = timed("event loops", lambda: loop_compare(base, budget, max_bytes))
        restarts = timed("restart", lambda: restart_times(base, args.loop, 64 if args.quick else 1024,
                                                          16 if args.quick else 64))
        seq_end, _ = timed("dd again", lambda: disk_ceiling(base, dd_mib, 10))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    lines = [
        f"Disk ceiling (dd, same directory, same run): sequential {seq:.0f} MB/s (best of 2 at the start; "
        f"{seq_end:.0f} MB/s at the end) with `bs=1M count={dd_mib} conv=fdatasync`; synchronous 4 KiB writes "
        f"{dsync:.0f}/s with `bs=4k oflag=dsync`. Ratios below are to the {seq:.0f} MB/s.",
        "",
        f"Appends (event loop: {args.loop}; stored bytes incl. batch headers; ~{budget} s or "
        f"{max_bytes // MiB} MiB per cell):",
        "",
        "| flush | record | batch | appenders | records/s | MB/s | × dd seq | appends per fsync |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        per_sync = "—" if c.appends_per_fsync == float("inf") else f"{c.appends_per_fsync:.1f}"
        lines.append(f"| {c.policy} | {c.record_bytes} B | {c.batch_records} | {c.appenders} | "
                     f"{c.records_per_s:,.0f} | {c.mb_per_s:.1f} | {c.mb_per_s / seq:.2f} | {per_sync} |")
    lines += ["", "Write path (1 KiB appends to one file, group-committed fdatasync where fsync'd), appends/s:", "",
              "| case | os.write + fdatasync in a thread | aiofiles | thread / aiofiles |", "|---|---|---|---|"]
    for label, f in paths:
        lines.append(f"| {label} | {f['thread']:,.0f} | {f['aiofiles']:,.0f} | {f['thread'] / f['aiofiles']:.2f} |")
    lines += ["", "Event loop on the append path, records/s:", "",
              "| case | asyncio | uvloop | uvloop / asyncio |", "|---|---|---|---|"]
    for label, f in loops:
        lines.append(f"| {label} | {f['asyncio']:,.0f} | {f['uvloop']:,.0f} | {f['uvloop'] / f['asyncio']:.2f} |")
    lines += ["", "Restart (`SegmentLogStore.start()`; 1 MiB segments of 16 KiB batches; page cache warm):", "",
              "| log | segments | case | restart | scanned |", "|---|---|---|---|---|"]
    for r in restarts:
        lines.append(f"| {r.log_mib} MiB | {r.segments} | {r.label} | {r.seconds * 1000:.0f} ms | "
                     f"{r.scanned_mib:.1f} MiB |")
    return "\n".join(lines)


async def visibility_cell(root: Path, visibility: Visibility, appends: int) -> tuple[list[float], list[float]]:
    """flush=always, one appender of 100 B records and one reader waiting at the high watermark: per
    record, ms from the append call until the producer's acknowledgement and until the reader sees it."""
    store = SegmentLogStore(root, visibility=visibility)
    await store.start()
    store.create_topic("v", 1, TopicConfig(flush=FlushPolicy.ALWAYS))
    log = store.partition("v", 0)
    batch = encode_batch([RecordSpec(b"x" * 100)])
    acked: list[float] = []
    seen: list[float] = []
    for i in range(appends):
        reader = asyncio.ensure_future(log.wait_for_data(i, 10))
        started = time.perf_counter()
        append = asyncio.ensure_future(log.append(batch))
        await reader
        seen.append((time.perf_counter() - started) * 1000)
        await append
        acked.append((time.perf_counter() - started) * 1000)
    await store.close()
    return acked, seen


def visibility_compare(base: Path, loop_kind: str, appends: int) -> str:
    """Paired, alternating runs of both visibility modes (REPEATS each); medians over all records."""
    results: dict[str, tuple[list[float], list[float]]] = {}
    for r in range(REPEATS):
        for mode in (Visibility.DURABLE, Visibility.WRITTEN):
            acked, seen = run(visibility_cell(base / f"vis-{mode}-{r}", mode, appends), loop_kind)
            got = results.setdefault(mode, ([], []))
            got[0].extend(acked)
            got[1].extend(seen)
    lines = ["| flush=always, 1 appender, 100 B | ack p50 / p99 ms | reader sees it p50 / p99 ms |", "|---|---:|---:|"]
    for name, (acked, seen) in results.items():
        q = statistics.quantiles
        lines.append(f"| visibility={name} | {statistics.median(acked):.3f} / {q(acked, n=100)[98]:.3f} | "
                     f"{statistics.median(seen):.3f} / {q(seen, n=100)[98]:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: the temp dir)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="event loop for the matrix (sluice serve uses uvloop when installed)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--child-append", nargs=2, metavar=("ROOT", "MIB"), help=argparse.SUPPRESS)
    parser.add_argument("--visibility", type=int, metavar="APPENDS", default=0,
                        help="only compare storage.visibility durable vs written (APPENDS per run)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # recovery warnings are expected here (the SIGKILL case)
    if args.child_append:
        asyncio.run(child_append(Path(args.child_append[0]), int(args.child_append[1])))
        return
    if args.visibility:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            print(visibility_compare(Path(tmp), args.loop, args.visibility))
        return
    started = time.perf_counter()
    text = report(args)
    print(text)
    print(f"\n(total {time.perf_counter() - started:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
