"""Which codec for the Kafka hot paths? Hand-written ``struct`` vs kio vs kafka-python's protocol module.

Run: ``python -m bench.bench_kafka_codec``. Workloads are what the broker does per request on the
hot paths: decode a ProduceRequest v8 (6 partitions × one 16 KiB batch, librdkafka-like), encode a
FetchResponse v11 (6 partitions × 64 KiB of stored batches), decode a FetchRequest v11 and encode a
ProduceResponse v8. Prints ops/s per library, side by side in one run.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

from kafka.protocol.consumer.fetch import FetchRequest as KpFetchRequest
from kafka.protocol.consumer.fetch import FetchResponse as KpFetchResponse
from kafka.protocol.producer.produce import ProduceRequest as KpProduceRequest
from kafka.protocol.producer.produce import ProduceResponse as KpProduceResponse
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from broker.protocol.kafka import build_entity, fetch, produce
from broker.protocol.records import RecordSpec, encode_batch

PARTITIONS = 6


def _rate(fn: Callable[[], object], seconds: float = 0.7) -> float:
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(20):
            fn()
        count += 20
        now = time.perf_counter()
        if now >= deadline:
            return count / (now - start)


def main() -> None:
    batch16k = encode_batch([RecordSpec(b"v" * 100, key=b"k%d" % i) for i in range(150)])
    records64k = encode_batch([RecordSpec(b"v" * 1000) for _ in range(64)])
    preq = produce.ProduceRequest(
        None, -1, 30000,
        (produce.ProduceTopic("bench", tuple(produce.ProducePartition(p, batch16k) for p in range(PARTITIONS))),),
    )
    preq_bytes = produce.encode_produce_request(preq, 8)
    fresp = fetch.FetchResponse(
        (fetch.FetchTopicResponse("bench", tuple(
            fetch.FetchPartitionResponse(p, 0, 1000, 1000, 0, records64k) for p in range(PARTITIONS)
        )),),
    )
    freq = fetch.FetchRequest(
        -1, 500, 1, 52428800, 0,
        (fetch.FetchTopic("bench", tuple(fetch.FetchPartition(p, 1000, 1048576) for p in range(PARTITIONS))),),
    )
    freq_bytes = fetch.encode_fetch_request(freq, 11)
    presp = produce.ProduceResponse(
        (produce.ProduceTopicResponse("bench", tuple(
            produce.ProducePartitionResponse(p, 0, 1000, -1, 0) for p in range(PARTITIONS)
        )),),
    )

    kio_preq = entity_reader(load_request_schema(0, 8))
    kio_freq = entity_reader(load_request_schema(1, 11))
    kio_fresp_cls = load_response_schema(1, 11)
    kio_fresp_w = entity_writer(kio_fresp_cls)
    kio_fresp = build_entity(kio_fresp_cls, {
        "throttle_time": 0, "error_code": 0, "session_id": 0,
        "responses": [{"topic": "bench", "partitions": [
            {"partition_index": p, "error_code": 0, "high_watermark": 1000, "last_stable_offset": 1000,
             "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1,
             "records": records64k} for p in range(PARTITIONS)]}],
    })
    kio_presp_cls = load_response_schema(0, 8)
    kio_presp_w = entity_writer(kio_presp_cls)

    def kio_encode_fetch() -> bytes:
        buf = io.BytesIO()
        kio_fresp_w(buf, kio_fresp)
        return buf.getvalue()

    def kio_encode_produce_resp() -> bytes:
        # Built per call, as a handler would.
        entity = build_entity(kio_presp_cls, {"throttle_time": 0, "responses": [{"name": "bench",
            "partition_responses": [{"index": p, "error_code": 0, "base_offset": 1000, "log_append_time": None,
                                     "log_start_offset": 0} for p in range(PARTITIONS)]}]})
        buf = io.BytesIO()
        kio_presp_w(buf, entity)
        return buf.getvalue()

    Part = KpFetchResponse.FetchableTopicResponse.PartitionData

    def kp_encode_fetch() -> bytes:
        resp = KpFetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=[
            KpFetchResponse.FetchableTopicResponse(topic="bench", partitions=[
                Part(partition_index=p, error_code=0, high_watermark=1000, last_stable_offset=1000,
                     log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1,
                     records=records64k) for p in range(PARTITIONS)])])
        return bytes(resp.encode(version=11))

    PResp = KpProduceResponse.TopicProduceResponse

    def kp_encode_produce_resp() -> bytes:
        resp = KpProduceResponse(throttle_time_ms=0, responses=[PResp(name="bench", partition_responses=[
            PResp.PartitionProduceResponse(index=p, error_code=0, base_offset=1000, log_append_time_ms=-1,
                                           log_start_offset=0, record_errors=[], error_message=None)
            for p in range(PARTITIONS)])])
        return bytes(resp.encode(version=8))

    # Sanity: all three produce the same bytes / the same values.
    assert kio_encode_fetch() == fetch.encode_fetch_response(fresp, 11) == kp_encode_fetch()
    assert b"".join(fetch.encode_fetch_response_parts(fresp, 11)) == kio_encode_fetch()
    assert kio_encode_produce_resp() == produce.encode_produce_response(presp, 8) == kp_encode_produce_resp()
    kio_preq_body: Any = kio_preq(preq_bytes, 0)[0]  # kio can only type a run-time-picked schema as its Protocol
    assert kio_preq_body.topic_data[0].partition_data[5].records == batch16k
    assert KpProduceRequest.decode(preq_bytes, version=8).topic_data[0].partition_data[5].records == batch16k

    cases: list[tuple[str, dict[str, Callable[[], object]]]] = [
        ("decode ProduceRequest v8 (6 × 16 KiB)", {
            "struct": lambda: produce.decode_produce_request(preq_bytes, 0, 8),
            "kio": lambda: kio_preq(preq_bytes, 0),
            "kafka-python": lambda: KpProduceRequest.decode(preq_bytes, version=8),
        }),
        ("encode FetchResponse v11 (6 × 64 KiB)", {
            "struct": lambda: fetch.encode_fetch_response_parts(fresp, 11),  # buffers for writelines
            "kio": kio_encode_fetch,
            "kafka-python": kp_encode_fetch,
        }),
        ("decode FetchRequest v11 (6 partitions)", {
            "struct": lambda: fetch.decode_fetch_request(freq_bytes, 0, 11),
            "kio": lambda: kio_freq(freq_bytes, 0),
            "kafka-python": lambda: KpFetchRequest.decode(freq_bytes, version=11),
        }),
        ("encode ProduceResponse v8 (6 partitions)", {
            "struct": lambda: produce.encode_produce_response(presp, 8),
            "kio": kio_encode_produce_resp,
            "kafka-python": kp_encode_produce_resp,
        }),
    ]
    print(f"{'workload':44} {'struct ops/s':>14} {'kio ops/s':>12} {'kafka-python':>13}  struct/kio  struct/kp")
    for name, impls in cases:
        rates = {lib: _rate(fn) for lib, fn in impls.items()}
        print(f"{name:44} {rates['struct']:14,.0f} {rates['kio']:12,.0f} {rates['kafka-python']:13,.0f}"
              f"  {rates['struct'] / rates['kio']:9.2f}x {rates['struct'] / rates['kafka-python']:8.2f}x")


if __name__ == "__main__":
    main()
