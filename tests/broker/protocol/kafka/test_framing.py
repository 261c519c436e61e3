"""FrameDecoder: whole frames out of any chunking; bad lengths rejected with a clear error."""

from __future__ import annotations

import struct

import pytest

from broker.protocol.kafka import FrameDecoder, FrameError, encode_frame


def _stream() -> tuple[bytes, list[bytes]]:
    payloads = [b"", b"a", b"hello" * 100, bytes(range(256)) * 10]
    return b"".join(encode_frame(p) for p in payloads), payloads


def test_whole_stream_at_once() -> None:
    data, payloads = _stream()
    assert FrameDecoder().feed(data) == payloads


def test_one_byte_at_a_time_decodes_the_same() -> None:
    data, payloads = _stream()
    decoder = FrameDecoder()
    frames: list[bytes] = []
    for i in range(len(data)):
        frames += decoder.feed(data[i : i + 1])
    assert frames == payloads
    assert decoder.pending_bytes == 0


def test_truncated_frame_is_left_pending() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode_frame(b"complete") + encode_frame(b"cut short")[:-3]) == [b"complete"]
    assert decoder.pending_bytes > 0


def test_negative_length_is_rejected() -> None:
    with pytest.raises(FrameError, match="negative frame length -5"):
        FrameDecoder().feed(struct.pack(">i", -5) + b"xxxx")


def test_oversized_length_is_rejected_before_buffering() -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    with pytest.raises(FrameError, match="exceeds the maximum request size 1000"):
        decoder.feed(struct.pack(">i", 1001))
    assert FrameDecoder(max_frame_bytes=1000).feed(encode_frame(b"x" * 1000)) == [b"x" * 1000]


def test_any_chunking_gives_the_same_frames() -> None:
    """Frames spread over many chunks, prefixes cut anywhere, several frames in one chunk."""
    import random

    rng = random.Random(7)
    payloads = [bytes([i % 251]) * rng.choice((0, 1, 3, 700, 70_000)) for i in range(60)]
    data = b"".join(encode_frame(p) for p in payloads)
    for _ in range(20):
        decoder = FrameDecoder()
        frames: list[bytes] = []
        pos = 0
        while pos < len(data):
            step = rng.choice((1, 2, 3, 5, 4096, 65_536, 300_000))
            frames += decoder.feed(memoryview(data)[pos : pos + step] if step == 5 else data[pos : pos + step])
            pos += step
            assert decoder.pending_bytes <= 70_004
        assert frames == payloads
        assert all(type(f) is bytes for f in frames)
        assert decoder.pending_bytes == 0
