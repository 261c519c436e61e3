"""encode_record_tuples (the ingest fast path) writes exactly the bytes encode_batch writes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol.records import (
    RecordSpec,
    RecordTuple,
    decode_records,
    encode_batch,
    encode_record_tuples,
    verify_batch,
)

optional_bytes = st.one_of(st.none(), st.binary(max_size=64))
headers = st.lists(st.tuples(st.text(max_size=8), optional_bytes), max_size=3).map(tuple)
record_tuples = st.tuples(optional_bytes, optional_bytes, headers, st.integers(min_value=0, max_value=2**45))


def _specs(records: list[RecordTuple]) -> list[RecordSpec]:
    return [RecordSpec(value, key, hdrs, ts) for value, key, hdrs, ts in records]


@settings(max_examples=300)
@given(records=st.lists(record_tuples, min_size=1, max_size=30), base=st.integers(min_value=0, max_value=2**40))
def test_same_bytes_as_encode_batch(records: list[RecordTuple], base: int) -> None:
    assert encode_record_tuples(records, base_offset=base) == encode_batch(_specs(records), base_offset=base)


@settings(max_examples=100)
@given(
    shared=headers,
    rows=st.lists(st.tuples(optional_bytes, optional_bytes, st.integers(0, 2**42), st.booleans()), min_size=1,
                  max_size=30),
)
def test_shared_header_tuples_are_encoded_like_distinct_ones(
    shared: tuple[tuple[str, bytes | None], ...], rows: list[tuple[bytes | None, bytes | None, int, bool]]
) -> None:
    # The fast path caches encoded headers by tuple identity: the same object many times, and equal
    # but distinct objects, must both give encode_batch's bytes.
    records: list[RecordTuple] = [(v, k, shared if same else tuple(shared), ts) for v, k, ts, same in rows]
    assert encode_record_tuples(records) == encode_batch(_specs(records))


@pytest.mark.parametrize("size", [127, 128, 8191, 8192, 70_000])
def test_large_fields_use_multi_byte_varints(size: int) -> None:
    records: list[RecordTuple] = [
        (b"v" * size, b"k" * (size // 2), (("h" * 200, b"x" * size),), 1_700_000_000_000),
        (b"", None, (), 1_700_000_000_000 + 10**9),  # a timestamp delta beyond the small-varint table
    ]
    batch = encode_record_tuples(records, base_offset=7)
    assert batch == encode_batch(_specs(records), base_offset=7)
    decoded = decode_records(batch)
    assert [(r.value, r.key, r.timestamp) for r in decoded] == [(v, k, ts) for v, k, _, ts in records]


def test_more_records_than_the_small_varint_table() -> None:
    hdrs = (("source", b"tcp:default"),)
    records: list[RecordTuple] = [(b"%d" % i, None, hdrs, 1_700_000_000_000 + i % 5) for i in range(9000)]
    batch = encode_record_tuples(records)
    assert batch == encode_batch(_specs(records))
    assert verify_batch(batch).record_count == 9000


def test_no_records_is_an_error() -> None:
    with pytest.raises(ValueError):
        encode_record_tuples([])


_SHARED_CACHE: dict[tuple[tuple[str, bytes | None], ...], bytes] = {}


@settings(max_examples=200)
@given(records=st.lists(record_tuples, min_size=1, max_size=10))
def test_a_header_cache_shared_across_calls_changes_nothing(records: list[RecordTuple]) -> None:
    # One cache across all examples: entries written by earlier calls serve later ones.
    assert encode_record_tuples(records, header_cache=_SHARED_CACHE) == encode_batch(_specs(records))
    assert all(hdrs in _SHARED_CACHE for _, _, hdrs, _ in records)
