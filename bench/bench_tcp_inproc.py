"""The TCP line path in process: for counting instructions per line.

    python -m bench.bench_tcp_inproc [--format ndjson|influx|csv] [--flush os] [--lines 30000]
    python -m bench.bench_tcp_inproc --devices 100 --per-turn K [--format ndjson|influx] [--flush os] [--lines 30000]

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

With ``--devices D`` it is bench_tcp's devices row made deterministic: the TCP listener (no ack mode, or
``--ack``) in this process, D connections to it from this process (plain blocking sockets), and the lines
sent in rounds: each round sends one line on each of ``--per-turn`` K connections (the next ones in turn),
then waits (on an event, no polling) until the sink has stored them (with ``--ack``, until each of those
connections got its ack). So K reads are ready at once: K = 1 is devices that never send in the same loop
turn (every read alone), larger K those that do (bench_tcp's driver wakes ~100 times a second and sends ~50
lines each time). ``--warmup W`` first sends W lines 100 at a time, untimed, so that the timed lines find
every device's route learned (1,000 devices: W = 8,000 leaves few unseen). Prints the thread's CPU per line
(everything: the loop, the socket reads, the listener, the sink, this bench's sends); for instructions,
callgrind as above with the same ``--warmup`` for both counts.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_tcp import make_lines
from ingest.health import HealthRegistry
from ingest.routing import SourceRef
from ingest.sink import IngestSink
from ingest.tcp.framing import LineFramer
from ingest.tcp.lines import LineStream, payload_format
from ingest.tcp.listener import TcpLineListener, TcpListenerConfig
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


class _CountingSink(IngestSink):
    """The sink, telling the bench when ``target`` lines have been stored (no polling loop in the count):
    ``messages_written`` is a property here, so the sink's own count sets the event."""

    target = 0
    reached: asyncio.Event
    _written = 0

    @property
    def messages_written(self) -> int:
        return self._written

    @messages_written.setter
    def messages_written(self, value: int) -> None:
        self._written = value
        if value >= self.target and hasattr(self, "reached"):
            self.reached.set()


async def run_devices(fmt: str, flush: str, data: bytes, count: int, data_dir: Path, devices: int,
                      per_turn: int, ack: bool, warmup: int, stream: bool = False,
                      coalesce_ms: float | None = None) -> float:
    """Thread CPU seconds for ``count`` lines sent by ``devices`` connections, ``per_turn`` at a time, after
    ``warmup`` lines (100 at a time, not timed: every device's route learned before). ``stream``: the next
    round follows after one loop iteration instead of once the round is stored. ``coalesce_ms``: the sink's
    ``coalesce_s`` (None: the IngestSink default, 0)."""
    settings = load_settings(None, data_dir=data_dir,
                             storage={"backend": "segment", "flush": flush, "default_partitions": 4})
    store = open_store(settings)
    await store.start()
    health = HealthRegistry()
    options: dict[str, Any] = {} if coalesce_ms is None else {"coalesce_s": coalesce_ms / 1000}
    sink = _CountingSink(store, build_router(settings.ingest), health, **options)
    sink.reached = asyncio.Event()
    listener = TcpLineListener(TcpListenerConfig(port=0, format=fmt, ack=ack), sink, health)
    await listener.start()
    loop = asyncio.get_running_loop()
    lines = [line + b"\n" for line in data.splitlines()]
    conns = [socket.create_connection(("127.0.0.1", listener.port)) for _ in range(devices)]
    acked = [0]
    acks = asyncio.Event()

    def on_answer(conn: socket.socket) -> None:  # ack mode: one read's answer ends with its ACK line
        acked[0] += conn.recv(65536).count(b"ACK ")
        if acked[0] >= sink.target:
            acks.set()

    for conn in conns:
        conn.setblocking(False)
        if ack:
            loop.add_reader(conn.fileno(), on_answer, conn)
    try:
        while listener.connection_count < devices:
            await asyncio.sleep(0.001)
        total = warmup + count  # ``data`` holds the warm-up lines first
        cpu = time.thread_time()
        sent = 0
        while sent < total:
            if sent == warmup:
                cpu = time.thread_time()
            batch = min(per_turn, total - sent) if sent >= warmup else min(100, warmup - sent)
            for k in range(batch):
                conns[(sent + k) % devices].send(lines[sent + k])
            sent += batch
            if stream and sent < total and sent > warmup:
                await asyncio.sleep(0)  # one loop iteration: the listener reads what is there
                continue
            sink.target = sent
            done = acks if ack else sink.reached
            done.clear()
            if (acked[0] if ack else sink.messages_written) < sent:
                await done.wait()
        cpu = time.thread_time() - cpu
        assert sink.messages_written == total and sink.dead_lettered == 0
    finally:
        for conn in conns:
            if ack:
                loop.remove_reader(conn.fileno())
            conn.close()
        await listener.stop()
        await store.close()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", choices=["ndjson", "influx", "csv"], default="ndjson")
    parser.add_argument("--flush", choices=["os", "always"], default="os")
    parser.add_argument("--lines", type=int, default=30_000)
    parser.add_argument("--devices", type=int, default=0, help="connections (0: no sockets, the read path alone)")
    parser.add_argument("--per-turn", type=int, default=1, help="with --devices: connections sending at once")
    parser.add_argument("--warmup", type=int, default=0,
                        help="with --devices: lines sent first, 100 at a time, untimed (8000: every device learned)")
    parser.add_argument("--ack", action="store_true", help="with --devices: the listener in ack mode")
    parser.add_argument("--stream", action="store_true",
                        help="with --devices: each round one loop iteration after the last, not once it is stored")
    parser.add_argument("--coalesce-ms", type=float, default=None, help="with --devices: the sink's coalescing")
    args = parser.parse_args()
    total = args.lines + args.warmup
    saved = Path(tempfile.gettempdir()) / f"bench-tcp-inproc-{args.format}-{total}.lines"
    if not saved.exists():
        saved.write_bytes(make_lines(args.format, total))
    data = saved.read_bytes()
    with tempfile.TemporaryDirectory(prefix="bench-tcp-inproc-") as tmp:
        coro = (run_devices(args.format, args.flush, data, args.lines, Path(tmp), args.devices, args.per_turn,
                            args.ack, args.warmup, args.stream, args.coalesce_ms)
                if args.devices else run(args.format, args.flush, data, args.lines, Path(tmp)))
        if importlib.util.find_spec("uvloop") is not None:  # as bench_tcp and sluice serve run
            import uvloop

            cpu = uvloop.run(coro)
        else:
            cpu = asyncio.run(coro)
    ack = ", ack" if args.ack else ""
    pace = ", streamed" if args.stream else ""
    coalesce = f", coalesce {args.coalesce_ms:g} ms" if args.coalesce_ms is not None else ""
    shape = f", {args.devices} connections, {args.per_turn} per turn{ack}{pace}{coalesce}" if args.devices else ""
    print(f"{args.lines} {args.format} lines{shape}, flush={args.flush}: "
          f"{cpu / args.lines * 1e6:.2f} µs of thread CPU per line")


if __name__ == "__main__":
    main()
