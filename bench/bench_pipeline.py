"""End-to-end sensor pipeline freshness: how soon a window's result is readable after it could be.

    python -m bench.bench_pipeline [--rate 10000] [--sensors 1000] [--warmup 15] [--duration 40]

The compose stack's data path, as processes on loopback: ``sluice serve`` (the compose routing rules,
3 partitions, flush=always), a device generator process (``--sensors`` simulated sensors sharing
``--connections`` TCP connections, NDJSON readings ``{"sensor","temp","ts"}`` at a steady ``--rate``
readings/s, paced against the clock, ``ts`` = send time), the standalone sensor processor (``sluice
process processors.examples.sensors:pipeline``: 10 s tumbling means, 5 s out-of-orderness bound, 5 s
allowed lateness) and a confluent-kafka consumer on ``sensor-avg`` in this process.

Freshness of a result = the time it became readable in ``sensor-avg`` − (window end + the 5 s bound):
the earliest moment the window could be complete by the pipeline's own rules. Reported over the
``first`` emissions of windows that end after the warm-up, as p50/p99/max, together with the rate the
generator reached, the rate Sluice stored and the processor's lag at the end (a processor that falls
behind shows up as growing freshness and lag, not as lost records).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from sluice.cli_demo import PIPELINE, SENSOR_ROUTES, TOPICS

WINDOW_MS = 10_000
BOUND_MS = 5_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _generate(port: int, sensors: int, rate: float, seconds: float, connections: int, report: Any) -> None:
    rng = random.Random(1)
    temps = [65 + rng.gauss(0, 1) * 20 for _ in range(sensors)]
    names = [f"sensor_{i}" for i in range(sensors)]
    writers = [(await asyncio.open_connection("127.0.0.1", port))[1] for _ in range(connections)]
    sent, nxt, tick = 0, 0, 0.01
    start = time.monotonic()
    end = start + seconds
    lag_max = 0.0
    while (now := time.monotonic()) < end:
        due = int((now - start) * rate)
        if due > sent:
            ts = int(time.time() * 1000)
            chunks: list[list[bytes]] = [[] for _ in writers]
            for _ in range(due - sent):
                i = nxt
                nxt = (nxt + 1) % sensors
                temps[i] += rng.gauss(0, 1) * 0.5
                chunks[i % connections].append(
                    b'{"sensor":"%s","temp":%.3f,"ts":%d}\n' % (names[i].encode(), temps[i], ts))
            for w, lines in zip(writers, chunks, strict=True):
                if lines:
                    w.write(b"".join(lines))
            await asyncio.gather(*(w.drain() for w in writers))
            sent = due
        lag_max = max(lag_max, (time.monotonic() - start) * rate - sent)
        await asyncio.sleep(max(0.0, tick - (time.monotonic() - now)))
    for w in writers:
        w.close()
    report.put({"sent": sent, "seconds": time.monotonic() - start, "max_behind": lag_max})


def _generator_main(port: int, sensors: int, rate: float, seconds: float, connections: int, report: Any) -> None:
    asyncio.run(_generate(port, sensors, rate, seconds, connections, report))


def _http(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _end_offsets(consumer: Consumer, topic: str) -> int:
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in meta.partitions)


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1] if len(values) > 1 else values[0]


def run(args: argparse.Namespace) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    kafka, tcp, http = _free_port(), _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update({
        "SLUICE_KAFKA__PORT": str(kafka), "SLUICE_TCP__PORT": str(tcp), "SLUICE_HTTP__PORT": str(http),
        "SLUICE_MQTT__ENABLED": "false", "SLUICE_STORAGE__DEFAULT_PARTITIONS": "3",
        "SLUICE_STORAGE__FLUSH": args.flush, "SLUICE_INGEST__ROUTES": json.dumps(SENSOR_ROUTES),
        "SLUICE_LOG_LEVEL": "WARNING",
    })
    procs: list[subprocess.Popen[bytes]] = []
    logs = data / "logs"
    logs.mkdir()

    def spawn(name: str, argv: list[str], extra: dict[str, str] | None = None) -> None:
        with (logs / f"{name}.log").open("wb") as log:
            procs.append(subprocess.Popen(argv, env={**env, **(extra or {})}, stdout=log, stderr=subprocess.STDOUT))

    bootstrap = f"127.0.0.1:{kafka}"
    try:
        spawn("sluice", [sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data / "sluice")])
        deadline = time.monotonic() + 30
        while True:
            try:
                _http(f"http://127.0.0.1:{http}/ready")
                break
            except OSError:
                assert time.monotonic() < deadline and procs[0].poll() is None, (logs / "sluice.log").read_text()
                time.sleep(0.1)
        subprocess.run([sys.executable, "-m", "sluice.cli", "topics", "create", TOPICS["input"], "-p", "3",
                        "--bootstrap", bootstrap], check=True, capture_output=True, env=env)
        spawn("processor", [sys.executable, "-m", "sluice.cli", "process", PIPELINE, "--bootstrap", bootstrap,
                            "--log-level", "WARNING"],
              {"SENSORS_INPUT": TOPICS["input"], "SENSORS_OUTPUT": TOPICS["output"], "SENSORS_LATE": TOPICS["late"],
               "SENSORS_ALERTS": TOPICS["alerts"], "SENSORS_GROUP": "sensor-avg"})
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{os.getpid()}",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "fetch.wait.max.ms": 10, "topic.metadata.refresh.interval.ms": 1000,
                             "allow.auto.create.topics": True})
        consumer.subscribe([TOPICS["output"]])
        report: Any = multiprocessing.get_context("spawn").Queue()
        seconds = args.warmup + args.duration
        gen = multiprocessing.get_context("spawn").Process(
            target=_generator_main, args=(tcp, args.sensors, args.rate, seconds, args.connections, report))
        t0_ms = time.time() * 1000
        gen.start()
        measure_from_ms = t0_ms + args.warmup * 1000
        stored_at_warmup: int | None = None
        stored_at_end: int | None = None
        gen_end_ms = t0_ms + seconds * 1000
        fresh: list[float] = []
        per_window: dict[int, list[float]] = {}
        stop_at = time.monotonic() + seconds + BOUND_MS / 1000 + WINDOW_MS / 1000 + 5
        while time.monotonic() < stop_at:
            msg = consumer.poll(0.05)
            now_ms = time.time() * 1000
            if stored_at_warmup is None and now_ms >= measure_from_ms:
                stored_at_warmup = _end_offsets(consumer, TOPICS["input"])
                stored_warm_ms = now_ms
            if stored_at_end is None and now_ms >= gen_end_ms:
                stored_at_end = _end_offsets(consumer, TOPICS["input"])
                stored_end_ms = now_ms
            if msg is None or msg.error() is not None:
                continue
            raw = msg.value()
            assert raw is not None  # every output record carries a JSON value
            value = json.loads(raw)
            if value["emit"] != "first" or value["window_end"] <= measure_from_ms:
                continue
            if value["window_end"] > t0_ms + seconds * 1000:
                continue  # the generator stopped inside this window
            delay = now_ms - (value["window_end"] + BOUND_MS)
            fresh.append(delay)
            per_window.setdefault(value["window_end"], []).append(delay)
        gen.join(30)
        gen_report = report.get(timeout=10)
        group = _http(f"http://127.0.0.1:{http}/groups/sensor-avg")
        consumer.close()
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        subprocess.run(["rm", "-rf", str(data)], check=False)
    assert fresh, "no window results arrived"
    assert stored_at_warmup is not None and stored_at_end is not None
    stored_rate = (stored_at_end - stored_at_warmup) / ((stored_end_ms - stored_warm_ms) / 1000)
    return {
        "target_rate": args.rate,
        "generated_rate": gen_report["sent"] / gen_report["seconds"],
        "generator_max_behind": gen_report["max_behind"],
        "stored_rate_after_warmup": stored_rate,
        "results": len(fresh),
        "windows": len(per_window),
        "p50_ms": _pct(fresh, 0.5),
        "p99_ms": _pct(fresh, 0.99),
        "max_ms": max(fresh),
        "per_window_p50_ms": [round(statistics.median(v)) for _, v in sorted(per_window.items())],
        "processor_lag_at_end": group.get("total_lag"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=10_000, help="readings per second")
    parser.add_argument("--sensors", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=10)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before windows count")
    parser.add_argument("--duration", type=float, default=40.0, help="measured seconds after the warm-up")
    parser.add_argument("--flush", default="always", choices=["always", "interval", "os"])
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2))
    print(f"\nrate: target {args.rate:,.0f}/s, generated {result['generated_rate']:,.0f}/s, stored "
          f"{result['stored_rate_after_warmup']:,.0f}/s; {result['results']} window results in "
          f"{result['windows']} windows; freshness p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms, "
          f"max {result['max_ms']:.0f} ms; processor lag at end {result['processor_lag_at_end']}")


if __name__ == "__main__":
    main()
