"""MQTT ingest into the durable log vs Mosquitto's own pub→sub, and memory per idle MQTT connection.

    python -m bench.bench_mqtt [--publishers 4] [--messages 25000] [--connections 10000]

Throughput (same load for both, 100 B payloads, MQTT 5, in-flight window 1000 on client and broker):
``--publishers`` ``mosquitto_pub -l`` processes (C) each send ``--messages`` lines at QoS 0, then QoS 1.

* Sluice: the MQTT listener runs in this process (uvloop) on the segment store ``sluice serve`` opens,
  flush=always (and flush=os), with the garbage-collector settings ``sluice serve`` applies once started
  (``sluice.gc_tuning``; ``--gc default`` keeps CPython's). Time = from starting the publishers until
  the ingest sink has durably appended every message (QoS 1: every PUBACK was sent after that append).
  Also reported: this process's CPU time per message (user + system), which the other load on a
  shared machine disturbs less than the rates.
* Mosquitto: ``mosquitto`` on a free port (persistence on, max_inflight_messages 1000) with a
  ``mosquitto_sub -C <total>`` subscriber at the same QoS. Time = from starting the publishers until the
  subscriber has received every message.

Each row prints the 1-minute load average when it ended.

Memory: a separate process opens ``--connections`` MQTT connections (CONNECT, CONNACK, then idle) to
a fresh ``sluice serve`` process's listener; reported is the RSS delta of that process per connection,
and the same for the Mosquitto process.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from broker.log.api import LogStore
from ingest.mqtt.listener import MqttListener
from sluice.components.mqtt import mqtt_listener
from sluice.config import load_settings
from sluice.gc_tuning import tune_for_serving
from sluice.runtime import Runtime
from sluice.serve import open_store

PAYLOAD = 100


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def make_lines(path: Path, count: int, tag: int) -> None:
    body = "".join(f"p{tag:02d}-{i:08d}-".ljust(PAYLOAD, "x") + "\n" for i in range(count))
    path.write_text(body)


def publishers(port: int, qos: int, files: list[Path]) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i, f in enumerate(files):
        procs.append(subprocess.Popen(
            ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-V", "mqttv5", "-q", str(qos), "-M", "1000",
             "-i", f"bench-pub-{i}", "-t", f"bench/dev{i}/reading", "-l"],
            stdin=f.open("rb"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        ))
    return procs


async def sluice_run(files: list[Path], total: int, qos: int, flush: str, data_dir: Path,
                     gc_tuning: bool = True) -> tuple[float, float]:
    """(seconds, CPU seconds of this process) to append ``total`` messages."""
    settings = load_settings(None, data_dir=data_dir, mqtt={"port": 0},
                             storage={"backend": "segment", "flush": flush})
    data_dir.mkdir(parents=True, exist_ok=True)
    store: LogStore = open_store(settings)
    await store.start()
    runtime = Runtime(settings, store)
    listener = mqtt_listener(runtime)
    assert isinstance(listener, MqttListener)
    await listener.start()
    sink = runtime.registries["ingest_sink"]
    if gc_tuning:
        tune_for_serving()  # as sluice serve does once its components have started
    try:
        cpu_start = time.process_time()
        start = time.perf_counter()
        procs = publishers(listener.port, qos, files)
        progress_at, seen = time.monotonic(), 0
        while sink.messages_written < total:
            if sink.messages_written != seen:
                progress_at, seen = time.monotonic(), sink.messages_written
            elif time.monotonic() - progress_at > 10:
                errs = [p.stderr.read().decode() for p in procs if p.stderr and p.poll() is not None]
                raise RuntimeError(f"stalled at {sink.messages_written}/{total} appended; {errs}")
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        for p in procs:
            await asyncio.to_thread(p.wait)
            assert p.returncode == 0, p.stderr.read() if p.stderr else ""
        return elapsed, cpu
    finally:
        await listener.stop()
        await store.close()


def mosquitto_conf(directory: Path, port: int) -> Path:
    conf = directory / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
        f"persistence_location {directory}/\nmax_inflight_messages 1000\nmax_queued_messages 0\n"
        f"max_connections -1\nuser {getpass.getuser()}\n"
    )
    return conf


def start_mosquitto(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = mosquitto_conf(directory, port)
    proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=raise_fd_limit)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def mosquitto_run(files: list[Path], total: int, qos: int, directory: Path) -> tuple[float, int]:
    proc, port = start_mosquitto(directory)
    try:
        sub = subprocess.Popen(
            ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", "mqttv5", "-q", str(qos),
             "-t", "bench/#", "-C", str(total), "-W", "120"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # let the subscription land before publishing
        start = time.perf_counter()
        procs = publishers(port, qos, files)
        received = 0
        assert sub.stdout is not None
        for _ in sub.stdout:
            received += 1
        sub.wait()
        elapsed = time.perf_counter() - start
        for p in procs:
            p.wait()
        return elapsed, received
    finally:
        proc.terminate()
        proc.wait()


# ---------------------------------------------------------------------------------------- memory
def connector(port: int, count: int) -> None:
    """Child process: open ``count`` MQTT 3.1.1 connections, say 'ready', idle until stdin closes."""
    raise_fd_limit()
    socks = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        cid = f"idle-{i:06d}".encode()
        body = b"\x00\x04MQTT\x04\x02\x02\x58" + len(cid).to_bytes(2, "big") + cid  # keepalive 600 s
        s.sendall(bytes((0x10, len(body))) + body)
        socks.append(s)
    for s in socks:
        ack = s.recv(4)
        assert ack == b"\x20\x02\x00\x00", ack
    print("ready", flush=True)
    sys.stdin.read()


def open_idle(port: int, count: int) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-m", "bench.bench_mqtt", "--connector", str(port), str(count)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == "ready", line
    return child


def rss_with_idle(pid: int, port: int, count: int, *, settle: float, hold: float) -> tuple[int, int]:
    """The broker's RSS after ``settle`` s, and again once ``count`` idle connections were open ``hold`` s."""
    time.sleep(settle)
    before = rss_kib(pid)
    child = open_idle(port, count)
    time.sleep(hold)
    after = rss_kib(pid)
    assert child.stdin is not None
    child.stdin.close()
    child.wait()
    return before, after


def sluice_memory(count: int, data_dir: Path) -> tuple[int, int]:
    """A fresh ``sluice serve`` process (so no freed memory from the throughput runs is reused)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SLUICE_MQTT__PORT": "0", "SLUICE_TCP__PORT": "0", "SLUICE_HTTP__PORT": "0",
           "SLUICE_KAFKA__PORT": "0", "SLUICE_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data_dir)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=raise_fd_limit)
    try:
        endpoints = data_dir / "endpoints.json"
        deadline = time.monotonic() + 30
        while not (endpoints.exists() and "mqtt" in endpoints.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "sluice did not start"
            time.sleep(0.05)
        port = json.loads(endpoints.read_text())["mqtt"]["port"]
        return rss_with_idle(proc.pid, port, count, settle=1.0, hold=2.0)
    finally:
        proc.terminate()
        proc.wait()


def mosquitto_memory(count: int, directory: Path) -> tuple[int, int]:
    proc, port = start_mosquitto(directory)
    try:
        return rss_with_idle(proc.pid, port, count, settle=0.3, hold=1.0)
    finally:
        proc.terminate()
        proc.wait()


async def main(args: argparse.Namespace) -> None:
    raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="bench-mqtt-"))
    try:
        total = args.publishers * args.messages
        files = []
        for i in range(args.publishers):
            f = tmp / f"lines-{i}.txt"
            make_lines(f, args.messages, i)
            files.append(f)
        print(f"{args.publishers} x mosquitto_pub -l, {args.messages} msgs each ({total} total, {PAYLOAD} B payloads)")
        rows = []
        gc_tuning = args.gc == "serving"
        for qos in (0, 1):
            for run in range(args.runs):
                s_always, cpu_always = await sluice_run(files, total, qos, "always", tmp / f"s-always-{qos}-{run}",
                                                        gc_tuning)
                s_os, cpu_os = await sluice_run(files, total, qos, "os", tmp / f"s-os-{qos}-{run}", gc_tuning)
                mdir = tmp / f"mosq-{qos}-{run}"
                mdir.mkdir()
                m_elapsed, received = await asyncio.to_thread(mosquitto_run, files, total, qos, mdir)
                row = (qos, run, total / s_always, total / s_os, received / m_elapsed, received)
                rows.append(row)
                print(f"QoS {qos} run {run + 1}: Sluice flush=always {row[2]:,.0f} msg/s, flush=os {row[3]:,.0f} msg/s;"
                      f" Mosquitto pub->sub {row[4]:,.0f} msg/s ({received}/{total} received);"
                      f" ratio always/Mosquitto {row[2] / row[4]:.2f}x, os/Mosquitto {row[3] / row[4]:.2f}x;"
                      f" Sluice CPU {cpu_always / total * 1e6:.1f} / {cpu_os / total * 1e6:.1f} us/msg;"
                      f" load {os.getloadavg()[0]:.1f}", flush=True)
        for qos in (0, 1):
            ratios = [min(r[2], r[3]) / r[4] for r in rows if r[0] == qos]
            if ratios:
                print(f"QoS {qos}: lowest ratio {min(ratios):.2f}x, highest {max(ratios):.2f}x over {len(ratios)} runs")
        if args.connections:
            before, after = await asyncio.to_thread(sluice_memory, args.connections, tmp / "s-mem")
            per = (after - before) * 1024 / args.connections
            mdir = tmp / "mosq-mem"
            mdir.mkdir()
            mb, ma = await asyncio.to_thread(mosquitto_memory, args.connections, mdir)
            mper = (ma - mb) * 1024 / args.connections
            print(f"idle connections: {args.connections}; Sluice RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB ="
                  f" {per / 1024:.1f} KiB/connection; Mosquitto RSS {mb / 1024:.1f} -> {ma / 1024:.1f} MiB ="
                  f" {mper / 1024:.1f} KiB/connection")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--connector":
        connector(int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=25_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--gc", choices=("serving", "default"), default="serving",
                        help="Sluice's garbage-collector settings: as sluice serve (default) or CPython's")
    ns = parser.parse_args()
    try:
        import uvloop

        uvloop.run(main(ns))
    except ImportError:
        asyncio.run(main(ns))
