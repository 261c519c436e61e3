"""How the console shows a record's bytes: pretty JSON, text, or a hex dump (pure functions, no I/O).

``auto`` picks the first that fits: JSON (valid UTF-8 that parses), then text (valid UTF-8 without control
characters other than tab and newlines), then hex. Asking for a view the bytes do not fit (``json`` for a
binary value) falls back the same way and says so, rather than failing the page. Values longer than
``MAX_SHOWN`` bytes are cut for display (the browser is for looking, not for exporting).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from broker.protocol.records import Record

__all__ = ["MAX_SHOWN", "VIEWS", "Shown", "ShownRecord", "View", "hex_dump", "show_bytes", "show_record"]

View = Literal["auto", "json", "text", "hex"]
VIEWS: tuple[View, ...] = ("auto", "json", "text", "hex")
MAX_SHOWN = 16 * 1024


@dataclass(frozen=True, slots=True)
class Shown:
    """Bytes ready for a ``<pre>``: the view used, the text, and notes (fallback, truncation)."""

    view: Literal["json", "text", "hex", "null"]
    text: str
    size: int
    note: str | None = None


@dataclass(frozen=True, slots=True)
class ShownRecord:
    partition: int
    offset: int
    timestamp: int
    key: Shown
    value: Shown
    headers: tuple[tuple[str, str], ...]


def hex_dump(data: bytes) -> str:
    """16 bytes a line: offset, hex pairs, and the printable ASCII (``.`` for the rest)."""
    lines = []
    for start in range(0, len(data), 16):
        chunk = data[start : start + 16]
        pairs = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{start:08x}  {pairs:<47}  {text}")
    return "\n".join(lines)


def _as_text(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ord(c) < 0x20 and c not in "\t\n\r" for c in text):
        return None
    return text


def _as_json(text: str | None) -> str | None:
    if text is None or not text.strip():
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return json.dumps(parsed, indent=2, ensure_ascii=False)


def show_bytes(data: bytes | None, view: View = "auto") -> Shown:
    """``data`` in ``view`` (or the first that fits, with a note saying why)."""
    if data is None:
        return Shown("null", "null", 0)
    size = len(data)
    cut = data[:MAX_SHOWN]
    truncated = f"first {MAX_SHOWN:,} of {size:,} bytes" if size > MAX_SHOWN else None
    if view == "hex":
        return Shown("hex", hex_dump(cut), size, truncated)
    text = _as_text(cut) if size <= MAX_SHOWN else _as_text(cut.decode("utf-8", "ignore").encode())
    pretty = _as_json(text) if size <= MAX_SHOWN else None  # a cut document is no longer JSON
    if view in ("auto", "json") and pretty is not None:
        return Shown("json", pretty, size, truncated)
    if view in ("auto", "text", "json") and text is not None:
        note = "not JSON: shown as text" if view == "json" else None
        return Shown("text", text, size, _join(note, truncated))
    note = None if view == "auto" else "not UTF-8 text: shown as hex"
    return Shown("hex", hex_dump(cut), size, _join(note, truncated))


def _join(*notes: str | None) -> str | None:
    found = [n for n in notes if n]
    return "; ".join(found) if found else None


def show_record(partition: int, record: Record, view: View = "auto") -> ShownRecord:
    headers = tuple(
        (name, "null" if value is None else (_as_text(value) or value.hex())) for name, value in record.headers
    )
    key_view: View = "auto" if view == "json" else view  # keys are rarely JSON: text unless hex was asked for
    return ShownRecord(
        partition=partition,
        offset=record.offset,
        timestamp=record.timestamp,
        key=show_bytes(record.key, key_view),
        value=show_bytes(record.value, view),
        headers=headers,
    )
