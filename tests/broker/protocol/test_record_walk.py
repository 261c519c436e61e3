"""The record walk Produce runs: its mypyc build and its pure-Python source give identical verdicts,
and both read records as Kafka's DefaultRecord.readFrom does (varint lengths, no over-long varints)."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from types import ModuleType

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import native
from broker.errors import BrokerError, InvalidRecordError
from broker.protocol import batch_validation, record_walk
from broker.protocol.batch_validation import validate_produce_batch
from broker.protocol.records import RecordSpec, encode_batch

TS = 1_700_000_000_000
HEADER = 61
SELECTED = native.select(record_walk)
PURE = native.pure("broker.protocol.record_walk")
Verdict = tuple[str, object]


def verdict(walk: Callable[[bytes, int, int, int], tuple[int, list[int]]], data: bytes, count: int) -> Verdict:
    """What a walk answers: its result, or the error's type, message and named records."""
    try:
        return "accepted", walk(data, HEADER, len(data), count)
    except InvalidRecordError as exc:
        return type(exc).__name__, (str(exc), exc.record_errors)


def assert_same_verdict(data: bytes, count: int) -> Verdict:
    compiled = verdict(SELECTED.walk_records, data, count)
    assert compiled == verdict(PURE.walk_records, data, count)
    return compiled


def batch_of(body: bytes, count: int) -> bytes:
    after_crc = struct.pack(">hiqqqhii", 0, count - 1, TS, TS, -1, -1, -1, count) + body
    return struct.pack(">qiibI", 0, 49 + len(body), 0, 2, crc32c.crc32c(after_crc)) + after_crc


def test_the_compiled_walk_is_built_where_the_install_could_build_it() -> None:
    """CI installs with a compiler (make test): there the compiled build must be the one selected, or
    the differential tests below would compare the source with itself."""
    if not native.is_compiled(SELECTED):
        if os.environ.get("CI"):
            pytest.fail("record_walk is not compiled in CI: the mypyc build failed (see the install log)")
        pytest.skip("record_walk not compiled here (make native builds it)")
    assert not native.is_compiled(PURE)


blobs = st.one_of(st.none(), st.binary(max_size=300))
records = st.lists(
    st.builds(RecordSpec, value=blobs, key=blobs,
              headers=st.lists(st.tuples(st.text(max_size=6), blobs), max_size=3).map(tuple),
              timestamp=st.one_of(st.just(-1), st.integers(min_value=0, max_value=2**60))),
    min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(specs=records)
def test_valid_batches_walk_the_same(specs: list[RecordSpec]) -> None:
    batch = encode_batch(specs)
    status, _ = assert_same_verdict(batch, len(specs))
    assert status == "accepted"


@settings(max_examples=600, deadline=None)
@given(specs=records, edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=3),
       cut=st.integers(min_value=0, max_value=4), count_change=st.sampled_from([0, 0, 0, -1, 1]))
def test_corrupted_batches_get_the_same_verdict(
    specs: list[RecordSpec], edits: list[tuple[int, int]], cut: int, count_change: int
) -> None:
    data = bytearray(encode_batch(specs))
    for where, value in edits:
        data[HEADER + where % (len(data) - HEADER)] = value
    del data[len(data) - cut:]
    assert_same_verdict(bytes(data), max(1, len(specs) + count_change))


@settings(max_examples=600, deadline=None)
@given(payload=st.binary(max_size=160), count=st.integers(min_value=1, max_value=8),
       tail=st.sampled_from([b"", b"\x80", b"\xff" * 12, b"\x00" * 6]))
def test_arbitrary_record_bytes_get_the_same_verdict(payload: bytes, count: int, tail: bytes) -> None:
    assert_same_verdict(bytes(HEADER) + payload + tail, count)


def _record(body: bytes) -> bytes:
    """A record: its zigzag body length (one byte, the body is short) then the body."""
    return bytes([len(body) * 2]) + body


@pytest.mark.parametrize(("name", "body"), [
    # value length 0 written in 6 bytes: Kafka's readVarint throws past 5 bytes (invalid record structure)
    ("six-byte varint", b"\x00\x00\x00\x00" + b"\x80\x80\x80\x80\x80\x00" + b"\x00"),
    # the offset delta written in 6 bytes
    ("six-byte offset delta", b"\x00\x00" + b"\x80\x80\x80\x80\x80\x00" + b"\x01\x00\x00"),
    # timestamp delta as an 11-byte varlong: Kafka's readVarlong throws past 10 bytes
    ("eleven-byte varlong", b"\x00" + b"\x80" * 10 + b"\x00" + b"\x00\x01\x00\x00"),
])
def test_over_long_varints_are_refused_as_kafka_does(name: str, body: bytes) -> None:
    """Kafka refuses a 32-bit varint longer than 5 bytes and a varlong longer than 10. The aiokafka C
    parser Produce used before read them (the documented 'known gap': such batches were accepted)."""
    data = batch_of(_record(body), 1)
    status, _ = assert_same_verdict(data, 1)
    assert status == "InvalidRecordError"
    with pytest.raises(InvalidRecordError) as info:
        validate_produce_batch(data, 1 << 20)
    assert [index for index, _ in info.value.record_errors] == [0]


def test_a_fifth_varint_byte_keeps_only_the_bits_a_java_int_holds() -> None:
    """Value length 0x1_0000_0001 read as Java's int keeps bit 0 only: zigzag 1 = -1, a null value,
    so the record is well formed (as Kafka reads it)."""
    body = b"\x00\x00\x00\x00" + b"\x81\x80\x80\x80\x10" + b"\x00"
    data = batch_of(_record(body), 1)
    assert assert_same_verdict(data, 1) == ("accepted", (0, []))


def validation_verdict(records: bytes | memoryview, compacted: bool = False) -> Verdict:
    """What Produce validation answers: the bytes to store and their header, or the error."""
    try:
        accepted = validate_produce_batch(records, 1 << 20, compacted=compacted)
    except BrokerError as exc:
        return type(exc).__name__, (str(exc), getattr(exc, "record_errors", ()))
    return "accepted", (bytes(accepted.data), accepted.header)


@settings(max_examples=500, deadline=None)
@given(specs=records, edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=3),
       cut=st.integers(min_value=0, max_value=4), count_change=st.sampled_from([0, 0, 0, -1, 1]),
       piece=st.sampled_from([5, 9, 40, 300]), walk=st.sampled_from([SELECTED, PURE]),
       bad_crc=st.booleans(), compacted=st.booleans())
def test_a_batch_handed_over_as_a_view_gets_the_verdict_of_the_whole_batch(
    specs: list[RecordSpec], edits: list[tuple[int, int]], cut: int, count_change: int, piece: int, walk: ModuleType,
    bad_crc: bool, compacted: bool,
) -> None:
    """A request buffer's view is walked in pieces (copies small enough to reuse warm memory) and its CRC
    taken from them; records cut by a piece's end, records longer than a piece, malformed records and a
    wrong CRC (which wins over every record error, as in Kafka) must come out as the checks of one whole
    ``bytes`` batch say."""
    body = bytearray(encode_batch(specs)[HEADER:])
    for where, value in edits:
        if body:
            body[where % len(body)] = value
    del body[len(body) - cut:]
    data = bytearray(batch_of(bytes(body), max(1, len(specs) + count_change)))
    if bad_crc:
        data[17] ^= 0x01
    whole = validation_verdict(bytes(data), compacted)
    saved = batch_validation._PIECE_BYTES, batch_validation._walk_piece
    batch_validation._PIECE_BYTES, batch_validation._walk_piece = piece, walk.walk_piece
    try:
        assert validation_verdict(memoryview(data).toreadonly(), compacted) == whole
    finally:
        batch_validation._PIECE_BYTES, batch_validation._walk_piece = saved
