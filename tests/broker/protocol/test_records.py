"""RecordBatch v2 codec: round trips, and clear errors for corrupt or truncated input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import CorruptRecordError, UnsupportedMagicError
from broker.protocol.records import (
    Compression,
    RecordSpec,
    decode_all,
    decode_records,
    encode_batch,
    split_complete_batches,
    verify_batch,
    with_base_offset,
)

optional_bytes = st.one_of(st.none(), st.binary(max_size=64))
headers = st.lists(st.tuples(st.text(max_size=8), optional_bytes), max_size=3).map(tuple)
record_specs = st.builds(
    RecordSpec,
    value=optional_bytes,
    key=optional_bytes,
    headers=headers,
    timestamp=st.one_of(st.none(), st.integers(min_value=0, max_value=2**41)),
)


@settings(max_examples=200)
@given(
    records=st.lists(record_specs, min_size=1, max_size=20),
    base=st.integers(min_value=0, max_value=2**40),
    compression=st.sampled_from(list(Compression)),
)
def test_round_trip(records: list[RecordSpec], base: int, compression: Compression) -> None:
    batch = encode_batch(records, base_offset=base, timestamp=1_700_000_000_000, compression=compression)
    header = verify_batch(batch)
    assert header.record_count == len(records)
    assert header.last_offset == base + len(records) - 1
    decoded = decode_records(batch)
    assert [r.offset for r in decoded] == list(range(base, base + len(records)))
    for spec, rec in zip(records, decoded, strict=True):
        assert (rec.key, rec.value, rec.headers) == (spec.key, spec.value, spec.headers)
        assert rec.timestamp == (spec.timestamp if spec.timestamp is not None else 1_700_000_000_000)


@given(records=st.lists(record_specs, min_size=1, max_size=5), flip=st.data())
def test_any_flipped_bit_after_the_crc_is_rejected(records: list[RecordSpec], flip: st.DataObject) -> None:
    batch = bytearray(encode_batch(records))
    position = flip.draw(st.integers(min_value=21, max_value=len(batch) - 1))
    batch[position] ^= 1 << flip.draw(st.integers(min_value=0, max_value=7))
    with pytest.raises(CorruptRecordError):
        verify_batch(bytes(batch))


@given(records=st.lists(record_specs, min_size=1, max_size=5), cut=st.data())
def test_truncated_input_is_rejected(records: list[RecordSpec], cut: st.DataObject) -> None:
    batch = encode_batch(records)
    length = cut.draw(st.integers(min_value=0, max_value=len(batch) - 1))
    with pytest.raises(CorruptRecordError, match="truncated"):
        verify_batch(batch[:length])


def test_wrong_magic_is_rejected_with_its_value() -> None:
    batch = bytearray(encode_batch([RecordSpec(b"x")]))
    batch[16] = 1
    with pytest.raises(UnsupportedMagicError, match="magic 1"):
        verify_batch(bytes(batch))


def test_rewriting_the_base_offset_keeps_the_crc_valid() -> None:
    batch = encode_batch([RecordSpec(b"a"), RecordSpec(b"b")])
    moved = bytes(with_base_offset(batch, 1234))
    assert verify_batch(moved).base_offset == 1234
    assert [r.offset for r in decode_records(moved)] == [1234, 1235]


def test_a_partial_batch_at_the_end_of_a_fetch_is_ignored() -> None:
    one = encode_batch([RecordSpec(b"1")], base_offset=0)
    two = encode_batch([RecordSpec(b"2")], base_offset=1)
    headers, covered = split_complete_batches(one + two[:-3])
    assert len(headers) == 1 and covered == len(one)
    assert [r.value for r in decode_all(one + two[:-3])] == [b"1"]


def test_record_length_that_disagrees_with_fields_is_rejected() -> None:
    batch = bytearray(encode_batch([RecordSpec(b"abc")]))
    batch[61] += 2  # record length varint (zigzag) grows by one
    # re-seal the CRC so that only the inner inconsistency remains
    import crc32c

    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    with pytest.raises(CorruptRecordError):
        decode_records(bytes(batch))
