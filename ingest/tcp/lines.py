"""Framed lines → messages for the sink, per stream (a TCP connection or a file).

Sans-IO. Keeps the per-stream state a line format needs: the line count (for ack lines) and, for
CSV, the header (the first non-empty line of the stream). Empty lines, and ``#`` comments in
InfluxDB line protocol, are counted and skipped. Lines over the length limit and broken CSV headers
become ``Rejected`` (dead letters) with their reason.
"""

from __future__ import annotations

from typing import Literal

from ingest.errors import FormatError
from ingest.formats import parse_csv_header
from ingest.routing import RawMessage, Rejected
from ingest.tcp.framing import LineTooLong

__all__ = ["LINE_FORMATS", "LineStream", "payload_format"]

LineFormat = Literal["ndjson", "influx", "csv", "raw"]
LINE_FORMATS: tuple[str, ...] = ("ndjson", "influx", "csv", "raw")


def payload_format(line_format: str) -> str:
    """The routing payload format for a line format (``ndjson`` lines are ``json`` payloads)."""
    return "json" if line_format == "ndjson" else line_format


class LineStream:
    def __init__(self, line_format: str, *, columns: tuple[str, ...] | None = None) -> None:
        if line_format not in LINE_FORMATS:
            raise ValueError(f"unknown line format {line_format!r} ({', '.join(LINE_FORMATS)})")
        self.format = line_format
        self.columns = columns
        self.line_no = 0  # lines seen on this stream, 1-based numbering
        self.header_line = 0  # the number of the CSV header line ``lines`` read (0: none)

    def lines(self, items: list[bytes | LineTooLong]) -> list[bytes] | None:
        """The lines of ``items`` that are messages (empty lines and comments skipped, as ``messages``
        skips them), for ``IngestSink.ingest_lines`` with ``columns`` (a CSV stream's header, read here when
        ``items`` starts the stream with a valid one); None (nothing counted) when ``items`` holds
        something ``messages`` must decide: a line over the length limit, or a CSV header that is not valid."""
        if LineTooLong in map(type, items):
            return None
        lines: list[bytes] = items  # type: ignore[assignment]  # (no LineTooLong in it; no cast() call per read)
        if self.format == "csv" and self.columns is None:
            start = 0
            while start < len(lines) and _skipped("csv", lines[start]):
                start += 1
            if start == len(lines):
                self.line_no += len(items)
                return []
            try:
                self.columns = parse_csv_header(lines[start])
            except FormatError:
                return None  # messages dead-letters it with its reason
            self.header_line = self.line_no + start + 1
            self.line_no += start + 1
            lines = lines[start + 1:]
        self.line_no += len(lines)
        if not all(lines) or any(map(bytes.isspace, lines)) or (
            self.format == "influx" and 0x23 in b"\n".join(lines)  # b"#" as an int: see line_kernels
        ):
            return [line for line in lines if not _skipped(self.format, line)]
        return lines

    def numbers(self, items: list[bytes | LineTooLong], first: int) -> list[int]:
        """The line number of each line ``lines(items)`` returned (``first``: the number of ``items[0]``)."""
        fmt = self.format
        header = self.header_line
        return [first + i for i, item in enumerate(items)
                if not isinstance(item, LineTooLong) and not _skipped(fmt, item) and first + i != header]

    def messages(
        self, items: list[bytes | LineTooLong], arrival_ms: int
    ) -> tuple[list[RawMessage | Rejected], list[int]]:
        """Messages for the sink and the line number of each."""
        out: list[RawMessage | Rejected] = []
        numbers: list[int] = []
        fmt = self.format
        columns = self.columns
        line_no = self.line_no
        for item in items:
            line_no += 1
            if isinstance(item, LineTooLong):
                out.append(Rejected(f"line of {item.length} bytes is longer than the limit", item.prefix))
                numbers.append(line_no)
                continue
            if _skipped(fmt, item):
                continue
            if fmt == "csv" and columns is None:
                try:
                    columns = parse_csv_header(item)
                except FormatError as exc:
                    out.append(Rejected(f"csv header: {exc}", item))
                    numbers.append(line_no)
                continue
            out.append(RawMessage(item, None, None, arrival_ms, columns))
            numbers.append(line_no)
        self.line_no = line_no
        self.columns = columns
        return out, numbers


def _skipped(fmt: str, line: bytes) -> bool:
    """Empty lines, and comments in InfluxDB line protocol: counted, not messages."""
    return not line or line.isspace() or (fmt == "influx" and line.lstrip().startswith(b"#"))
