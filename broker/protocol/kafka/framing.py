"""Kafka framing: every request and response is an int32 big-endian size followed by that many bytes.

Sans-IO, in two shapes: ``FrameDecoder.feed(data)`` returns the complete frames (without their size
prefix) found so far and keeps the remainder; ``FrameAssembler`` hands out the buffers a socket reads
into (``asyncio.BufferedProtocol``: ``get_buffer()``, then ``received(nbytes)``) so that a large frame
is read straight into a buffer of its own, with no copy in user space. A negative size or one above
``max_frame_bytes`` raises ``FrameError``: the stream cannot be trusted after that and the caller closes the connection.
``pending_bytes`` tells a caller at EOF whether a frame was cut short (a truncated frame).
"""

from __future__ import annotations

import mmap
import struct
import sys

from broker.protocol.kafka.errors import FrameError

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_POOL_BYTES",
    "DIRECT_FRAME_BYTES",
    "FrameAssembler",
    "FrameDecoder",
    "FramePool",
    "encode_frame",
]

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
DIRECT_FRAME_BYTES = 4 * 1024  # frames above this are read into a buffer of their own
# One read into the shared buffer takes at most this (several small frames); kept small: every
# connection holds one, idle or not.
_SCRATCH_BYTES = 16 * 1024
_SIZE = struct.Struct(">i")
DEFAULT_POOL_BYTES = 16 * 1024 * 1024  # large-frame buffers kept for reuse (FramePool): RSS it may hold
# A fresh buffer above this is an anonymous mapping, whose pages become memory only when a read fills them:
# a size prefix announcing 100 MB costs nothing until the bytes come (a zero-filled bytearray of that size
# was resident at once; a few connections sending 8 bytes each could take gigabytes). Below it, a bytearray.
_MAPPED_BUFFER_BYTES = 64 * 1024
# Mapped buffers are made in whole steps of this, so that the next request of about the same size (a
# producer's batches differ by a few bytes) fits the buffer its predecessor left.
_MAPPED_STEP_BYTES = 128 * 1024


def _check_size(size: int, max_frame_bytes: int, limit_name: str = "the maximum request size") -> None:
    if size < 0:
        raise FrameError(f"negative frame length {size}")
    if size > max_frame_bytes:
        raise FrameError(f"frame length {size} exceeds {limit_name} {max_frame_bytes}")


class FrameAssembler:
    """Splits a byte stream into size-prefixed frames, owning the buffers the stream is read into.

    ``get_buffer()`` gives the memory the next read may fill, ``received(n)`` says how much it did and
    returns the frames completed. Small frames share a scratch buffer and are copied out of it (as
    ``bytes``). A frame above ``DIRECT_FRAME_BYTES`` gets a buffer of exactly its size as soon as its
    size prefix is read; the part that came with that read is moved there and every later read lands
    in it directly, so a 1 MB Produce request is not copied in user space at all (it is handed over as
    a read-only ``memoryview`` of that buffer). Sizes are checked before any memory is taken for them.

    Large-frame buffers come from a ``FramePool`` (one per listener, shared by its connections), which
    hands a buffer out again once nothing refers to it any more."""

    __slots__ = ("_end", "_filled", "_frame", "_pool", "_scratch", "_start", "limit_name", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, pool: FramePool | None = None) -> None:
        self.max_frame_bytes = max_frame_bytes  # may change between frames (a lower limit before a login)
        self.limit_name = "the maximum request size"  # what the refusal calls the limit
        self._pool = pool if pool is not None else FramePool()
        self._scratch = bytearray(_SCRATCH_BYTES)
        self._start = 0  # unconsumed bytes are _scratch[_start:_end]
        self._end = 0
        self._frame: memoryview | None = None  # a large frame being read into its own buffer
        self._filled = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes received that do not yet form a complete frame."""
        return self._end - self._start + (self._filled if self._frame is not None else 0)

    def get_buffer(self) -> memoryview:
        """Where the next read goes (never empty)."""
        if self._frame is not None:
            return self._frame[self._filled :]
        if self._end == len(self._scratch):  # full: move the unconsumed start of a small frame to the front
            held = self._end - self._start
            self._scratch[:held] = memoryview(self._scratch)[self._start : self._end]
            self._start, self._end = 0, held
        return memoryview(self._scratch)[self._end :]

    def received(self, nbytes: int) -> list[bytes | memoryview]:
        """``nbytes`` were read into the last buffer handed out; the frames they complete, in order.
        Raises ``FrameError`` for a size that cannot be (the stream cannot be trusted after it)."""
        frames: list[bytes | memoryview] = []
        frame = self._frame
        if frame is not None:
            self._filled += nbytes
            if self._filled == len(frame):
                frames.append(frame.toreadonly())
                self._frame, self._filled = None, 0
            return frames
        self._end += nbytes
        buf, pos, end = self._scratch, self._start, self._end
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            _check_size(size, self.max_frame_bytes, self.limit_name)
            body = pos + 4
            if size > DIRECT_FRAME_BYTES:
                have = min(end - body, size)
                frame = self._pool.take(size)
                frame[:have] = memoryview(buf)[body : body + have]
                pos = body + have
                if have < size:
                    self._frame, self._filled = frame, have
                    break
                frames.append(frame.toreadonly())
                continue
            if end - body < size:
                break
            frames.append(bytes(memoryview(buf)[body : body + size]))
            pos = body + size
        if pos == end:
            self._start = self._end = 0
        else:
            self._start = pos
        return frames


class FramePool:
    """Buffers for large frames, handed out again once nothing refers to them.

    A fresh megabyte for every Produce request cost more in the kernel (page faults and zeroing when it
    was first touched, unmapping when freed: ``sluice serve`` gives every large block its own mapping,
    returned on free, see ``sluice.malloc_tuning``) than reading the request itself (bench/RESULTS.md). A
    buffer is free when its only references are the pool's: every view of a frame (the request being
    decoded, a refusal being logged) holds one, so a buffer is never reused under a live view. The pool
    keeps at most ``max_bytes``; a frame that finds no free buffer and no room gets one of its own. A fresh
    buffer above ``_MAPPED_BUFFER_BYTES`` is a private anonymous ``mmap`` (Python's default, a shared
    one, is shmem: each page fault and the unmapping cost more), a whole number of
    ``_MAPPED_STEP_BYTES``: memory only where reads wrote, so what a size prefix announces is not
    resident before the client sends it."""

    __slots__ = ("_buffers", "_held", "max_bytes")

    def __init__(self, max_bytes: int = DEFAULT_POOL_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buffers: list[bytearray | mmap.mmap] = []
        self._held = 0

    @property
    def held_bytes(self) -> int:
        return self._held

    def take(self, size: int) -> memoryview:
        """``size`` writable bytes (their content is whatever was there)."""
        buffers = self._buffers
        best: bytearray | mmap.mmap | None = None
        for buffer in buffers:
            # references to a free buffer: the list, the loop variable, getrefcount's argument
            if len(buffer) >= size and (best is None or len(buffer) < len(best)) and sys.getrefcount(buffer) <= 3:
                best = buffer
        if best is not None:
            return memoryview(best)[:size]
        fresh: bytearray | mmap.mmap
        if size <= _MAPPED_BUFFER_BYTES:
            fresh = bytearray(size)
        else:
            fresh = mmap.mmap(-1, -(-size // _MAPPED_STEP_BYTES) * _MAPPED_STEP_BYTES, flags=mmap.MAP_PRIVATE)
        held = len(fresh)
        if self._held + held > self.max_bytes:
            self._evict(self._held + held - self.max_bytes)
        if self._held + held <= self.max_bytes:
            buffers.append(fresh)
            self._held += held
        return memoryview(fresh)[:size]

    def _evict(self, wanted: int) -> None:
        """Drop free buffers, smallest first, until ``wanted`` bytes are released (or none is free)."""
        for buffer in sorted(self._buffers, key=len):
            if wanted <= 0:
                return
            if sys.getrefcount(buffer) <= 4:  # + sorted()'s list
                self._buffers.remove(buffer)
                self._held -= len(buffer)
                wanted -= len(buffer)


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
                _check_size(size, self.max_frame_bytes)
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
