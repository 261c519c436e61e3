"""Route a read's worth of TCP/file lines at once, for the lines that route like others seen before.

``SourceRoutes.route_each`` walks the rules, parses the payload into a document and derives key,
device, headers and event time for every message. For a line source whose rules take all of that from
one or two payload fields (the default TCP route: key and device from ``device_id``; a sensor rule on
``sensor``), the result for a line is a function of those fields' values: lines with the same values
go to the same ``LineTarget`` (log topic, device, key, headers), and only the event time may differ
per line. A ``LinePlan`` keeps one target per distinct value, learned from the first line that had it
by routing that line with ``route_each`` itself ("by example"), and for every further line checks that
it is valid in the format, reads the fields and looks the target up.

Every line the plan is not sure about comes back as ``None`` and the caller routes it with
``route_each``, so verdicts (what is stored where, which line is a dead letter and why) are those of
``route_each``. Lines the plan takes:

- NDJSON (``JsonLinePlan``): JSON objects that msgspec decodes (fields other than the few the rules
  read are validated and skipped), in a read whose bytes are valid UTF-8 (msgspec does not check the
  UTF-8 of skipped strings) and, in reads with a line of 400 bytes or more, hold no run of 19 digits
  (``parse_json`` reads those with the stdlib, which refuses integers of more digits than
  ``sys.get_int_max_str_digits()`` (at least 640) and may hit its recursion limit at a shallower nesting
  than msgspec did: neither fits in a line under 400 bytes, which nests at most 199 deep; below both
  limits the stdlib and msgspec accept the same documents with the same values);
  the field values the rules read are strings, non-boolean numbers or absent. msgspec refuses some
  documents ``parse_json`` accepts (NaN, lone surrogates, numbers out of float range): those fall back.
- InfluxDB line protocol (``InfluxLinePlan``): lines without ``"`` or ``\\`` of two or three sections
  separated by single spaces, the timestamp ASCII digits; the series section (measurement and tags)
  decides the target, learned by example (so it is valid exactly when that line parsed), and the field
  section is checked by its *shape*: digits replaced by ``9``. A shape is accepted once one line of it
  parsed with all-9 digits: all-9 digits are the largest magnitude a shape holds, so if that value is a
  finite float / an integer in range, so is every value of the same shape (and digit replacement keeps
  UTF-8 validity and every separator).

- CSV rows (``CsvLinePlan``, ``ingest/csv_lines.py``, whose docstring has its rules): by header and by
  the raw bytes of the fields the rules read.

Plans exist only for rule chains whose every rule is understood here (``line_plan``: no fan-out, no
re-encoded values, no topic templates, top-level field names); otherwise every line takes
``route_each``. tests/ingest/test_line_routes.py compares both on random and malformed lines.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from broker import native
from broker.protocol.records import encode_headers, encode_key
from ingest import line_kernels
from ingest.errors import PayloadError
from ingest.formats import parse_influx
from ingest.line_kernels import LineTarget
from ingest.router import SourceRoutes
from ingest.routing import RawMessage, Rejected, RouteRule, event_time_ms

__all__ = ["InfluxLinePlan", "JsonLinePlan", "LinePlan", "LineTarget", "line_plan"]

_kernels = native.select(line_kernels)
_CACHE_MAX = 100_000  # distinct field values / series / shapes per plan; cleared when full
_DIGITS_TO_9 = bytes(0x39 if 0x30 <= b <= 0x39 else b for b in range(256))
_LONG_DIGITS = b"9" * 19  # parse_json hands payloads with 19+ digits in a row to the stdlib
_SHORT_LINE = 400  # reads of shorter lines need no digit screen (the module docstring says why)
_SLOW: Any = object()  # a cached "route_each decides lines like this one"
_NONE_TYPE = type(None)
_SCALARS = (str, int, float, _NONE_TYPE)  # field values a target may be keyed on (bool is not: True == 1)


class LinePlan:
    """``route(lines, arrival_ms, columns)`` -> per line its target or None (route it with ``route_each``),
    and per line its event time (or None: every line's is ``arrival_ms``). ``columns``: a CSV stream's header."""

    def __init__(self, routes: SourceRoutes) -> None:
        self.routes = routes

    def route(self, lines: Sequence[bytes], arrival_ms: int,
              columns: tuple[str, ...] | None = None) -> tuple[list[LineTarget | None], list[int] | None]:
        raise NotImplementedError

    def _learn(self, line: bytes, arrival_ms: int, topic: str, stamp: int) -> LineTarget | None:
        """The target of every line that routes like ``line``: ``route_each``'s own result for it, when
        that is one record of ``line`` as it came, to ``topic`` at ``stamp``; else None."""
        results = self.routes.route_each(RawMessage(line, None, None, arrival_ms, None))
        if len(results) != 1 or isinstance(results[0], Rejected):
            return None
        routed_topic, device, (value, key, headers, timestamp) = results[0]
        if routed_topic != topic or value is not line or timestamp != stamp:
            return None
        # The kernels' own class (compiled, when they are): they read its fields directly.
        target: LineTarget = _kernels.LineTarget(routed_topic, device, key, headers, encode_key(key),
                                                 encode_headers(headers))
        return target


# ---------------------------------------------------------------- which chains have a plan


def _top_level(name: str | None) -> bool:
    return name is not None and name != "" and "." not in name


def _effective_chain(routes: SourceRoutes) -> tuple[RouteRule, ...] | None:
    """The rules ``route_each`` tries for a line, in order, ending at the first that always applies;
    None when a rule fans out or no rule always applies."""
    configured, defaults = routes.rules_for(None)
    chain: list[RouteRule] = []
    for rule in (*configured, *defaults):
        if rule.fan_out:
            return None
        chain.append(rule)
        if rule.when_field is None:
            return tuple(chain)
    return None


def _plain(rule: RouteRule) -> bool:
    return rule.value == "original" and "{" not in rule.topic


def line_plan(routes: SourceRoutes) -> LinePlan | None:
    """The plan for a line source's rules (cached on ``routes``), or None: route every line alone."""
    plan = routes.line_plan
    if plan is None or isinstance(plan, LinePlan):
        return plan
    plan = routes.line_plan = _build(routes)
    return plan


def _build(routes: SourceRoutes) -> LinePlan | None:
    chain = _effective_chain(routes)
    if chain is None or not all(_plain(rule) for rule in chain):
        return None
    source_format = routes.source.format or "raw"
    formats = [rule.format or source_format for rule in chain]
    if source_format == "json" and all(fmt == "json" for fmt in formats):
        return JsonLinePlan.build(routes, chain)
    if source_format == "influx" and formats[-1] == "influx" and all(fmt != "influx" for fmt in formats[:-1]):
        # The guards read JSON (or raw, or CSV without a header): none applies to a line without '"'.
        return InfluxLinePlan.build(routes, chain[-1])
    if source_format == "csv":
        from ingest.csv_lines import CsvLinePlan  # imports this module

        return CsvLinePlan.build(routes, chain)
    return None


# ---------------------------------------------------------------- NDJSON


class _JsonRule:
    """One rule of a JSON plan: its guard field, the fields its target depends on, its time field."""

    __slots__ = ("getter", "guard", "identity", "rule", "targets", "time_field", "time_format")

    def __init__(self, rule: RouteRule, attr: Callable[[str], str]) -> None:
        self.rule = rule
        self.guard = attr(rule.when_field) if rule.when_field is not None else None
        names: list[str] = []
        device_field = rule.device.arg if rule.device is not None else "device_id"
        if rule.key.kind == "field":
            names.append(rule.key.arg)
        elif rule.key.kind in ("default", "device"):
            names.append(device_field)
        if device_field not in names:
            names.append(device_field)
        self.identity = tuple(attr(name) for name in names)
        self.getter = operator.attrgetter(*self.identity)  # with one field: its value; else a tuple
        time_field = rule.time.field
        self.time_field = attr(time_field) if time_field not in ("arrival", "default") else None
        self.time_format = rule.time.format
        self.targets: dict[Any, LineTarget] = {}

    @staticmethod
    def supported(rule: RouteRule) -> bool:
        if rule.when_field is not None and not _top_level(rule.when_field):
            return False
        if rule.device is not None and (rule.device.kind != "field" or not _top_level(rule.device.arg)):
            return False
        if rule.key.kind not in ("default", "none", "device", "field"):
            return False
        if rule.key.kind == "field" and not _top_level(rule.key.arg):
            return False
        return rule.time.field in ("arrival", "default") or _top_level(rule.time.field)


class JsonLinePlan(LinePlan):
    def __init__(self, routes: SourceRoutes, rules: Sequence[RouteRule]) -> None:
        super().__init__(routes)
        names: dict[str, str] = {}  # JSON field name -> struct attribute

        def attr(name: str) -> str:
            return names.setdefault(name, f"f{len(names)}")

        self._rules = [_JsonRule(rule, attr) for rule in rules]
        # gc=False: a decoded line's fields cannot refer back to it (no cycle), so the collector need not
        # track the ~1,000 structs of each read (tracked, they start a generation-0 collection every ~700)
        fields = msgspec.defstruct(
            "LineFields", [(a, Any, None) for a in names.values()], rename={a: n for n, a in names.items()},
            gc=False,
        )
        self._decode = msgspec.json.Decoder(fields).decode
        self._guards = [(r.guard, r) for r in self._rules[:-1] if r.guard is not None]
        self._guard_getters = [operator.attrgetter(r.guard) for r in self._rules[:-1] if r.guard is not None]
        self._final = self._rules[-1]
        self._timed = any(r.time_field is not None for r in self._rules)

    @classmethod
    def build(cls, routes: SourceRoutes, rules: Sequence[RouteRule]) -> JsonLinePlan | None:
        return cls(routes, rules) if all(_JsonRule.supported(rule) for rule in rules) else None

    def _documents(self, lines: Sequence[bytes]) -> list[Any]:
        """Per line its fields struct, or None when the line is for ``route_each``."""
        decode = self._decode
        try:
            docs: list[Any] = list(map(decode, lines))
        except Exception:  # some line is not for the plan (msgspec.DecodeError, RecursionError…): find which
            docs = []
            for line in lines:
                try:
                    docs.append(decode(line))
                except Exception:
                    docs.append(None)
        joined = b"\n".join(lines)
        suspect = max(map(len, lines)) >= _SHORT_LINE and (
            joined.translate(_DIGITS_TO_9).find(_LONG_DIGITS) >= 0  # not `in`: see formats.parse_json
        )
        if not suspect and not joined.isascii():
            try:
                joined.decode("utf-8")
            except UnicodeDecodeError:
                suspect = True
        if suspect:
            for i, line in enumerate(lines):
                if docs[i] is not None and not _utf8_short_digits(line):
                    docs[i] = None
        return docs

    def route(self, lines: Sequence[bytes], arrival_ms: int,
              columns: tuple[str, ...] | None = None) -> tuple[list[LineTarget | None], list[int] | None]:
        docs = self._documents(lines)
        final = self._final
        if final.time_field is None and len(final.identity) == 1 and None not in docs and all(
            list(map(getter, docs)).count(None) == len(docs) for getter in self._guard_getters
        ):
            # The usual read: every line decoded, no guard applies, the target keyed on one field.
            try:
                out: list[LineTarget | None] = list(map(final.targets.get, map(final.getter, docs)))
            except TypeError:  # an unhashable value (a JSON array or object): per line below
                pass
            else:
                if None in out:
                    for index, target in enumerate(out):
                        if target is None:
                            out[index] = self._target(final, docs[index], lines[index], arrival_ms)
                return out, None
        return self._route_each_line(lines, docs, arrival_ms)

    def _route_each_line(
        self, lines: Sequence[bytes], docs: list[Any], arrival_ms: int
    ) -> tuple[list[LineTarget | None], list[int] | None]:
        final = self._final
        guards = self._guards
        out: list[LineTarget | None] = []
        append = out.append
        stamps: list[int] | None = [] if self._timed else None
        for index, doc in enumerate(docs):
            target = None
            stamp = arrival_ms
            if doc is not None:
                rule = final
                for guard, guarded in guards:
                    if getattr(doc, guard) is not None:
                        rule = guarded
                        break
                target = self._target(rule, doc, lines[index], arrival_ms)
                if target is not None and rule.time_field is not None:
                    try:
                        stamp = event_time_ms(getattr(doc, rule.time_field), rule.time_format)
                    except Exception:  # the rule rejects this line: route_each says why
                        target = None
            append(target)
            if stamps is not None:
                stamps.append(stamp)
        return out, stamps

    def _target(self, rule: _JsonRule, doc: Any, line: bytes, arrival_ms: int) -> LineTarget | None:
        identity = rule.identity
        if len(identity) == 1:
            value = getattr(doc, identity[0])
            kind = type(value)
            if kind is str:
                cache_key: Any = value
            elif kind in _SCALARS:
                cache_key = (kind, value)
            else:
                return None
        else:
            values = [getattr(doc, name) for name in identity]
            if any(type(v) not in _SCALARS for v in values):
                return None
            cache_key = tuple((type(v), v) for v in values)
        target = rule.targets.get(cache_key)
        if target is None:
            if len(rule.targets) >= _CACHE_MAX:
                rule.targets.clear()
            stamp = arrival_ms
            if rule.time_field is not None:
                try:
                    stamp = event_time_ms(getattr(doc, rule.time_field), rule.time_format)
                except Exception:
                    return None  # not learned from a line its rule rejects
            target = rule.targets[cache_key] = self._learn(line, arrival_ms, rule.rule.topic, stamp) or _SLOW
        return None if target is _SLOW else target


def _utf8_short_digits(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return line.translate(_DIGITS_TO_9).find(_LONG_DIGITS) < 0


# ---------------------------------------------------------------- InfluxDB line protocol


class InfluxLinePlan(LinePlan):
    def __init__(self, routes: SourceRoutes, rule: RouteRule) -> None:
        super().__init__(routes)
        self._rule = rule
        time = rule.time
        # How a line's timestamp becomes event time: "arrival", or through the rule's format.
        self._time_format = (
            None if time.field == "arrival" else "epoch_ns" if time.field == "default" else time.format
        )
        self._series: dict[bytes, LineTarget] = {}
        self._shapes: dict[bytes, bool] = {}
        self._arrival_ms = 0

    @classmethod
    def build(cls, routes: SourceRoutes, rule: RouteRule) -> InfluxLinePlan | None:
        if rule.key.kind not in ("default", "series", "tag", "none", "device"):
            return None
        if rule.device is not None and rule.device.kind != "tag":
            return None
        if rule.time.field not in ("arrival", "default", "timestamp"):
            return None
        return cls(routes, rule)

    def route(self, lines: Sequence[bytes], arrival_ms: int,
              columns: tuple[str, ...] | None = None) -> tuple[list[LineTarget | None], list[int] | None]:
        if len(self._series) >= _CACHE_MAX:
            self._series.clear()
        if len(self._shapes) >= _CACHE_MAX:
            self._shapes.clear()
        self._arrival_ms = arrival_ms  # for _learn_series
        return _kernels.route_influx_lines(
            lines if isinstance(lines, list) else list(lines), arrival_ms, self._time_format, self._series,
            self._shapes, self._learn_series, _valid_fields, event_time_ms, _SLOW,
        )

    def _learn_series(self, series: bytes, line: bytes, stamp: int) -> LineTarget:
        # A series starting with whitespace could make a line whose fields start with '#' a comment.
        if not series or series[:1].isspace():
            return _SLOW
        return self._learn(line, self._arrival_ms, self._rule.topic, stamp) or _SLOW


def _valid_fields(shape: bytes) -> bool:
    """Whether a field section of this shape (digits as 9) parses (see the module docstring)."""
    if not shape:
        return False
    try:
        parse_influx(b"m " + shape)
    except PayloadError:
        return False
    return True
