"""File source: replay or tail a file (logs, CSV, NDJSON, InfluxDB lines) into the log.

The file is read with aiofiles in chunks of ``read_bytes``; the complete lines of a chunk are one write
through the same ``IngestSink`` as every other front door (``ingest_lines``: one RecordBatch per partition
per chunk, routed a chunk at a time where the rules allow it). The position — byte offset of the next
unread line, the file's inode and device, the CSV header — is kept in ``<state_dir>/<name>.json``
(``ingest/file/positions.py``). On start:

- a saved position for the same inode (and a file at least that long) resumes from that offset;
- a different inode (the file was rotated) or a shorter file (truncated) starts from 0;
- no saved position starts from the beginning, or from the end with ``start = "end"``.

``replay`` reads to the end of the file, writes the last line even without a newline, and stops.
``tail`` keeps polling for new lines every ``poll_interval_s``; a partial last line waits for its
newline. When the path gets a new inode (rotation) or shrinks (truncation), tail finishes what is
left of the old file and continues with the new one from offset 0.

Exactly once across crashes (``kill -9`` included): before the sink appends a batch of a chunk, the
chunk's extent and the batch's (topic, partition, base offset, lines) are saved and fsynced
(``ingest/append_journal.py``); after the chunk is durable the plain position replaces them. A restart
that finds a chunk in flight looks its batches up in the log and writes again only the lines none of
whose records got there, so no line is stored twice or skipped. The one exception is a line that a
fan-out rule (``continue = true``) turns into records in several partitions: a crash between those
appends stores the ones already written a second time. When the log cannot store a chunk (storage
failure), the source waits ``poll_interval_s`` and resumes the same way from the saved position.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiofiles

from broker.log.config import FlushPolicy
from ingest.append_journal import APPEND_JOURNAL, AppendEntry
from ingest.errors import ConfigError, FormatError, SinkError
from ingest.file.positions import Pending, Position, PositionStore, lines_done, stored_entries
from ingest.formats import parse_csv_header
from ingest.health import HealthRegistry
from ingest.routing import RawMessage, Rejected, SourceRef
from ingest.sink import IngestSink
from ingest.tcp.framing import LineFramer, LineTooLong
from ingest.tcp.lines import LINE_FORMATS, LineStream, payload_format

__all__ = ["FileSource", "FileSourceConfig", "Position", "PositionStore"]

log = logging.getLogger("ingest.file")


@dataclass(frozen=True, slots=True)
class FileSourceConfig:
    name: str
    path: Path
    format: str = "raw"  # ndjson | influx | csv | raw
    mode: str = "tail"  # replay | tail
    start: str = "beginning"  # beginning | end (when no position is saved)
    poll_interval_s: float = 0.5
    max_line_bytes: int = 64 * 1024
    read_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        if self.format not in LINE_FORMATS:
            raise ConfigError(f"file source {self.name!r}: unknown format {self.format!r}")
        if self.mode not in ("replay", "tail"):
            raise ConfigError(f"file source {self.name!r}: mode must be 'replay' or 'tail'")
        if self.start not in ("beginning", "end"):
            raise ConfigError(f"file source {self.name!r}: start must be 'beginning' or 'end'")
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"file source name {self.name!r} must be a plain, non-empty file name")


class FileSource:
    def __init__(
        self,
        config: FileSourceConfig,
        sink: IngestSink,
        health: HealthRegistry,
        positions: PositionStore,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.sink = sink
        self.health = health
        self.positions = positions
        self.source = SourceRef("file", config.name, payload_format(config.format))
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.finished = asyncio.Event()  # replay reached the end (or the source stopped)
        self.lines_written = 0
        self.offset = 0  # byte offset of the next unread line (the end of the last chunk written)
        self._saved_offset = -1  # the plain position last saved (-1: none, or a chunk's pending state since)
        self.read_offset = 0  # bytes of the current file read so far (a partial last line included)
        self.files_opened = 0  # the file, then each file that replaced it (rotation, truncation)
        self.following = asyncio.Event()  # set once the file is open and its start offset chosen

    async def start(self) -> None:
        self.health.register(self.source)
        self._task = asyncio.create_task(self._run(), name=f"file-source-{self.config.name}")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 10)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None

    async def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                if not self.config.path.exists():
                    if self.config.mode == "replay":
                        log.error("file to replay does not exist", extra={"path": str(self.config.path)})
                        return
                    await self._sleep()
                    continue
                try:
                    rotated = await self._follow()
                except SinkError as exc:
                    # The log could not store the chunk (the sink logged why): the next attempt resumes from
                    # the saved position, whose pending state says which of the chunk's lines got stored.
                    self.health.error(self.source, None, str(exc))
                    await self._sleep()
                    continue
                if not rotated:
                    return
        except Exception:
            log.exception("file source failed", extra={"source": self.source.label, "path": str(self.config.path)})
            self.health.error(self.source, None, "file source failed; see the log")
        finally:
            self.finished.set()

    async def _sleep(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self.config.poll_interval_s)

    def _saved(self, st: os.stat_result) -> Position | None:
        """The saved position when it belongs to this file (same inode, not past its end)."""
        saved = self.positions.load(self.config.name)
        if saved is None or (saved.inode, saved.device) != (st.st_ino, st.st_dev) or saved.offset > st.st_size:
            return None
        return saved if saved.pending is None or saved.pending.end <= st.st_size else None

    async def _follow(self) -> bool:
        """Read the current file; True when it was rotated/truncated and the next one should be read."""
        config = self.config
        async with aiofiles.open(config.path, "rb") as f:
            st = os.fstat(f.fileno())
            saved = self._saved(st)
            stream = LineStream(config.format)
            if saved is not None:
                offset = saved.offset
                stream.columns = saved.columns
                if config.format == "csv" and offset > 0 and saved.columns is None:
                    stream.columns = await self._header(f)  # saved before positions kept the header
                if saved.pending is not None:
                    offset = await self._finish_pending(f, st, saved, stream)
            elif self.positions.load(config.name) is None and config.start == "end":
                offset = st.st_size
            else:
                offset = 0
            await f.seek(offset)
            read_offset = offset
            framer = LineFramer(config.max_line_bytes)
            self.offset = self.read_offset = offset
            self._saved_offset = offset if saved is not None and saved.pending is None else -1
            self.files_opened += 1
            self.following.set()
            while True:
                data = await f.read(config.read_bytes)
                if data:
                    read_offset += len(data)
                    self.read_offset = read_offset
                    await self._write(framer.feed(data), stream, st, read_offset - framer.pending)
                    if self._stopping.is_set():
                        self._save(st, stream)
                        return False
                    continue
                if config.mode == "replay":
                    await self._write(framer.end(), stream, st, read_offset)
                    self._save(st, stream)
                    return False
                if self._stopping.is_set():
                    self._save(st, stream)
                    return False
                if self._replaced(st, read_offset):
                    await self._write(framer.end(), stream, st, read_offset)
                    self._save(st, stream)
                    log.info("file rotated or truncated; following the new file", extra={"path": str(config.path)})
                    return True
                self._save(st, stream)  # idle: nothing pending any more
                await self._sleep()

    def _replaced(self, st: os.stat_result, read_offset: int) -> bool:
        try:
            now = os.stat(self.config.path)
        except FileNotFoundError:
            return False  # mid-rotation: keep the old file until the new one appears
        return (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev) or now.st_size < read_offset

    async def _header(self, f: Any) -> tuple[str, ...] | None:
        await f.seek(0)
        first = await f.readline()
        try:
            return parse_csv_header(first)
        except FormatError:
            return None

    def _position(self, st: os.stat_result, offset: int, columns: tuple[str, ...] | None,
                  pending: Pending | None = None) -> Position:
        return Position(str(self.config.path), st.st_ino, st.st_dev, offset, columns, pending)

    def _save(self, st: os.stat_result, stream: LineStream) -> None:
        """Save the plain position (nothing pending) when it moved since the last save. Between chunks
        it is not saved: the next chunk's pending state replaces the last one's, which resolves to the same
        place after a crash (its batches are all in the log), and a rename costs milliseconds on some disks."""
        if self.offset != self._saved_offset:
            self.positions.save(self.config.name, self._position(st, self.offset, stream.columns), sync=False)
            self._saved_offset = self.offset

    async def _write(self, items: list[bytes | LineTooLong], stream: LineStream, st: os.stat_result,
                     end: int) -> None:
        """Write the lines of one chunk (``items``: the chunk's lines from ``self.offset`` to ``end``)."""
        start = self.offset
        if items:
            columns = stream.columns  # the header in force at the chunk's start
            arrival = int(self._clock() * 1000)
            lines = stream.lines(items)
            batch: Sequence[bytes] | Sequence[RawMessage | Rejected] = (
                lines if lines is not None else stream.messages(items, arrival)[0])
            await self._ingest(batch, lines is not None, arrival, stream.columns, st, start, end, columns, [], None)
        self.offset = end

    async def _ingest(self, batch: Sequence[Any], as_lines: bool, arrival: int, columns: tuple[str, ...] | None,
                      st: os.stat_result, start: int, end: int, start_columns: tuple[str, ...] | None,
                      entries: list[AppendEntry], owners: list[int] | None) -> None:
        """One sink call for a chunk's lines (``as_lines``) or messages, its appends saved as they come
        (``entries``: the chunk's earlier ones; ``owners``: each item's index in the whole chunk, when
        ``batch`` is what is left of it)."""
        if not batch:
            return

        store = self.sink.store

        def journal(appends: list[AppendEntry]) -> None:
            for topic, partition, base, owned in appends:
                entries.append((topic, partition, base, owned if owners is None else [owners[o] for o in owned]))
            # fsynced when a topic fsyncs its records (flush=always), so that after a power cut too the
            # file knows about every batch that survived it; other policies promise nothing across one
            sync = any(store.has_topic(topic) and store.topic(topic).config.flush is FlushPolicy.ALWAYS
                       for topic, _, _, _ in appends)
            self.positions.save(self.config.name, self._position(st, start, start_columns,
                                                                 Pending(end, tuple(entries))), sync=sync)
            self._saved_offset = -1  # the file now says "pending"

        token = APPEND_JOURNAL.set(journal)
        try:
            if as_lines:
                await self.sink.ingest_lines(self.source, list(batch), arrival, columns)
            else:
                await self.sink.ingest(self.source, batch)  # no per-line outcomes needed
        finally:
            APPEND_JOURNAL.reset(token)
        self.lines_written += len(batch)

    async def _finish_pending(self, f: Any, st: os.stat_result, saved: Position, stream: LineStream) -> int:
        """The chunk a crash left in flight: write the lines of it that did not reach the log (the module
        docstring); returns the offset after it."""
        pending = saved.pending
        assert pending is not None
        await f.seek(saved.offset)
        data = await f.read(pending.end - saved.offset)
        framer = LineFramer(self.config.max_line_bytes)
        items = framer.feed(data) + framer.end()
        arrival = int(self._clock() * 1000)
        lines = stream.lines(items)
        chunk: Sequence[Any] = lines if lines is not None else stream.messages(items, arrival)[0]
        stored = stored_entries(self.sink.store, self.source.label, pending.appends)
        done = lines_done(pending.appends, stored, self.sink.dead_letter_topic)
        left = [index for index in range(len(chunk)) if index not in done]
        log.info("resuming a chunk that was being written",
                 extra={"source": self.source.label, "offset": saved.offset, "end": pending.end,
                        "lines": len(chunk), "stored": len(chunk) - len(left)})
        self.offset = saved.offset
        await self._ingest([chunk[i] for i in left], lines is not None, arrival, stream.columns, st,
                           saved.offset, pending.end, saved.columns, list(stored), left)
        self.offset = pending.end
        self._save(st, stream)
        return pending.end
