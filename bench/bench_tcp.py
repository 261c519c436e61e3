"""TCP line ingest into the durable log, side by side with Redis Streams, in one run.

    python -m bench.bench_tcp [--lines 200000] [--partitions 4] [--devices 100 --interval-ms 10 --device-seconds 5]
                              [--formats ndjson,influx,csv] [--devices-only] [--coalesce-ms MS]

Sluice: the TCP line listener (NDJSON, InfluxDB line protocol, then CSV: a header line, then rows) runs in
this process on the store ``sluice serve`` would open (``open_store``: segment files when that backend is present) with
flush=always and flush=os; ``nc`` (C, netcat-openbsd) pushes a pre-generated file of lines.
Time = from nc's start until the sink reports every line durably appended.

Peer: redis-server started on a free port with AOF on (``appendfsync always`` / ``no``, the same
durability promises), fed the same lines as ``XADD tcp * line <line>`` by ``redis-cli --pipe`` (C; for CSV
the rows, without the header).
Time = until redis-cli has every reply. Prints a table and the ratios (Sluice / Redis), and each server's
CPU per line: for Sluice this process's CPU time over the run (user + system: the listener, the store's
writes and this bench's wait for the last line), for Redis redis-server's (``/proc/<pid>/stat``), read
before and after the pipe. On a shared machine CPU per line moves less than the rates do. This process
takes ``sluice serve``'s garbage-collector settings (``sluice.gc_tuning``) before the runs.

Devices row (``--devices 100``, 0 to skip; NDJSON and InfluxDB only): the realistic shape instead of one bulk pipe —
``--devices`` connections, each sending one line every ``--interval-ms`` (10 ms: 10,000 lines/s in
all) for ``--device-seconds``, from a separate Python process (``--drive``, asyncio). Both sides get
the same lines (Redis as one ``XADD`` per line, replies read); flush=os against appendfsync no.
Reported: lines/s the driver reached (the offered rate when the server and the driver keep up;
for Redis, replies included), for Sluice the time from the driver's exit to the last line stored,
and the server's CPU per line (Sluice: this process's CPU time; Redis: redis-server's, from /proc).
Ratio = Redis CPU per line / Sluice CPU per line (> 1: Sluice spends less).

The sink takes ``sluice serve``'s ingest settings (``ingest.coalesce_ms``: a small write within that long of
the source's last one waits for it, ``ingest/line_turns.py``); ``--coalesce-ms`` sets another value (0: a
write every loop turn). ``--devices-only`` runs the devices row alone.
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
import sys
import tempfile
import time
from pathlib import Path

from ingest.health import HealthRegistry
from ingest.sink import IngestSink
from ingest.tcp.listener import TcpLineListener, TcpListenerConfig
from sluice.components.ingest_core import build_router
from sluice.config import Settings, load_settings
from sluice.gc_tuning import tune_for_serving
from sluice.serve import open_store

CSV_HEADER = b"device_id,ts,temp,hum\n"


def make_lines(fmt: str, count: int, seed: int = 1) -> bytes:
    """``count`` readings of 1,000 devices as lines of ``fmt``; CSV starts with its header line (not counted)."""
    rng = random.Random(seed)
    out = [CSV_HEADER.decode()] if fmt == "csv" else []
    ts = 1_700_000_000_000
    for i in range(count):
        dev = f"dev-{rng.randrange(1000):04d}"
        temp = round(15 + rng.random() * 15, 2)
        hum = round(30 + rng.random() * 40, 1)
        if fmt == "ndjson":
            out.append(f'{{"device_id":"{dev}","ts":{ts + i},"temp":{temp},"hum":{hum}}}\n')
        elif fmt == "csv":
            out.append(f"{dev},{ts + i},{temp},{hum}\n")
        else:
            out.append(f"weather,device_id={dev} temp={temp},hum={hum} {(ts + i) * 1_000_000}\n")
    return "".join(out).encode()


def _ingest_overrides(coalesce_ms: float | None) -> dict:
    return {} if coalesce_ms is None else {"ingest": {"coalesce_ms": coalesce_ms}}


def _sink_options(settings: Settings) -> dict:
    """The IngestSink settings ``sluice serve`` passes (sluice/components/ingest_core.py)."""
    options: dict = {"max_pending_bytes": settings.ingest.max_pending_bytes}
    coalesce_ms = getattr(settings.ingest, "coalesce_ms", None)  # (a tree before the setting: none)
    if coalesce_ms is not None:
        options["coalesce_s"] = coalesce_ms / 1000
    return options


async def run_sluice(lines_file: Path, fmt: str, count: int, flush: str, partitions: int, data_dir: Path,
                     coalesce_ms: float | None = None) -> dict:
    settings = load_settings(
        None,
        data_dir=data_dir,
        storage={"backend": "segment", "flush": flush, "default_partitions": partitions},
        **_ingest_overrides(coalesce_ms),
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(settings)
    await store.start()
    router = build_router(settings.ingest)
    health = HealthRegistry()
    sink = IngestSink(store, router, health, **_sink_options(settings))
    listener = TcpLineListener(TcpListenerConfig(port=0, format=fmt), sink, health)
    await listener.start()
    try:
        cpu = time.process_time()
        start = time.perf_counter()
        with lines_file.open("rb") as stdin:
            proc = await asyncio.create_subprocess_exec("nc", "-N", "127.0.0.1", str(listener.port), stdin=stdin)
            await proc.wait()
        while sink.messages_written < count:
            await asyncio.sleep(0.001)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        assert sink.dead_lettered == 0, "bench lines must all be valid"
    finally:
        await listener.stop()
        await store.flush()
        await store.close()
    return {"store": type(store).__name__, "seconds": elapsed, "rate": count / elapsed, "cpu_us": cpu / count * 1e6}


def _drive_command(port: int, lines_file: Path, args: argparse.Namespace, resp: bool) -> list[str]:
    return [sys.executable, "-m", "bench.bench_tcp", "--drive", str(port), "--drive-file", str(lines_file),
            "--devices", str(args.devices), "--interval-ms", str(args.interval_ms),
            "--device-seconds", str(args.device_seconds)] + (["--resp"] if resp else [])


def _device_lines(args: argparse.Namespace) -> int:
    return args.devices * round(args.device_seconds * 1000 / args.interval_ms)


async def run_sluice_devices(lines_file: Path, fmt: str, args: argparse.Namespace, data_dir: Path) -> dict:
    """The devices row, Sluice side: flush=os, the driver in its own process."""
    count = _device_lines(args)
    settings = load_settings(
        None, data_dir=data_dir,
        storage={"backend": "segment", "flush": "os", "default_partitions": args.partitions},
        **_ingest_overrides(args.coalesce_ms),
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(settings)
    await store.start()
    sink = IngestSink(store, build_router(settings.ingest), HealthRegistry(), **_sink_options(settings))
    listener = TcpLineListener(TcpListenerConfig(port=0, format=fmt, backlog=4096), sink, HealthRegistry())
    await listener.start()
    try:
        cpu = time.process_time()
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(*_drive_command(listener.port, lines_file, args, resp=False),
                                                    stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError("the device driver failed")
        sent = time.perf_counter()
        while sink.messages_written < count:
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        assert sink.dead_lettered == 0, "bench lines must all be valid"
    finally:
        await listener.stop()
        await store.flush()
        await store.close()
    return {"rate": float(out), "lag": start + elapsed - sent, "cpu_us": cpu / count * 1e6}


def run_redis_devices(lines_file: Path, args: argparse.Namespace, work: Path) -> dict:
    count = _device_lines(args)
    port = _free_port()
    work.mkdir(parents=True, exist_ok=True)
    server = _start_redis(port, work, "no")
    try:
        cpu = _proc_cpu(server.pid)
        out = subprocess.run(_drive_command(port, lines_file, args, resp=True), check=True,
                             capture_output=True).stdout
        cpu = _proc_cpu(server.pid) - cpu
        length = subprocess.run(["redis-cli", "-p", str(port), "xlen", "tcp"], capture_output=True).stdout
        assert int(length) == count, length
    finally:
        server.terminate()
        server.wait(10)
    return {"rate": float(out), "cpu_us": cpu / count * 1e6}


def _proc_cpu(pid: int) -> float:
    """user + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(port: int, lines: list[bytes], devices: int, interval: float, seconds: float, resp: bool) -> None:
    """``devices`` connections, each writing one line every ``interval`` s (device d sends lines d,
    d + devices, …); with ``resp`` each line is an XADD and every reply is read before returning."""
    per_device = round(seconds / interval)

    async def device(d: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        start = loop.time() + d * interval / devices  # spread the devices over the interval
        for k in range(per_device):
            delay = start + k * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            line = lines[(k * devices + d) % len(lines)]
            writer.write(resp_xadd(line) if resp else line + b"\n")
        await writer.drain()
        if resp:  # an XADD reply is one bulk string: two CRLFs (a stream id holds none)
            crlfs = 0
            while crlfs < 2 * per_device:
                chunk = await reader.read(65536)
                if not chunk:
                    raise RuntimeError("redis closed the connection")
                crlfs += chunk.count(b"\r\n")
        writer.close()
        await writer.wait_closed()

    first = time.time()
    await asyncio.gather(*(device(d) for d in range(devices)))
    print(f"{devices * per_device / (time.time() - first):.0f}")  # lines/s the driver reached, replies included


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resp_xadd(lines: bytes) -> bytes:
    parts = []
    for line in lines.splitlines():
        parts.append(b"*5\r\n$4\r\nXADD\r\n$3\r\ntcp\r\n$1\r\n*\r\n$4\r\nline\r\n$%d\r\n%s\r\n" % (len(line), line))
    return b"".join(parts)


def _start_redis(port: int, work: Path, fsync: str) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work), "--save", "",
         "--appendonly", "yes", "--appendfsync", fsync, "--protected-mode", "no", "--maxclients", "1000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout.strip() != b"PONG":
        if time.monotonic() > deadline:
            server.terminate()
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)
    return server


def run_redis(resp_file: Path, count: int, fsync: str, work: Path) -> dict:
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
        length = subprocess.run(["redis-cli", "-p", str(port), "xlen", "tcp"], capture_output=True).stdout
        assert int(length) == count, length
    finally:
        server.terminate()
        server.wait(10)
    return {"store": "redis-server", "seconds": elapsed, "rate": count / elapsed, "cpu_us": cpu / count * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--devices", type=int, default=100, help="connections of the devices row (0: no row)")
    parser.add_argument("--interval-ms", type=float, default=10.0, help="devices row: ms between a device's lines")
    parser.add_argument("--device-seconds", type=float, default=5.0, help="devices row: how long each device sends")
    parser.add_argument("--formats", default="ndjson,influx,csv", help="comma-separated: ndjson, influx, csv")
    parser.add_argument("--devices-only", action="store_true", help="the devices row alone (no bulk rows)")
    parser.add_argument("--coalesce-ms", type=float, default=None,
                        help="ingest.coalesce_ms for Sluice (default: the setting's default, as sluice serve runs)")
    parser.add_argument("--drive", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the driver process
    parser.add_argument("--drive-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--resp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive is not None:
        asyncio.run(drive(args.drive, args.drive_file.read_bytes().splitlines(), args.devices,
                          args.interval_ms / 1000, args.device_seconds, args.resp))
        return
    for tool in ("nc", "redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing: run scripts/install-system-deps.sh")
    use_uvloop = importlib.util.find_spec("uvloop") is not None
    if use_uvloop:
        import uvloop
    tune_for_serving()  # the garbage-collector settings `sluice serve` runs with (sluice/gc_tuning.py)
    coalesce = args.coalesce_ms if args.coalesce_ms is not None else getattr(
        load_settings(None).ingest, "coalesce_ms", "(no setting)")
    print(f"lines={args.lines} partitions={args.partitions} loop={'uvloop' if use_uvloop else 'asyncio'} "
          f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} coalesce_ms={coalesce}")
    rows = []
    devices: list[tuple[str, dict, dict]] = []
    with tempfile.TemporaryDirectory(prefix="bench-tcp-") as tmp:
        root = Path(tmp)
        for fmt in args.formats.split(","):
            lines = make_lines(fmt, args.lines)
            lines_file = root / f"lines.{fmt}"
            lines_file.write_bytes(lines)
            resp_file = root / f"resp.{fmt}"
            resp_file.write_bytes(resp_xadd(lines.removeprefix(CSV_HEADER) if fmt == "csv" else lines))
            for flush, fsync in (("always", "always"), ("os", "no")) if not args.devices_only else ():
                data_dir = root / f"sluice-{fmt}-{flush}"
                coro = run_sluice(lines_file, fmt, args.lines, flush, args.partitions, data_dir, args.coalesce_ms)
                sluice = uvloop.run(coro) if use_uvloop else asyncio.run(coro)
                redis = run_redis(resp_file, args.lines, fsync, root / f"redis-{fmt}-{flush}")
                rows.append((fmt, flush, sluice, redis, fsync))
                with contextlib.suppress(OSError):
                    shutil.rmtree(data_dir)
            if args.devices and fmt != "csv":
                coro_devices = run_sluice_devices(lines_file, fmt, args, root / f"sluice-{fmt}-devices")
                sluice_devices = uvloop.run(coro_devices) if use_uvloop else asyncio.run(coro_devices)
                devices.append((fmt, sluice_devices, run_redis_devices(lines_file, args, root / f"redis-{fmt}-dev")))
    print("| format | durability | Sluice store | Sluice lines/s | Redis Streams lines/s (appendfsync) | ratio | "
          "Sluice CPU µs/line | Redis CPU µs/line |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for fmt, flush, sluice, redis, fsync in rows:
        print(f"| {fmt} | flush={flush} | {sluice['store']} | {sluice['rate']:,.0f} | "
              f"{redis['rate']:,.0f} ({fsync}) | {sluice['rate'] / redis['rate']:.2f}x | "
              f"{sluice['cpu_us']:.2f} | {redis['cpu_us']:.2f} |")

    if devices:
        print(f"\n{args.devices} connections x 1 line every {args.interval_ms:g} ms for {args.device_seconds:g} s "
              f"({_device_lines(args):,} lines; flush=os / appendfsync no)")
        print("| format | Sluice lines/s sent | Sluice driver exit -> all stored | Sluice CPU µs/line | "
              "Redis lines/s sent | Redis CPU µs/line | CPU ratio (Redis / Sluice) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for fmt, sl, rd in devices:
            print(f"| {fmt} | {sl['rate']:,.0f} | {sl['lag'] * 1000:.0f} ms | {sl['cpu_us']:.1f} | {rd['rate']:,.0f} | "
                  f"{rd['cpu_us']:.1f} | {rd['cpu_us'] / sl['cpu_us']:.2f}x |")


if __name__ == "__main__":
    main()
