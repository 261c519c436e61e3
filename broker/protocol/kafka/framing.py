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
    """Splits a byte stream into size-prefixed frames."""

    __slots__ = ("_buf", "_need", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._need = -1  # size of the frame being collected; -1 while reading the prefix

    @property
    def pending_bytes(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data``; return every frame completed by it, in order."""
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        while True:
            if self._need < 0:
                if end - pos < 4:
                    break
                (size,) = _SIZE.unpack_from(buf, pos)
                if size < 0:
                    raise FrameError(f"negative frame length {size}")
                if size > self.max_frame_bytes:
                    raise FrameError(f"frame length {size} exceeds the maximum request size {self.max_frame_bytes}")
                self._need = size
                pos += 4
            if end - pos < self._need:
                break
            frames.append(bytes(buf[pos : pos + self._need]))
            pos += self._need
            self._need = -1
        if pos:
            del buf[:pos]
        return frames


def encode_frame(payload: bytes | bytearray) -> bytes:
    """Prefix ``payload`` with its size."""
    return _SIZE.pack(len(payload)) + payload
