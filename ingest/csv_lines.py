"""Route a read's worth of CSV rows at once: ``CsvLinePlan``, the CSV member of ``ingest/line_routes.py``.

A CSV stream (a TCP connection, a file) starts with its header; every later row is parsed against it
(``formats.parse_csv_row``) into a document of column name -> value. Under a rule chain ``line_plan``
accepts (no fan-out, original values, no topic template, every rule reading CSV), the verdict for a row is
a function of the header and of the raw bytes of at most three of its fields, the *identity*: the key
field (``key = "field:NAME"``), the device field (``device = "field:NAME"``) and ``device_id`` (the default
key and device). So, as the other plans do, the plan learns one ``LineTarget`` per header and identity by
routing the first row that has it with ``route_each`` ("by example") and looks the target up for every
further row. Why the verdict depends on nothing else:

- ``route_each`` parses each row the same way for every rule, and a field lookup on a CSV document finds
  a value exactly when the header has that column (a value is never None, never a nested object): so the
  rule that applies (the first whose ``when_field`` is a column, or one without) is fixed by the header;
- key, device and headers come from the identity fields' text through ``csv_value`` (a pure function of
  the bytes), or from nothing in the row; the topic is the rule's, the value the row as it came;
- the event time, when the rule reads a field, is worked out per row here, as ``route_each`` does it.

A rule with ``when_field`` that reads JSON or raw payloads (the default sensor route reads JSON) is
passed over for every row the plan takes: a raw payload has no fields, and a JSON document with a field
is an object, which needs a ``"``. Any other rule that does not read CSV leaves the chain without a plan.

A row the plan takes must parse exactly as ``parse_csv_row`` parses it, and that is checked without the
csv module: a row without ``"`` and ``\\r`` is the same list of fields for ``csv.reader`` (excel dialect,
strict) as for ``bytes.split(b",")`` (tests/ingest/test_csv_lines.py compares both on random rows), so
the plan takes rows that hold neither, are valid UTF-8 and have as many commas as the header has columns
less one; every other row goes back to the caller as None and is routed (or dead-lettered, with the
reason ``route_each`` gives) alone.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any

from broker import native
from broker.protocol.records import encode_headers, encode_key
from ingest import line_kernels
from ingest.formats import csv_value
from ingest.line_kernels import LineTarget
from ingest.line_routes import LinePlan
from ingest.router import SourceRoutes
from ingest.routing import RawMessage, Rejected, RouteRule, event_time_ms

__all__ = ["CsvLinePlan"]

_kernels = native.select(line_kernels)
_CACHE_MAX = 100_000  # headers per plan, identities per header; cleared when full
_SLOW: Any = object()  # a cached "route_each decides rows like this one"
_QUOTE = 0x22  # b'"' and b"\r" as ints: `b'"' in line` first tries its operand as an int (see line_kernels)
_CR = 0x0D
_COMMA = b","


class _Header:
    """What a plan knows for the rows under one header: the rule that applies, which fields decide the
    target, the event-time field, and the targets learned so far (by the identity fields' raw bytes)."""

    __slots__ = ("commas", "identity", "rule", "targets", "time_format", "time_index")

    def __init__(self, columns: tuple[str, ...], rule: RouteRule | None) -> None:
        self.commas = len(columns) - 1
        self.rule = rule  # None: no rule applies (route_each routes nothing or rejects): rows go alone
        self.targets: dict[Any, LineTarget] = {}
        self.time_index = -1  # the event-time column; -1: arrival time
        self.time_format = "epoch_ms"
        names: list[str] = ["device_id"]  # the default key and the default device read it
        if rule is not None:
            if rule.key.kind == "field":
                names.append(rule.key.arg)
            if rule.device is not None and rule.device.kind == "field":
                names.append(rule.device.arg)
            if rule.time.field not in ("arrival", "default"):
                if rule.time.field not in columns:  # every row is rejected for it: route_each says so
                    self.rule = None
                else:
                    self.time_index = columns.index(rule.time.field)
                    self.time_format = rule.time.format
        indexes = sorted({columns.index(name) for name in names if name in columns})
        self.identity: tuple[int, ...] = tuple(indexes)


def _rule_for(chain: Sequence[RouteRule], columns: tuple[str, ...]) -> RouteRule | None:
    """The rule ``route_each`` applies to a row that parsed under ``columns``."""
    for rule in chain:
        if rule.when_field is None or rule.when_field in columns:
            return rule
    return None


def _plain_row(line: bytes, commas: int) -> bool:
    """Whether ``line`` is a row the plan may take (the module docstring): no quote or CR, the header's
    number of commas, valid UTF-8."""
    if not line or _QUOTE in line or _CR in line or line.count(_COMMA) != commas:
        return False
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class CsvLinePlan(LinePlan):
    def __init__(self, routes: SourceRoutes, chain: Sequence[RouteRule]) -> None:
        super().__init__(routes)
        self._chain = tuple(chain)
        self._headers: dict[tuple[str, ...], _Header] = {}

    @classmethod
    def build(cls, routes: SourceRoutes, chain: Sequence[RouteRule]) -> CsvLinePlan | None:
        """The plan for a CSV source's rule chain, or None when a rule reads rows in a way it does not know."""
        kept: list[RouteRule] = []
        for rule in chain:
            fmt = rule.format or "csv"
            if fmt == "csv":
                kept.append(rule)
            elif rule.when_field is None or fmt not in ("json", "raw"):
                return None
            # else: a guarded JSON or raw rule never applies to a row the plan takes (the module docstring)
        return cls(routes, kept)

    def route(self, lines: Sequence[bytes], arrival_ms: int,
              columns: tuple[str, ...] | None = None) -> tuple[list[LineTarget | None], list[int] | None]:
        if columns is None:  # rows before a header: route_each rejects each with its reason
            return [None] * len(lines), None
        header = self._headers.get(columns)
        if header is None:
            if len(self._headers) >= _CACHE_MAX:
                self._headers.clear()
            header = self._headers[columns] = _Header(columns, _rule_for(self._chain, columns))
        if header.rule is None or not lines:
            return [None] * len(lines), None
        commas = header.commas
        joined = b"\n".join(lines)
        plain = all(lines) and _QUOTE not in joined and _CR not in joined and list(
            map(bytes.count, lines, itertools.repeat(_COMMA))).count(commas) == len(lines)
        if plain and not joined.isascii():
            try:
                joined.decode("utf-8")
            except UnicodeDecodeError:
                plain = False
        taken: list[bool] | None = None if plain else [_plain_row(line, commas) for line in lines]
        identity = header.identity
        values: list[Any]
        if not identity:  # one target for every row under this header (None: a row the plan does not take)
            values = [b""] * len(lines) if taken is None else [b"" if ok else None for ok in taken]
        else:
            pick = operator.itemgetter(*identity)  # one index: the field's bytes; more: a tuple of them
            if taken is None:
                values = list(map(pick, map(bytes.split, lines, itertools.repeat(_COMMA))))
            else:
                values = [pick(line.split(_COMMA)) if ok else None for line, ok in zip(lines, taken, strict=True)]
        stamps: list[int] | None = None
        refused: set[int] = set()  # rows whose event time the rule refuses: route_each says why
        if header.time_index >= 0:
            stamps = self._stamps(lines, taken, header, arrival_ms, refused)
        targets = header.targets
        if len(targets) >= _CACHE_MAX:
            targets.clear()
        out: list[LineTarget | None] = list(map(targets.get, values))
        for index, target in enumerate(out):
            if target is not None:
                if target is _SLOW or index in refused:
                    out[index] = None
                continue
            if (taken is not None and not taken[index]) or index in refused:
                continue
            found = targets.get(values[index])  # learned from an earlier row of this read
            if found is not None:
                out[index] = None if found is _SLOW else found
                continue
            stamp = stamps[index] if stamps is not None else arrival_ms
            learned = targets[values[index]] = self._learn_row(lines[index], arrival_ms, columns, header, stamp)
            out[index] = None if learned is _SLOW else learned
        if stamps is not None:
            for index, target in enumerate(out):
                if target is None:
                    stamps[index] = arrival_ms
        return out, stamps

    @staticmethod
    def _stamps(lines: Sequence[bytes], taken: list[bool] | None, header: _Header, arrival_ms: int,
                refused: set[int]) -> list[int]:
        """Per row its event time (arrival time for rows not taken); adds to ``refused`` the rows whose
        time the rule refuses."""
        index = header.time_index
        fmt = header.time_format
        to_ms: Callable[[Any, str], int] = event_time_ms
        stamps: list[int] = []
        for position, line in enumerate(lines):
            stamp = arrival_ms
            if taken is None or taken[position]:
                try:
                    stamp = to_ms(csv_value(line.split(_COMMA)[index].decode()), fmt)
                except Exception:
                    refused.add(position)
            stamps.append(stamp)
        return stamps

    def _learn_row(self, line: bytes, arrival_ms: int, columns: tuple[str, ...], header: _Header,
                   stamp: int) -> LineTarget:
        """The target of every row under ``columns`` with ``line``'s identity: ``route_each``'s own result
        for ``line``, when that is one record of the row as it came to the rule's topic at ``stamp``."""
        assert header.rule is not None
        results = self.routes.route_each(RawMessage(line, None, None, arrival_ms, columns))
        if len(results) != 1 or isinstance(results[0], Rejected):
            return _SLOW
        routed_topic, device, (value, key, headers, timestamp) = results[0]
        if routed_topic != header.rule.topic or value is not line or timestamp != stamp:
            return _SLOW
        # The kernels' own class (compiled, when they are): they read its fields directly.
        target: LineTarget = _kernels.LineTarget(routed_topic, device, key, headers, encode_key(key),
                                                 encode_headers(headers))
        return target
