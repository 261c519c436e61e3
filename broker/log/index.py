"""Sparse offset and time indexes of one segment, sans-IO: batches and bytes in, lookups and bytes out.

The segment code writes the bytes this module hands back; recovery and lazy loading feed file bytes
back in. Keeping the rules here, away from file descriptors, lets them be tested in isolation.

File formats (big-endian, fixed width, append-only)::

    <base>.index       8 bytes per entry: relative offset u32, file position u32
    <base>.timeindex  12 bytes per entry: timestamp i64, relative offset u32

Rules:
- An offset entry ``(r, p)`` says the batch at file position ``p`` has base offset ``base + r``. One is
  added for the batch about to be stored once ``interval`` bytes have been stored since the previous
  entry, so a lookup scans at most about ``interval`` bytes. Position 0 needs no entry: a lookup that
  finds no entry starts at ``(0, 0)``. Both fields strictly increase.
- A time entry ``(T, r)`` says every batch stored before relative offset ``r`` has a max timestamp
  ``<= T``. One is added at an offset-entry point when the running max timestamp has grown since the
  last time entry, and once more when the segment is closed (``finalize``), so the last ``T`` of a
  closed segment is the segment's max timestamp. ``T`` strictly increases.
- ``time_scan_start(ts)`` is the ``r`` of the last entry with ``T < ts``: no batch before it can hold
  a timestamp ``>= ts``, so a seek-to-time scan may start there.

Entries live in typed arrays (4 or 8 bytes each), not lists of ints (about 36 bytes each): an index
costs about 20 bytes per ``interval`` bytes of log, and ``nbytes`` reports it to the ``IndexCache``
that bounds how many closed segments keep theirs in memory.
"""

from __future__ import annotations

import bisect
import struct
import sys
from array import array
from dataclasses import dataclass, field
from itertools import pairwise

__all__ = ["OFFSET_ENTRY", "TIME_ENTRY", "SegmentIndex"]

OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")
NO_TIMESTAMP = -1
_BIG_ENDIAN = sys.byteorder == "big"


def _u32s() -> array[int]:
    return array("I")


def _i64s() -> array[int]:
    return array("q")


def _increasing(values: array[int]) -> bool:
    return all(a < b for a, b in pairwise(values))


def _from_big_endian(typecode: str, raw: bytes) -> array[int]:
    out = array(typecode)
    out.frombytes(raw)
    if not _BIG_ENDIAN:
        out.byteswap()
    return out


@dataclass(slots=True)
class SegmentIndex:
    """The in-memory copy of both indexes of a segment plus the state needed to extend them."""

    interval: int
    rel_offsets: array[int] = field(default_factory=_u32s)
    positions: array[int] = field(default_factory=_u32s)
    time_stamps: array[int] = field(default_factory=_i64s)
    time_rels: array[int] = field(default_factory=_u32s)
    bytes_since_entry: int = 0
    max_timestamp: int = NO_TIMESTAMP  # running max over every batch seen
    next_rel: int = 0  # relative offset after the last batch seen

    # -- building ------------------------------------------------------------------------

    def on_batch(self, position: int, rel_base: int, rel_last: int, max_ts: int, size: int) -> tuple[bytes, bytes]:
        """Account for a batch stored at ``position``; returns bytes to append to (.index, .timeindex)."""
        index_bytes = time_bytes = b""
        if (
            self.bytes_since_entry >= self.interval
            and (not self.rel_offsets or rel_base > self.rel_offsets[-1])
            and (not self.positions or position > self.positions[-1])
        ):
            self.rel_offsets.append(rel_base)
            self.positions.append(position)
            index_bytes = OFFSET_ENTRY.pack(rel_base, position)
            if self.max_timestamp > self.last_time:
                self.time_stamps.append(self.max_timestamp)
                self.time_rels.append(rel_base)
                time_bytes = TIME_ENTRY.pack(self.max_timestamp, rel_base)
            self.bytes_since_entry = 0
        self.bytes_since_entry += size
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
        self.next_rel = rel_last + 1
        return index_bytes, time_bytes

    def finalize(self) -> bytes:
        """Close the segment: a last time entry carrying its max timestamp (bytes for .timeindex)."""
        if self.max_timestamp > self.last_time:
            self.time_stamps.append(self.max_timestamp)
            self.time_rels.append(self.next_rel)
            return TIME_ENTRY.pack(self.max_timestamp, self.next_rel)
        return b""

    @property
    def nbytes(self) -> int:
        """Bytes the entries take in memory."""
        return 8 * len(self.rel_offsets) + 12 * len(self.time_stamps)

    @property
    def last_time(self) -> int:
        return self.time_stamps[-1] if self.time_stamps else NO_TIMESTAMP

    # -- lookups -------------------------------------------------------------------------

    def position_for(self, rel: int) -> tuple[int, int]:
        """``(r, p)`` of the last entry with ``r <= rel``: the batch holding ``rel`` starts at or after ``p``."""
        i = bisect.bisect_right(self.rel_offsets, rel) - 1
        if i < 0:
            return 0, 0
        return self.rel_offsets[i], self.positions[i]

    def time_scan_start(self, timestamp: int) -> int:
        """Relative offset before which no batch has a max timestamp ``>= timestamp``."""
        i = bisect.bisect_left(self.time_stamps, timestamp) - 1
        return self.time_rels[i] if i >= 0 else 0

    # -- (de)serialising -----------------------------------------------------------------

    def to_bytes(self) -> tuple[bytes, bytes]:
        index = b"".join(OFFSET_ENTRY.pack(r, p) for r, p in zip(self.rel_offsets, self.positions, strict=True))
        times = b"".join(TIME_ENTRY.pack(t, r) for t, r in zip(self.time_stamps, self.time_rels, strict=True))
        return index, times

    @classmethod
    def from_bytes(
        cls, interval: int, index: bytes, times: bytes, *, size: int, rel_limit: int
    ) -> SegmentIndex | None:
        """Parse both files of a closed segment; None when they are inconsistent (then rebuild).

        ``size`` is the segment's byte size and ``rel_limit`` its offset count: every offset entry
        must point inside the segment, every time entry at or before its end.
        """
        if len(index) % OFFSET_ENTRY.size or len(times) % TIME_ENTRY.size:
            return None
        pairs = _from_big_endian("I", index)
        rels, positions = pairs[0::2], pairs[1::2]
        time_entries = list(TIME_ENTRY.iter_unpack(times))
        stamps = array("q", (t for t, _ in time_entries))
        time_rels = array("I", (r for _, r in time_entries))
        if not (_increasing(rels) and _increasing(positions) and _increasing(stamps)):
            return None
        if any(b < a for a, b in pairwise(time_rels)):
            return None
        if (positions and positions[-1] >= size) or (rels and rels[-1] >= rel_limit):
            return None
        if time_rels and time_rels[-1] > rel_limit:
            return None
        out = cls(interval, rels, positions, stamps, time_rels)
        out.max_timestamp = out.last_time
        out.next_rel = rel_limit
        return out

    def truncated(self, position: int, rel: int, max_timestamp: int) -> SegmentIndex:
        """The entries that describe only bytes before ``position`` (offsets before ``rel``).

        Used by recovery: everything from ``position`` on is scanned again and re-indexed, so the
        state (running max, bytes since the last entry) is set as it was at ``position``.
        """
        keep = bisect.bisect_left(self.positions, position)
        while keep and self.rel_offsets[keep - 1] >= rel:
            keep -= 1
        out = SegmentIndex(self.interval, self.rel_offsets[:keep], self.positions[:keep])  # array slices copy
        for ts, r in zip(self.time_stamps, self.time_rels, strict=True):
            if r > rel or ts > max_timestamp:
                break
            out.time_stamps.append(ts)
            out.time_rels.append(r)
        out.max_timestamp = max_timestamp
        out.next_rel = rel
        out.bytes_since_entry = position - (out.positions[-1] if out.positions else 0)
        return out
