"""The broker's Produce path in-process (no sockets): ``handle_produce`` on a memory store, records/s.

Run: ``python -m bench.bench_produce`` (a few seconds); records per second of CPU time (the
machine may be shared). Each request holds one batch of 100 records (100 B values by default,
``--value-bytes`` to change it; no key, librdkafka's shape; ``--headers`` adds a key and two headers, the ingest shape).
Request decoding and socket I/O are left out, so the figure is what validation, the idempotence check
and the append cost per record. To compare two versions of the broker, run this file from each tree
(``PYTHONPATH=<tree> python <tree>/bench/bench_produce.py``), interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from types import SimpleNamespace

from broker.log.memory import MemoryLogStore
from broker.protocol.records import RecordSpec, encode_batch
from broker.server.handlers_common import BrokerContext, ConnectionInfo
from broker.server.handlers_produce import handle_produce

TS = 1_700_000_000_000


async def run(requests: int, headers: bool, value_bytes: int = 100) -> float:
    store = MemoryLogStore(default_partitions=1)
    ctx = BrokerContext(store, None, "127.0.0.1", 9092)
    conn = ConnectionInfo("127.0.0.1", 1)
    extra = {"key": b"sensor_1", "headers": (("source", b"tcp:default"), ("device", b"sensor_1"))} if headers else {}
    batch = encode_batch([RecordSpec(b"x" * value_bytes, timestamp=TS + i, **extra) for i in range(100)])  # type: ignore[arg-type]
    body = SimpleNamespace(acks=1, topic_data=[SimpleNamespace(name="bench", partition_data=[
        SimpleNamespace(index=0, records=batch)])])
    start = time.process_time()  # CPU time: the machine may be shared
    for _ in range(requests):
        response = await handle_produce(ctx, body, conn)
        assert response is not None and response.topics[0].partitions[0].error_code == 0
    return requests * 100 / (time.process_time() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=5_000)
    parser.add_argument("--headers", action="store_true", help="a key and two headers per record")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per record value (100: librdkafka's "
                        "bench shape; 1024: the 1 KiB row of issue 18)")
    parser.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    args = parser.parse_args()
    best = max(asyncio.run(run(args.requests, args.headers, args.value_bytes)) for _ in range(args.repeat))
    shape = "key + 2 headers" if args.headers else "value only"
    print(f"produce path, {args.value_bytes} B values, {shape}: {best:,.0f} records/s "
          f"({1e6 / best:.3f} µs per record)")


if __name__ == "__main__":
    main()
