"""Kafka framing: every request and response is an int32 big-endian size followed by that many bytes.

Sans-IO: ``FrameDecoder.feed(data)`` returns the complete frames (without their size prefix) found
so far and keeps the remainder. A negative size or one above ``max_frame_bytes`` raises
``FrameError``: the stream cannot be trusted after that and the caller closes the connection.
``pending_bytes`` tells a caller at EOF whether a frame was cut short (a truncated frame).
"""

from __future__ import annotations

import struct

from broker.protocol.kafka.errors import FrameError

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "FrameDecoder", "encode_frame"]

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
_SIZE = struct.Struct(">i")


class FrameDecoder:
    """Splits a byte stream into size-prefixed frames.

    Each frame's bytes are copied once: a frame inside one chunk is a slice of it; one spread over
    several chunks is joined from them when its last byte arrives (the chunks are held, not appended
    to a growing buffer: with 1 MB Produce requests read 256 KiB at a time, a bytearray buffer cost
    three copies and a move of every byte, bench/RESULTS.md)."""

    __slots__ = ("_held", "_need", "_parts", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._parts: list[bytes | memoryview] = []  # the start of an incomplete frame (or size prefix)
        self._held = 0  # bytes in _parts
        self._need = -1  # size of the frame being collected; -1 while reading the prefix

    @property
    def pending_bytes(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        return self._held

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data``; return every frame completed by it, in order."""
        chunk = data if isinstance(data, bytes) else bytes(data)
        frames: list[bytes] = []
        pos = 0
        if self._parts:
            if self._need < 0:  # a size prefix cut short: small, joined with what follows
                chunk = b"".join(self._parts) + chunk
                self._parts, self._held = [], 0
            else:
                missing = self._need - self._held
                if len(chunk) < missing:
                    self._parts.append(chunk)
                    self._held += len(chunk)
                    return frames
                self._parts.append(memoryview(chunk)[:missing])
                frames.append(b"".join(self._parts))
                self._parts, self._held, self._need = [], 0, -1
                pos = missing
        end = len(chunk)
        while True:
            if self._need < 0:
                if end - pos < 4:
                    break
                (size,) = _SIZE.unpack_from(chunk, pos)
                if size < 0:
                    raise FrameError(f"negative frame length {size}")
                if size > self.max_frame_bytes:
                    raise FrameError(f"frame length {size} exceeds the maximum request size {self.max_frame_bytes}")
                self._need = size
                pos += 4
            if end - pos < self._need:
                break
            frames.append(chunk[pos : pos + self._need])
            pos += self._need
            self._need = -1
        if pos < end:  # kept as a view: joined (one copy) when the frame completes
            self._parts.append(memoryview(chunk)[pos:])
            self._held = end - pos
        return frames


def encode_frame(payload: bytes | bytearray) -> bytes:
    """Prefix ``payload`` with its size."""
    return _SIZE.pack(len(payload)) + payload
