"""Where the acks=all + flush=always end-to-end latency tail comes from: a probed broker.

Run: ``python -m bench.bench_kafka_tail [--seconds 5] [--runs 2] [--flush always|os] [--linger 1]``. Each run
starts a broker in a child process (segment store, flush=always by default — ``--flush os`` is the
control without fsyncs, uvloop, the same ``KafkaServer`` ``sluice serve`` runs)
with probes, and drives it with ``bench.bench_kafka.kafka_latency`` (librdkafka idempotent producer,
acks=all, 10k records/s; a consumer thread from the end). Probes, all inside the broker process:

- event-loop lag: a task sleeping 1 ms in a loop, the overshoot of each sleep;
- time spent in the event loop's ``os.write`` calls to segment files (``segment.write_all``): the
  suspect that a write blocks while an fsync in the worker thread writes back the same file;
- duration of each fsync round in the worker thread (``segment._fsync_all``);
- a timeline of every loop stall, fsync and checkpoint write over 20 ms.

The probes wrap module-level functions of ``broker.log.segment`` in the child only; nothing in the
broker changes. The end-to-end figures are printed next to the probe figures so they can be matched.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SLOW_S = 0.02


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def broker_main(root: Path, port_file: Path, seconds: float, flush: str) -> None:
    """The child: a probed broker that serves for ``seconds`` and prints its probe figures as JSON."""
    import uvloop

    import broker.log.segment as segment
    import broker.log.segment_partition as segment_partition
    from broker.groups.coordinator import GroupCoordinator
    from broker.groups.offsets import MemoryOffsetStore
    from broker.log.config import FlushPolicy, TopicConfig
    from broker.server.kafka import KafkaServer, KafkaServerConfig

    t0 = time.perf_counter()
    writes: list[float] = []
    fsyncs: list[float] = []
    slow: list[tuple[str, float, float]] = []
    write_all, fsync_all = segment_partition.write_all, segment_partition._fsync_all
    store_points = segment.SegmentLogStore._store_points

    def timed_write_all(fd: int, data: Any) -> None:
        started = time.perf_counter()
        write_all(fd, data)
        writes.append(time.perf_counter() - started)

    def timed_fsync_all(files: list[int], dirs: list[Path]) -> None:
        started = time.perf_counter()
        fsync_all(files, dirs)
        took = time.perf_counter() - started
        fsyncs.append(took)
        if took > SLOW_S:
            slow.append(("fsync", started - t0, took))

    def timed_store_points(self: Any, points: Any, seq: int) -> None:
        started = time.perf_counter()
        store_points(self, points, seq)
        took = time.perf_counter() - started
        if took > SLOW_S:
            slow.append(("checkpoint write", started - t0, took))

    gc_started: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        elif time.perf_counter() - gc_started[0] > SLOW_S:
            slow.append((f"gc gen {info['generation']}", gc_started[0] - t0, time.perf_counter() - gc_started[0]))

    segment_partition.write_all = timed_write_all
    segment_partition._fsync_all = timed_fsync_all
    segment.SegmentLogStore._store_points = timed_store_points  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)

    async def serve() -> None:
        store = segment.SegmentLogStore(root, default_config=TopicConfig(flush=FlushPolicy(flush)))
        await store.start()
        coordinator = GroupCoordinator(MemoryOffsetStore())
        await coordinator.start()
        server = KafkaServer(store, coordinator, KafkaServerConfig(port=0))
        await server.start()
        port_file.write_text(str(server.port))
        lags: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            lag = time.perf_counter() - started - 0.001
            lags.append(lag)
            if lag > SLOW_S:
                slow.append(("event-loop stall", started - t0, lag))
        await server.stop()
        await coordinator.stop()
        await store.close()
        ms = 1000.0
        print(json.dumps({
            "loop_lag_p99_ms": _pct(lags, 0.99) * ms, "loop_lag_max_ms": _pct(lags, 1.0) * ms,
            "writes": len(writes), "write_p99_ms": _pct(writes, 0.99) * ms, "write_max_ms": _pct(writes, 1.0) * ms,
            "fsyncs": len(fsyncs), "fsync_p50_ms": _pct(fsyncs, 0.5) * ms, "fsync_p99_ms": _pct(fsyncs, 0.99) * ms,
            "fsync_max_ms": _pct(fsyncs, 1.0) * ms,
            "slow": [(what, round(at, 3), round(took * ms, 1)) for what, at, took in sorted(slow, key=lambda s: s[1])],
        }))

    uvloop.run(serve())


def one_run(seconds: float, flush: str, linger_ms: int) -> dict[str, Any]:
    from bench.bench_kafka import kafka_latency

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port_file = root / "port"
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_kafka_tail", "--broker", str(root / "data"), str(port_file),
             str(seconds + 8), flush], stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or child.poll() is not None:
                raise RuntimeError("probed broker did not start")
            time.sleep(0.05)
        latencies = kafka_latency(f"127.0.0.1:{port_file.read_text()}", "latency", seconds, "all", linger_ms)
        out, _ = child.communicate(timeout=120)
    probes: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    probes.update(e2e_p50_ms=statistics.median(latencies), e2e_p99_ms=_pct(latencies, 0.99),
                  e2e_max_ms=max(latencies), records=len(latencies))
    return probes


def main() -> None:
    if sys.argv[1:2] == ["--broker"]:
        broker_main(Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
        return
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 5.0
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 2
    flush = sys.argv[sys.argv.index("--flush") + 1] if "--flush" in sys.argv else "always"
    linger_ms = int(sys.argv[sys.argv.index("--linger") + 1]) if "--linger" in sys.argv else 1
    print(f"flush={flush}, acks=all + idempotence, linger.ms={linger_ms}, {seconds:g} s at 10k records/s per run")
    print("| run | e2e p50 / p99 / max ms | fsync p50 / p99 / max ms | write() p99 / max ms "
          "| loop lag p99 / max ms |\n|---|---:|---:|---:|---:|")
    timelines = []
    for run in range(1, runs + 1):
        r = one_run(seconds, flush, linger_ms)
        print(f"| {run} | {r['e2e_p50_ms']:.2f} / {r['e2e_p99_ms']:.2f} / {r['e2e_max_ms']:.2f} "
              f"| {r['fsync_p50_ms']:.2f} / {r['fsync_p99_ms']:.2f} / {r['fsync_max_ms']:.2f} "
              f"| {r['write_p99_ms']:.3f} / {r['write_max_ms']:.3f} "
              f"| {r['loop_lag_p99_ms']:.2f} / {r['loop_lag_max_ms']:.2f} |", flush=True)
        timelines.append(r["slow"])
    for run, slow in enumerate(timelines, 1):
        print(f"run {run} events over {SLOW_S * 1000:.0f} ms (name, s since broker start, ms): {slow}")


if __name__ == "__main__":
    main()
