"""Kafka protocol throughput and latency: Sluice vs Redis Streams vs NATS JetStream, in one run.

Run: ``python -m bench.bench_kafka`` (add ``--quick`` for a smoke run). Every server is started by
the benchmark on a free loopback port with a fresh temporary data directory:

- Sluice (``sluice serve``, segment store, flush=always) driven by librdkafka (confluent-kafka):
  produce (100 B and 1 KiB records, acks=1 and acks=all), consume (assigned partition, from the
  start), and end-to-end latency at a fixed 10k records/s.
- Redis Streams (``redis-server``, appendonly off): ``redis-benchmark`` XADD pipelined (-P 100);
  XREADGROUP COUNT 1000 via redis-py (NOACK, and with XACK per batch); latency XADD→XREADGROUP BLOCK.
- NATS JetStream (``nats-server -js``, file storage): nats-py publish with 100 acks in flight,
  push consumer, latency publish→push subscription.

Targets (issue 3): produce ≥ 2× Redis XADD pipelined (100 B); consume ≥ 3× Redis XREADGROUP;
latency p99 no worse than NATS JetStream.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

RATE = 10_000  # records/s for the latency runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


@contextmanager
def process(
    args: list[str], port: int | None = None, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        if port is not None:
            wait_port(port)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def sluice(data_dir: Path, flush: str = "always") -> Iterator[tuple[str, int]]:
    env = {**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false",
           "SLUICE_HTTP__ENABLED": "false", "SLUICE_STORAGE__FLUSH": flush, "SLUICE_LOG_LEVEL": "WARNING"}
    with process([sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data_dir)], env=env) as proc:
        endpoints = data_dir / "endpoints.json"
        deadline = time.monotonic() + 30
        while not endpoints.exists() or "kafka" not in endpoints.read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("sluice did not start")
            time.sleep(0.05)
        yield f"127.0.0.1:{json.loads(endpoints.read_text())['kafka']['port']}", proc.pid


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- Sluice via librdkafka


def kafka_produce(bootstrap: str, topic: str, n: int, size: int, acks: str) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5, "batch.size": 1_000_000,
                         "batch.num.messages": 100_000, "queue.buffering.max.messages": 1_000_000,
                         "enable.idempotence": acks == "all", "compression.type": "none"})
    payload = b"x" * size
    producer.produce(topic, payload)  # topic auto-created before timing
    producer.flush(30)
    started = time.perf_counter()
    produce = producer.produce
    for _ in range(n):
        try:
            produce(topic, payload)
        except BufferError:
            producer.poll(0.01)
            produce(topic, payload)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - started
    assert remaining == 0
    return n / elapsed


def kafka_consume(bootstrap: str, topic: str, n: int) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                         "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10_485_760,
                         "queued.min.messages": 1_000_000})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    started = time.perf_counter()
    while got < n:
        got += sum(1 for m in consumer.consume(min(10_000, n - got), timeout=1.0) if m.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    return got / elapsed


def kafka_latency(bootstrap: str, topic: str, seconds: float) -> list[float]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1, "enable.idempotence": True})
    producer.produce(topic, b"warm-up")
    producer.flush(10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "latency", "fetch.wait.max.ms": 500,
                         "fetch.min.bytes": 1, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, -1)])  # from the end
    latencies: list[float] = []
    total = int(seconds * RATE)
    done = threading.Event()

    def consume() -> None:
        while len(latencies) < total and not done.is_set():
            m = consumer.poll(0.1)  # one at a time: consume(n) would wait for n records to gather
            if m is not None and m.error() is None and m.value() != b"warm-up":
                latencies.append((time.time_ns() - int(m.value())) / 1e6)

    reader = threading.Thread(target=consume)
    reader.start()
    time.sleep(1.0)  # assignment + first fetch
    pace(lambda: producer.produce(topic, str(time.time_ns()).encode()), total, producer.poll)
    producer.flush(10)
    reader.join(30)
    done.set()
    consumer.close()
    return latencies


def pace(send: object, total: int, idle: object) -> None:
    """Send ``total`` records at RATE/s: every millisecond the records then due, sleeping in between
    (sleeping, not spinning, so the consumer thread gets the GIL at once)."""
    started = time.perf_counter()
    sent = 0
    while sent < total:
        due = min(total, int((time.perf_counter() - started) * RATE) + 1)
        while sent < due:
            send()  # type: ignore[operator]
            sent += 1
        idle(0)  # type: ignore[operator]
        time.sleep(max(0.0, started + sent / RATE - time.perf_counter()))


# ---------------------------------------------------------------- Redis Streams


def redis_xadd_pipelined(port: int, n: int, size: int) -> float:
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-n", str(n), "-P", "100", "--csv",
         "XADD", f"bench-{size}", "*", "f", "x" * size],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout
    last = [line for line in out.splitlines() if line.startswith('"XADD')][-1]
    return float(last.split(",")[1].strip('"'))


def redis_xreadgroup(port: int, stream: str, n: int, ack: bool) -> float:
    import redis

    r = redis.Redis(port=port)
    group = f"g-{ack}"
    r.xgroup_create(stream, group, id="0")
    got = 0
    started = time.perf_counter()
    while got < n:
        resp = r.xreadgroup(group, "c1", {stream: ">"}, count=1000, noack=not ack)
        if not resp:
            break
        entries = resp[0][1]
        got += len(entries)
        if ack:
            r.xack(stream, group, *[e[0] for e in entries])
    return got / (time.perf_counter() - started)


def redis_latency(port: int, seconds: float) -> list[float]:
    import redis

    writer = redis.Redis(port=port)
    reader_conn = redis.Redis(port=port)
    writer.xgroup_create("lat", "g", id="$", mkstream=True)
    total = int(seconds * RATE)
    latencies: list[float] = []

    def consume() -> None:
        while len(latencies) < total:
            resp = reader_conn.xreadgroup("g", "c", {"lat": ">"}, count=1000, block=500, noack=True)
            for _id, fields in resp[0][1] if resp else []:
                latencies.append((time.time_ns() - int(fields[b"t"])) / 1e6)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    pace(lambda: writer.xadd("lat", {"t": str(time.time_ns())}), total, lambda _t: None)
    reader.join(30)
    return latencies


# ---------------------------------------------------------------- NATS JetStream


async def nats_throughput(port: int, n: int, size: int) -> tuple[float, float]:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    stream = f"bench{size}"
    await js.add_stream(name=stream, subjects=[f"{stream}.x"])
    payload = b"x" * size
    window = 100  # nats-py stalls with ~1000 publish acks outstanding; 100 in flight does not
    started = time.perf_counter()
    for i in range(0, n, window):
        await asyncio.gather(*(js.publish(f"{stream}.x", payload) for _ in range(min(window, n - i))))
    produce_rate = n / (time.perf_counter() - started)
    got = 0
    done = asyncio.Event()

    async def on_msg(msg: object) -> None:
        nonlocal got
        got += 1
        if got >= n:
            done.set()

    started = time.perf_counter()
    # Push consumer, acks by nats-py after each callback (pull fetch() stalled in nats-py here).
    await js.subscribe(f"{stream}.x", durable=f"d{size}", cb=on_msg, pending_msgs_limit=1_000_000)
    await asyncio.wait_for(done.wait(), 300)
    consume_rate = got / (time.perf_counter() - started)
    await nc.close()
    return produce_rate, consume_rate


async def nats_latency(port: int, seconds: float) -> list[float]:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(name="lat", subjects=["lat.x"])
    latencies: list[float] = []
    total = int(seconds * RATE)
    done = asyncio.Event()

    async def on_msg(msg: object) -> None:
        latencies.append((time.time_ns() - int(msg.data)) / 1e6)  # type: ignore[attr-defined]
        if len(latencies) >= total:
            done.set()

    await js.subscribe("lat.x", cb=on_msg, manual_ack=False)
    loop = asyncio.get_running_loop()
    started = loop.time()
    pending: set[asyncio.Task[object]] = set()
    for i in range(total):
        delay = started + i / RATE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(js.publish("lat.x", str(time.time_ns()).encode()))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.wait_for(done.wait(), 30)
    await nc.close()
    return latencies


# ---------------------------------------------------------------- report


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    quick = "--quick" in sys.argv
    n_small, n_large, seconds = (50_000, 20_000, 2.0) if quick else (300_000, 100_000, 5.0)
    for tool in ("redis-server", "redis-benchmark", "nats-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing: run scripts/install-system-deps.sh")
    results: dict[str, float] = {}
    broker_cpu: dict[str, float] = {}
    lat: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # acks=1 against a broker that does not fsync per batch (flush=os, Kafka's own default);
        # acks=all against flush=always (fsync before the answer, one fsync shared per group commit).
        for flush, acks in (("os", "1"), ("always", "all")):
            with sluice(root / f"sluice-{flush}", flush) as (bootstrap, pid):
                for size, n in ((100, n_small), (1024, n_large)):
                    topic = f"p{size}"
                    name = f"sluice produce {size}B acks={acks} flush={flush}"
                    cpu = cpu_seconds(pid)
                    results[name] = kafka_produce(bootstrap, topic, n, size, acks)
                    broker_cpu[name] = (cpu_seconds(pid) - cpu) / n * 1e6
                    print(f"{name}: {results[name]:,.0f}/s, broker CPU {broker_cpu[name]:.2f} µs/record", flush=True)
                    if flush == "os":
                        name = f"sluice consume {size}B"
                        cpu = cpu_seconds(pid)
                        results[name] = kafka_consume(bootstrap, topic, n + 1)
                        broker_cpu[name] = (cpu_seconds(pid) - cpu) / n * 1e6
                        print(f"{name}: {results[name]:,.0f}/s, broker CPU {broker_cpu[name]:.2f} µs/record",
                              flush=True)
                lat[f"sluice flush={flush} acks={acks}"] = kafka_latency(bootstrap, "latency", seconds)
        redis_port = free_port()
        with process(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no",
                      "--dir", str(root)], redis_port):
            for size, n in ((100, n_small), (1024, n_large)):
                results[f"redis XADD {size}B"] = redis_xadd_pipelined(redis_port, n, size)
                results[f"redis XREADGROUP {size}B noack"] = redis_xreadgroup(redis_port, f"bench-{size}", n, False)
                results[f"redis XREADGROUP {size}B xack"] = redis_xreadgroup(redis_port, f"bench-{size}", n, True)
                print({k: f"{v:,.0f}" for k, v in results.items() if k.startswith("redis")}, flush=True)
            lat["redis"] = redis_latency(redis_port, seconds)
        nats_port = free_port()
        (root / "nats").mkdir()
        with process(["nats-server", "-js", "-p", str(nats_port), "-a", "127.0.0.1", "-sd", str(root / "nats")],
                     nats_port):
            for size, n in ((100, n_small), (1024, n_large)):
                p, c = asyncio.run(nats_throughput(nats_port, n, size))
                results[f"nats publish {size}B"], results[f"nats consume {size}B"] = p, c
                print(f"nats {size}B publish {p:,.0f}/s consume {c:,.0f}/s", flush=True)
            lat["nats"] = asyncio.run(nats_latency(nats_port, seconds))

    print("\n| workload | records/s | broker CPU µs/record |\n|---|---:|---:|")
    for name, value in results.items():
        cpu_note = f"{broker_cpu[name]:.2f}" if name in broker_cpu else ""
        print(f"| {name} | {value:,.0f} | {cpu_note} |")
    print("\n| latency at 10k records/s | p50 ms | p99 ms | records |\n|---|---:|---:|---:|")
    for name, values in lat.items():
        print(f"| {name} | {statistics.median(values):.2f} | {pct(values, 0.99):.2f} | {len(values)} |")
    redis_xadd = results["redis XADD 100B"]
    redis_read = max(results["redis XREADGROUP 100B noack"], results["redis XREADGROUP 100B xack"])
    print("\nTargets:")
    for key in ("sluice produce 100B acks=1 flush=os", "sluice produce 100B acks=all flush=always"):
        ratio = results[key] / redis_xadd
        print(f"- {key} vs Redis XADD pipelined: {ratio:.2f}x (target >= 2x: {'met' if ratio >= 2 else 'NOT met'})")
    ratio = results["sluice consume 100B"] / redis_read
    print(f"- consume 100B vs Redis XREADGROUP (faster variant): {ratio:.2f}x (target >= 3x: "
          f"{'met' if ratio >= 3 else 'NOT met'})")
    n99 = pct(lat["nats"], 0.99)
    for key in ("sluice flush=os acks=1", "sluice flush=always acks=all"):
        s99 = pct(lat[key], 0.99)
        print(f"- latency p99 {key} {s99:.2f} ms vs NATS JetStream {n99:.2f} ms: {'met' if s99 <= n99 else 'NOT met'}")


if __name__ == "__main__":
    main()
