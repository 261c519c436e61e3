"""File source: replay or tail a file (logs, CSV, NDJSON, InfluxDB lines) into the log.

The file is read with aiofiles in chunks; complete lines go through the same ``IngestSink`` as every
other front door. After each durable write the position — byte offset of the next unread line plus
the file's inode and device — is saved atomically to ``<state_dir>/<name>.json``. On start:

- a saved position for the same inode (and a file at least that long) resumes from that offset;
- a different inode (the file was rotated) or a shorter file (truncated) starts from 0;
- no saved position starts from the beginning, or from the end with ``start = "end"``.

``replay`` reads to the end of the file, writes the last line even without a newline, and stops.
``tail`` keeps polling for new lines every ``poll_interval_s``; a partial last line waits for its
newline. When the path gets a new inode (rotation) or shrinks (truncation), tail finishes what is
left of the old file and continues with the new one from offset 0.

Positions are saved only after the durable append, so a crash replays at most the last chunk
(at-least-once), never skips lines. When the log cannot store a chunk (storage failure), the source
waits ``poll_interval_s`` and reads again from the last saved position. For CSV the header (the
file's first line) is re-read on resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiofiles

from ingest.errors import ConfigError, FormatError, SinkError
from ingest.formats import parse_csv_header
from ingest.health import HealthRegistry
from ingest.routing import SourceRef
from ingest.sink import IngestSink
from ingest.tcp.framing import LineFramer
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


@dataclass(frozen=True, slots=True)
class Position:
    path: str
    inode: int
    device: int
    offset: int


class PositionStore:
    """One small JSON file per source, replaced atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _file(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def load(self, name: str) -> Position | None:
        path = self._file(name)
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            return Position(str(data["path"]), int(data["inode"]), int(data["device"]), int(data["offset"]))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable file position", extra={"file": str(path), "error": str(exc)})
            return None

    def save(self, name: str, position: Position) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._file(name)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(asdict(position)))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)


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
        self.offset = 0  # byte offset of the next unread line (saved after each durable write)
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
                    # The log could not store the chunk (the sink logged why); the position was not saved,
                    # so the next attempt re-reads from the last durable line.
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

    def _initial_offset(self, st: os.stat_result) -> int:
        saved = self.positions.load(self.config.name)
        if saved is not None and (saved.inode, saved.device) == (st.st_ino, st.st_dev) and saved.offset <= st.st_size:
            return saved.offset
        if saved is None and self.config.start == "end":
            return st.st_size
        return 0

    async def _follow(self) -> bool:
        """Read the current file; True when it was rotated/truncated and the next one should be read."""
        config = self.config
        async with aiofiles.open(config.path, "rb") as f:
            st = os.fstat(f.fileno())
            offset = self._initial_offset(st)
            stream = LineStream(config.format)
            if config.format == "csv" and offset > 0:
                stream.columns = await self._header(f)
            await f.seek(offset)
            read_offset = offset
            framer = LineFramer(config.max_line_bytes)
            self.offset = self.read_offset = offset
            self.files_opened += 1
            self.following.set()
            while True:
                data = await f.read(config.read_bytes)
                if data:
                    read_offset += len(data)
                    self.read_offset = read_offset
                    await self._write(framer.feed(data), stream, st, read_offset - framer.pending)
                    if self._stopping.is_set():
                        return False
                    continue
                if config.mode == "replay":
                    await self._write(framer.end(), stream, st, read_offset)
                    return False
                if self._stopping.is_set():
                    return False
                if self._replaced(st, read_offset):
                    await self._write(framer.end(), stream, st, read_offset)
                    log.info("file rotated or truncated; following the new file", extra={"path": str(config.path)})
                    return True
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

    async def _write(self, items: list[Any], stream: LineStream, st: os.stat_result, offset: int) -> None:
        if items:
            messages, _ = stream.messages(items, int(self._clock() * 1000))
            if messages:
                await self.sink.ingest(self.source, messages)  # no per-line outcomes needed
                self.lines_written += len(messages)
        if offset != self.offset:
            self.positions.save(self.config.name, Position(str(self.config.path), st.st_ino, st.st_dev, offset))
            self.offset = offset
