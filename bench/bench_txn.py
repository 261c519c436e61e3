"""What transactions cost on the produce path: a transactional producer against a plain idempotent one,
side by side on the same broker, in rounds whose order rotates.

Run: ``python -m bench.bench_txn [--records 200000] [--rounds 3] [--flush always|os]``.
Each round sends ``--records`` 100-byte records with librdkafka (confluent-kafka, linger.ms=5,
acks=all) as (a) an idempotent producer and (b) a transactional producer committing every 1,000 and
every 10,000 records; the ratio (b)/(a) is the figure (a transaction adds AddPartitionsToTxn, EndTxn,
one marker per partition and three durable transaction-log writes). One ``sluice serve`` child
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


def _produce(bootstrap: str, topic: str, records: int, per_txn: int | None) -> float:
    """Records per second; ``per_txn`` None = idempotent, else commit every ``per_txn`` records."""
    from confluent_kafka import Producer

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                              "queue.buffering.max.messages": 1_000_000}
    if per_txn is not None:
        config["transactional.id"] = f"bench-{topic}"
    producer = Producer(config)
    if per_txn is not None:
        producer.init_transactions(30)
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    started = time.perf_counter()
    sent = 0
    while sent < records:
        chunk = min(per_txn or records, records - sent)
        if per_txn is not None:
            producer.begin_transaction()
        for _ in range(chunk):
            while True:
                try:
                    producer.produce(topic, PAYLOAD, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
        if per_txn is not None:
            producer.commit_transaction(60)
        sent += chunk
    producer.flush(60)
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries failed, e.g. {failures[0]}")
    return records / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flush", choices=["always", "os"], default="always")
    args = parser.parse_args()
    rows: dict[str, list[float]] = {"idempotent": [], "txn/1000": [], "txn/10000": []}
    with tempfile.TemporaryDirectory() as tmp:
        proc, bootstrap = _start_broker(Path(tmp) / "data", args.flush)
        try:
            kinds: list[tuple[str, int | None]] = [("idempotent", None), ("txn/1000", 1000), ("txn/10000", 10_000)]
            for round_no in range(args.rounds):
                order = kinds[round_no % 3:] + kinds[:round_no % 3]  # rotate: no row always runs first
                for name, per_txn in order:
                    rate = _produce(bootstrap, f"{name.replace('/', '-')}-{round_no}", args.records, per_txn)
                    rows[name].append(rate)
                    print(f"round {round_no + 1} {name:11s} {rate:10,.0f} records/s", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    base = statistics.median(rows["idempotent"])
    print(f"\nflush={args.flush}, {args.records:,} x 100 B per row, median of {args.rounds} rounds:")
    for name, rates in rows.items():
        median = statistics.median(rates)
        print(f"  {name:11s} {median:10,.0f} records/s  ratio to idempotent {median / base:.2f}")


if __name__ == "__main__":
    main()
