"""MQTT ingest into the durable log vs Mosquitto's own pub→sub, and memory per idle MQTT connection.

    python -m bench.bench_mqtt [--publishers 4] [--messages 50000] [--runs 3] [--connections 10000]
                               [--loadgen raw|mosquitto_pub] [--loadgen-procs 1]

Throughput (same load for both brokers, 100 B payloads, MQTT 5, ``--publishers`` connections, QoS 0 then
QoS 1, at most 1000 QoS 1 messages in flight per connection):

* Load generator ``raw`` (default, ``bench/mqtt_loadgen.py``): ``--loadgen-procs`` Python processes
  share the publishing connections; each connection's PUBLISH packets are encoded before the clock
  starts and sent in slices, PUBACKs are checked in bulk, so the generator spends far less CPU per
  message than either broker (its own CPU per message is printed). ``mosquitto_pub``: one
  ``mosquitto_pub -l -M 1000`` process per connection reading pre-generated lines (the load of the
  earlier results; it spends ~8 µs of CPU per QoS 1 message, about twice Sluice's).
* Sluice: the MQTT listener runs in this process (uvloop) on the segment store ``sluice serve`` opens,
  flush=always (and flush=os), with the garbage-collector settings ``sluice serve`` applies once started
  (``sluice.gc_tuning``; ``--gc default`` keeps CPython's). Time = from ``go`` until the ingest sink has
  durably appended every message (QoS 1: every PUBACK was sent after that append).
* Mosquitto: ``mosquitto`` on a free port (persistence on, ``set_tcp_nodelay true``, no in-flight or
  queue limit towards the subscriber: its fastest settings here) with one subscriber to ``bench/#`` at
  the same QoS (``raw``: ``mqtt_loadgen sub``, PUBACKs written in bulk; ``mosquitto_pub``:
  ``mosquitto_sub -C``). Time = from ``go`` until the subscriber has received every message.

Each row prints Sluice's CPU per message (this process, user + system), Mosquitto's (its process), the
load generator's, and the 1-minute load average when it ended.

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


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Load:
    """The publishers of one run: started and connected by ``ready()``, sending from ``go()``."""

    def __init__(self, kind: str, port: int, qos: int, publishers: int, messages: int, procs: int,
                 files: list[Path]) -> None:
        self.kind, self.port, self.qos = kind, port, qos
        self.publishers, self.messages, self.procs, self.files = publishers, messages, procs, files
        self.children: list[subprocess.Popen[str]] = []
        self.lines: list[subprocess.Popen[bytes]] = []
        self.children_cpu = 0.0

    def ready(self) -> None:
        if self.kind == "mosquitto_pub":
            return  # started by go(): the clock includes their start and connect, as in the earlier results
        per, extra = divmod(self.publishers, self.procs)
        first = 0
        for i in range(self.procs):
            n = per + (1 if i < extra else 0)
            if not n:
                continue
            self.children.append(subprocess.Popen(
                [sys.executable, "-m", "bench.mqtt_loadgen", "pub", "127.0.0.1", str(self.port), "--qos",
                 str(self.qos), "--connections", str(n), "--first-tag", str(first), "--messages", str(self.messages),
                 "--window", "1000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            first += n
        for child in self.children:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.strip() == "ready", line

    def go(self) -> None:
        if self.kind == "mosquitto_pub":
            self.lines = publishers(self.port, self.qos, self.files)
            return
        for child in self.children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()

    def finish(self) -> float:
        """Wait for every publisher; the load generator's CPU seconds."""
        if self.kind == "mosquitto_pub":
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            for p in self.lines:
                p.wait()
                assert p.returncode == 0, p.stderr.read() if p.stderr else ""
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        cpu = 0.0
        for child in self.children:
            out, _ = child.communicate()
            result = json.loads(out.strip().splitlines()[-1])
            assert child.returncode == 0 and "error" not in result, result
            cpu += result["cpu_s"]
        return cpu


def publishers(port: int, qos: int, files: list[Path]) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i, f in enumerate(files):
        procs.append(subprocess.Popen(
            ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-V", "mqttv5", "-q", str(qos), "-M", "1000",
             "-i", f"bench-pub-{i}", "-t", f"bench/dev{i}/reading", "-l"],
            stdin=f.open("rb"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        ))
    return procs


async def sluice_run(load: Load, total: int, flush: str, data_dir: Path,
                     gc_tuning: bool = True) -> tuple[float, float, float]:
    """(seconds, CPU seconds of this process, the load generator's CPU seconds) to append ``total`` messages."""
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
        load.port = listener.port
        await asyncio.to_thread(load.ready)
        cpu_start = time.process_time()
        start = time.perf_counter()
        load.go()
        progress_at, seen = time.monotonic(), 0
        while sink.messages_written < total:
            if sink.messages_written != seen:
                progress_at, seen = time.monotonic(), sink.messages_written
            elif time.monotonic() - progress_at > 10:
                raise RuntimeError(f"stalled at {sink.messages_written}/{total} appended")
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        load_cpu = await asyncio.to_thread(load.finish)
        return elapsed, cpu, load_cpu
    finally:
        await listener.stop()
        await store.close()


def mosquitto_conf(directory: Path, port: int) -> Path:
    conf = directory / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
        f"persistence_location {directory}/\nmax_inflight_messages 0\nmax_queued_messages 0\n"
        f"set_tcp_nodelay true\nmax_connections -1\nuser {getpass.getuser()}\n"
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


def mosquitto_run(load: Load, total: int, directory: Path) -> tuple[float, int, float, float, float]:
    """(seconds, messages received, Mosquitto's CPU seconds, the load generator's, the subscriber's)."""
    proc, port = start_mosquitto(directory)
    qos = load.qos
    try:
        if load.kind == "mosquitto_pub":
            sub = subprocess.Popen(
                ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", "mqttv5", "-q", str(qos),
                 "-t", "bench/#", "-C", str(total), "-W", "120"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            time.sleep(0.5)  # let the subscription land before publishing
        else:
            sub = subprocess.Popen([sys.executable, "-m", "bench.mqtt_loadgen", "sub", "127.0.0.1", str(port),
                                    "--qos", str(qos), "--count", str(total)], stdout=subprocess.PIPE)
            assert sub.stdout is not None
            line = sub.stdout.readline()
            assert line.strip() == b"ready", line
        load.port = port
        load.ready()
        cpu_start = proc_cpu_s(proc.pid)
        start = time.perf_counter()
        load.go()
        assert sub.stdout is not None
        received = 0
        sub_cpu = 0.0
        if load.kind == "mosquitto_pub":
            for _ in sub.stdout:
                received += 1
        else:
            result = json.loads(sub.stdout.readline())
            assert "error" not in result, result
            received, sub_cpu = result["messages"], result["cpu_s"]
        elapsed = time.perf_counter() - start
        mosquitto_cpu = proc_cpu_s(proc.pid) - cpu_start
        sub.wait()
        load_cpu = load.finish()
        return elapsed, received, mosquitto_cpu, load_cpu, sub_cpu
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


def sluice_memory(count: int, data_dir: Path, event_loop: str = "auto") -> tuple[int, int]:
    """A fresh ``sluice serve`` process (so no freed memory from the throughput runs is reused)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SLUICE_MQTT__PORT": "0", "SLUICE_TCP__PORT": "0", "SLUICE_HTTP__PORT": "0",
           "SLUICE_KAFKA__PORT": "0", "SLUICE_LOG_LEVEL": "WARNING", "SLUICE_EVENT_LOOP": event_loop}
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
        if args.loadgen == "mosquitto_pub":
            for i in range(args.publishers):
                f = tmp / f"lines-{i}.txt"
                make_lines(f, args.messages, i)
                files.append(f)
            print(f"{args.publishers} x mosquitto_pub -l, {args.messages} msgs each ({total} total, {PAYLOAD} B)")
        else:
            print(f"{args.publishers} connections from {args.loadgen_procs} bench.mqtt_loadgen process(es),"
                  f" {args.messages} msgs each ({total} total, {PAYLOAD} B payloads)")
        rows = []
        gc_tuning = args.gc == "serving"

        def load(qos: int) -> Load:
            return Load(args.loadgen, 0, qos, args.publishers, args.messages, args.loadgen_procs, files)

        for qos in (0, 1):
            for run in range(args.runs):
                s_always, cpu_always, gen_always = await sluice_run(load(qos), total, "always",
                                                                    tmp / f"s-always-{qos}-{run}", gc_tuning)
                s_os, cpu_os, gen_os = await sluice_run(load(qos), total, "os", tmp / f"s-os-{qos}-{run}", gc_tuning)
                mdir = tmp / f"mosq-{qos}-{run}"
                mdir.mkdir()
                m_elapsed, received, m_cpu, m_gen, m_sub = await asyncio.to_thread(
                    mosquitto_run, load(qos), total, mdir)
                row = (qos, run, total / s_always, total / s_os, received / m_elapsed, received)
                rows.append(row)
                us = 1e6 / total
                print(f"QoS {qos} run {run + 1}: Sluice flush=always {row[2]:,.0f} msg/s, flush=os {row[3]:,.0f} msg/s;"
                      f" Mosquitto pub->sub {row[4]:,.0f} msg/s ({received}/{total} received);"
                      f" ratio always/Mosquitto {row[2] / row[4]:.2f}x, os/Mosquitto {row[3] / row[4]:.2f}x;"
                      f" CPU us/msg: Sluice {cpu_always * us:.1f} / {cpu_os * us:.1f}, Mosquitto {m_cpu * us:.1f},"
                      f" load generator {gen_always * us:.2f} / {gen_os * us:.2f} / {m_gen * us:.2f}"
                      f" (+ subscriber {f'{m_sub * us:.2f}' if args.loadgen == 'raw' else 'not measured'});"
                      f" load {os.getloadavg()[0]:.1f}", flush=True)
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
    parser.add_argument("--messages", type=int, default=50_000, help="per publisher")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--loadgen", choices=("raw", "mosquitto_pub"), default="raw")
    parser.add_argument("--loadgen-procs", type=int, default=1, help="raw: processes sharing the publishers")
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--gc", choices=("serving", "default"), default="serving",
                        help="Sluice's garbage-collector settings: as sluice serve (default) or CPython's")
    ns = parser.parse_args()
    try:
        import uvloop

        uvloop.run(main(ns))
    except ImportError:
        asyncio.run(main(ns))
