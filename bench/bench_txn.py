"""What transactions cost on the produce path: a transactional producer against a plain idempotent one,
side by side on the same broker, in rounds whose order rotates.

Run: ``python -m bench.bench_txn [--records 200000] [--rounds 3] [--flush always|os]``.
Each round sends ``--records`` 100-byte records with librdkafka (confluent-kafka, linger.ms=5,
acks=all) as (a) a transactional producer committing every 1,000 / 10,000 records and (b) an
idempotent producer that flushes every 1,000 / 10,000 records: the same rhythm of waiting for its
records, so the ratio (a)/(b) is what the transaction adds (AddPartitionsToTxn, EndTxn, one marker
per partition and three durable transaction-log writes). A free-running idempotent row is kept for
reference: on a 2-core machine its produce loop competes with the broker for CPU. Broker CPU per
record (user + system time of the ``sluice serve`` process over each row) is printed beside each
throughput: it does not depend on how busy the rest of the machine is. One ``sluice serve`` child
process (segment store, 3 partitions) serves every round, so the machine's noise hits all rows alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PAYLOAD = b"x" * 100


def _start_broker(data_dir: Path, flush: str) -> tuple[subprocess.Popen[bytes], str]:
    env = {**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false",
           "SLUICE_HTTP__ENABLED": "false", "SLUICE_STORAGE__DEFAULT_PARTITIONS": "3",
           "SLUICE_STORAGE__FLUSH": flush, "SLUICE_EVENT_LOOP": "uvloop"}
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data_dir)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoints = data_dir / "endpoints.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if endpoints.exists():
            data = json.loads(endpoints.read_text())
            if "kafka" in data:
                return proc, f"127.0.0.1:{data['kafka']['port']}"
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("sluice serve did not announce its Kafka port")


def _produce(bootstrap: str, topic: str, records: int, per_txn: int | None, transactional: bool) -> float:
    """Records per second, sent in chunks of ``per_txn`` (None: one chunk): each chunk a committed
    transaction, or (idempotent) followed by a flush, so both rows wait for their records at the same
    rhythm and the difference is what the transaction adds."""
    from confluent_kafka import Producer

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                              "queue.buffering.max.messages": 1_000_000}
    if transactional:
        config["transactional.id"] = f"bench-{topic}"
    producer = Producer(config)
    if transactional:
        producer.init_transactions(30)
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    started = time.perf_counter()
    sent = 0
    while sent < records:
        chunk = min(per_txn or records, records - sent)
        if transactional:
            producer.begin_transaction()
        for _ in range(chunk):
            while True:
                try:
                    producer.produce(topic, PAYLOAD, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
        if transactional:
            producer.commit_transaction(60)
        else:
            producer.flush(60)
        sent += chunk
    producer.flush(60)
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries failed, e.g. {failures[0]}")
    return records / elapsed


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flush", choices=["always", "os"], default="always")
    args = parser.parse_args()
    kinds: list[tuple[str, int | None, bool]] = [
        ("idempotent", None, False), ("idem+flush/1000", 1000, False), ("txn/1000", 1000, True),
        ("idem+flush/10000", 10_000, False), ("txn/10000", 10_000, True)]
    rows: dict[str, list[float]] = {name: [] for name, _, _ in kinds}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in kinds}  # broker CPU µs per record
    with tempfile.TemporaryDirectory() as tmp:
        proc, bootstrap = _start_broker(Path(tmp) / "data", args.flush)
        try:
            for round_no in range(args.rounds):
                shift = round_no % len(kinds)
                for name, per_txn, transactional in kinds[shift:] + kinds[:shift]:  # rotate: no row always first
                    topic = f"{name.replace('/', '-').replace('+', '-')}-{round_no}"
                    before = _cpu_seconds(proc.pid)
                    rate = _produce(bootstrap, topic, args.records, per_txn, transactional)
                    cost = (_cpu_seconds(proc.pid) - before) / args.records * 1e6
                    rows[name].append(rate)
                    cpu[name].append(cost)
                    print(f"round {round_no + 1} {name:16s} {rate:10,.0f} records/s  broker {cost:5.2f} µs CPU/record",
                          flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"\nflush={args.flush}, {args.records:,} x 100 B per row, median of {args.rounds} rounds:")
    for name, rates in rows.items():
        median, cost = statistics.median(rates), statistics.median(cpu[name])
        line = f"  {name:16s} {median:10,.0f} records/s  broker {cost:5.2f} µs CPU/record"
        if name.startswith("txn/"):
            control = "idem+flush/" + name.split("/")[1]
            line += (f"  vs {control}: throughput x{median / statistics.median(rows[control]):.2f},"
                     f" broker CPU x{cost / statistics.median(cpu[control]):.2f}")
        print(line)


if __name__ == "__main__":
    main()
