"""What Produce checks in a client's record batch before storing it: Kafka's rules, in Kafka's order.

Sluice stores a producer's batch as it came and hands it to consumers untouched, so every promise a
consumer relies on (one offset per record, records that parse, a payload that decompresses) is
checked here, once, on the way in. The rules are those of Kafka's ``ProduceRequest.validateRecords``,
``UnifiedLog.analyzeAndValidateRecords`` and ``LogValidator`` (``validateBatch``, ``validateRecord``),
with Kafka's error codes (the exception raised → code, in ``broker.server.handlers_common``):

1. exactly one complete RecordBatch v2 (``InvalidRecordError`` → INVALID_RECORD; magic 0/1 is
   INVALID_RECORD too, other magic values ``CorruptRecordError`` → CORRUPT_MESSAGE), zstd only from
   Produce v7 on (``UnsupportedCompressionError`` → UNSUPPORTED_COMPRESSION_TYPE);
2. base offset 0 (INVALID_RECORD), size ≤ max.message.bytes (``RecordTooLargeError`` →
   MESSAGE_TOO_LARGE), CRC (CORRUPT_MESSAGE);
3. record count ≥ 1 and equal to last_offset_delta + 1 (so a batch takes exactly the offsets of the
   records it holds), not a control batch, a producer id comes with a sequence ≥ 0 (INVALID_RECORD);
4. a compressed payload decompresses (INVALID_RECORD) to at most max.message.bytes less the batch
   header (MESSAGE_TOO_LARGE; a Java producer splits the batch and retries) — decompression stops at
   that bound, so a small "bomb" never takes more memory than a legal batch;
5. the payload holds exactly ``record_count`` well-formed records (INVALID_RECORD, naming the record
   in ``record_errors``);
6. offset deltas are 0, 1, 2, …: Kafka rewrites a compressed batch whose deltas are not (and never
   looks at an uncompressed one's); Sluice serves stored bytes as they are, so it refuses them
   (INVALID_RECORD naming each record) rather than hand consumers offsets that do not exist;
7. on a compacted topic every record has a key (INVALID_RECORD naming each keyless record), and the
   timestamp type is CreateTime (``InvalidTimestampError`` → INVALID_TIMESTAMP, every record named,
   as Kafka answers a producer that sets LogAppendTime).
Then, as Kafka does, the header's max_timestamp is set to the records' real maximum (the time index
and retention read it), the CRC recomputed — only when the producer got it wrong.

The record walk (5–6, ``broker.protocol.record_walk``) is the per-record cost of Produce: one pass
over the lengths and varints that copies nothing, compiled with mypyc where the install could build
it (about 30 ns per record, against ~1 µs for its pure-Python source; ``python -m bench.bench_records``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import crc32c

from broker import native
from broker.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
    UnsupportedCompressionError,
)
from broker.protocol import record_walk
from broker.protocol.compression import Compression, decompress
from broker.protocol.records import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    BATCH_HEADER_SIZE,
    CRC_START,
    LOG_OVERHEAD,
    MAGIC_V2,
    BatchHeader,
    unpack_header,
)

__all__ = ["AcceptedBatch", "validate_produce_batch"]

NO_TIMESTAMP = -1
_MAX_TIMESTAMP_AT = 35  # offset of max_timestamp in the batch header
_CRC_AT = 17
_ATTRIBUTES_LOW_AT = 22  # low byte of the int16 attributes: the compression bits
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_MAGIC_AT = 16
# the mypyc build of the record walk, or its source (same code, same verdicts); every name comes from the
# selected module (a stale build is importable but not selected: mixing the two failed every Produce)
_record_walk = native.select(record_walk)
_walk_records: Callable[[bytes, int, int, int, bool], tuple[int, list[int]]] = _record_walk.walk_records
_walk_piece: Callable[
    [bytes, int, int, int, int, int, list[int], list[tuple[int, str]], bool], tuple[int, int, int, int]
] = _record_walk.walk_piece
_finish_walk: Callable[[int, int, int, list[tuple[int, str]]], None] = _record_walk.finish_walk
_LONGEST_DELTA: int = _record_walk.LONGEST_DELTA
# A batch handed over as a view of the request buffer is walked in copies of this size: below glibc's mmap
# threshold (sluice.malloc_tuning), so each copy reuses warm heap memory. A whole-batch copy of 1 MB was a
# fresh mapping every request: 256 page faults and an munmap, a third of the broker's CPU at 1 KiB records.
# The CRC of an uncompressed view is taken piece by piece from these copies while they are in cache (one
# read of the request from memory instead of two; the verdicts keep Kafka's order, see ``_walk_view``).
_PIECE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class AcceptedBatch:
    """A batch that passed: the bytes to store (the producer's own, or a copy with max_timestamp
    corrected) and their header."""

    data: bytes | bytearray | memoryview
    header: BatchHeader


def validate_produce_batch(
    records: bytes | bytearray | memoryview, max_message_bytes: int, *, compacted: bool = False, version: int = 8
) -> AcceptedBatch:
    """Check one partition's records from a Produce request; raise the broker error Kafka's code maps to.

    ``max_message_bytes`` and ``compacted`` (cleanup.policy has compact: every record needs a key)
    come from the topic's config; ``version`` is the Produce request's (zstd needs 7 or later).
    ``records`` is not copied: a view of the request buffer is accepted as it is (and walked in pieces)."""
    data = records if isinstance(records, bytes) else memoryview(records).toreadonly()
    # An uncompressed view has its CRC taken during the walk (``_walk_view``), every other batch's here.
    crc_in_walk = not isinstance(data, bytes) and _codec_bits(data) == Compression.NONE
    header = _check_framing(data, max_message_bytes, version, crc_now=not crc_in_walk)
    codec_id = header.attributes & ATTR_COMPRESSION_MASK
    if codec_id > Compression.ZSTD:
        raise InvalidRecordError(f"record batch names unknown compression codec {codec_id}")
    codec = Compression(codec_id)
    if codec is not Compression.NONE:
        try:
            payload = decompress(codec, memoryview(data)[BATCH_HEADER_SIZE:], max_message_bytes - BATCH_HEADER_SIZE)
        except RecordTooLargeError as exc:
            raise RecordTooLargeError(
                f"{exc} (max.message.bytes={max_message_bytes}, less the {BATCH_HEADER_SIZE}-byte batch header)"
            ) from exc
        except CorruptRecordError as exc:
            raise InvalidRecordError(str(exc)) from exc
        max_delta, null_keys = _walk_records(payload, 0, len(payload), header.record_count, compacted)
    elif isinstance(data, bytes):
        max_delta, null_keys = _walk_records(data, BATCH_HEADER_SIZE, len(data), header.record_count, compacted)
    else:
        max_delta, null_keys = _walk_view(data, header, compacted)
    max_timestamp = max(header.base_timestamp + max_delta, NO_TIMESTAMP)
    _check_keys_and_timestamps(header, null_keys)
    if max_timestamp == header.max_timestamp:
        return AcceptedBatch(data, header)
    fixed = bytearray(data)
    _I64.pack_into(fixed, _MAX_TIMESTAMP_AT, max_timestamp)
    _U32.pack_into(fixed, _CRC_AT, crc32c.crc32c(memoryview(fixed)[CRC_START:]))
    return AcceptedBatch(fixed, unpack_header(fixed))


def _walk_view(data: memoryview, header: BatchHeader, keys: bool) -> tuple[int, list[int]]:
    """``walk_records`` over a batch that is not ``bytes`` (the compiled walk reads ``bytes`` only): its
    records copied in pieces of ``_PIECE_BYTES`` (a record longer than that gets a piece of its own), the
    CRC taken from each piece as it is copied. The verdicts are those of the whole-batch checks in Kafka's
    order: a CRC mismatch wins over anything the walk found (the CRC of the rest is taken then); a record
    refused in a piece is walked again over one copy of the batch, so that even the message of a malformed
    record is the same."""
    count = header.record_count
    end = len(data)
    pos, i, max_delta = BATCH_HEADER_SIZE, 0, _LONGEST_DELTA
    crc, crc_end = crc32c.crc32c(data[CRC_START:BATCH_HEADER_SIZE]), BATCH_HEADER_SIZE
    null_keys: list[int] = []
    bad_offsets: list[tuple[int, str]] = []
    size = _PIECE_BYTES
    try:
        while True:
            piece_end = min(end, pos + size)
            piece = bytes(data[pos:piece_end])
            if piece_end > crc_end:  # pieces overlap by the record a piece's end cut: its bytes count once
                crc = crc32c.crc32c(memoryview(piece)[crc_end - pos :], crc)
                crc_end = piece_end
            i, used, max_delta, need = _walk_piece(
                piece, 0, end - pos, count, i, max_delta, null_keys, bad_offsets, keys)
            pos += used
            if i == count or piece_end == end:
                break
            size = max(_PIECE_BYTES, need)
        _finish_walk(pos, end, count, bad_offsets)
    except InvalidRecordError:
        _check_crc(data, header)  # CORRUPT_MESSAGE first, as the whole-batch order has it
        return _walk_records(bytes(data), BATCH_HEADER_SIZE, end, count, keys)  # the verdict, with its message
    if crc != header.crc:
        raise _crc_mismatch(header, crc)
    return max_delta, null_keys


def _codec_bits(data: bytes | memoryview) -> int:
    """The compression codec the attributes name (0 when the batch is too short to say)."""
    return data[_ATTRIBUTES_LOW_AT] & ATTR_COMPRESSION_MASK if len(data) > _ATTRIBUTES_LOW_AT else 0


def _crc_mismatch(header: BatchHeader, actual: int) -> CorruptRecordError:
    return CorruptRecordError(f"record batch CRC mismatch: stored {header.crc:#010x}, computed {actual:#010x}")


def _check_crc(data: bytes | memoryview, header: BatchHeader) -> None:
    actual = crc32c.crc32c(memoryview(data)[CRC_START:])
    if actual != header.crc:
        raise _crc_mismatch(header, actual)


def _check_keys_and_timestamps(header: BatchHeader, null_keys: list[int]) -> None:
    """LogValidator.validateRecord's per-record rules, each record's first error reported: a key on a
    compacted topic (INVALID_RECORD), then the timestamp type (INVALID_TIMESTAMP, which wins for the
    batch when any record has it)."""
    if not null_keys and not header.attributes & ATTR_LOG_APPEND_TIME:
        return
    errors: dict[int, str] = {i: "Compacted topic cannot accept message without key" for i in null_keys}
    if header.attributes & ATTR_LOG_APPEND_TIME:
        for i in range(header.record_count):
            errors.setdefault(i, "Invalid timestamp type: producer should not set timestamp type to LogAppendTime")
    listed = tuple(sorted(errors.items()))
    if len(listed) > len(null_keys):
        raise InvalidTimestampError("One or more records have been rejected due to invalid timestamp", listed)
    raise InvalidRecordError(
        f"One or more records have been rejected due to {len(listed)} record errors in total, and only "
        f"showing the first three errors at most: {list(listed[:3])}", listed
    )


def _check_framing(data: bytes | memoryview, max_message_bytes: int, version: int, *, crc_now: bool) -> BatchHeader:
    """Steps 1–3: everything the 61-byte header and the CRC can tell. Without ``crc_now`` the caller takes
    the CRC later (``_walk_view``), and here only when a step 3 check fails (a mismatch answers first)."""
    if len(data) > _MAGIC_AT and data[_MAGIC_AT] != MAGIC_V2:
        magic = data[_MAGIC_AT]
        if magic in (0, 1):
            raise InvalidRecordError(
                f"Produce requests from version 3 on may only contain record batches with magic 2, not {magic}"
            )
        raise CorruptRecordError(f"invalid magic {magic} in record batch")
    zstd = len(data) > _ATTRIBUTES_LOW_AT and data[_ATTRIBUTES_LOW_AT] & ATTR_COMPRESSION_MASK == Compression.ZSTD
    if zstd and version < 7:
        raise UnsupportedCompressionError(
            f"Produce requests with version {version} are not allowed to use ZStandard compression"
        )
    if len(data) < BATCH_HEADER_SIZE:
        raise InvalidRecordError("Produce requests must have one complete record batch per partition")
    header = unpack_header(data)
    if header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(f"record batch length {header.batch_length} is shorter than its header")
    if header.size > len(data):
        raise InvalidRecordError(
            f"Produce requests must have one complete record batch per partition: the batch says "
            f"{header.size} bytes, {len(data)} are present"
        )
    if header.size < len(data):
        raise InvalidRecordError("Produce requests may only contain exactly one record batch per partition")
    if header.base_offset != 0:
        raise InvalidRecordError(f"the base offset of a produced record batch must be 0, not {header.base_offset}")
    if header.size > max_message_bytes:
        raise RecordTooLargeError(
            f"record batch of {header.size} bytes exceeds max.message.bytes={max_message_bytes}"
        )
    if crc_now:
        _check_crc(data, header)
    try:
        _check_count_and_producer(header)
    except InvalidRecordError:
        if not crc_now:
            _check_crc(data, header)
        raise
    return header


def _check_count_and_producer(header: BatchHeader) -> None:
    """Step 3: the record count and offsets the header declares, no control batch, a producer's sequence."""
    count = header.record_count
    if count <= 0:
        raise InvalidRecordError(f"invalid record count {count} in record batch")
    if header.last_offset_delta + 1 != count:
        raise InvalidRecordError(
            f"inconsistent record batch: offsets [0, {header.last_offset_delta}] for {count} records"
        )
    if header.attributes & ATTR_CONTROL:
        raise InvalidRecordError("clients may not write control records")
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise InvalidRecordError(
            f"invalid sequence {header.base_sequence} in a record batch of producer id {header.producer_id}"
        )
