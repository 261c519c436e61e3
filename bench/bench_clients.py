"""Client library, HTTP API and SSE, measured against one real Sluice (subprocess, memory storage).

    python -m bench.bench_clients [--records 50000]

1. HTTP produce: POST /topics/{t}/records with batches of 100 JSON records (httpx, 4 concurrent requests).
2. SSE delivery latency: a record produced over HTTP until an SSE client (httpx stream) sees it; p50/p99.
3. The Python client (clients.AsyncProducer / AsyncConsumer on aiokafka) beside raw librdkafka
   (confluent-kafka Producer/Consumer), produce and consume records/s, 100-byte JSON values, same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer

from clients import AsyncAdmin, AsyncConsumer, AsyncProducer
from tests.sluice_server import SluiceProcess

VALUE = {"sensor": "sensor_1", "temp": 71.25, "unit": "F", "ts": 1_700_000_000_000, "pad": "x" * 30}


async def http_produce(base: str, records: int) -> float:
    topic = f"http-{uuid.uuid4().hex[:6]}"
    body = {"records": [{"key": f"sensor_{i % 10}", "value": VALUE} for i in range(100)]}
    batches = records // 100
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        await client.post(f"/topics/{topic}/records", json=body)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(batches):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                queue.get_nowait()
                r = await client.post(f"/topics/{topic}/records", json=body)
                r.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(4)))
        return batches * 100 / (time.perf_counter() - start)


async def sse_latency(base: str, samples: int) -> tuple[float, float]:
    topic = f"sse-{uuid.uuid4().hex[:6]}"
    lat: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        await client.post("/topics", json={"name": topic})
        async with client.stream("GET", f"/topics/{topic}/stream") as resp:
            lines = resp.aiter_lines()
            while (await anext(lines)) != "":  # retry + subscribed event
                pass
            for i in range(samples):
                sent = time.perf_counter()
                await client.post(f"/topics/{topic}/records", json={"records": [{"value": {"i": i}}]})
                while True:
                    line = await anext(lines)
                    if line.startswith("data: ") and json.loads(line[6:])["value"] == {"i": i}:
                        lat.append((time.perf_counter() - sent) * 1000)
                        break
    lat.sort()
    return statistics.median(lat), lat[int(len(lat) * 0.99) - 1]


async def py_client(bootstrap: str, records: int) -> tuple[float, float]:
    topic = f"py-{uuid.uuid4().hex[:6]}"
    async with AsyncAdmin(bootstrap) as admin:
        await admin.create_topic(topic, 1)
    async with AsyncProducer(bootstrap, linger_ms=5) as producer:
        start = time.perf_counter()
        futures = [await producer.send_nowait(topic, VALUE, key="sensor_1") for _ in range(records)]
        await asyncio.gather(*futures)
        produce = records / (time.perf_counter() - start)
    async with AsyncConsumer(topic, bootstrap=bootstrap, max_batch=5000) as consumer:
        got = 0
        start = time.perf_counter()
        while got < records:
            got += len(await consumer.getmany(timeout_ms=1000))
        consume = records / (time.perf_counter() - start)
    return produce, consume


async def raw_aiokafka(bootstrap: str, records: int) -> float:
    from aiokafka import AIOKafkaProducer

    topic = f"ak-{uuid.uuid4().hex[:6]}"
    payload = json.dumps(VALUE, separators=(",", ":")).encode()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    try:
        await (await producer.send(topic, payload))
        start = time.perf_counter()
        futures = [await producer.send(topic, payload, key=b"sensor_1") for _ in range(records)]
        await asyncio.gather(*futures)
        return records / (time.perf_counter() - start)
    finally:
        await producer.stop()


def librdkafka(bootstrap: str, records: int) -> tuple[float, float]:
    topic = f"rd-{uuid.uuid4().hex[:6]}"
    payload = json.dumps(VALUE, separators=(",", ":")).encode()
    producer = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    producer.produce(topic, payload)
    producer.flush(10)
    start = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, payload, key=b"sensor_1")
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)
    produce = records / (time.perf_counter() - start)
    consumer = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"b-{topic}", "auto.offset.reset": "earliest",
                           "enable.auto.commit": False})
    consumer.subscribe([topic])
    got = 0
    consume_start: float | None = None
    while got < records + 1:
        msgs = consumer.consume(5000, 1.0)
        if msgs and consume_start is None:
            consume_start = time.perf_counter()
        got += sum(1 for m in msgs if m.error() is None)
    consume = records / (time.perf_counter() - (consume_start or time.perf_counter()))
    consumer.close()
    return produce, consume


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--sse-samples", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = SluiceProcess(Path(tmp) / "data", env={"SLUICE_LOG_LEVEL": "WARNING"}).start()
        try:
            http_rps = asyncio.run(http_produce(server.http, args.records))
            p50, p99 = asyncio.run(sse_latency(server.http, args.sse_samples))
            py_p, py_c = asyncio.run(py_client(server.bootstrap, args.records))
            ak_p = asyncio.run(raw_aiokafka(server.bootstrap, args.records))
            rd_p, rd_c = librdkafka(server.bootstrap, args.records)
        finally:
            server.stop()
    print(f"HTTP produce (batches of 100 JSON records, 4 concurrent): {http_rps:,.0f} records/s")
    print(f"SSE delivery latency (HTTP produce -> SSE event, {args.sse_samples} samples): "
          f"p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    print(f"clients.AsyncProducer (aiokafka): {py_p:,.0f} records/s | confluent-kafka (librdkafka): {rd_p:,.0f} "
          f"records/s | ratio {py_p / rd_p:.2f}")
    print(f"raw aiokafka AIOKafkaProducer (no serializer, no wrapper): {ak_p:,.0f} records/s")
    print(f"clients.AsyncConsumer (aiokafka): {py_c:,.0f} records/s | confluent-kafka (librdkafka): {rd_c:,.0f} "
          f"records/s | ratio {py_c / rd_c:.2f}")


if __name__ == "__main__":
    main()
