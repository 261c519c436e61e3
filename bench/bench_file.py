"""File source replay into the durable log, side by side with Redis Streams fed the same lines, in one run.

    python -m bench.bench_file [--lines 200000] [--partitions 4] [--formats ndjson,influx,csv] [--read-bytes 65536]
                               [--flush always,os] [--sluice-only]

Sluice: a ``FileSource`` in replay mode (``ingest/file``) reads a file of ``bench.bench_tcp.make_lines``
lines (1,000 devices; CSV with its header) into the store ``sluice serve`` opens (segment files, 4
partitions), flush=always and flush=os, with the routes ``sluice serve`` builds from default settings;
time = from the source's start until it has finished the file (every chunk durable, the position saved).
Reported: lines/s, and this process's CPU per line (user + system, the source and the store's writes).

Peer: redis-server with AOF on (``appendfsync always`` / ``no``), fed the same lines as
``XADD file * line <line>`` by ``redis-cli --pipe`` (C) from a file of RESP commands made beforehand (the
conversion is not timed: a user would need a tool for it, Redis has no file tailer); time = until
redis-cli has every reply. Ratio = Sluice lines/s / Redis lines/s (> 1: Sluice is faster).

``--sluice-only`` skips Redis (for counting instructions per line: ``valgrind --tool=callgrind python -m
bench.bench_file --sluice-only --flush os --formats F --lines N`` for N = 10,000 and 30,000, each run once
before so that both read the saved lines file, the difference of the totals over 20,000).

No Fluent Bit or Vector row: neither is packaged in Debian here (``apt-cache policy fluent-bit vector``),
and CI installs what this repository can install.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.bench_tcp import CSV_HEADER, _free_port, _proc_cpu, _start_redis, make_lines, resp_xadd
from ingest.file.source import FileSource, FileSourceConfig, PositionStore
from ingest.health import HealthRegistry
from ingest.sink import IngestSink
from sluice.components.ingest_core import build_router
from sluice.config import load_settings
from sluice.gc_tuning import tune_for_serving
from sluice.serve import open_store


async def run_sluice(lines_file: Path, fmt: str, count: int, flush: str, partitions: int, read_bytes: int,
                     data_dir: Path) -> dict[str, float | str]:
    settings = load_settings(None, data_dir=data_dir,
                             storage={"backend": "segment", "flush": flush, "default_partitions": partitions})
    data_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(settings)
    await store.start()
    health = HealthRegistry()
    sink = IngestSink(store, build_router(settings.ingest), health, max_pending_bytes=settings.ingest.max_pending_bytes)
    config = FileSourceConfig(name="bench", path=lines_file, format=fmt, mode="replay", read_bytes=read_bytes)
    source = FileSource(config, sink, health, PositionStore(data_dir / "positions"))
    try:
        cpu = time.process_time()
        start = time.perf_counter()
        await source.start()
        await source.finished.wait()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        await source.stop()
        assert sink.messages_written == count and sink.dead_lettered == 0, (sink.messages_written, sink.dead_lettered)
    finally:
        await store.flush()
        await store.close()
    return {"store": type(store).__name__, "rate": count / elapsed, "cpu_us": cpu / count * 1e6}


def run_redis(resp_file: Path, count: int, fsync: str, work: Path) -> dict[str, float]:
    port = _free_port()
    work.mkdir(parents=True, exist_ok=True)
    server = _start_redis(port, work, fsync)
    try:
        cpu = _proc_cpu(server.pid)
        start = time.perf_counter()
        with resp_file.open("rb") as stdin:
            done = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], stdin=stdin, capture_output=True)
        elapsed = time.perf_counter() - start
        cpu = _proc_cpu(server.pid) - cpu
        if b"errors: 0" not in done.stdout:
            raise RuntimeError(f"redis-cli --pipe failed: {done.stdout!r}")
    finally:
        server.terminate()
        server.wait(10)
    return {"rate": count / elapsed, "cpu_us": cpu / count * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--formats", default="ndjson,influx,csv")
    parser.add_argument("--read-bytes", type=int, default=64 * 1024)
    parser.add_argument("--flush", default="always,os", help="comma-separated: always, os")
    parser.add_argument("--sluice-only", action="store_true", help="no Redis runs")
    args = parser.parse_args()
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None and not args.sluice_only:
            raise SystemExit(f"{tool} is missing: run scripts/install-system-deps.sh")
    use_uvloop = importlib.util.find_spec("uvloop") is not None
    if use_uvloop:
        import uvloop
    tune_for_serving()
    print(f"lines={args.lines} partitions={args.partitions} read_bytes={args.read_bytes} "
          f"loop={'uvloop' if use_uvloop else 'asyncio'} cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-file-") as tmp:
        root = Path(tmp)
        for fmt in args.formats.split(","):
            # generated once per format and count, kept in the temporary directory (a callgrind count then
            # leaves out the generation)
            lines_file = Path(tempfile.gettempdir()) / f"bench-file-{fmt}-{args.lines}.lines"
            if not lines_file.exists():
                lines_file.write_bytes(make_lines(fmt, args.lines))
            resp_file = root / f"resp.{fmt}"
            if not args.sluice_only:
                lines = lines_file.read_bytes()
                resp_file.write_bytes(resp_xadd(lines.removeprefix(CSV_HEADER) if fmt == "csv" else lines))
            for flush in args.flush.split(","):
                fsync = {"always": "always", "os": "no"}[flush]
                data_dir = root / f"sluice-{fmt}-{flush}"
                coro = run_sluice(lines_file, fmt, args.lines, flush, args.partitions, args.read_bytes, data_dir)
                sluice = uvloop.run(coro) if use_uvloop else asyncio.run(coro)
                redis = ({"rate": float("nan"), "cpu_us": float("nan")} if args.sluice_only
                         else run_redis(resp_file, args.lines, fsync, root / f"redis-{fmt}-{flush}"))
                rows.append((fmt, flush, sluice, redis, fsync))
                with contextlib.suppress(OSError):
                    shutil.rmtree(data_dir)
    print("| format | durability | Sluice lines/s | Redis Streams lines/s (appendfsync) | ratio | "
          "Sluice CPU µs/line | Redis CPU µs/line |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for fmt, flush, sluice, redis, fsync in rows:
        print(f"| {fmt} | flush={flush} | {sluice['rate']:,.0f} | {redis['rate']:,.0f} ({fsync}) | "
              f"{float(sluice['rate']) / redis['rate']:.2f}x | {sluice['cpu_us']:.2f} | {redis['cpu_us']:.2f} |")


if __name__ == "__main__":
    main()
