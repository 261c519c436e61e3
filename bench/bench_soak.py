"""Soak: does a long-running Sluice's memory plateau, and does reading its log back cost memory?

Run::

    python -m bench.bench_soak --duration 3600 --devices 1000 --sample-s 60   # the bench/RESULTS.md figure
    python -m bench.bench_soak --duration 20 --devices 20 --sample-s 2        # smoke (tests/bench)

What it does, in one run:
1. starts ``sluice serve`` as ``make run`` does (segment store on disk, default flush and visibility) with
   the example processor attached (``processors.examples.sensors:pipeline``), on free ports;
2. drives a device fleet with ``sluice simulate --profile mix``: half the devices over MQTT (QoS 1, one
   connection each), half over Kafka (one producer), for ``--duration`` seconds;
3. samples the broker every ``--sample-s`` seconds: RSS (``VmRSS``), open descriptors, bytes of log on
   disk;
4. stops the fleet, restarts Sluice (fresh RSS once started and idle), reads every topic back from the
   start with a Kafka consumer (confluent-kafka), and samples RSS again (``--read-back DATA_DIR`` does
   only this, on a data directory kept with ``--keep``).

It prints the samples as a table and two verdicts: the plateau (median RSS of the last quarter of the
samples over that of the second quarter; 1.00 means flat) and the read-back ratio (RSS after reading
the whole log over RSS of the fresh start; the target is <= 1.2). Memory is not compared with a peer
here: the question is whether Sluice's own memory follows the log, not how it compares.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition

__all__ = ["Sample", "main", "rss_mib"]

PROCESSOR = "processors.examples.sensors:pipeline"
MiB = 1 << 20
STOP_GRACE_S = 60.0  # past --duration, a fleet still draining its last acks is stopped


@dataclass(frozen=True)
class Sample:
    elapsed_s: float
    rss_mib: float
    fds: int
    log_mib: float


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def dir_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / MiB


class Broker:
    """``sluice serve`` on free ports with the example processor attached."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoints: dict[str, dict[str, object]] = {}

    def start(self) -> Broker:
        env = {**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__PORT": "0", "SLUICE_TCP__PORT": "0",
               "SLUICE_HTTP__PORT": "0", "SLUICE_LOG_LEVEL": "WARNING",
               "SLUICE_KAFKA__GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}
        endpoints = self.data_dir / "endpoints.json"
        endpoints.unlink(missing_ok=True)
        log = (self.data_dir.parent / "sluice.log").open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(self.data_dir),
                                      "--processor", PROCESSOR], env=env, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 60
        while not (endpoints.exists() and {"kafka", "mqtt"} <= set(json.loads(endpoints.read_text() or "{}"))):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sluice did not start; see {self.data_dir.parent / 'sluice.log'}")
            time.sleep(0.1)
        self.endpoints = json.loads(endpoints.read_text())
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def port(self, name: str) -> int:
        return int(str(self.endpoints[name]["port"]))

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port('kafka')}"

    def sample(self, started: float) -> Sample:
        return Sample(time.monotonic() - started, rss_mib(self.pid), open_fds(self.pid),
                      dir_mib(self.data_dir / "logs"))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def fleet(broker: Broker, devices: int, duration: float) -> list[subprocess.Popen[bytes]]:
    half = max(1, devices // 2)
    base = [sys.executable, "-m", "sluice.cli", "simulate", "--profile", "mix", "--duration", str(duration),
            "--json"]
    mqtt = base + ["--transport", "mqtt", "--port", str(broker.port("mqtt")), "--sensors", str(half)]
    kafka = base + ["--transport", "kafka", "--bootstrap", broker.bootstrap, "--sensors", str(max(1, devices - half)),
                    "--first-id", str(half)]
    return [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for cmd in (mqtt, kafka)]


def read_everything(bootstrap: str) -> int:
    """Read every partition of every topic from its start to its end; returns the records read."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"soak-{time.time_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "fetch.max.bytes": 8 * MiB, "enable.partition.eof": True})
    try:
        metadata = consumer.list_topics(timeout=30)
        parts = [TopicPartition(t, p, 0) for t, tm in metadata.topics.items() if not t.startswith("__")
                 for p in tm.partitions]
        consumer.assign(parts)
        remaining, count = len(parts), 0
        while remaining:
            msgs = consumer.consume(10_000, timeout=5)
            if not msgs:
                break
            for msg in msgs:
                err = msg.error()
                if err is None:
                    count += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    remaining -= 1
        return count
    finally:
        consumer.close()


def quarter_median(samples: list[Sample], q: int) -> float:
    n = len(samples)
    part = samples[q * n // 4:(q + 1) * n // 4] or samples[-1:]
    return statistics.median(s.rss_mib for s in part)


def drive(broker: Broker, args: argparse.Namespace) -> list[Sample]:
    """Run the fleet for ``--duration`` seconds, sampling the broker; returns the samples."""
    started = time.monotonic()
    samples = [broker.sample(started)]
    load = fleet(broker, args.devices, args.duration)
    print("| elapsed s | RSS MiB | fds | log MiB |\n|---:|---:|---:|---:|", flush=True)
    next_sample = started + args.sample_s
    stop_at = started + args.duration + STOP_GRACE_S  # then the fleet is told to stop (SIGTERM)
    while any(p.poll() is None for p in load):
        time.sleep(max(0.1, min(next_sample, stop_at) - time.monotonic()))
        now = time.monotonic()
        if now >= next_sample:
            next_sample += args.sample_s
            s = broker.sample(started)
            samples.append(s)
            print(f"| {s.elapsed_s:.0f} | {s.rss_mib:.1f} | {s.fds} | {s.log_mib:.1f} |", flush=True)
        if now >= stop_at:
            for p in load:
                if p.poll() is None:
                    p.terminate()
            stop_at = float("inf")
    for p in load:
        _, err = p.communicate()
        if p.returncode != 0:  # reported, not fatal: the broker's figures are what this run is for
            transport = "mqtt" if p is load[0] else "kafka"
            print(f"note: the {transport} fleet (sluice simulate) exited {p.returncode}: "
                  f"{err.decode(errors='replace').strip().splitlines()[-1:]}", flush=True)
    return samples


def read_back(data_dir: Path, settle_s: float) -> None:
    """Restart on ``data_dir``, then read the whole log back; prints RSS before and after."""
    broker = Broker(data_dir).start()
    try:
        time.sleep(settle_s)
        fresh = rss_mib(broker.pid)
        t0 = time.monotonic()
        records = read_everything(broker.bootstrap)
        read_s = time.monotonic() - t0
        after = rss_mib(broker.pid)
    finally:
        broker.stop()
    print(f"read back: {records} records ({dir_mib(data_dir / 'logs'):.0f} MiB of log) in {read_s:.1f} s; "
          f"RSS fresh {fresh:.1f} MiB, after {after:.1f} MiB: ratio {after / fresh:.2f} (target <= 1.2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds the fleet runs")
    parser.add_argument("--devices", type=int, default=1000, help="simulated devices, half MQTT and half Kafka")
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--dir", type=Path, default=None, help="where the data directory goes (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory and the broker's log")
    parser.add_argument("--read-back", type=Path, default=None, metavar="DATA_DIR",
                        help="skip the fleet: restart on an existing data directory and read it back")
    args = parser.parse_args()
    if args.read_back is not None:
        read_back(args.read_back, min(5.0, args.sample_s))
        return

    work = Path(tempfile.mkdtemp(prefix="sluice-soak-", dir=args.dir))
    data_dir = work / "data"
    data_dir.mkdir()
    print(f"soak: {args.devices} devices for {args.duration:.0f} s, sample every {args.sample_s:.0f} s; "
          f"data in {work}", flush=True)
    broker = Broker(data_dir).start()
    try:
        samples = drive(broker, args)
    finally:
        broker.stop()
    plateau = quarter_median(samples, 3) / quarter_median(samples, 1)
    print(f"\nplateau: median RSS of the last quarter / second quarter = {plateau:.2f} "
          f"({quarter_median(samples, 1):.1f} -> {quarter_median(samples, 3):.1f} MiB); "
          f"fds {samples[1].fds if len(samples) > 1 else samples[0].fds} -> {samples[-1].fds}", flush=True)
    read_back(data_dir, min(5.0, args.sample_s))
    if not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
