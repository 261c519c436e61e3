"""The TCP line path in process, without sockets: for counting instructions per line.

    python -m bench.bench_tcp_inproc [--format ndjson|influx|csv] [--flush os] [--lines 30000]

``bench.bench_tcp``'s lines (1,000 devices), cut into 64 KiB reads, go through what the listener does with a
read without ack mode: ``LineFramer.feed`` → ``LineStream.lines`` → ``IngestSink.ingest_lines`` (or
``LineStream.messages`` → ``IngestSink.ingest`` for a read ``lines`` leaves to it), into the
segment store ``sluice serve`` opens (4 partitions), on a fake clock advancing 5 ms per read; the
interpreter's default garbage-collector settings. Prints the thread's CPU per line, which a shared machine
makes noisy; the figure in bench/RESULTS.md is counted in instructions instead:

    PYTHONPATH=. valgrind --tool=callgrind python -m bench.bench_tcp_inproc --lines N

for N = 10,000 and 30,000 (each run once before, so both use cached bytecode and the lines saved in the
temporary directory, not generated), the difference of the two totals divided by 20,000: start-up and
learning the 1,000 devices cancel out.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import tempfile
import time
from pathlib import Path

from bench.bench_tcp import make_lines
from ingest.health import HealthRegistry
from ingest.routing import SourceRef
from ingest.sink import IngestSink
from ingest.tcp.framing import LineFramer
from ingest.tcp.lines import LineStream, payload_format
from sluice.components.ingest_core import build_router
from sluice.config import load_settings
from sluice.serve import open_store

READ_BYTES = 64 * 1024


async def run(fmt: str, flush: str, data: bytes, count: int, data_dir: Path) -> float:
    """Thread CPU seconds spent on ``data``'s reads."""
    clock = [1_700_000_000.0]
    settings = load_settings(None, data_dir=data_dir,
                             storage={"backend": "segment", "flush": flush, "default_partitions": 4})
    store = open_store(settings)
    await store.start()
    health = HealthRegistry(clock=lambda: clock[0])
    sink = IngestSink(store, build_router(settings.ingest), health, clock=lambda: clock[0])
    source = SourceRef("tcp", "default", payload_format(fmt))
    health.register(source)
    framer = LineFramer()
    stream = LineStream(fmt)
    try:
        cpu = time.thread_time()
        for pos in range(0, len(data), READ_BYTES):
            clock[0] += 0.005  # 200 reads a second
            items = framer.feed(data[pos:pos + READ_BYTES])
            lines = stream.lines(items)
            if lines is None:  # what the listener does with a read LineStream.lines leaves to messages
                await sink.ingest(source, stream.messages(items, int(clock[0] * 1000))[0])
            else:
                await sink.ingest_lines(source, lines, int(clock[0] * 1000), stream.columns)
        cpu = time.thread_time() - cpu
        assert sink.messages_written == count and sink.dead_lettered == 0
    finally:
        await store.close()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", choices=["ndjson", "influx", "csv"], default="ndjson")
    parser.add_argument("--flush", choices=["os", "always"], default="os")
    parser.add_argument("--lines", type=int, default=30_000)
    args = parser.parse_args()
    saved = Path(tempfile.gettempdir()) / f"bench-tcp-inproc-{args.format}-{args.lines}.lines"
    if not saved.exists():
        saved.write_bytes(make_lines(args.format, args.lines))
    data = saved.read_bytes()
    with tempfile.TemporaryDirectory(prefix="bench-tcp-inproc-") as tmp:
        coro = run(args.format, args.flush, data, args.lines, Path(tmp))
        if importlib.util.find_spec("uvloop") is not None:  # as bench_tcp and sluice serve run
            import uvloop

            cpu = uvloop.run(coro)
        else:
            cpu = asyncio.run(coro)
    print(f"{args.lines} {args.format} lines, flush={args.flush}: "
          f"{cpu / args.lines * 1e6:.2f} µs of thread CPU per line")


if __name__ == "__main__":
    main()
