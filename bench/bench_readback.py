"""Memory after writing and reading back a large log: does RSS follow the bytes retained?

Run::

    python -m bench.bench_readback --gib 10          # the bench/RESULTS.md figure (issue 18's target)
    python -m bench.bench_readback --gib 0.05        # smoke

One ``sluice serve`` as ``make run`` starts it (segment store, default flush, the example processor
attached; see ``bench.bench_soak.Broker``), on free ports:

1. RSS of the fresh, idle broker;
2. ``--gib`` GiB of 1 KiB records written over Kafka by the librdkafka load generator
   (``bench/loadgen/kafka_produce.c``, one process per partition at once, acks=1), RSS sampled;
3. every record read back from offset 0 with confluent-kafka in the same broker process, RSS sampled;
4. a restart, RSS of the fresh broker on the full log, the whole log read back again, RSS sampled.

The verdicts are RSS after the read-back over RSS of the fresh start, for the first process (written
then read) and for the restarted one (target: <= 1.2 each). Memory is Sluice's own question here (does it
grow with the log?), so there is no peer row. Needs gcc and librdkafka-dev
(``bash scripts/install-system-deps.sh bench``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from bench.bench_kafka import build_loadgen
from bench.bench_soak import Broker, dir_mib, read_everything, rss_mib

__all__ = ["main"]

GiB = 1 << 30
RECORD_BYTES = 1024
TOPIC = "bulk"
SETTLE_S = 5.0


def create_topic(bootstrap: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(30)


def fill(exe: Path, bootstrap: str, partitions: int, gib: float) -> tuple[int, float]:
    """Write ``gib`` GiB of 1 KiB records, one load generator per partition at once; (records, seconds)."""
    per_partition = max(1, int(gib * GiB / RECORD_BYTES / partitions))
    settings = ["linger.ms=5", "batch.num.messages=10000", "acks=1"]
    started = time.perf_counter()
    procs = [subprocess.Popen([str(exe), bootstrap, TOPIC, str(p), str(per_partition), str(RECORD_BYTES), *settings],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for p in range(partitions)]
    errors = [p.communicate(timeout=3600)[1].decode(errors="replace").strip() for p in procs]
    if any(p.returncode for p in procs) or any(errors):
        raise SystemExit(f"load generator failed: {[p.returncode for p in procs]} {errors}")
    return per_partition * partitions, time.perf_counter() - started


def read_back(broker: Broker, label: str, fresh: float) -> float:
    started = time.perf_counter()
    records = read_everything(broker.bootstrap)
    seconds = time.perf_counter() - started
    after = rss_mib(broker.pid)
    print(f"{label}: read {records:,} records in {seconds:.1f} s; RSS {after:.1f} MiB, "
          f"ratio to the fresh start {after / fresh:.2f} (target <= 1.2)", flush=True)
    return after / fresh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=10.0, help="GiB of 1 KiB records to write (default 10)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the bulk topic")
    parser.add_argument("--dir", type=Path, default=None, help="where the data directory goes (default: a temp dir)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sluice-readback-", dir=args.dir))
    data_dir = work / "data"
    data_dir.mkdir()
    exe = build_loadgen(work)
    broker = Broker(data_dir).start()
    try:
        time.sleep(SETTLE_S)
        fresh = rss_mib(broker.pid)
        print(f"fresh start: RSS {fresh:.1f} MiB; writing {args.gib:g} GiB to {args.partitions} partitions "
              f"(data in {work})", flush=True)
        create_topic(broker.bootstrap, args.partitions)
        records, seconds = fill(exe, broker.bootstrap, args.partitions, args.gib)
        written = rss_mib(broker.pid)
        print(f"written: {records:,} records, {dir_mib(data_dir / 'logs') / 1024:.2f} GiB of log in {seconds:.1f} s "
              f"({records * RECORD_BYTES / seconds / 1e6:.0f} MB/s); RSS {written:.1f} MiB "
              f"({written / fresh:.2f}x fresh)", flush=True)
        first = read_back(broker, "read back in the same process", fresh)
    finally:
        broker.stop()

    broker = Broker(data_dir).start()
    try:
        time.sleep(SETTLE_S)
        restarted = rss_mib(broker.pid)
        print(f"restarted on the full log: RSS {restarted:.1f} MiB", flush=True)
        second = read_back(broker, "read back after the restart", restarted)
    finally:
        broker.stop()
    print(f"\nverdict: RSS after read-back / fresh start = {first:.2f} (written and read by one process), "
          f"{second:.2f} (after a restart); target <= 1.2")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
