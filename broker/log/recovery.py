"""Opening a partition directory after a restart: the recovery checkpoint and the tail scan.

Why a checkpoint: a crash can only tear bytes that were not yet fsynced. Each partition remembers
its *recovery point* (segment, byte position, next offset, running max timestamp) as of its last
completed fsync; the store writes all of them to ``recovery-checkpoint.json`` about once a second
and at shutdown (plus a ``.clean-shutdown`` marker). On start only the bytes after the recovery
point are scanned batch by batch with their CRC, so restart time depends on the unflushed tail,
not on the size of the log. Segments before it are trusted and their indexes loaded lazily.

Scan rules:
- A batch is kept if its header parses, its CRC matches and its base offset is the next expected
  one. The first batch that fails ends the log: the segment is truncated there, later segments are
  deleted, and a WARNING says how many bytes went and why.
- If the segment named by the checkpoint is shorter than its checkpointed size (the file was cut
  after it was synced), the checkpoint cannot be trusted for it and the whole segment is scanned.
- No checkpoint at all (first crash before one was written) means scanning every segment.
- Recovered bytes are fsynced before the store accepts writes, so the new recovery point is the end.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from broker.errors import InvalidRecordError, StorageError
from broker.log.fdcache import FdCache
from broker.log.files import atomic_write, fsync_dir, read_json
from broker.log.index import SegmentIndex
from broker.log.segment_file import UNBOUNDED_FDS, Segment
from broker.protocol.records import BATCH_HEADER_SIZE, decode_header, verify_batch

__all__ = [
    "CHECKPOINT_FILE",
    "CLEAN_MARKER",
    "Recovered",
    "RecoveryPoint",
    "load_checkpoint",
    "recover_partition",
    "write_checkpoint",
]

log = logging.getLogger("broker.log.recovery")

CHECKPOINT_FILE = "recovery-checkpoint.json"
CLEAN_MARKER = ".clean-shutdown"
_SCAN_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class RecoveryPoint:
    """Everything up to ``position`` of segment ``segment`` is known to be on disk."""

    segment: int
    position: int
    offset: int  # next offset at ``position``
    max_timestamp: int  # running max timestamp of the segment up to ``position``
    created_ms: int  # when the segment was created (segment.ms rolls survive restarts)


def load_checkpoint(root: Path) -> dict[str, RecoveryPoint]:
    """Recovery points by partition directory name; an unreadable file means "scan everything"."""
    path = root / CHECKPOINT_FILE
    try:
        doc = read_json(path)
        if doc is None:
            return {}
        if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), dict):
            raise ValueError("no 'partitions' object")
        return {name: RecoveryPoint(**fields) for name, fields in doc["partitions"].items()}
    except (StorageError, TypeError, ValueError) as exc:
        log.warning("recovery checkpoint unreadable; every segment will be scanned",
                    extra={"path": str(path), "error": str(exc)})
        return {}


def write_checkpoint(root: Path, points: dict[str, RecoveryPoint]) -> None:
    doc = {"version": 1, "partitions": {name: _as_dict(p) for name, p in sorted(points.items())}}
    atomic_write(root / CHECKPOINT_FILE, json.dumps(doc, separators=(",", ":")).encode())


def _as_dict(point: RecoveryPoint) -> dict[str, int]:
    return {f.name: getattr(point, f.name) for f in dataclasses.fields(point)}


@dataclass(slots=True)
class Recovered:
    segments: list[Segment]
    point: RecoveryPoint
    scanned_bytes: int
    truncated_bytes: int


def _list_segments(directory: Path) -> list[int]:
    """Base offsets of the ``.log`` files; leftovers of interrupted work are removed."""
    bases: list[int] = []
    stems: set[str] = set()
    others: list[str] = []
    for entry in os.scandir(directory):
        stem, _, ext = entry.name.partition(".")
        if entry.name.endswith(".tmp"):
            os.unlink(entry.path)  # an atomic write that did not finish
        elif ext == "log" and len(stem) == 20 and stem.isascii() and stem.isdigit():  # "²" is isdigit, not int()
            bases.append(int(stem))
            stems.add(stem)
        elif ext in ("index", "timeindex"):
            others.append(entry.name)
    for name in others:
        if name.partition(".")[0] not in stems:
            os.unlink(directory / name)  # index of a segment whose log was deleted
    return sorted(bases)


def recover_partition(
    directory: Path, *, interval: int, point: RecoveryPoint | None, now_ms: int, fds: FdCache = UNBOUNDED_FDS
) -> Recovered:
    """Open the segments of one partition directory, scanning and repairing the unflushed tail."""
    try:
        bases = _list_segments(directory)
    except OSError as exc:
        raise StorageError(f"cannot list partition directory {directory}: {exc.strerror}") from exc
    if not bases:
        seg = Segment.create(directory, 0, now_ms, interval, fds)
        fsync_dir(directory)  # the new segment's directory entries, before anything is appended to it
        return Recovered([seg], RecoveryPoint(0, 0, 0, -1, now_ms), 0, 0)

    segments: list[Segment] = []
    for i, base in enumerate(bases):
        st = os.stat(directory / f"{base:020d}.log")
        end = bases[i + 1] if i + 1 < len(bases) else base
        segments.append(Segment(directory, base, size=st.st_size, end_offset=end,
                                last_write_ms=int(st.st_mtime * 1000), created_ms=now_ms, fds=fds))

    # Where trusted bytes end: (segment index, index state at that position, next offset).
    start_i, index, position, expected = _resume_point(segments, point, interval)
    scanned = truncated = 0
    i = start_i
    while i < len(segments):
        seg = segments[i]
        if i > start_i:
            index, position, expected = SegmentIndex(interval), 0, seg.base_offset
        assert index is not None
        end, next_offset, error = _scan(seg, index, position, expected)
        scanned += end - position
        seg.end_offset = next_offset
        later = segments[i + 1 :]
        gap = bool(later) and next_offset != later[0].base_offset
        if error is None and gap:
            error = f"segment ends at offset {next_offset} but the next one starts at {later[0].base_offset}"
        if error is not None and (end < seg.size or later):
            cut = seg.size - end + sum(s.size for s in later)
            truncated += cut
            log.warning(
                "truncated %d bytes of torn or corrupt log data", cut,
                extra={"segment": str(seg.log_path), "position": end, "offset": next_offset,
                       "deleted_segments": len(later), "reason": error},
            )
            _truncate(seg, end)
            for dropped in later:
                dropped.delete()
            del segments[i + 1 :]
            if later:
                fsync_dir(directory)
        seg.index = index
        if end > position or error is not None:
            _sync_log(seg)
        if i < len(segments) - 1:
            seg.index.finalize()
            raw_index, raw_times = seg.index.to_bytes()
            atomic_write(seg.index_path, raw_index)
            atomic_write(seg.time_path, raw_times)
            seg.close()
        i += 1

    active = segments[-1]
    if active.index is None:  # nothing scanned (cannot happen: the last segment is always scanned)
        active.index = SegmentIndex(interval)
    if point is not None and point.segment == active.base_offset:
        active.created_ms = point.created_ms
    active.active = True
    active.open_log()
    active.open_index_writers(*active.index.to_bytes())
    recovered_point = RecoveryPoint(active.base_offset, active.size, active.end_offset,
                                    active.index.max_timestamp, active.created_ms)
    return Recovered(segments, recovered_point, scanned, truncated)


def _resume_point(
    segments: list[Segment], point: RecoveryPoint | None, interval: int
) -> tuple[int, SegmentIndex, int, int]:
    """The first segment to scan, with its index state, byte position and next offset there."""
    bases = [s.base_offset for s in segments]
    if point is None or point.segment < bases[0]:
        return 0, SegmentIndex(interval), 0, bases[0]
    if point.segment not in bases:
        i = max(j for j, b in enumerate(bases) if b < point.segment)
        return i, SegmentIndex(interval), 0, bases[i]
    i = bases.index(point.segment)
    seg = segments[i]
    if point.position > seg.size or point.offset < seg.base_offset:
        log.warning("segment is shorter than its checkpointed durable size; scanning all of it",
                    extra={"segment": str(seg.log_path), "size": seg.size, "checkpoint": point.position})
        return i, SegmentIndex(interval), 0, seg.base_offset
    try:
        raw_index = seg.index_path.read_bytes()
        raw_times = seg.time_path.read_bytes()
    except OSError:
        return i, SegmentIndex(interval), 0, seg.base_offset
    loaded = SegmentIndex.from_bytes(interval, raw_index, raw_times, size=seg.size, rel_limit=2**32)
    if loaded is None:
        return i, SegmentIndex(interval), 0, seg.base_offset
    index = loaded.truncated(point.position, point.offset - seg.base_offset, point.max_timestamp)
    if not seg.entry_matches(index):
        return i, SegmentIndex(interval), 0, seg.base_offset
    return i, index, point.position, point.offset


def _scan(seg: Segment, index: SegmentIndex, position: int, expected: int) -> tuple[int, int, str | None]:
    """Check batches from ``position`` with their CRC, feeding ``index``; returns (end, next offset, error)."""
    size = seg.size
    want = _SCAN_CHUNK
    need = 0  # bytes of a batch that did not fit in the last chunk
    while position < size:
        buf = seg.pread(min(want, size - position), position)
        view = memoryview(buf)
        pos = 0
        while pos < len(view):
            absolute = position + pos
            if len(view) - pos < BATCH_HEADER_SIZE:
                if absolute + BATCH_HEADER_SIZE > size:
                    return absolute, expected, f"{size - absolute} bytes at the end are a partial batch header"
                break
            try:
                header = decode_header(view, pos)
            except InvalidRecordError as exc:
                return absolute, expected, str(exc)
            if pos + header.size > len(view):
                if absolute + header.size > size:
                    return absolute, expected, (
                        f"batch at position {absolute} needs {header.size} bytes, {size - absolute} are present"
                    )
                need = header.size
                break
            try:
                verify_batch(view, pos)
            except InvalidRecordError as exc:
                return absolute, expected, str(exc)
            if header.base_offset != expected:
                return absolute, expected, f"batch has base offset {header.base_offset}, expected {expected}"
            index.on_batch(absolute, expected - seg.base_offset, header.last_offset - seg.base_offset,
                           header.max_timestamp, header.size)
            expected = header.last_offset + 1
            pos += header.size
        # A batch larger than the chunk: read exactly as much as it needs next time.
        want = max(_SCAN_CHUNK, need)
        position += pos
    return position, expected, None


def _truncate(seg: Segment, end: int) -> None:
    try:
        os.ftruncate(seg.open_log(), end)
    except OSError as exc:
        raise StorageError(f"cannot truncate {seg.log_path} to {end} bytes: {exc.strerror}") from exc
    seg.size = end


def _sync_log(seg: Segment) -> None:
    try:
        os.fdatasync(seg.open_log())
    except OSError as exc:
        raise StorageError(f"cannot fsync {seg.log_path}: {exc.strerror}") from exc
