"""Produce-side batch validation: Kafka's rules (LogValidator, ProduceRequest.validateRecords) and codes."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import native
from broker.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
    UnsupportedCompressionError,
)
from broker.protocol import batch_validation, record_walk
from broker.protocol.batch_validation import validate_produce_batch
from broker.protocol.records import Compression, RecordSpec, decode_records, encode_batch, verify_batch

LIMIT = 1024 * 1024 + 12
COMPILED = native.is_compiled(native.select(record_walk))


@pytest.fixture(autouse=True, params=["selected", "pure"])
def walk_build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every rule here holds for the build Produce runs (mypyc's where it was built) and for the
    pure-Python source it falls back to: the same verdicts either way."""
    if request.param == "pure":
        if not COMPILED:
            pytest.skip("no compiled record walk: 'selected' already runs the pure source")
        monkeypatch.setattr(batch_validation, "_walk_records", native.pure("broker.protocol.record_walk").walk_records)
    return str(request.param)
TS = 1_700_000_000_000


def reseal(batch: bytearray) -> bytes:
    """Recompute the CRC after editing covered bytes: a producer's bug, not corruption in transit."""
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def edited(batch: bytes, fmt: str, at: int, value: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(fmt, out, at, value)
    return reseal(out)


def rejected(batch: bytes) -> InvalidRecordError:
    with pytest.raises(InvalidRecordError) as info:
        validate_produce_batch(batch, LIMIT)
    return info.value


def specs(n: int) -> list[RecordSpec]:
    return [RecordSpec(b"value-%d" % i, key=b"k%d" % i, headers=(("h", b"x"),), timestamp=TS + i) for i in range(n)]


@pytest.mark.parametrize("codec", list(Compression))
def test_well_formed_batches_are_accepted_as_they_came(codec: Compression) -> None:
    batch = encode_batch(specs(50), compression=codec)
    accepted = validate_produce_batch(batch, LIMIT)
    assert accepted.data == batch
    assert accepted.header.record_count == 50


def test_a_batch_claiming_more_offsets_than_records_is_refused() -> None:
    """The reported defect: one record whose last_offset_delta says 1,000,000."""
    batch = edited(encode_batch([RecordSpec(b"one")]), ">i", 23, 1_000_000)
    error = rejected(batch)
    assert type(error) is InvalidRecordError
    assert "1000000" in str(error)


def test_record_count_must_match_the_records_present() -> None:
    three = encode_batch(specs(3))
    # count and last delta both say 4, three records present: the fourth is missing
    more = edited(edited(three, ">i", 57, 4), ">i", 23, 3)
    error = rejected(more)
    assert [index for index, _ in error.record_errors] == [3]
    # count says 2: a third record is left over
    fewer = edited(edited(three, ">i", 57, 2), ">i", 23, 1)
    assert "follow the last" in str(rejected(fewer))
    assert "record count 0" in str(rejected(edited(edited(three, ">i", 57, 0), ">i", 23, -1)))


def test_offset_deltas_must_be_consecutive_and_each_bad_record_is_named() -> None:
    batch = bytearray(encode_batch([RecordSpec(b"a"), RecordSpec(b"b"), RecordSpec(b"c")]))
    # records start at 61: length varint, attributes, ts delta, offset delta
    second = 61 + 1 + batch[61] // 2  # the first record's length varint is one byte
    assert batch[second + 3] == 2  # zigzag(1)
    batch[second + 3] = 10  # offset delta 5
    error = rejected(reseal(batch))
    assert error.record_errors == ((1, "offset delta 5, expected 1"),)


def test_a_record_attributes_byte_is_one_byte_as_in_kafka() -> None:
    """Found by a mutation run: record 1's attributes byte is 0x83. aiokafka's C parser reads
    attributes as a varint (0x83 0x00) and saw offset delta 1; Kafka reads one byte, so the offset
    delta is the next-but-one byte, -44: refused. (Accepted before the fast path was guarded.)"""
    body = bytes.fromhex(
        "2400000001189faff50be0da0a727f66cb1f001e830057026b1038f2b9eedd01be820028000004026b1a7babe134"
        "5684e1da1d4c6930990014000006026b069eed19002000000801145e8820db8333e5a2cf7a00"
    )
    after_crc = struct.pack(">hiqqqhii", 0, 4, TS, TS, -1, -1, -1, 5) + body
    data = struct.pack(">qiibI", 0, 49 + len(body), 0, 2, crc32c.crc32c(after_crc)) + after_crc
    error = rejected(data)
    assert error.record_errors == ((1, "offset delta -44, expected 1"),)


def test_a_record_field_running_past_its_record_is_named() -> None:
    batch = bytearray(encode_batch([RecordSpec(b"a" * 10), RecordSpec(b"b" * 10)]))
    value_length_at = batch.index(b"b" * 10) - 1
    batch[value_length_at] = 2 * 40  # the second value claims 40 bytes
    error = rejected(reseal(batch))
    assert [index for index, _ in error.record_errors] == [1]


def test_batch_level_rules_in_kafkas_order() -> None:
    good = encode_batch(specs(2))
    assert "base offset" in str(rejected(edited(good, ">q", 0, 7)))
    control = bytearray(good)
    control[22] |= 0x20
    assert "control" in str(rejected(reseal(control)))
    no_sequence = encode_batch(specs(2), producer_id=5, producer_epoch=0, base_sequence=-1)
    assert "sequence" in str(rejected(no_sequence))
    assert "exactly one" in str(rejected(good + good))
    assert "complete" in str(rejected(good[:-1]))
    assert "complete" in str(rejected(b""))
    unknown_codec = bytearray(good)
    unknown_codec[22] |= 0x07
    assert "codec 7" in str(rejected(reseal(unknown_codec)))
    flipped = bytearray(good)
    flipped[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC"):
        validate_produce_batch(bytes(flipped), LIMIT)
    with pytest.raises(RecordTooLargeError):
        validate_produce_batch(good, len(good) - 1)


@pytest.mark.parametrize("as_view", [False, True], ids=["bytes", "view"])
def test_a_wrong_crc_is_answered_before_the_header_and_record_rules_after_it(as_view: bool) -> None:
    """Kafka checks the CRC before the record count, the control bit, the producer's sequence and the
    records: a batch broken in transit is CORRUPT_MESSAGE whatever else is wrong with it. A view of a
    request buffer has its CRC taken during the walk, so it must answer the same."""
    good = encode_batch(specs(3))
    control = bytearray(good)
    control[22] |= 0x20
    miscounted = bytearray(good)
    struct.pack_into(">i", miscounted, 57, 4)  # record_count 4, last_offset_delta 2
    bad_record = bytearray(good)
    bad_record[61] = 0x7F  # the first record's length varint: runs past the batch
    no_sequence = bytearray(encode_batch(specs(2), producer_id=5, producer_epoch=0, base_sequence=-1))
    for broken in (control, miscounted, bad_record, no_sequence):
        broken[17] ^= 0x01  # the stored CRC no longer matches
        batch = memoryview(bytearray(broken)).toreadonly() if as_view else bytes(broken)
        with pytest.raises(CorruptRecordError, match="CRC"):
            validate_produce_batch(batch, LIMIT)
        broken[17] ^= 0x01
        resealed = memoryview(bytearray(reseal(broken))).toreadonly() if as_view else reseal(broken)
        with pytest.raises(InvalidRecordError):
            validate_produce_batch(resealed, LIMIT)


def test_zstd_before_produce_v7_is_an_unsupported_compression_type() -> None:
    zstd = encode_batch(specs(2), compression=Compression.ZSTD)
    with pytest.raises(UnsupportedCompressionError, match="version 6"):
        validate_produce_batch(zstd, LIMIT, version=6)
    assert validate_produce_batch(zstd, LIMIT, version=7).data == zstd
    gzip = encode_batch(specs(2), compression=Compression.GZIP)
    assert validate_produce_batch(gzip, LIMIT, version=3).data == gzip


def test_log_append_time_from_a_producer_is_an_invalid_timestamp_for_every_record() -> None:
    batch = bytearray(encode_batch(specs(3)))
    batch[22] |= 0x08
    error = rejected(reseal(batch))
    assert isinstance(error, InvalidTimestampError)
    assert [index for index, _ in error.record_errors] == [0, 1, 2]


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4])
def test_a_compacted_topic_refuses_records_without_a_key(codec: Compression) -> None:
    batch = encode_batch([RecordSpec(b"a", key=b"k"), RecordSpec(b"b"), RecordSpec(b"c", key=b"")], compression=codec)
    assert validate_produce_batch(batch, LIMIT).data == batch  # not compacted: fine
    with pytest.raises(InvalidRecordError) as info:
        validate_produce_batch(batch, LIMIT, compacted=True)
    assert type(info.value) is InvalidRecordError
    assert [index for index, _ in info.value.record_errors] == [1]  # an empty key is a key
    assert "without key" in str(info.value)


@pytest.mark.parametrize("codec", list(Compression))
def test_a_wrong_max_timestamp_is_corrected_as_kafka_does(codec: Compression) -> None:
    batch = edited(encode_batch(specs(3), compression=codec), ">q", 35, TS + 10**9)
    accepted = validate_produce_batch(batch, LIMIT)
    assert accepted.header.max_timestamp == TS + 2
    assert verify_batch(accepted.data).max_timestamp == TS + 2  # CRC recomputed
    assert [r.value for r in decode_records(accepted.data)] == [b"value-0", b"value-1", b"value-2"]


@pytest.mark.parametrize("codec", [c for c in Compression if c is not Compression.NONE])
def test_compressed_payload_that_does_not_decode_is_invalid(codec: Compression) -> None:
    batch = bytearray(encode_batch(specs(20), compression=codec))
    for i in range(70, len(batch)):
        batch[i] = 0x5A
    error = rejected(reseal(batch))
    assert type(error) is InvalidRecordError


@pytest.mark.parametrize("codec", [c for c in Compression if c is not Compression.NONE])
def test_compressed_batch_must_fit_max_message_bytes_once_decompressed(codec: Compression) -> None:
    records = [RecordSpec(b"\x00" * 1000, timestamp=TS) for _ in range(200)]  # ~200 KB, compresses well
    batch = encode_batch(records, compression=codec)
    assert len(batch) < 20_000
    assert validate_produce_batch(batch, 300_000).header.record_count == 200
    with pytest.raises(RecordTooLargeError, match="decompress"):
        validate_produce_batch(batch, 100_000)


def _mutations() -> st.SearchStrategy[tuple[bytes, int, int]]:
    blobs = st.one_of(st.none(), st.binary(max_size=40))
    record = st.builds(RecordSpec, value=blobs, key=blobs,
                       headers=st.lists(st.tuples(st.text(max_size=4), blobs), max_size=2).map(tuple),
                       timestamp=st.integers(min_value=0, max_value=2**41))
    return st.tuples(
        st.lists(record, min_size=1, max_size=6).map(lambda rs: encode_batch(rs)),
        st.integers(min_value=0, max_value=10_000),
        st.integers(min_value=0, max_value=255),
    )


@settings(max_examples=400, deadline=None)
@given(case=_mutations())
def test_any_resealed_byte_change_is_refused_or_stays_decodable(case: tuple[bytes, int, int]) -> None:
    """A producer bug (any byte of the records changed, CRC recomputed) is either refused with a
    broker error, or the batch decodes to exactly its declared records at offsets 0..n-1."""
    batch, where, value = case
    mutated = bytearray(batch)
    mutated[61 + where % (len(batch) - 61)] = value
    data = reseal(mutated)
    count = struct.unpack_from(">i", data, 57)[0]
    try:
        accepted = validate_produce_batch(data, LIMIT)
    except InvalidRecordError:
        return
    decoded = decode_records(accepted.data)
    assert [r.offset for r in decoded] == list(range(count))


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=120), count=st.integers(min_value=1, max_value=8),
       tail=st.sampled_from([b"", b"\x80", b"\xff" * 12]))
def test_arbitrary_record_bytes_never_escape_as_anything_but_a_refusal(payload: bytes, count: int, tail: bytes) -> None:
    """Any bytes after a well-formed header (what a hostile producer controls once the CRC matches):
    nothing but InvalidRecordError comes out."""
    body = payload + tail
    after_crc = struct.pack(">hiqqqhii", 0, count - 1, TS, TS, -1, -1, -1, count) + body
    data = struct.pack(">qiibI", 0, 49 + len(body), 0, 2, crc32c.crc32c(after_crc)) + after_crc
    try:
        validate_produce_batch(data, LIMIT)
    except InvalidRecordError:
        pass
