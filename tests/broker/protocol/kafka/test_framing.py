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
