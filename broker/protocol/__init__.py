"""Sans-IO codecs: Kafka RecordBatch v2 (and, with the Kafka issue, request/response frames)."""

from broker.protocol.records import (
    BatchHeader,
    Compression,
    Record,
    RecordSpec,
    decode_all,
    decode_records,
    encode_batch,
    verify_batch,
)

__all__ = [
    "BatchHeader",
    "Compression",
    "Record",
    "RecordSpec",
    "decode_all",
    "decode_records",
    "encode_batch",
    "verify_batch",
]
