"""RecordBatch v2 codec throughput: Sluice's encoders and decoder vs kafka-python's, same records, one run.

Run: ``python -m bench.bench_records`` (a few seconds). 100-record batches of 100 B values with a key and
two headers (the shape ingest writes); records/s, best of 5 timeit repeats.
"""

from __future__ import annotations

import argparse
import timeit

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from broker.protocol.records import RecordSpec, decode_records, encode_batch, encode_record_tuples

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

    # (direction, case) -> callable; the kafka-python case of each direction is the peer
    cases = {
        ("encode", "encode_batch (RecordSpec)"): lambda: encode_batch(specs, timestamp=TS),
        ("encode", "encode_record_tuples (ingest path)"): lambda: encode_record_tuples(tuples),
        ("encode", "kafka-python DefaultRecordBatchBuilder"): kafka_python_encode,
        ("decode", "decode_records"): lambda: decode_records(batch),
        ("decode", "kafka-python DefaultRecordBatch iteration"): kafka_python_decode,
    }
    rates = {case: 100 * n / min(timeit.repeat(fn, number=n, repeat=5)) for case, fn in cases.items()}
    peers = {direction: rate for (direction, name), rate in rates.items() if name.startswith("kafka-python")}
    print("| case | records/s | vs kafka-python |")
    print("|---|---:|---:|")
    for (direction, name), rate in rates.items():
        print(f"| {name} | {rate:,.0f} | {rate / peers[direction]:.2f}x |")


if __name__ == "__main__":
    main()
