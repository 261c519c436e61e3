"""RecordBatch v2 codec throughput: Sluice's encoders and decoder vs kafka-python's, same records, one run.

Run: ``python -m bench.bench_records`` (a few seconds). 100-record batches of 100 B values with a key and
two headers (the shape ingest writes); records/s, best of 5 timeit repeats. The "validate" rows are
Produce's per-batch check (``broker/protocol/batch_validation.py``) against the header + CRC check it
replaced, on that shape, on librdkafka's (values only) and zstd-compressed.
"""

from __future__ import annotations

import argparse
import timeit

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from broker.protocol.batch_validation import validate_produce_batch
from broker.protocol.records import (
    Compression,
    RecordSpec,
    decode_records,
    encode_batch,
    encode_record_tuples,
    verify_batch,
)

TS = 1_700_000_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=500, help="batches per timing")
    args = parser.parse_args()
    n = args.batches
    headers = (("source", b"tcp:default"), ("device", b"sensor_1"))
    specs = [RecordSpec(b"x" * 100, key=b"sensor_%d" % i, headers=headers, timestamp=TS + i) for i in range(100)]
    tuples = [(s.value, s.key, s.headers, TS + i) for i, s in enumerate(specs)]  # the specs' timestamps

    def kafka_python_encode() -> bytes:
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
        for i, s in enumerate(specs):
            builder.append(i, s.timestamp, s.key, s.value, list(headers))
        return bytes(builder.build())

    batch = encode_batch(specs)
    assert len(kafka_python_encode()) == len(batch)  # the same records in the same v2 layout

    def kafka_python_decode() -> int:
        return sum(1 for _ in DefaultRecordBatch(bytearray(batch)))

    plain = encode_batch([RecordSpec(b"x" * 100, timestamp=TS) for _ in range(100)])  # kafka_produce's shape
    zstd = encode_batch(specs, compression=Compression.ZSTD)
    limit = 1024 * 1024 + 12

    # (direction, case) -> callable; the kafka-python case of each direction is the peer
    cases = {
        ("encode", "encode_batch (RecordSpec)"): lambda: encode_batch(specs, timestamp=TS),
        ("encode", "encode_record_tuples (ingest path)"): lambda: encode_record_tuples(tuples),
        ("encode", "kafka-python DefaultRecordBatchBuilder"): kafka_python_encode,
        ("decode", "decode_records"): lambda: decode_records(batch),
        ("decode", "kafka-python DefaultRecordBatch iteration"): kafka_python_decode,
        ("validate", "verify_batch: header + CRC only (Produce before issue 11)"): lambda: verify_batch(batch),
        ("validate", "validate_produce_batch, key + 2 headers"): lambda: validate_produce_batch(batch, limit),
        ("validate", "validate_produce_batch, value only"): lambda: validate_produce_batch(plain, limit),
        ("validate", "validate_produce_batch, key + 2 headers, zstd"): lambda: validate_produce_batch(zstd, limit),
        ("validate", "kafka-python DefaultRecordBatch iteration (key + 2 headers)"): kafka_python_decode,
    }
    rates = {case: 100 * n / min(timeit.repeat(fn, number=n, repeat=5)) for case, fn in cases.items()}
    peers = {direction: rate for (direction, name), rate in rates.items() if name.startswith("kafka-python")}
    print("| case | records/s | vs kafka-python |")
    print("|---|---:|---:|")
    for (direction, name), rate in rates.items():
        print(f"| {name} | {rate:,.0f} | {rate / peers[direction]:.2f}x |")


if __name__ == "__main__":
    main()
