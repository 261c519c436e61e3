"""Consumer protocol assignment decoding: round trips, and bytes made by real clients."""

from __future__ import annotations

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment as KpAssignment

from broker.groups.assignment import ConsumerAssignment, decode_assignment, encode_assignment
from broker.groups.errors import InvalidConsumerProtocolError

names = st.text(min_size=1, max_size=20)
partition_lists = st.lists(
    st.tuples(names, st.lists(st.integers(0, 2**31 - 1), max_size=8).map(tuple)), max_size=6
).map(tuple)


@given(partition_lists, st.none() | st.binary(max_size=40), st.integers(0, 3))
def test_assignment_round_trip(parts: tuple[tuple[str, tuple[int, ...]], ...], user_data: bytes | None, v: int) -> None:
    a = ConsumerAssignment(parts, user_data, v)
    assert decode_assignment(encode_assignment(a)) == a


@given(partition_lists, st.none() | st.binary(max_size=40), st.integers(0, 3))
def test_assignment_matches_kafka_python(
    parts: tuple[tuple[str, tuple[int, ...]], ...], user_data: bytes | None, v: int
) -> None:
    theirs = KpAssignment(
        assigned_partitions=[KpAssignment.TopicPartition(topic=t, partitions=list(p)) for t, p in parts],
        user_data=user_data,
        version=v,
    )
    encoded = theirs.encode()
    assert decode_assignment(encoded) == ConsumerAssignment(parts, user_data, v)
    assert encode_assignment(ConsumerAssignment(parts, user_data, v)) == encoded


def test_aiokafka_v0_bytes_decode() -> None:
    assign = ConsumerProtocolMemberAssignment(0, [("orders", [0, 2]), ("events", [1])], b"").encode()
    decoded = decode_assignment(assign)
    assert decoded.topic_partitions() == [("events", 1), ("orders", 0), ("orders", 2)]


def test_newer_version_is_read_as_the_newest_known() -> None:
    a = decode_assignment(b"\x00\x05" + encode_assignment(ConsumerAssignment((("t", (3,)),)))[2:] + b"extra")
    assert a.topic_partitions() == [("t", 3)]


def test_empty_bytes_mean_nothing_assigned() -> None:
    assert decode_assignment(b"").partitions == ()


@pytest.mark.parametrize(
    "data",
    [
        b"\x00",  # half a version
        b"\x00\x00\x00\x00\x00\x02\x00\x01a",  # two topics announced, one present
        b"\x00\x00\x7f\xff\xff\xff",  # absurd array length
        b"\xff\xff\x00\x00\x00\x00",  # negative version
        b"\x00\x00\x00\x00\x00\x01\xff\xff\x00\x00\x00\x00",  # null topic name
        b"\x00\x00\x00\x00\x00\x01\x00\x02\xff\xfe\xff\xff\xff\xff",  # topic not UTF-8
    ],
)
def test_malformed_bytes_raise_a_clear_error(data: bytes) -> None:
    with pytest.raises(InvalidConsumerProtocolError):
        decode_assignment(data)


@given(st.binary(max_size=64))
def test_garbage_never_raises_anything_else(data: bytes) -> None:
    try:
        decode_assignment(data)
    except InvalidConsumerProtocolError:
        pass
