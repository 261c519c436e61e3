"""Kafka protocol throughput and latency: Sluice vs Redis Streams vs NATS JetStream, in one run.

Run: ``python -m bench.bench_kafka`` (add ``--quick`` for a smoke run, ``--latency-only`` for the
latency table alone, ``--visibility-rounds N`` for N paired runs of flush=always with
``storage.visibility`` durable and written). Needs gcc and librdkafka-dev
(``scripts/install-system-deps.sh bench``). Every server is started by the benchmark on a free
loopback port with a fresh temporary data directory:

- Sluice (``sluice serve``, segment store; acks=1 against flush=os, acks=all + idempotence against
  flush=always) driven by librdkafka three ways:
  **kafka_produce** (``bench/loadgen/kafka_produce.c``, compiled here): C like redis-benchmark, one
  static payload, 10,000 records per ``rd_kafka_produce_batch`` call, delivery reports for failures
  only — the load generator that takes least CPU from the broker on a 2-core machine;
  **kcat**: ``KCAT_PROCS`` concurrent ``kcat -P -l FILE`` processes, each producing its own
  pre-generated file of lines; and one Python thread calling confluent-kafka ``produce()`` per
  record. The C runs are timed from start until every process has exited (each exits once every
  record is delivered) and the count is checked against the partition's high watermark afterwards.
  Consume (assigned partition, from the start) and end-to-end latency at a fixed 10k records/s use
  confluent-kafka; latency with ``linger.ms`` 0 (send at once, as the Redis and NATS clients do) and 1.
- Redis Streams (``redis-server``): ``redis-benchmark`` XADD pipelined (-P 100), once with no
  persistence (Redis's default) and once with ``appendonly yes, appendfsync always`` (fsync before
  the reply, the durable peer of acks=all + flush=always); XREADGROUP COUNT 1000 via redis-py (NOACK,
  and with XACK per batch); latency XADD→XREADGROUP BLOCK.
- NATS JetStream (``nats-server -js``, file storage; 2.9 has no per-message fsync setting): nats-py
  publish with 100 acks in flight, push consumer, latency publish→push subscription.

Targets (issue 3): produce ≥ 2× Redis XADD pipelined (100 B); consume ≥ 3× Redis XREADGROUP;
latency p99 no worse than NATS JetStream.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

RATE = 10_000  # records/s for the latency runs
# Concurrent kcat producers (``--kcat-procs N``). redis-benchmark is one C process with 50 connections;
# on the 2-core box a sweep of 1/2/4/8 kcat processes gave the most records/s with 1-2 (see RESULTS.md).
KCAT_PROCS = 2
# Concurrent kafka_produce processes (``--loadgen-procs N``): one measured fastest on 2 cores (RESULTS.md).
LOADGEN_PROCS = 1
LOADGEN_SOURCE = Path(__file__).resolve().parent / "loadgen" / "kafka_produce.c"


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
def sluice(data_dir: Path, flush: str = "always", visibility: str = "durable") -> Iterator[tuple[str, int]]:
    env = {**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false",
           "SLUICE_HTTP__ENABLED": "false", "SLUICE_STORAGE__FLUSH": flush, "SLUICE_LOG_LEVEL": "WARNING",
           "SLUICE_STORAGE__VISIBILITY": visibility}
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


def write_lines(path: Path, n: int, size: int) -> Path:
    """``n`` lines of ``size`` bytes (plus the newline kcat splits on)."""
    line = (b"x" * size) + b"\n"
    with path.open("wb") as f:
        for i in range(0, n, 10_000):
            f.write(line * min(10_000, n - i))
    return path


def high_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def run_producers(commands: list[list[str]], bootstrap: str, topic: str, expected: int) -> tuple[float, float]:
    """Run the C producers at once; records/s from start until the last one exits, the record count
    verified from the broker's high watermark, and their CPU µs per record (children's rusage). Any
    non-zero exit or anything on stderr fails the run."""
    before = high_watermark(bootstrap, topic)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in commands]
    errors = [p.communicate(timeout=600)[1].decode(errors="replace").strip() for p in procs]
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    if any(p.returncode for p in procs) or any(errors):
        raise RuntimeError(f"{commands[0][0]} failed: {[p.returncode for p in procs]} {errors}")
    stored = high_watermark(bootstrap, topic) - before
    if stored != expected:
        raise RuntimeError(f"{commands[0][0]} produced {expected} records but the broker stored {stored}")
    return stored / elapsed, cpu / stored * 1e6


def kcat_produce(bootstrap: str, topic: str, files: list[Path], per_file: int, acks: str) -> tuple[float, float]:
    """One ``kcat -P`` per file, all at once (see ``run_producers``)."""
    args = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-p", "0", "-X", "linger.ms=5",
            "-X", "batch.num.messages=10000", "-X", "queue.buffering.max.messages=1000000",
            "-X", "queue.buffering.max.kbytes=1048576", "-X", f"acks={acks}"]
    if acks == "all":
        args += ["-X", "enable.idempotence=true"]
    subprocess.run(args, input=b"warm-up\n", check=True, timeout=60)  # creates the topic, untimed
    return run_producers([[*args, "-l", str(f)] for f in files], bootstrap, topic, per_file * len(files))


def build_loadgen(build_dir: Path) -> Path:
    exe = build_dir / "kafka_produce"
    try:
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(LOADGEN_SOURCE), "-lrdkafka"],
                       check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise SystemExit(f"cannot build {LOADGEN_SOURCE.name} (gcc and librdkafka-dev: "
                         f"scripts/install-system-deps.sh bench): {detail}") from exc
    return exe


def loadgen_produce(
    exe: Path, bootstrap: str, topic: str, per_proc: int, size: int, acks: str, idempotence: bool
) -> tuple[float, float]:
    """``LOADGEN_PROCS`` kafka_produce processes at once (see ``run_producers``)."""
    settings = ["linger.ms=5", "batch.num.messages=10000", f"acks={acks}", f"enable.idempotence={idempotence}".lower()]
    subprocess.run([str(exe), bootstrap, topic, "0", "1", str(size), *settings],
                   check=True, capture_output=True, timeout=60)  # creates the topic, untimed
    command = [str(exe), bootstrap, topic, "0", str(per_proc), str(size), *settings]
    return run_producers([command] * LOADGEN_PROCS, bootstrap, topic, per_proc * LOADGEN_PROCS)


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


def kafka_latency(bootstrap: str, topic: str, seconds: float, acks: str, linger_ms: int) -> list[float]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": linger_ms,
                         "enable.idempotence": acks == "all"})
    producer.produce(topic, b"warm-up")
    producer.flush(10)
    total = int(seconds * RATE)
    reader = LatencyReader(_kafka_reader, (bootstrap, topic, total, seconds))

    def send(stamps: list[bytes]) -> None:
        for stamp in stamps:
            producer.produce(topic, stamp)

    pace(send, total, producer.poll)
    producer.flush(10)
    return reader.latencies(seconds)


class LatencyReader:
    """A reader in its own process, so that it never waits for the GIL of the pacing producer: the
    figure is the broker's and the clients', not the harness's (the NATS run is one asyncio loop)."""

    def __init__(self, target: Callable[..., None], args: tuple[object, ...]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._ready, self._out = ctx.Event(), ctx.Queue()
        self._proc = ctx.Process(target=target, args=(*args, self._ready, self._out), daemon=True)
        self._proc.start()
        if not self._ready.wait(60):
            self._proc.kill()
            raise RuntimeError("latency reader did not start")

    def latencies(self, seconds: float) -> list[float]:
        latencies: list[float] = self._out.get(timeout=seconds + 60)
        self._proc.join(10)
        return latencies


def _kafka_reader(bootstrap: str, topic: str, total: int, seconds: float, ready: Any, out: Any) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "latency", "fetch.wait.max.ms": 500,
                         "fetch.min.bytes": 1, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, -1)])  # from the end
    consumer.poll(1.0)  # assignment + first fetch
    ready.set()
    latencies: list[float] = []
    deadline = time.monotonic() + seconds + 30
    while len(latencies) < total and time.monotonic() < deadline:
        m = consumer.poll(0.1)  # one at a time: consume(n) would wait for n records to gather
        if m is not None and m.error() is None and m.value() != b"warm-up":
            sent_ns = m.value()
            assert sent_ns is not None  # every record the load generator sends carries its send time
            latencies.append((time.time_ns() - int(sent_ns)) / 1e6)
    consumer.close()
    out.put(latencies)


def pace(send: Callable[[list[bytes]], object], total: int, idle: Callable[[float], object]) -> None:
    """Send ``total`` records at RATE/s: every millisecond the records then due, in one ``send`` call
    (a client may pipeline them), sleeping in between (not spinning, so the consumer thread gets the
    GIL at once).

    Each record carries its *scheduled* send time (wall clock, ns), not the time ``send`` was finally
    called: a client that blocks (a synchronous Redis call waiting for its fsync) delays the records
    behind it, and that wait is latency too (no coordinated omission)."""
    started = time.perf_counter()
    started_ns = time.time_ns()
    sent = 0
    while sent < total:
        due = min(total, int((time.perf_counter() - started) * RATE) + 1)
        if due > sent:
            send([str(started_ns + i * 1_000_000_000 // RATE).encode() for i in range(sent, due)])
            sent = due
        idle(0)
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
        # redis-py types every command's result as Awaitable[Any] | Any (sync and async clients alike)
        resp: Any = r.xreadgroup(group, "c1", {stream: ">"}, count=1000, noack=not ack)
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
    writer.xgroup_create("lat", "g", id="$", mkstream=True)
    total = int(seconds * RATE)
    reader = LatencyReader(_redis_reader, (port, total, seconds))

    def send(stamps: list[bytes]) -> None:
        pipe = writer.pipeline(transaction=False)  # the records due this tick, one round trip
        for stamp in stamps:
            pipe.xadd("lat", {"t": stamp})
        pipe.execute()

    pace(send, total, lambda _t: None)
    return reader.latencies(seconds)


def _redis_reader(port: int, total: int, seconds: float, ready: Any, out: Any) -> None:
    import redis

    conn = redis.Redis(port=port)
    conn.ping()
    ready.set()
    latencies: list[float] = []
    deadline = time.monotonic() + seconds + 30
    while len(latencies) < total and time.monotonic() < deadline:
        # redis-py types every command's result as Awaitable[Any] | Any (sync and async clients alike)
        resp: Any = conn.xreadgroup("g", "c", {"lat": ">"}, count=1000, block=500, noack=True)
        for _id, fields in resp[0][1] if resp else []:
            latencies.append((time.time_ns() - int(fields[b"t"])) / 1e6)
    out.put(latencies)


# ---------------------------------------------------------------- NATS JetStream


async def nats_throughput(port: int, n: int, size: int) -> tuple[float, float]:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream(timeout=NATS_ACK_TIMEOUT_S)
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
    from nats.aio.msg import Msg

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream(timeout=NATS_ACK_TIMEOUT_S)
    await js.add_stream(name="lat", subjects=["lat.x"])
    latencies: list[float] = []
    total = int(seconds * RATE)
    done = asyncio.Event()

    async def on_msg(msg: Msg) -> None:
        latencies.append((time.time_ns() - int(msg.data)) / 1e6)
        if len(latencies) >= total:
            done.set()

    await js.subscribe("lat.x", cb=on_msg, manual_ack=False)
    loop = asyncio.get_running_loop()
    started = loop.time()
    started_ns = time.time_ns()
    pending: set[asyncio.Task[object]] = set()
    for i in range(total):
        delay = started + i / RATE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        stamp = str(started_ns + i * 1_000_000_000 // RATE).encode()  # scheduled time, as in pace()
        task = asyncio.ensure_future(js.publish("lat.x", stamp))
        pending.add(task)
        task.add_done_callback(pending.discard)
    failed = sum(isinstance(r, Exception) for r in await asyncio.gather(*pending, return_exceptions=True))
    try:
        await asyncio.wait_for(done.wait(), 30)
    except TimeoutError:  # a row with what arrived, said so, rather than no latency table at all
        print(f"nats latency: {len(latencies)} of {total} records arrived ({failed} publishes failed)",
              file=sys.stderr, flush=True)
    await nc.close()
    return latencies


# ---------------------------------------------------------------- report


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def acks_label(acks: str) -> str:
    """A row's producer settings: acks=all runs with idempotence (the one plain acks=all row says so)."""
    return "acks=all + idempotence" if acks == "all" else f"acks={acks}"


# nats-py waits 5 s for a JetStream publish ack by default. Publisher, push subscriber and its acks share
# one asyncio loop; on a loaded machine (load 15-25 on 2 cores) that loop fell more than 5 s behind, the
# publishes raised nats.errors.TimeoutError and the benchmark stopped (bench/RESULTS.md). A late ack is
# slowness to measure, not a failure.
NATS_ACK_TIMEOUT_S = 120.0


def nats_server(root: Path, name: str) -> tuple[list[str], int]:
    """The nats-server command line: JetStream with its file store in ``root / name``."""
    port = free_port()
    (root / name).mkdir()
    return ["nats-server", "-js", "-p", str(port), "-a", "127.0.0.1", "-sd", str(root / name)], port


def redis_server(root: Path, name: str, durable: bool) -> tuple[list[str], int]:
    """The redis-server command line: no persistence (Redis's default), or AOF with an fsync before
    every reply (``appendfsync always``, the durable peer of acks=all + flush=always)."""
    port = free_port()
    (root / name).mkdir()
    persistence = ["--appendonly", "yes", "--appendfsync", "always"] if durable else ["--appendonly", "no"]
    return ["redis-server", "--port", str(port), "--save", "", *persistence, "--dir", str(root / name)], port


def latency_phase(root: Path, seconds: float) -> dict[str, list[float]]:
    """End-to-end latency at RATE records/s, every system on a fresh server and data directory, after
    ``os.sync()``: the gigabytes the throughput runs left in the page cache are written back first, so
    that their writeback does not land in one system's run and not another's."""
    lat: dict[str, list[float]] = {}

    def record(key: str, values: list[float]) -> None:
        lat[key] = values
        print(f"latency {key}: p50 {statistics.median(values):.2f} ms, p99 {pct(values, 0.99):.2f} ms", flush=True)

    root.mkdir()
    # flush=always twice: consumers see a record once fsynced (visibility=durable, the default) or once
    # written (visibility=written, the pre-issue-11 behaviour); the difference is what durability costs.
    for flush, acks, visibility in (("os", "1", ""), ("always", "all", "durable"), ("always", "all", "written")):
        for linger in (0, 1):
            os.sync()
            mode = f" visibility={visibility}" if visibility else ""
            with sluice(root / f"sluice-{flush}{visibility}-{linger}", flush, visibility or "durable") as (
                bootstrap, _pid
            ):
                record(f"sluice {acks_label(acks)} flush={flush}{mode} linger.ms={linger}",
                       kafka_latency(bootstrap, "latency", seconds, acks, linger))
    for durable in (False, True):
        os.sync()
        command, redis_port = redis_server(root, f"redis-{durable}", durable)
        with process(command, redis_port):
            record("redis AOF fsync always" if durable else "redis", redis_latency(redis_port, seconds))
    os.sync()
    command, nats_port = nats_server(root, "nats")
    with process(command, nats_port):
        record("nats", asyncio.run(nats_latency(nats_port, seconds)))
    return lat


def visibility_rounds(root: Path, seconds: float, rounds: int) -> None:
    """Sluice flush=always with visibility=durable and =written, alternating, ``rounds`` times: on a
    shared machine the paired runs show what waiting for the fsync costs consumers better than one run."""
    root.mkdir()
    rows: dict[str, list[list[float]]] = {}
    for r in range(rounds):
        for linger in (0, 1):
            for visibility in ("durable", "written"):
                os.sync()
                with sluice(root / f"{visibility}-{linger}-{r}", "always", visibility) as (bootstrap, _pid):
                    values = kafka_latency(bootstrap, "latency", seconds, "all", linger)
                key = f"sluice acks=all + idempotence flush=always visibility={visibility} linger.ms={linger}"
                rows.setdefault(key, []).append(values)
                print(f"round {r + 1} {key}: p50 {statistics.median(values):.2f} ms, "
                      f"p99 {pct(values, 0.99):.2f} ms", flush=True)
    print(f"\n| p50 / p99 ms | {' | '.join(f'round {r + 1}' for r in range(rounds))} |")
    print(f"|---|{'---:|' * rounds}")
    for key, runs in rows.items():
        cells = " | ".join(f"{statistics.median(v):.2f} / {pct(v, 0.99):.2f}" for v in runs)
        print(f"| {key} | {cells} |")


def main() -> None:
    global KCAT_PROCS, LOADGEN_PROCS
    quick = "--quick" in sys.argv
    if "--kcat-procs" in sys.argv:
        KCAT_PROCS = int(sys.argv[sys.argv.index("--kcat-procs") + 1])
    if "--loadgen-procs" in sys.argv:
        LOADGEN_PROCS = int(sys.argv[sys.argv.index("--loadgen-procs") + 1])
    n_small, n_large, seconds = (50_000, 20_000, 2.0) if quick else (300_000, 100_000, 5.0)
    if "--visibility-rounds" in sys.argv:  # Sluice's two flush=always visibility modes, paired, N rounds
        rounds = int(sys.argv[sys.argv.index("--visibility-rounds") + 1])
        with tempfile.TemporaryDirectory() as tmp:
            visibility_rounds(Path(tmp) / "visibility", seconds, rounds)
        return
    if "--latency-only" in sys.argv:  # the latency table alone (every system, side by side)
        with tempfile.TemporaryDirectory() as tmp:
            lat = latency_phase(Path(tmp) / "latency", seconds)
        print_latency(lat)
        return
    # C load generators: records per run (split over their processes); Redis XADD gets the same total.
    c_total = {100: 200_000, 1024: 40_000} if quick else {100: 2_000_000, 1024: 400_000}
    for tool in ("redis-server", "redis-benchmark", "nats-server", "kcat", "gcc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing: run scripts/install-system-deps.sh bench")
    results: dict[str, float] = {}
    broker_cpu: dict[str, float] = {}
    client_cpu: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        loadgen = build_loadgen(root)
        kcat_files = {size: [write_lines(root / f"lines-{size}-{i}", n // KCAT_PROCS, size) for i in range(KCAT_PROCS)]
                      for size, n in c_total.items()}
        # acks=1 against a broker that does not fsync per batch (flush=os, Kafka's own default);
        # acks=all against flush=always (fsync before the answer, one fsync shared per group commit).
        for flush, acks in (("os", "1"), ("always", "all")):
            with sluice(root / f"sluice-{flush}", flush) as (bootstrap, pid):
                for size, total in c_total.items():
                    # acks=all runs twice with kafka_produce: plain, and with idempotence (librdkafka then
                    # keeps at most 5 requests in flight and spends more CPU per record); kcat with it.
                    runs = [
                        (acks_label(acks), f"kafka_produce x{LOADGEN_PROCS}", partial(
                            loadgen_produce, loadgen, bootstrap, f"lg{size}", total // LOADGEN_PROCS, size, acks,
                            acks == "all")),
                        (acks_label(acks), f"kcat x{KCAT_PROCS}", partial(
                            kcat_produce, bootstrap, f"kcat{size}", kcat_files[size], total // KCAT_PROCS, acks)),
                    ]
                    if acks == "all":
                        runs.insert(0, ("acks=all", f"kafka_produce x{LOADGEN_PROCS}", partial(
                            loadgen_produce, loadgen, bootstrap, f"lg{size}-plain", total // LOADGEN_PROCS, size,
                            acks, False)))
                    for settings, label, run in runs:
                        name = f"sluice produce {size}B {settings} flush={flush} ({label})"
                        cpu = cpu_seconds(pid)
                        results[name], client_cpu[name] = run()
                        broker_cpu[name] = (cpu_seconds(pid) - cpu) / total * 1e6
                        print(f"{name}: {results[name]:,.0f}/s, broker CPU {broker_cpu[name]:.2f} µs/record, "
                              f"load generator CPU {client_cpu[name]:.2f} µs/record", flush=True)
                for size, n in ((100, n_small), (1024, n_large)):
                    topic = f"p{size}"
                    name = f"sluice produce {size}B {acks_label(acks)} flush={flush} (Python produce() loop)"
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
        for durable in (False, True):
            label = "redis AOF fsync always" if durable else "redis"
            command, redis_port = redis_server(root, f"redis-{durable}", durable)
            with process(command, redis_port):
                for size, n in ((100, n_small), (1024, n_large)):
                    results[f"{label} XADD {size}B"] = redis_xadd_pipelined(redis_port, c_total[size], size)
                    if not durable:
                        for ack in (False, True):
                            variant = "xack" if ack else "noack"
                            results[f"redis XREADGROUP {size}B {variant}"] = redis_xreadgroup(
                                redis_port, f"bench-{size}", n, ack)
                print({k: f"{v:,.0f}" for k, v in results.items() if k.startswith(label)}, flush=True)
        command, nats_port = nats_server(root, "nats")
        with process(command, nats_port):
            for size, n in ((100, n_small), (1024, n_large)):
                p, c = asyncio.run(nats_throughput(nats_port, n, size))
                results[f"nats publish {size}B"], results[f"nats consume {size}B"] = p, c
                print(f"nats {size}B publish {p:,.0f}/s consume {c:,.0f}/s", flush=True)
        lat = latency_phase(root / "latency", seconds)

    print("\n| workload | records/s | broker CPU µs/record | load generator CPU µs/record |\n|---|---:|---:|---:|")
    for name, value in results.items():
        broker = f"{broker_cpu[name]:.2f}" if name in broker_cpu else ""
        client = f"{client_cpu[name]:.2f}" if name in client_cpu else ""
        print(f"| {name} | {value:,.0f} | {broker} | {client} |")
    print_latency(lat)
    report_targets(results, lat)


def print_latency(lat: dict[str, list[float]]) -> None:
    print("\n| latency at 10k records/s | p50 ms | p99 ms | records |\n|---|---:|---:|---:|")
    for name, values in lat.items():
        print(f"| {name} | {statistics.median(values):.2f} | {pct(values, 0.99):.2f} | {len(values)} |")


def report_targets(results: dict[str, float], lat: dict[str, list[float]]) -> None:
    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print("\nTargets:")
    for key in (k for k in results if k.startswith("sluice produce 100B")):
        peers = [("redis", "Redis XADD pipelined")]
        if "flush=always" in key:
            peers.append(("redis AOF fsync always", "Redis XADD pipelined, appendfsync always"))
        for peer, peer_name in peers:
            ratio = results[key] / results[f"{peer} XADD 100B"]
            print(f"- {key} vs {peer_name}: {ratio:.2f}x (target >= 2x: {verdict(ratio >= 2)})")
    redis_read = max(results["redis XREADGROUP 100B noack"], results["redis XREADGROUP 100B xack"])
    ratio = results["sluice consume 100B"] / redis_read
    print(f"- consume 100B vs Redis XREADGROUP (faster variant): {ratio:.2f}x (target >= 3x: {verdict(ratio >= 3)})")
    for key in (k for k in lat if k.startswith("sluice")):
        # The target peer is NATS JetStream (which, in 2.9, never fsyncs per message); the Redis row with
        # the same durability as the Sluice row is shown beside it.
        redis = "redis AOF fsync always" if "flush=always" in key else "redis"
        s99 = pct(lat[key], 0.99)
        for peer, peer_name in (("nats", "NATS JetStream (target)"), (redis, redis.replace("redis", "Redis"))):
            peer99 = pct(lat[peer], 0.99)
            print(f"- latency p99 {key} {s99:.2f} ms vs {peer_name} {peer99:.2f} ms: {verdict(s99 <= peer99)}")


if __name__ == "__main__":
    main()
