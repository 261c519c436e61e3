"""Compression codecs of RecordBatch v2 payloads, with decompression bounded by the caller.

A small compressed payload can expand a thousand-fold (gzip) or far more (zstd), so nothing here
decompresses without a limit: gzip, lz4 and zstd write into a buffer (cramjam's ``decompress_into``)
that starts small and grows up to ``limit``, and stop when it is full; raw snappy declares its length
up front, read before allocating. Going over the limit raises ``RecordTooLargeError``; bytes that do
not decode raise ``CorruptRecordError``.

Kafka's formats: gzip (RFC 1952), snappy (raw blocks from librdkafka, or the xerial framing of
Java's SnappyOutputStream), lz4 (the LZ4 frame format), zstd (zstd frames).
"""

from __future__ import annotations

import gzip
import struct
from enum import IntEnum

import cramjam

from broker.errors import CorruptRecordError, RecordTooLargeError

__all__ = ["DEFAULT_DECOMPRESS_LIMIT", "Compression", "compress", "decompress"]

# Readers of stored batches that know no topic limit (HTTP reads, processors, ListOffsets) decode at
# most this much per batch: 64 times the default max.message.bytes, far above what Produce accepts.
DEFAULT_DECOMPRESS_LIMIT = 64 * 1024 * 1024


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16
_BLOCK_LENGTH = struct.Struct(">i")
# Rust's io::Write::write_all message when the output slice is full: cramjam's only sign that the
# payload decodes to more than the buffer holds (a corrupt payload fails with another message).
_BUFFER_FULL = "failed to write whole buffer"
_FIRST_GUESS_MIN = 64 * 1024
_FIRST_GUESS_RATIO = 8


def compress(codec: Compression, data: bytes) -> bytes:
    if codec is Compression.NONE:
        return data
    if codec is Compression.GZIP:
        return gzip.compress(data, compresslevel=6)
    if codec is Compression.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec is Compression.LZ4:
        return bytes(cramjam.lz4.compress(data))
    return bytes(cramjam.zstd.compress(data))


def decompress(codec: Compression, data: bytes | memoryview, limit: int) -> bytes:
    """``data`` decompressed, if it decodes to at most ``limit`` bytes."""
    if codec is Compression.NONE:
        if len(data) > limit:
            raise RecordTooLargeError(f"records of {len(data)} bytes exceed the limit of {limit}")
        return bytes(data)
    if codec is Compression.SNAPPY:
        if bytes(data[: len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC:
            return _xerial_snappy(data, limit)
        return _raw_snappy(data, limit)
    module = {Compression.GZIP: cramjam.gzip, Compression.LZ4: cramjam.lz4, Compression.ZSTD: cramjam.zstd}[codec]
    # Start from a guess and grow 8x while the output does not fit: a buffer of ``limit`` bytes up front
    # would cost its whole size (bytearray zero-fills) for every small batch.
    size = min(limit, max(_FIRST_GUESS_MIN, _FIRST_GUESS_RATIO * len(data)))
    while True:
        out = bytearray(size)
        try:
            written = module.decompress_into(data, out)
        except Exception as exc:  # cramjam raises its own DecompressionError type
            if _BUFFER_FULL not in str(exc):
                raise CorruptRecordError(f"cannot decompress {codec.name} records: {exc}") from exc
            if size >= limit:
                raise RecordTooLargeError(f"{codec.name} records decompress to more than {limit} bytes") from exc
            size = min(limit, size * 8)
            continue
        return bytes(memoryview(out)[:written])


def _raw_snappy(data: bytes | memoryview, limit: int, total: int = 0) -> bytes:
    try:
        size = cramjam.snappy.decompress_raw_len(data)
    except Exception as exc:
        raise CorruptRecordError(f"cannot decompress SNAPPY records: {exc}") from exc
    if total + size > limit:
        raise RecordTooLargeError(f"SNAPPY records decompress to more than {limit} bytes")
    out = bytearray(size)
    try:
        written = cramjam.snappy.decompress_raw_into(data, out)
    except Exception as exc:
        raise CorruptRecordError(f"cannot decompress SNAPPY records: {exc}") from exc
    return bytes(memoryview(out)[:written])


def _xerial_snappy(data: bytes | memoryview, limit: int) -> bytes:
    """Java's SnappyOutputStream framing: a 16-byte header, then (int32 length, raw block) pairs."""
    view = memoryview(data)
    blocks: list[bytes] = []
    total = 0
    pos = _XERIAL_HEADER_SIZE
    while pos < len(view):
        if pos + 4 > len(view):
            raise CorruptRecordError("cannot decompress SNAPPY records: truncated xerial block length")
        (length,) = _BLOCK_LENGTH.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > len(view):
            raise CorruptRecordError("cannot decompress SNAPPY records: xerial block runs past the payload")
        block = _raw_snappy(view[pos : pos + length], limit, total)
        total += len(block)
        blocks.append(block)
        pos += length
    return b"".join(blocks)
