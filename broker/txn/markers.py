"""Transaction markers: the control batches that end a transaction in each of its partitions.

A marker is an ordinary RecordBatch v2 with the control and transactional attribute bits set, the
producer id and epoch of the transaction, and one record whose key is (version int16 = 0, type
int16: 0 = abort, 1 = commit) and whose value is (version int16 = 0, coordinator epoch int32).
"""

from __future__ import annotations

import struct

import crc32c

from broker.protocol.records import ATTR_CONTROL, ATTR_TRANSACTIONAL, RecordSpec, encode_batch

__all__ = ["ABORT", "COMMIT", "encode_marker", "marker_type"]

ABORT = 0
COMMIT = 1
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
_ATTRIBUTES_AT = 21  # base offset 8, length 4, leader epoch 4, magic 1, crc 4
_CRC_AT = 17


def encode_marker(producer_id: int, producer_epoch: int, commit: bool, *, timestamp_ms: int,
                  coordinator_epoch: int = 0) -> bytes:
    record = RecordSpec(key=_KEY.pack(0, COMMIT if commit else ABORT), value=_VALUE.pack(0, coordinator_epoch))
    batch = bytearray(encode_batch([record], timestamp=timestamp_ms, producer_id=producer_id,
                                   producer_epoch=producer_epoch))
    attributes = int.from_bytes(batch[_ATTRIBUTES_AT:_ATTRIBUTES_AT + 2], "big") | ATTR_CONTROL | ATTR_TRANSACTIONAL
    batch[_ATTRIBUTES_AT:_ATTRIBUTES_AT + 2] = attributes.to_bytes(2, "big")
    batch[_CRC_AT:_CRC_AT + 4] = crc32c.crc32c(bytes(batch[_ATTRIBUTES_AT:])).to_bytes(4, "big")
    return bytes(batch)


def marker_type(key: bytes | None) -> int | None:
    """ABORT or COMMIT for a control record's key; None for a key that is no marker."""
    if key is None or len(key) < _KEY.size:
        return None
    _version, kind = _KEY.unpack_from(key)
    return kind if kind in (ABORT, COMMIT) else None
