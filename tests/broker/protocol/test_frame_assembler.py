"""FrameAssembler: the frames of any byte stream, however the reads cut it, are FrameDecoder's."""

from __future__ import annotations

import struct
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol.kafka import FrameAssembler, FrameDecoder, FrameError, FramePool
from broker.protocol.kafka.framing import DIRECT_FRAME_BYTES


def feed(assembler: FrameAssembler, stream: bytes, cuts: list[int]) -> list[bytes]:
    """Deliver ``stream`` as a socket would: each read fills at most the buffer handed out (and at
    most the next cut's size)."""
    frames: list[bytes] = []
    pos = 0
    sizes = iter(cuts)
    while pos < len(stream):
        buffer = assembler.get_buffer()
        assert len(buffer) > 0
        n = min(len(buffer), len(stream) - pos, max(1, next(sizes, len(stream))))
        buffer[:n] = stream[pos : pos + n]
        pos += n
        frames += [bytes(f) for f in assembler.received(n)]
    return frames


def framed(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


sizes = st.one_of(st.integers(0, 40), st.integers(DIRECT_FRAME_BYTES - 2, DIRECT_FRAME_BYTES + 2),
                  st.integers(20_000, 70_000))


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(sizes, min_size=1, max_size=8), cuts=st.lists(st.integers(1, 90_000), max_size=30))
def test_any_cutting_gives_the_frames_in_order(lengths: list[int], cuts: list[int]) -> None:
    payloads = [bytes([i % 251]) * n for i, n in enumerate(lengths)]
    stream = framed(payloads)
    assembler = FrameAssembler()
    assert feed(assembler, stream, cuts) == payloads == FrameDecoder().feed(stream)
    assert assembler.pending_bytes == 0


def test_one_byte_at_a_time() -> None:
    payloads = [b"a", b"", b"x" * (DIRECT_FRAME_BYTES + 10), b"bc"]
    assembler = FrameAssembler()
    assert feed(assembler, framed(payloads), [1] * 100_000) == payloads


def test_a_large_frame_is_read_into_its_own_buffer_and_handed_over_uncopied() -> None:
    assembler = FrameAssembler()
    payload = bytes(range(256)) * 400
    stream = framed([payload])
    first = assembler.get_buffer()
    first[:100] = stream[:100]
    assert assembler.received(100) == []
    rest = assembler.get_buffer()
    assert len(rest) == len(payload) - 96  # exactly the frame's missing bytes: the read lands in the frame
    rest[:] = stream[100:]
    (frame,) = assembler.received(len(rest))
    assert isinstance(frame, memoryview) and frame.readonly and bytes(frame) == payload


def test_truncated_stream_reports_pending_bytes() -> None:
    assembler = FrameAssembler()
    assert feed(assembler, framed([b"x" * 10])[:7], []) == []
    assert assembler.pending_bytes == 7


@pytest.mark.parametrize("size", [-1, 1001])
def test_bad_sizes_are_refused_before_any_memory_is_taken(size: int) -> None:
    assembler = FrameAssembler(max_frame_bytes=1000)
    buffer = assembler.get_buffer()
    buffer[:4] = struct.pack(">i", size)
    with pytest.raises(FrameError):
        assembler.received(4)


def _one_large_frame(assembler: FrameAssembler, payload: bytes) -> memoryview:
    (frame,) = feed_views(assembler, framed([payload]))
    assert isinstance(frame, memoryview)
    return frame


def feed_views(assembler: FrameAssembler, stream: bytes) -> list[bytes | memoryview]:
    frames: list[bytes | memoryview] = []
    pos = 0
    while pos < len(stream):
        buffer = assembler.get_buffer()
        n = min(len(buffer), len(stream) - pos)
        buffer[:n] = stream[pos : pos + n]
        pos += n
        frames += assembler.received(n)
    return frames


def test_a_large_frame_buffer_is_reused_only_once_nothing_refers_to_it() -> None:
    pool = FramePool(max_bytes=120_000)
    assembler = FrameAssembler(pool=pool)
    first = _one_large_frame(assembler, b"a" * 50_000)
    kept = first[10:20]  # a view of the first request, still in use
    del first
    second = _one_large_frame(assembler, b"b" * 50_000)
    assert bytes(kept) == b"a" * 10  # not overwritten: the second frame got a buffer of its own
    assert second.obj is not kept.obj
    buffers = {id(kept.obj), id(second.obj)}  # (the pool keeps both alive: their ids stay theirs)
    del kept, second
    third = _one_large_frame(FrameAssembler(pool=pool), b"c" * 40_000)  # the pool serves every connection
    assert id(third.obj) in buffers and bytes(third) == b"c" * 40_000  # free and large enough: reused
    assert pool.held_bytes == 100_000
    fourth = _one_large_frame(assembler, b"d" * 60_000)  # none large enough, no room: one of its own...
    assert bytes(fourth) == b"d" * 60_000 and len(cast(bytearray, fourth.obj)) == 60_000
    assert pool.held_bytes <= 120_000  # ...after the free 50,000-byte buffer was dropped for it


def test_a_slightly_larger_request_reuses_the_mapped_buffer_its_predecessor_left() -> None:
    # A producer's batches differ by a few bytes: the next one must not need fresh pages.
    pool = FramePool()
    assembler = FrameAssembler(pool=pool)
    first = _one_large_frame(assembler, b"a" * 200_000)
    buffer_id = id(first.obj)
    del first
    second = _one_large_frame(assembler, b"b" * 200_100)
    assert id(second.obj) == buffer_id and bytes(second) == b"b" * 200_100 and len(second) == 200_100
