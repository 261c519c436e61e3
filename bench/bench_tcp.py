"""TCP line ingest into the durable log, side by side with Redis Streams, in one run.

    python -m bench.bench_tcp [--lines 200000] [--partitions 4]

Sluice: the TCP line listener (NDJSON, then InfluxDB line protocol) runs in this process on the
store ``sluice serve`` would open (``open_store``: segment files when that backend is present) with
flush=always and flush=os; ``nc`` (C, netcat-openbsd) pushes a pre-generated file of lines.
Time = from nc's start until the sink reports every line durably appended.

Peer: redis-server started on a free port with AOF on (``appendfsync always`` / ``no``, the same
durability promises), fed the same lines as ``XADD tcp * line <line>`` by ``redis-cli --pipe`` (C).
Time = until redis-cli has every reply. Prints a table and the ratios (Sluice / Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ingest.health import HealthRegistry
from ingest.sink import IngestSink
from ingest.tcp.listener import TcpLineListener, TcpListenerConfig
from sluice.components.ingest_core import build_router
from sluice.config import load_settings
from sluice.serve import open_store


def make_lines(fmt: str, count: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    out = []
    ts = 1_700_000_000_000
    for i in range(count):
        dev = f"dev-{rng.randrange(1000):04d}"
        temp = round(15 + rng.random() * 15, 2)
        hum = round(30 + rng.random() * 40, 1)
        if fmt == "ndjson":
            out.append(f'{{"device_id":"{dev}","ts":{ts + i},"temp":{temp},"hum":{hum}}}\n')
        else:
            out.append(f"weather,device_id={dev} temp={temp},hum={hum} {(ts + i) * 1_000_000}\n")
    return "".join(out).encode()


async def run_sluice(lines_file: Path, fmt: str, count: int, flush: str, partitions: int, data_dir: Path) -> dict:
    settings = load_settings(
        None,
        data_dir=data_dir,
        storage={"backend": "segment", "flush": flush, "default_partitions": partitions},
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(settings)
    await store.start()
    router = build_router(settings.ingest)
    health = HealthRegistry()
    sink = IngestSink(store, router, health, max_pending_bytes=settings.ingest.max_pending_bytes)
    listener = TcpLineListener(TcpListenerConfig(port=0, format=fmt), sink, health)
    await listener.start()
    try:
        start = time.perf_counter()
        with lines_file.open("rb") as stdin:
            proc = await asyncio.create_subprocess_exec("nc", "-N", "127.0.0.1", str(listener.port), stdin=stdin)
            await proc.wait()
        while sink.messages_written < count:
            await asyncio.sleep(0.001)
        elapsed = time.perf_counter() - start
        assert sink.dead_lettered == 0, "bench lines must all be valid"
    finally:
        await listener.stop()
        await store.flush()
        await store.close()
    return {"store": type(store).__name__, "seconds": elapsed, "rate": count / elapsed}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resp_xadd(lines: bytes) -> bytes:
    parts = []
    for line in lines.splitlines():
        parts.append(b"*5\r\n$4\r\nXADD\r\n$3\r\ntcp\r\n$1\r\n*\r\n$4\r\nline\r\n$%d\r\n%s\r\n" % (len(line), line))
    return b"".join(parts)


def run_redis(resp_file: Path, count: int, fsync: str, work: Path) -> dict:
    port = _free_port()
    work.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work), "--save", "",
         "--appendonly", "yes", "--appendfsync", fsync, "--protected-mode", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout.strip() != b"PONG":
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        start = time.perf_counter()
        with resp_file.open("rb") as stdin:
            done = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], stdin=stdin, capture_output=True)
        elapsed = time.perf_counter() - start
        if b"errors: 0" not in done.stdout:
            raise RuntimeError(f"redis-cli --pipe failed: {done.stdout!r}")
        length = subprocess.run(["redis-cli", "-p", str(port), "xlen", "tcp"], capture_output=True).stdout
        assert int(length) == count, length
    finally:
        server.terminate()
        server.wait(10)
    return {"store": "redis-server", "seconds": elapsed, "rate": count / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    for tool in ("nc", "redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing: run scripts/install-system-deps.sh")
    use_uvloop = importlib.util.find_spec("uvloop") is not None
    print(f"lines={args.lines} partitions={args.partitions} loop={'uvloop' if use_uvloop else 'asyncio'} "
          f"cpus={os.cpu_count()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-tcp-") as tmp:
        root = Path(tmp)
        for fmt in ("ndjson", "influx"):
            lines = make_lines(fmt, args.lines)
            lines_file = root / f"lines.{fmt}"
            lines_file.write_bytes(lines)
            resp_file = root / f"resp.{fmt}"
            resp_file.write_bytes(resp_xadd(lines))
            for flush, fsync in (("always", "always"), ("os", "no")):
                data_dir = root / f"sluice-{fmt}-{flush}"
                coro = run_sluice(lines_file, fmt, args.lines, flush, args.partitions, data_dir)
                if use_uvloop:
                    import uvloop

                    sluice = uvloop.run(coro)
                else:
                    sluice = asyncio.run(coro)
                redis = run_redis(resp_file, args.lines, fsync, root / f"redis-{fmt}-{flush}")
                rows.append((fmt, flush, sluice, redis, fsync))
                with contextlib.suppress(OSError):
                    shutil.rmtree(data_dir)
    print("| format | durability | Sluice store | Sluice lines/s | Redis Streams lines/s (appendfsync) | ratio |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for fmt, flush, sluice, redis, fsync in rows:
        print(f"| {fmt} | flush={flush} | {sluice['store']} | {sluice['rate']:,.0f} | "
              f"{redis['rate']:,.0f} ({fsync}) | {sluice['rate'] / redis['rate']:.2f}x |")


if __name__ == "__main__":
    main()
