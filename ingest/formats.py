"""Payload formats devices send: JSON, InfluxDB line protocol, CSV rows with a header, raw bytes.

Sans-IO and pure: each parser takes one payload (one MQTT publish, one TCP or file line) and
returns a ``Parsed`` value or raises ``FormatError`` with a reason a person can act on.

InfluxDB line protocol (https://docs.influxdata.com/influxdb/v2/reference/syntax/line-protocol/)::

    measurement[,tag_key=tag_value...] field_key=field_value[,field_key=field_value...] [timestamp]

- measurement: escape ``,`` and space with ``\\``; tag keys, tag values, field keys: escape ``,``, ``=``
  and space.
- field values: float (``1``, ``-1.5``, ``1e3``), integer ``12i``, unsigned ``12u``, boolean
  (``t T true True TRUE f F false False FALSE``), string ``"..."`` (escape ``"`` and ``\\``).
- timestamp: integer nanoseconds since the epoch (precision is a rule setting).
- a line starting with ``#`` is a comment; parsers reject it (callers skip comments before).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from ingest.errors import FormatError
from ingest.fastinit import fast_frozen_init

__all__ = [
    "FORMATS",
    "InfluxPoint",
    "Parsed",
    "PayloadFormat",
    "csv_value",
    "parse_csv_header",
    "parse_csv_row",
    "parse_influx",
    "parse_json",
    "parse_payload",
]

PayloadFormat = Literal["json", "influx", "csv", "raw"]
FORMATS: tuple[str, ...] = ("json", "influx", "csv", "raw")

_MAX_ERROR_SNIPPET = 60
_SERIES_CACHE: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}  # devices repeat their series
_SERIES_CACHE_MAX = 100_000


@fast_frozen_init  # one per parsed payload
@dataclass(frozen=True, slots=True)
class InfluxPoint:
    measurement: str
    tags: tuple[tuple[str, str], ...]  # in the order given
    fields: dict[str, Any] = field(hash=False)
    timestamp: int | None  # as written (nanoseconds unless the rule says otherwise)

    def series_key(self) -> str:
        """Measurement plus tag set, tags sorted by key, escaped as line protocol writes them."""
        cache_key = (self.measurement, self.tags)
        found = _SERIES_CACHE.get(cache_key)
        if found is not None:
            return found
        if len(_SERIES_CACHE) >= _SERIES_CACHE_MAX:
            _SERIES_CACHE.clear()
        parts = [_escape(self.measurement, ", ")]
        for k, v in sorted(self.tags):
            parts.append(f"{_escape(k, ',= ')}={_escape(v, ',= ')}")
        found = _SERIES_CACHE[cache_key] = ",".join(parts)
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "measurement": self.measurement,
            "tags": dict(self.tags),
            "fields": self.fields,
            "timestamp": self.timestamp,
        }


@fast_frozen_init  # one per parsed payload
@dataclass(frozen=True, slots=True)
class Parsed:
    """A parsed payload: ``document`` is the JSON value / CSV row / point, ready for field lookups."""

    format: PayloadFormat
    document: Any = None  # json: any JSON value; csv: dict[str, str | int | float]; influx: InfluxPoint
    point: InfluxPoint | None = None

    def lookup(self, name: str) -> Any:
        """A field by name (dotted path into JSON objects); influx looks at fields, then tags.

        Returns ``None`` when absent.
        """
        if self.point is not None:
            if name in self.point.fields:
                return self.point.fields[name]
            for k, v in self.point.tags:
                if k == name:
                    return v
            return None
        doc = self.document
        if isinstance(doc, dict):
            if name in doc:
                return doc[name]
            if "." in name:
                for part in name.split("."):
                    if not isinstance(doc, dict) or part not in doc:
                        return None
                    doc = doc[part]
                return doc
        return None

    def tag(self, name: str) -> str | None:
        if self.point is None:
            return None
        for k, v in self.point.tags:
            if k == name:
                return v
        return None

    def to_json_bytes(self) -> bytes:
        doc = self.point.to_json() if self.point is not None else self.document
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _snippet(text: str | bytes) -> str:
    shown = text if isinstance(text, str) else text.decode("utf-8", "replace")
    return shown if len(shown) <= _MAX_ERROR_SNIPPET else shown[:_MAX_ERROR_SNIPPET] + "…"


def _decode(payload: bytes) -> str:
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"not UTF-8 (byte {exc.start})") from None


# ---------------------------------------------------------------- JSON


# 19+ digits in a row: possibly an integer beyond 64 bits, which orjson reads as a float where
# the stdlib keeps the exact int. Such payloads take the stdlib path. Found by mapping every digit
# to "9" and looking for nineteen of them (3x quicker than a regex on device payloads).
_DIGITS_TO_9 = bytes(0x39 if 0x30 <= b <= 0x39 else b for b in range(256))
_LONG_DIGITS = b"9" * 19


def parse_json(payload: bytes) -> Parsed:
    # orjson parses device JSON ~7x faster than the stdlib. It is stricter (no NaN/Infinity, no
    # lone surrogates), so whatever it refuses goes through the stdlib below, as do long integers:
    # the same documents are accepted, with the same values and the same error messages
    # (tests/ingest/test_json_fast.py checks this against the stdlib).
    # find(), not `in`: bytes.__contains__ first tries its operand as an int and builds a TypeError each call
    if payload.translate(_DIGITS_TO_9).find(_LONG_DIGITS) < 0:
        try:
            return Parsed("json", orjson.loads(payload))
        except orjson.JSONDecodeError:
            pass
    return _parse_json_stdlib(payload)


def _parse_json_stdlib(payload: bytes) -> Parsed:
    try:
        doc = json.loads(payload.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise FormatError(f"not UTF-8 (byte {exc.start})") from None
    except ValueError as exc:
        msg = getattr(exc, "msg", str(exc))
        pos = getattr(exc, "pos", None)
        where = f" at byte {pos}" if pos is not None else ""
        raise FormatError(f"invalid JSON: {msg}{where}") from None
    except RecursionError:  # the stdlib parser recurses per nesting level (orjson stops at 1024)
        raise FormatError("invalid JSON: nested too deeply") from None
    return Parsed("json", doc)


# ---------------------------------------------------------------- CSV


def parse_csv_header(payload: bytes) -> tuple[str, ...]:
    text = _decode(payload).strip("\r\n")
    try:
        row = next(csv.reader([text], strict=True))
    except (csv.Error, StopIteration) as exc:
        raise FormatError(f"invalid CSV header: {exc}") from None
    names = tuple(name.strip() for name in row)
    if not names or any(not n for n in names):
        raise FormatError(f"CSV header has an empty column name: {_snippet(text)!r}")
    if len(set(names)) != len(names):
        raise FormatError(f"CSV header repeats a column name: {_snippet(text)!r}")
    return names


def csv_value(raw: str) -> str | int | float:
    """A CSV field as the row's document holds it: an int or a finite float when it reads as one, else as it came."""
    text = raw.strip()
    if text and (text[0].isdigit() or text[0] in "+-."):
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                return raw
            return number if math.isfinite(number) else raw
    return raw


def parse_csv_row(payload: bytes, columns: tuple[str, ...] | None) -> Parsed:
    if not columns:
        raise FormatError("CSV row arrived before a header line")
    text = _decode(payload).strip("\r\n")
    try:
        row = next(csv.reader([text], strict=True))
    except (csv.Error, StopIteration) as exc:
        raise FormatError(f"invalid CSV row: {exc}") from None
    if len(row) != len(columns):
        raise FormatError(f"CSV row has {len(row)} columns, the header has {len(columns)}")
    return Parsed("csv", {name: csv_value(value) for name, value in zip(columns, row, strict=True)})


# ---------------------------------------------------------------- InfluxDB line protocol

_TRUE = frozenset(("t", "T", "true", "True", "TRUE"))
_FALSE = frozenset(("f", "F", "false", "False", "FALSE"))


def _escape(text: str, chars: str) -> str:
    if "\\" not in text and not any(c in text for c in chars):
        return text
    out = text.replace("\\", "\\\\")
    for c in chars:
        out = out.replace(c, "\\" + c)
    return out


def _field_value(raw: str, line: str) -> Any:
    if not raw:
        raise FormatError(f"field with an empty value: {_snippet(line)!r}")
    last = raw[-1]
    if last == "i" or last == "u":
        try:
            number = int(raw[:-1], 10)
        except ValueError:
            raise FormatError(f"invalid integer field value {_snippet(raw)!r}") from None
        if last == "u" and number < 0:
            raise FormatError(f"unsigned field value is negative: {_snippet(raw)!r}")
        if not -(2**63) <= number < 2**64:
            raise FormatError(f"integer field value out of range: {_snippet(raw)!r}")
        return number
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    if raw[0] == '"':
        if len(raw) < 2 or raw[-1] != '"':
            raise FormatError(f"unterminated string field value: {_snippet(raw)!r}")
        return raw[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    try:
        real = float(raw)
    except ValueError:
        raise FormatError(f"invalid field value {_snippet(raw)!r}") from None
    if not math.isfinite(real):
        raise FormatError(f"field value is not a finite number: {_snippet(raw)!r}")
    return real


def _split_escaped(text: str, sep: str) -> list[str]:
    """Split on ``sep`` not preceded by a backslash and not inside double quotes."""
    parts: list[str] = []
    current: list[str] = []
    i = 0
    in_quotes = False
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            current.append(c)
            current.append(text[i + 1])
            i += 2
            continue
        if c == '"':
            in_quotes = not in_quotes
        elif c == sep and not in_quotes:
            parts.append("".join(current))
            current = []
            i += 1
            continue
        current.append(c)
        i += 1
    if in_quotes:
        raise FormatError("unterminated string field value")
    parts.append("".join(current))
    return parts


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in ",= \\\"":
            out.append(text[i + 1])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _key_value(item: str, what: str, line: str) -> tuple[str, str]:
    pair = item.split("=") if "\\" not in item and '"' not in item else _split_escaped(item, "=")
    if len(pair) < 2 or not pair[0]:
        raise FormatError(f"{what} {_snippet(item)!r} is not key=value: {_snippet(line)!r}")
    if len(pair) > 2:
        # An unescaped '=' inside a string field value is legal: rejoin the value.
        if what != "field" or not pair[1].startswith('"'):
            raise FormatError(f"{what} {_snippet(item)!r} has an unescaped '=': {_snippet(line)!r}")
        return pair[0], "=".join(pair[1:])
    return pair[0], pair[1]


def parse_influx(payload: bytes) -> Parsed:
    line = _decode(payload).rstrip("\r\n")
    if not line.strip():
        raise FormatError("empty line")
    if line.lstrip().startswith("#"):
        raise FormatError("comment line")
    sections = line.split(" ") if "\\" not in line and '"' not in line else _split_escaped(line, " ")
    if len(sections) not in (2, 3) or not all(sections):
        raise FormatError(
            f"expected 'measurement[,tags] fields [timestamp]' separated by single spaces: {_snippet(line)!r}"
        )
    series = _split_escaped(sections[0], ",") if "\\" in sections[0] else sections[0].split(",")
    measurement = _unescape(series[0])
    if not measurement:
        raise FormatError(f"missing measurement: {_snippet(line)!r}")
    tags: list[tuple[str, str]] = []
    for item in series[1:]:
        k, v = _key_value(item, "tag", line)
        if not v:
            raise FormatError(f"tag {k!r} has an empty value: {_snippet(line)!r}")
        tags.append((_unescape(k), _unescape(v)))
    fields: dict[str, Any] = {}
    raw_fields = sections[1]
    items = raw_fields.split(",") if '"' not in raw_fields and "\\" not in raw_fields else _split_escaped(
        raw_fields, ","
    )
    for item in items:
        k, v = _key_value(item, "field", line)
        fields[_unescape(k)] = _field_value(v, line)
    timestamp: int | None = None
    if len(sections) == 3:
        try:
            timestamp = int(sections[2], 10)
        except ValueError:
            raise FormatError(f"invalid timestamp {_snippet(sections[2])!r}") from None
    point = InfluxPoint(measurement, tuple(tags), fields, timestamp)
    return Parsed("influx", point, point)


# ---------------------------------------------------------------- dispatch

_RAW = Parsed("raw", None)  # raw payloads have nothing to parse; Parsed is immutable, so share one


def parse_payload(fmt: str, payload: bytes, columns: tuple[str, ...] | None = None) -> Parsed:
    """``payload`` parsed as ``fmt``. Raises ``FormatError`` and nothing else: whatever a parser throws on
    hostile input (RecursionError, MemoryError, a library's own error) is the payload's fault, and becomes
    a reason for its dead letter instead of taking down the batch it arrived in."""
    try:
        if fmt == "json":
            return parse_json(payload)
        if fmt == "influx":
            return parse_influx(payload)
        if fmt == "csv":
            return parse_csv_row(payload, columns)
    except FormatError:
        raise
    except Exception as exc:
        raise FormatError(f"cannot be parsed as {fmt} ({type(exc).__name__}: {_snippet(str(exc))})") from None
    if fmt == "raw":
        return _RAW
    raise FormatError(f"unknown payload format {fmt!r} (known: {', '.join(FORMATS)})")
