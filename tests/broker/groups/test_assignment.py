"""Consumer protocol subscription/assignment decoding: round trips, and bytes made by real clients."""

from __future__ import annotations

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment as KpAssignment
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as KpSubscription

from broker.groups.assignment import (
    ConsumerAssignment,
    ConsumerSubscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from broker.groups.errors import InvalidConsumerProtocolError

names = st.text(min_size=1, max_size=20)
partition_lists = st.lists(
    st.tuples(names, st.lists(st.integers(0, 2**31 - 1), max_size=8).map(tuple)), max_size=6
).map(tuple)


@st.composite
def subscriptions(draw: st.DrawFn) -> ConsumerSubscription:
    version = draw(st.integers(0, 3))
    return ConsumerSubscription(
        topics=tuple(draw(st.lists(names, max_size=6))),
        user_data=draw(st.none() | st.binary(max_size=40)),
        owned_partitions=draw(partition_lists) if version >= 1 else (),
        generation_id=draw(st.integers(-1, 2**31 - 1)) if version >= 2 else -1,
        rack_id=draw(st.none() | names) if version >= 3 else None,
        version=version,
    )


@given(subscriptions())
def test_subscription_round_trip(sub: ConsumerSubscription) -> None:
    assert decode_subscription(encode_subscription(sub)) == sub


@given(partition_lists, st.none() | st.binary(max_size=40), st.integers(0, 3))
def test_assignment_round_trip(parts: tuple[tuple[str, tuple[int, ...]], ...], user_data: bytes | None, v: int) -> None:
    a = ConsumerAssignment(parts, user_data, v)
    assert decode_assignment(encode_assignment(a)) == a


@given(subscriptions())
def test_subscription_matches_kafka_python_both_ways(sub: ConsumerSubscription) -> None:
    theirs = KpSubscription(
        topics=list(sub.topics),
        user_data=sub.user_data,
        owned_partitions=[KpSubscription.TopicPartition(topic=t, partitions=list(p)) for t, p in sub.owned_partitions],
        generation_id=sub.generation_id,
        rack_id=sub.rack_id,
        version=sub.version,
    )
    encoded = theirs.encode()
    assert encode_subscription(sub) == encoded
    assert decode_subscription(encoded) == sub
    back = KpSubscription.decode(encode_subscription(sub))
    assert list(back.topics) == list(sub.topics)


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
    meta = ConsumerProtocolMemberMetadata(0, ["orders", "events"], b"").encode()
    assert decode_subscription(meta) == ConsumerSubscription(("orders", "events"), b"", version=0)
    assign = ConsumerProtocolMemberAssignment(0, [("orders", [0, 2]), ("events", [1])], b"").encode()
    decoded = decode_assignment(assign)
    assert decoded.topic_partitions() == [("events", 1), ("orders", 0), ("orders", 2)]


def test_newer_version_is_read_as_the_newest_known() -> None:
    v3 = encode_subscription(ConsumerSubscription(("t",), None, (("t", (0,)),), 7, "rack-a", version=3))
    v9 = b"\x00\x09" + v3[2:] + b"future-field"
    sub = decode_subscription(v9)
    assert (sub.version, sub.topics, sub.generation_id, sub.rack_id) == (9, ("t",), 7, "rack-a")
    a = decode_assignment(b"\x00\x05" + encode_assignment(ConsumerAssignment((("t", (3,)),)))[2:] + b"extra")
    assert a.topic_partitions() == [("t", 3)]


def test_empty_bytes_mean_nothing_assigned() -> None:
    assert decode_assignment(b"").partitions == ()
    assert decode_subscription(b"").topics == ()


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
        decode_subscription(data)


@given(st.binary(max_size=64))
def test_garbage_never_raises_anything_else(data: bytes) -> None:
    for decode in (decode_subscription, decode_assignment):
        try:
            decode(data)
        except InvalidConsumerProtocolError:
            pass
