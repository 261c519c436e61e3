"""CSV rows routed a read at a time (ingest/csv_lines.py) get the verdicts ``SourceRoutes.route`` gives them.

Differential, as tests/ingest/test_line_routes.py does for NDJSON and InfluxDB: random, malformed and
hostile rows under several headers and rule chains go through the plan and the old route; a row the plan
takes must get from the old route exactly one record of the row with the plan's topic, device, key,
headers and event time, and the plan must take the well-formed rows. The sink-level tests compare what
``ingest_lines`` and ``ingest`` store, and ``LineStream.lines`` against ``LineStream.messages``.
"""

from __future__ import annotations

import csv

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker import native
from broker.log.memory import MemoryLogStore
from ingest import csv_lines, line_writes
from ingest import sink as sink_module
from ingest.csv_lines import CsvLinePlan
from ingest.health import HealthRegistry
from ingest.line_routes import line_plan
from ingest.router import Router, SourceRoutes
from ingest.routing import KeySpec, RawMessage, RouteDefaults, RouteRule, SourceRef, TimeSpec
from ingest.sink import IngestSink
from ingest.tcp.framing import LineFramer, LineTooLong
from ingest.tcp.lines import LineStream
from tests.ingest.conftest import read_all

ARRIVAL = 1_700_000_000_123
CSV_SOURCE = SourceRef("tcp", "default", "csv")
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


@pytest.fixture(params=["selected", "pure"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The compiled kernels (when built) and their pure source."""
    if request.param == "pure":
        pure_kernels = native.pure("ingest.line_kernels")
        monkeypatch.setattr(csv_lines, "_kernels", pure_kernels)
        monkeypatch.setattr(line_writes, "_kernels", pure_kernels)
        monkeypatch.setattr(sink_module, "_encode_prepared",
                            native.pure("broker.protocol.prepared_records").encode_prepared_records)
    return str(request.param)


def _routers() -> list[Router]:
    """The default routes (with the JSON sensor rule a CSV row never takes), a key and device field, event
    time from a column (epoch ms, RFC 3339), a CSV guard, keyless rows."""
    sensors = RouteDefaults(sensors_topic="sensors")
    by_serial = [RouteRule("serials", "serials", "tcp", key=KeySpec("field", "serial"),
                           device=KeySpec("field", "serial"), time=TimeSpec("ts", "epoch_ms"))]
    guarded = [
        RouteRule("alarms", "alarms", "tcp", key=KeySpec("field", "alarm"), time=TimeSpec("when", "rfc3339"),
                  when_field="alarm", format="csv"),
        RouteRule("rest", "rest", "tcp", key=KeySpec("device")),
    ]
    keyless = [RouteRule("keyless", "keyless", "tcp", key=KeySpec("none"))]
    return [Router([], sensors), Router(by_serial, sensors), Router(guarded, sensors), Router(keyless)]


HEADERS: list[tuple[str, ...]] = [
    ("device_id", "ts", "temp"),
    ("serial", "ts", "device_id", "sensor"),
    ("alarm", "when", "device_id"),
    ("temp",),
    ("a.b", "device_id", "ts", "when", "serial", "alarm"),
]


def _verdicts(routes: SourceRoutes, lines: list[bytes], columns: tuple[str, ...]
              ) -> tuple[list[object], list[object], list[bool]]:
    """(old verdict per row, new verdict per row, whether the plan took the row), the plan's verdicts from a
    second read of the rows (the first learned their targets) and from the rows in reverse order after that."""
    plan = line_plan(routes)
    assert isinstance(plan, CsvLinePlan)
    first = plan.route(lines, ARRIVAL, columns)
    again = plan.route(lines, ARRIVAL, columns)
    assert again == first
    backwards = plan.route(lines[::-1], ARRIVAL, columns)
    assert (backwards[0][::-1], backwards[1][::-1] if backwards[1] is not None else None) == first
    targets, stamps = first
    assert len(targets) == len(lines) and (stamps is None or len(stamps) == len(lines))
    old: list[object] = []
    new: list[object] = []
    for index, (line, target) in enumerate(zip(lines, targets, strict=True)):
        old.append(routes.route(RawMessage(line, None, None, ARRIVAL, columns)))
        if target is None:
            new.append(old[-1])  # the sink routes it the old way
        else:
            stamp = stamps[index] if stamps is not None else ARRIVAL
            new.append([(target.topic, target.device, (line, target.key, target.headers, stamp))])
    return old, new, [t is not None for t in targets]


_fields = st.sampled_from([
    "dev-1", "dev-2", "7", "007", "7.0", "-3", "1e3", "nan", "inf", "", " 5 ", "1700000000000", "1700000000000.5",
    "-1", "2024-05-01T12:00:00Z", "1960-01-01T00:00:00Z", "é", "x y", "1_0", "99999999999999999999", "\t",
]) | st.text(alphabet="ab1,.-\"\r\\ \x00é", max_size=4)


@st.composite
def _rows(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return draw(st.binary(max_size=20)).replace(b"\n", b" ")
    row = ",".join(draw(st.lists(_fields, min_size=1, max_size=7))).encode()
    if kind == 1 and row:  # a byte inserted somewhere
        at = draw(st.integers(0, len(row)))
        row = row[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b'"', b"\r", b",", b" "])) + row[at:]
    return row


def _well_formed(i: int, columns: tuple[str, ...]) -> bytes:
    values = {"device_id": f"dev-{i % 7}", "ts": str(1_700_000_000_000 + i), "temp": f"{i / 3:.2f}",
              "serial": str(i % 4), "sensor": f"s{i % 3}", "alarm": f"al{i % 2}",
              "when": f"2024-05-01T12:00:{i % 60:02d}Z", "a.b": "x"}
    return ",".join(values[name] for name in columns).encode()


@pytest.mark.usefixtures("kernels")
@pytest.mark.parametrize("router_index", range(4))
@settings(max_examples=40, suppress_health_check=_SLOW_OK, deadline=None)
@given(lines=st.lists(_rows(), min_size=1, max_size=12), header=st.sampled_from(HEADERS))
@example(lines=[b"7,1,2", b"007,1,2", b"7.0,1,2", b" 7 ,1,2", b"d,\xff,2", b'd,"1",2', b"d,1,2\r", b"d,1"],
         header=HEADERS[0])
@example(lines=[b"d,1,2", b'd,"x,2', b'd,1,"', b"d,1,2\r", b"d,\xff,2", b"e,1,2", b"\xc3,1,2"], header=HEADERS[0])
@example(lines=[b"1,1700000000000,d,s", b"1,x,d,s", b"1,1e400,d,s", b"1,-5,d,s", b"nan,1,d,s"], header=HEADERS[1])
@example(lines=[b"a,2024-05-01T12:00:00Z,d", b"a,1960-01-01T00:00:00Z,d", b"a,bad,d", b",,"], header=HEADERS[2])
def test_rows_get_the_old_verdicts(router_index: int, lines: list[bytes], header: tuple[str, ...]) -> None:
    routes = _routers()[router_index].for_source(CSV_SOURCE)
    old, new, _ = _verdicts(routes, lines, header)
    assert new == old


@pytest.mark.usefixtures("kernels")
@pytest.mark.parametrize("router_index", range(4))
@pytest.mark.parametrize("header", HEADERS)
def test_plan_takes_well_formed_rows(router_index: int, header: tuple[str, ...]) -> None:
    routes = _routers()[router_index].for_source(CSV_SOURCE)
    lines = [_well_formed(i, header) for i in range(40)]
    old, new, taken = _verdicts(routes, lines, header)
    assert new == old
    rejected = any(not isinstance(verdict, list) or len(verdict) != 1 or not isinstance(verdict[0], tuple)
                   for verdict in old)
    assert all(taken) != rejected  # every row the old route stores as it came is taken; a refused one is not


def test_rows_before_a_header_and_chains_without_a_plan() -> None:
    routes = _routers()[0].for_source(CSV_SOURCE)
    plan = line_plan(routes)
    assert isinstance(plan, CsvLinePlan)
    assert plan.route([b"a,b"], ARRIVAL, None) == ([None], None)
    for rules in ([RouteRule("copy", "copies", "tcp", fan_out=True)], [RouteRule("t", "t-{0}", "tcp")],
                  [RouteRule("j", "j", "tcp", value="json")], [RouteRule("j", "j", "tcp", format="json")],
                  [RouteRule("i", "i", "tcp", format="influx", when_field="x"), RouteRule("r", "r", "tcp")]):
        assert line_plan(Router(rules).for_source(CSV_SOURCE)) is None


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab1,. \t\x00\x0b\x1c\x85\u2028é'\\;|")), max_size=12))
def test_rows_without_quotes_or_cr_split_on_commas_as_the_csv_module_reads_them(text: str) -> None:
    """The plan's parse (csv_lines' docstring): rows without '"' and CR."""
    if text:
        assert next(csv.reader([text], strict=True)) == text.split(",")


# ---------------------------------------------------------------- the sink and the line stream


def _stored(store: MemoryLogStore) -> dict[tuple[str, int], list[tuple[object, ...]]]:
    out: dict[tuple[str, int], list[tuple[object, ...]]] = {}
    for info in store.list_topics(include_internal=True):
        for partition, recs in read_all(store, info.name).items():
            out[(info.name, partition)] = [(r.key, r.value, r.headers, r.timestamp) for r in recs]
    return out


@pytest.mark.usefixtures("kernels")
@settings(max_examples=30, suppress_health_check=_SLOW_OK, deadline=None)
@given(lines=st.lists(_rows(), min_size=1, max_size=10), router_index=st.integers(0, 3),
       header=st.sampled_from(HEADERS))
async def test_ingest_lines_stores_what_ingest_stores(lines: list[bytes], router_index: int,
                                                      header: tuple[str, ...]) -> None:
    good = [_well_formed(i, header) for i in range(8)]
    lines = good + lines + good
    router = _routers()[router_index]
    stores = [MemoryLogStore(default_partitions=3), MemoryLogStore(default_partitions=3)]
    sinks = [IngestSink(store, router, HealthRegistry(clock=lambda: 1000.0)) for store in stores]
    await sinks[0].ingest(CSV_SOURCE, [RawMessage(line, None, None, ARRIVAL, header) for line in lines])
    await sinks[1].ingest_lines(CSV_SOURCE, lines, ARRIVAL, header)
    assert _stored(stores[1]) == _stored(stores[0])
    assert sinks[1].dead_lettered == sinks[0].dead_lettered
    assert sinks[1].messages_written == sinks[0].messages_written == len(lines)
    assert sinks[1].health.snapshot() == sinks[0].health.snapshot()


@settings(max_examples=150, deadline=None)
@given(chunks=st.lists(st.binary(max_size=30) | st.sampled_from(
    [b"\n\n", b"  \n", b"a,b\n", b"a,,b\n", b"a,a\n", b'"x\n', b"1,2\r\n", b"#c\n"]), max_size=8))
def test_csv_line_stream_lines_are_the_messages_payloads(chunks: list[bytes]) -> None:
    """``lines`` reads the header as ``messages`` does (a broken one is left to ``messages``, which
    dead-letters it), skips what it skips, and numbers the lines alike."""
    framers = [LineFramer(16), LineFramer(16)]
    streams = [LineStream("csv"), LineStream("csv")]
    for chunk in [*chunks, None]:
        items = [framer.feed(chunk) if chunk is not None else framer.end() for framer in framers]
        messages, _ = streams[0].messages(items[0], ARRIVAL)
        lines = streams[1].lines(items[1])
        if lines is None:
            assert any(isinstance(item, LineTooLong) for item in items[1]) or streams[1].columns is None
            again, _ = streams[1].messages(items[1], ARRIVAL)
            assert again == messages
        else:
            assert all(isinstance(m, RawMessage) and m.columns == streams[1].columns for m in messages)
            assert lines == [m.payload for m in messages if isinstance(m, RawMessage)]
        assert streams[1].line_no == streams[0].line_no
        assert streams[1].columns == streams[0].columns
