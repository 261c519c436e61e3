"""Line plans (ingest/line_routes.py) give every line the verdict ``SourceRoutes.route`` gives it.

Differential: random, malformed and hostile NDJSON and InfluxDB lines go through both; for each line
the plan takes, the old route must give exactly one record of that line with the plan's topic, device,
key, headers and event time. Lines the plan leaves are routed the old way by the sink, so their verdict
is the old one by construction; the tests also check that the plan does take the well-formed lines
(a plan that took nothing would pass the comparison and speed nothing up). The sink-level tests compare
what ``ingest_lines`` and ``ingest`` store (records per partition in order, dead letters, health).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker import native
from broker.log.memory import MemoryLogStore
from broker.protocol import prepared_records
from broker.protocol.prepared_records import encode_prepared_records
from broker.protocol.records import encode_headers, encode_key, encode_record_tuples
from ingest import line_kernels, line_routes, line_writes
from ingest import sink as sink_module
from ingest.health import HealthRegistry
from ingest.line_routes import InfluxLinePlan, JsonLinePlan, line_plan
from ingest.router import Router, SourceRoutes
from ingest.routing import KeySpec, RawMessage, RouteDefaults, RouteRule, SourceRef, TimeSpec
from ingest.sink import IngestSink
from ingest.tcp.framing import LineFramer, LineTooLong
from ingest.tcp.lines import LineStream
from tests.ingest.conftest import read_all

ARRIVAL = 1_700_000_000_123
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]  # the kernels fixture is per test


@pytest.fixture(params=["selected", "pure"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The tests that run the kernels run with the selected ones (compiled when built) and their pure source
    (the NDJSON plan's routing uses none)."""
    if request.param == "pure":
        pure_kernels = native.pure("ingest.line_kernels")
        monkeypatch.setattr(line_routes, "_kernels", pure_kernels)
        monkeypatch.setattr(line_writes, "_kernels", pure_kernels)
        encode = native.pure("broker.protocol.prepared_records").encode_prepared_records
        monkeypatch.setattr(sink_module, "_encode_prepared", encode)
    return str(request.param)
JSON_SOURCE = SourceRef("tcp", "default", "json")
INFLUX_SOURCE = SourceRef("tcp", "default", "influx")


def _json_routers() -> list[Router]:
    sensors = RouteDefaults(sensors_topic="sensors")
    custom = [
        RouteRule("serials", "serials", "tcp", key=KeySpec("field", "serial"), device=KeySpec("field", "serial"),
                  time=TimeSpec("t", "epoch_s"), when_field="serial"),
        RouteRule("rest", "rest", "tcp", key=KeySpec("field", "device_id"), time=TimeSpec("ts", "rfc3339")),
    ]
    keyless = [RouteRule("keyless", "keyless", "tcp", key=KeySpec("none"))]
    return [Router([], sensors), Router([], RouteDefaults()), Router(custom, sensors), Router(keyless, sensors)]


def _influx_routers() -> list[Router]:
    by_host = [RouteRule("hosts", "hosts", "tcp", key=KeySpec("tag", "host"), device=KeySpec("tag", "host"),
                         time=TimeSpec("timestamp", "epoch_s"))]
    arrival = [RouteRule("arrival", "arrival", "tcp", key=KeySpec("series"), time=TimeSpec("arrival"))]
    return [Router([], RouteDefaults(sensors_topic="sensors")), Router(by_host), Router(arrival)]


def _verdicts(routes: SourceRoutes, lines: list[bytes]) -> tuple[list[object], list[object], list[bool]]:
    """(old verdict per line, new verdict per line, whether the plan took the line)."""
    plan = line_plan(routes)
    assert plan is not None
    targets, stamps = plan.route(lines, ARRIVAL)
    assert len(targets) == len(lines) and (stamps is None or len(stamps) == len(lines))
    old: list[object] = []
    new: list[object] = []
    for index, (line, target) in enumerate(zip(lines, targets, strict=True)):
        old.append(routes.route(RawMessage(line, None, None, ARRIVAL)))
        if target is None:
            new.append(old[-1])  # the sink routes it the old way
        else:
            stamp = stamps[index] if stamps is not None else ARRIVAL
            new.append([(target.topic, target.device, (line, target.key, target.headers, stamp))])
    return old, new, [t is not None for t in targets]


# ---------------------------------------------------------------- NDJSON

_ids = st.one_of(st.text(max_size=6), st.integers(-5, 5), st.floats(allow_nan=False), st.booleans(), st.none(),
                 st.lists(st.integers(), max_size=2), st.just("dev-1"), st.just("\ud800"))
_times = st.one_of(st.integers(-5, 2**60), st.floats(), st.text(max_size=8), st.just("2024-05-01T12:00:00Z"),
                   st.just(1_700_000_000), st.none())
_extra = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=5)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_inserted = st.sampled_from([b"\xff", b"\xc3", b'"', b"\\", b",", b"}", b" ", b"\t", b"\x00"])


@st.composite
def _json_lines(draw: st.DrawFn) -> bytes:
    doc: dict[str, object] = {}
    for name, values in (("device_id", _ids), ("sensor", _ids), ("serial", _ids), ("ts", _times), ("t", _times)):
        if draw(st.booleans()):
            doc[name] = draw(values)
    doc.update(draw(st.dictionaries(st.sampled_from(["x", "device_id", "v", "ts"]), _extra, max_size=2)))
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()), allow_nan=True)
    line = text.encode("utf-8", "surrogatepass")
    mutation = draw(st.integers(0, 5))
    if mutation == 1 and line:  # truncated
        line = line[: draw(st.integers(0, len(line) - 1))]
    elif mutation == 2:  # a byte inserted somewhere
        at = draw(st.integers(0, len(line)))
        line = line[:at] + draw(_inserted) + line[at:]
    elif mutation == 3:
        line = draw(st.binary(max_size=30))
    return line.replace(b"\n", b" ")


def _well_formed_json(i: int) -> bytes:
    return json.dumps({"device_id": f"dev-{i % 7}", "ts": 1_700_000_000_000 + i, "temp": i / 3}).encode()


@pytest.mark.parametrize("router_index", range(4))
@settings(max_examples=40, suppress_health_check=_SLOW_OK, deadline=None)
@given(lines=st.lists(_json_lines(), min_size=1, max_size=12))
@example(lines=[b'{"device_id":"a","x":"\xff"}'])  # msgspec does not check the UTF-8 of skipped strings
@example(lines=[b'{"device_id":"a","n":1234567890123456789012}'])  # orjson's float vs the stdlib's int
@example(lines=[b'{"device_id":"a","v":NaN}', b'{"device_id":1e400}', b'{"device_id":"\\ud800"}'])
@example(lines=[b'{"device_id":"a","device_id":"b"}', b'{"device\\u005fid":"c"}', b'{"sensor":null}'])
@example(lines=[b'{"device_id":true}', b'{"device_id":1}', b'{"device_id":1.0}', b'{"device_id":"1"}'])
@example(lines=[b'{"x":' + b"[" * 1100 + b"]" * 1100 + b"}", b"[1]", b'"s"', b"{}", b"\xef\xbb\xbf{}"])
# more digits than the stdlib's int() converts (parse_json's path for 19+ digits refuses it, msgspec skips it),
# and deep nesting with a long number: lines of 400+ bytes, which the digit screen checks
@example(lines=[b'{"device_id":"a","n":1}', b'{"device_id":"a","n":' + b"1" * 5000 + b"}"])
@example(lines=[b'{"device_id":"a","n":1}', b'{"device_id":"a","x":' + b"[" * 980 + b"1" * 20 + b"]" * 980 + b"}"])
def test_json_lines_get_the_old_verdicts(router_index: int, lines: list[bytes]) -> None:
    routes = _json_routers()[router_index].for_source(JSON_SOURCE)
    old, new, _ = _verdicts(routes, lines)
    assert new == old


@pytest.mark.usefixtures("kernels")
@pytest.mark.parametrize("router_index", range(4))
def test_json_plan_takes_well_formed_lines(router_index: int) -> None:
    routes = _json_routers()[router_index].for_source(JSON_SOURCE)
    assert isinstance(line_plan(routes), JsonLinePlan)
    lines = [_well_formed_json(i) for i in range(50)]
    old, new, taken = _verdicts(routes, lines)
    assert new == old
    if router_index == 2:  # its catch-all reads "ts" as RFC 3339: epoch ms are rejected (the old way)
        assert not any(taken)
        lines = [json.dumps({"device_id": f"d{i % 3}", "ts": f"2024-05-01T12:00:{i:02d}Z"}).encode() for i in range(20)]
        serials = [json.dumps({"serial": i % 4, "t": 1_700_000_000 + i}).encode() for i in range(20)]
        old, new, taken = _verdicts(routes, serials + lines)
        assert new == old and all(taken)
        return
    assert all(taken)
    sensors = [json.dumps({"sensor": f"s{i % 3}", "ts": 1_700_000_000_000 + i}).encode() for i in range(20)]
    old, new, taken = _verdicts(routes, sensors + lines[:5])
    assert new == old and all(taken)


# ---------------------------------------------------------------- InfluxDB line protocol

_names = st.text(alphabet="abcxyz_-019 ,=\\\"#\t\xe9", min_size=0, max_size=5)
_values = st.sampled_from([
    "1", "-1.5", "1e3", "9e99", "1e400", "1_0", "12i", "-12i", "9223372036854775807i", "-9223372036854775809i",
    "18446744073709551615u", "18446744073709551616u", "-1u", "t", "FALSE", "true", '"str"', '"a b"', '"x=1"', "nan",
    "inf", "0x10", ".5", "5.", "", "1e", "--1", "12", "0", "99999999999999999999i", "١", "1 2",
])
_stamps = st.sampled_from(["", " 1700000000000000000", " 1700000000", " -5", " +5", " 1_0", " 99999999999999999999999",
                           " x", "  1", " 1700000000000000000 ", " 17000000000000000000000000"])


@st.composite
def _influx_lines(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 6)) == 0:
        return draw(st.binary(max_size=30)).replace(b"\n", b" ")
    measurement = draw(st.sampled_from(["weather", "m", "#c", " m", "a\\ b", "é"]) | _names)
    tags = draw(st.lists(st.tuples(st.sampled_from(["device_id", "host", "device", "t"]) | _names,
                                   st.sampled_from(["d1", "h-2", ""]) | _names), max_size=3))
    fields = draw(st.lists(st.tuples(st.sampled_from(["temp", "hum", "v1", "v2"]) | _names, _values), max_size=3))
    series = measurement + "".join(f",{k}={v}" for k, v in tags)
    line = f"{series} {','.join(f'{k}={v}' for k, v in fields)}{draw(_stamps)}"
    return line.encode().replace(b"\n", b" ")


def _well_formed_influx(i: int, stamp: int = 1_700_000_000_000_000_000) -> bytes:
    return f"weather,device_id=dev-{i % 7},host=h{i % 3} temp={i / 3},n={i}i,ok=t {stamp + i}".encode()


@pytest.mark.usefixtures("kernels")
@pytest.mark.parametrize("router_index", range(3))
@settings(max_examples=40, suppress_health_check=_SLOW_OK, deadline=None)
@given(lines=st.lists(_influx_lines(), min_size=1, max_size=12))
@example(lines=[b"m,t=1 f=1 5", b"m,t=1 f=1e400 5", b"m,t=1 f=9e99 5", b"m,t=1 f=1_0 5", b"m,t=1 f=1,f=2 5"])
@example(lines=[b"\t g=1 5", b"\t #f=1 5", b"# comment here", b"m f=1\r", b"m f=1 5\r"])
@example(lines=[b"m,t=1 a=9223372036854775807i 5", b"m,t=1 a=1223372036854775807i 5",
                b"m,t=1 a=9999999999999999999i 5", b"m,t=1 a=1999999999999999999i 5"])
@example(lines=[b"m,t=1 a=1 9007199254740991999999", b"m,t=1 a=1 9007199254740992000000"])
@example(lines=[b"m,t=\xff f=1 5", b"m,t=1 \xff=1 5", b'm,t=1 s="x y" 5', b"m\\,x,t=1 f=1 5", b"m,t=1,t=2 f=1"])
def test_influx_lines_get_the_old_verdicts(router_index: int, lines: list[bytes]) -> None:
    routes = _influx_routers()[router_index].for_source(INFLUX_SOURCE)
    old, new, _ = _verdicts(routes, lines)
    assert new == old


@pytest.mark.usefixtures("kernels")
@pytest.mark.parametrize("router_index", range(3))
def test_influx_plan_takes_well_formed_lines(router_index: int) -> None:
    routes = _influx_routers()[router_index].for_source(INFLUX_SOURCE)
    assert isinstance(line_plan(routes), InfluxLinePlan)
    stamp = 1_700_000_000 if router_index == 1 else 1_700_000_000_000_000_000  # router 1 reads seconds
    lines = [_well_formed_influx(i, stamp) for i in range(50)] + [b"cpu,host=h1 load=0.5", b"cpu,host=h1 load=1.25"]
    old, new, taken = _verdicts(routes, lines)
    assert new == old and all(taken)


def test_rules_without_a_plan_route_every_line_alone() -> None:
    fan_out = RouteRule("copy", "copies", "tcp", fan_out=True)
    template = RouteRule("tpl", "t-{0}", "tcp")
    reencoded = RouteRule("json", "json", "tcp", value="json")
    nested = RouteRule("nested", "n", "tcp", key=KeySpec("field", "meta.id"))
    for rules in ([fan_out], [template], [reencoded], [nested]):
        assert line_plan(Router(rules).for_source(JSON_SOURCE)) is None
    assert line_plan(Router([]).for_source(SourceRef("tcp", "default", "raw"))) is None  # CSV: test_csv_lines


# ---------------------------------------------------------------- the sink and the line stream


def _stored(store: MemoryLogStore) -> dict[tuple[str, int], list[tuple[object, ...]]]:
    out: dict[tuple[str, int], list[tuple[object, ...]]] = {}
    for info in store.list_topics(include_internal=True):
        topic = info.name
        for partition, recs in read_all(store, topic).items():
            out[(topic, partition)] = [(r.key, r.value, r.headers, r.timestamp) for r in recs]
    return out


async def _both_ways(router: Router, source: SourceRef, lines: list[bytes]) -> None:
    stores = [MemoryLogStore(default_partitions=3), MemoryLogStore(default_partitions=3)]
    sinks = [IngestSink(store, router, HealthRegistry(clock=lambda: 1000.0)) for store in stores]
    await sinks[0].ingest(source, [RawMessage(line, None, None, ARRIVAL) for line in lines])
    await sinks[1].ingest_lines(source, lines, ARRIVAL)
    assert _stored(stores[1]) == _stored(stores[0])
    assert sinks[1].dead_lettered == sinks[0].dead_lettered
    assert sinks[1].messages_written == sinks[0].messages_written == len(lines)
    assert sinks[1].health.snapshot() == sinks[0].health.snapshot()


@pytest.mark.usefixtures("kernels")
@settings(max_examples=30, suppress_health_check=_SLOW_OK, deadline=None)
@given(lines=st.lists(_json_lines(), min_size=1, max_size=10), router_index=st.integers(0, 3))
async def test_ingest_lines_stores_what_ingest_stores_json(lines: list[bytes], router_index: int) -> None:
    good = [_well_formed_json(i) for i in range(8)]
    await _both_ways(_json_routers()[router_index], JSON_SOURCE, good + lines + good)


@pytest.mark.usefixtures("kernels")
@settings(max_examples=30, suppress_health_check=_SLOW_OK, deadline=None)
@given(lines=st.lists(_influx_lines(), min_size=1, max_size=10), router_index=st.integers(0, 2))
async def test_ingest_lines_stores_what_ingest_stores_influx(lines: list[bytes], router_index: int) -> None:
    good = [_well_formed_influx(i) for i in range(8)]
    await _both_ways(_influx_routers()[router_index], INFLUX_SOURCE, good + lines + good)


@pytest.mark.usefixtures("kernels")
async def test_refused_topic_and_refused_append_become_dead_letters_on_both_paths() -> None:
    from broker.log.config import TopicConfig

    router = Router([], RouteDefaults())
    lines = [_well_formed_json(i) for i in range(5)] + [b'{"device_id": "big", "x": "' + b"x" * 10000 + b'"}']
    for options in ({"auto_create_topics": False}, {"default_config": TopicConfig(max_message_bytes=8192)}):
        stores = [MemoryLogStore(**options), MemoryLogStore(**options)]
        for store in stores:
            if not options.get("auto_create_topics", True):
                store.create_topic("_dead_letters")
        sinks = [IngestSink(store, router, HealthRegistry(clock=lambda: 1000.0)) for store in stores]
        await sinks[0].ingest(JSON_SOURCE, [RawMessage(line, None, None, ARRIVAL) for line in lines])
        await sinks[1].ingest_lines(JSON_SOURCE, lines, ARRIVAL)
        assert sinks[0].dead_lettered > 0
        assert _stored(stores[1]) == _stored(stores[0])
        assert sinks[1].dead_lettered == sinks[0].dead_lettered


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(st.binary(max_size=40) | st.sampled_from([b"\n\n", b"  \n", b"#c\n", b" # c\n", b"a b\r\n"]),
                       max_size=8), fmt=st.sampled_from(["ndjson", "influx", "raw"]))
def test_line_stream_lines_are_the_messages_payloads(chunks: list[bytes], fmt: str) -> None:
    framers = [LineFramer(16), LineFramer(16)]
    streams = [LineStream(fmt), LineStream(fmt)]
    for chunk in [*chunks, None]:
        items = [framer.feed(chunk) if chunk is not None else framer.end() for framer in framers]
        messages, _ = streams[0].messages(items[0], ARRIVAL)
        lines = streams[1].lines(items[1])
        if lines is None:
            assert any(isinstance(item, LineTooLong) for item in items[1])
            streams[1].messages(items[1], ARRIVAL)
        else:
            assert lines == [m.payload for m in messages if isinstance(m, RawMessage)]
            assert len(lines) == len(messages)
        assert streams[1].line_no == streams[0].line_no


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.tuples(st.binary(max_size=300), st.none() | st.binary(max_size=20),
                                  st.sampled_from([(), (("source", b"tcp:x"),), (("a", None), ("device", b"d"))]),
                                  st.integers(0, 2**41)), min_size=1, max_size=40))
def test_prepared_records_encode_like_record_tuples(records: list[tuple[bytes, bytes | None, tuple, int]]) -> None:
    prepared = [(value, encode_key(key), encode_headers(headers), ts) for value, key, headers, ts in records]
    expected = encode_record_tuples(records)
    assert native.pure("broker.protocol.prepared_records").encode_prepared_records(prepared) == expected
    assert native.select(prepared_records).encode_prepared_records(prepared) == expected


@settings(max_examples=100, deadline=None)
@given(records=st.lists(st.tuples(st.binary(max_size=300), st.none() | st.binary(max_size=20),
                                  st.sampled_from([(), (("source", b"tcp:x"),), (("a", None), ("device", b"d"))]),
                                  st.integers(0, 2**41), st.booleans()), min_size=1, max_size=40),
       stamped=st.booleans(), cut=st.tuples(st.integers(0, 40), st.integers(0, 40)))
def test_line_groups_encode_like_prepared_records(
    records: list[tuple[bytes, bytes | None, tuple, int, bool]], stamped: bool, cut: tuple[int, int]
) -> None:
    """A LineGroup's batch (lines with their targets' key and headers, and records routed alone) is the
    batch of the same records as PreparedRecords, for any run of them, compiled and pure."""
    start, end = sorted(min(c, len(records)) for c in cut)
    if start == end:
        start, end = 0, len(records)
    for module in (native.select(line_kernels), native.pure("ingest.line_kernels")):
        group = module.LineGroup("t", 0)
        lines: list[bytes] = []
        targets: list[object] = []
        stamps: list[int] = []
        prepared = []
        for index, (value, key, headers, ts, alone) in enumerate(records):
            ts = ts if stamped or alone else ARRIVAL  # a record routed alone has its own time either way
            prepared.append((value, encode_key(key), encode_headers(headers), ts))
            lines.append(value if not alone else b"not the record's value")
            targets.append(module.LineTarget("t", None, key, headers, encode_key(key), encode_headers(headers)))
            stamps.append(ts if not alone else -1)
            if alone:
                group.add(index, prepared[-1])
            else:
                group.owners.append(index)
        expected = encode_prepared_records(prepared[start:end])
        assert module.encode_line_group(group, lines, targets, stamps if stamped else None, ARRIVAL,
                                        start, end) == expected
