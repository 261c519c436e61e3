"""The processors' per-record kernels (``processors.record_kernels``): their mypyc build and their
pure-Python source, run inside the executor, give exactly what the general path gives (each record
decoded with ``json.loads``, pushed through ``key_by``, and each item through ``WindowLogic.on_item``):
the same outputs in the same order, dead letters, late records, counters and state."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from broker import native
from broker.errors import CorruptRecordError
from broker.protocol.records import Compression, RecordSpec, encode_batch, stamp_log_append_time, with_base_offset
from broker.txn.markers import encode_marker
from processors import executor as executor_module
from processors import fastdecode, record_kernels, shuffle_kernels
from processors import windows as windows_module
from processors.aggregations import Count, Max, Mean, Sum
from processors.executor import Executor, RecordLike
from processors.fastdecode import decode_from
from processors.kafka_records import RawSegment
from processors.pipeline import Pipeline
from processors.serde import HEADER_WATERMARK
from processors.triggers import CountTrigger, EarlyEvery, Trigger
from processors.watermarks import BoundedOutOfOrderness
from processors.windows import Sliding, Tumbling, WindowSpec

SELECTED = native.select(record_kernels)
PURE = native.pure("processors.record_kernels")
T0 = 1_700_000_000_000


def test_the_compiled_kernels_are_built_where_the_install_could_build_them() -> None:
    """CI installs with a compiler (make test): there the compiled build must be the one selected, or
    the differential tests below would compare the source with itself."""
    if not native.is_compiled(SELECTED):
        if os.environ.get("CI"):
            pytest.fail("record_kernels is not compiled in CI: the mypyc build failed (see the install log)")
        pytest.skip("record_kernels not compiled here (make native builds it)")
    assert not native.is_compiled(PURE)


# -- workload -------------------------------------------------------------------------------------


def readings(seed: int, n: int = 1_500) -> list[tuple[bytes | None, tuple[tuple[str, bytes | None], ...]]]:
    """Sensor readings out of order by up to 12 s against a 3 s bound (late records, updates within
    lateness, late beyond it), with what the general path must also handle: values that do not
    decode, values without the key or the event time, temperatures that do not add, NaN and long
    integers (the stdlib reads them, orjson does not), watermark punctuations and null values."""
    rng = random.Random(seed)
    out: list[tuple[bytes | None, tuple[tuple[str, bytes | None], ...]]] = []
    for i in range(n):
        ts = T0 + i * 20 - rng.choice([0, 0, 0, 0, 200, 2_000, 4_000, 6_000, 12_000])
        doc: dict[str, Any] = {"sensor": f"s{rng.randrange(7)}", "temp": round(rng.gauss(20, 5), 3), "ts": ts}
        kind = rng.random()
        headers: tuple[tuple[str, bytes | None], ...] = ()
        raw: bytes | None
        if kind < 0.02:
            raw = b'{"sensor": "s1", "temp": '  # does not decode
        elif kind < 0.04:
            raw = json.dumps({"temp": 1.0, "ts": ts}).encode()  # no sensor: key_by fails
        elif kind < 0.06:
            raw = json.dumps({"sensor": "s2", "temp": 1.0}).encode()  # no ts: event time fails
        elif kind < 0.08:
            raw = json.dumps({**doc, "temp": "warm"}).encode()  # the mean cannot add it
        elif kind < 0.09:
            raw = json.dumps({**doc, "temp": float("nan")}).encode()  # NaN: the stdlib reads it
        elif kind < 0.10:
            raw = json.dumps({**doc, "id": 123456789012345678901234567890, "n": [-9223372036854775809]}).encode()
        elif kind < 0.11:
            raw = json.dumps({**doc, "sensor": ["s", 1]}).encode()  # an unhashable key... as a list
        elif kind < 0.12:
            raw, headers = b"", ((HEADER_WATERMARK, str(ts - 6_000).encode()),)
        elif kind < 0.125:
            raw, headers = b"", ((HEADER_WATERMARK, b"soon"),)  # a punctuation that does not parse
        elif kind < 0.13:
            raw = None
        else:
            raw = json.dumps(doc).encode()
            if kind > 0.97:
                headers = (("trace", b"x"),)  # headers, not a punctuation
        out.append((raw, headers))
    return out


def stored_batches(rows: list[tuple[bytes | None, tuple[tuple[str, bytes | None], ...]]], partitions: int,
                   per_batch: int) -> list[tuple[int, list[RecordLike]]]:
    """The rows spread over partitions in batches, read back with the attached runner's decoder."""
    out: list[tuple[int, list[RecordLike]]] = []
    offsets = [0] * partitions
    for start in range(0, len(rows), per_batch):
        p = (start // per_batch) % partitions
        specs = [RecordSpec(raw, None, headers, T0 + start + i)
                 for i, (raw, headers) in enumerate(rows[start : start + per_batch])]
        data = bytearray(encode_batch(specs))
        data[0:8] = offsets[p].to_bytes(8, "big")  # the base offset, as the log assigns it
        out.append((p, decode_from(bytes(data), offsets[p])))
        offsets[p] += len(specs)
    return out


def keyed_key(v: Any) -> Any:
    key = v["sensor"]
    return tuple(key) if isinstance(key, list) else key


def pipeline(spec: WindowSpec, agg: Any, trigger: Trigger | None = None, lateness: int = 2_000) -> Pipeline:
    stream = Pipeline.source("in", group="g", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(3_000))
    (stream.key_by(keyed_key).window(spec, trigger=trigger, allowed_lateness=lateness, late_topic="late")
        .aggregate(agg).sink("out"))
    return stream.pipeline


def general_path(ex: Executor) -> Executor:
    """``ex`` without the kernels: values through ``json.loads``, items through ``WindowLogic.on_item``."""
    ex._json = False
    ex.deserializer = lambda r: None if r.value is None else json.loads(r.value.decode())
    for node in ex.keyed.values():
        node.rt._batch_on_items = None
    return ex


def run(ex: Executor, batches: list[tuple[int, list[RecordLike]]], ticks: bool) -> dict[str, Any]:
    now = 1_000
    for p in range(3):
        ex.add_partition(("in", p), now)
    outputs: list[Any] = []  # output records, and a snapshot of the state midway
    for i, (p, records) in enumerate(batches):
        ex.process(("in", p), records, now)
        if ticks:
            now += 700
            ex.tick(now)
        outputs += ex.take_outputs()
        if i == len(batches) // 2:
            outputs.append(("snapshot", json.dumps(ex.snapshot(), sort_keys=True, default=repr)))
    ex.eof(now)
    outputs += ex.take_outputs()
    return {"outputs": outputs, "records_in": ex.records_in, "late": ex.late_count, "dead": ex.dead_letters,
            "watermark": ex.watermark}


def with_kernels(kernels: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_module, "_KERNELS", kernels)
    monkeypatch.setattr(windows_module, "_KERNELS", kernels)


CASES: dict[str, Callable[[], Pipeline]] = {
    "tumbling mean": lambda: pipeline(Tumbling(1_000), Mean("temp")),
    "tumbling mean, offset, no lateness": lambda: pipeline(Tumbling(700, offset_ms=150), Mean("temp"), lateness=0),
    "tumbling sum": lambda: pipeline(Tumbling(1_000), Sum("temp")),
    "tumbling count": lambda: pipeline(Tumbling(1_000), Count()),
    "tumbling max (add called)": lambda: pipeline(Tumbling(1_000), Max("temp")),
    "tumbling mean of a function (add called)": lambda: pipeline(Tumbling(1_000), Mean(lambda v: v["temp"] * 2)),
    "tumbling, early every 500 ms": lambda: pipeline(Tumbling(1_000), Mean("temp"), EarlyEvery(500)),
    "tumbling 10 s, early every 500 ms": lambda: pipeline(Tumbling(10_000), Sum("temp"), EarlyEvery(500)),
    "tumbling, count trigger (general path)": lambda: pipeline(Tumbling(1_000), Mean("temp"), CountTrigger(5)),
    "sliding (general path)": lambda: pipeline(Sliding(1_000, 500), Mean("temp")),
}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("build", ["selected", "pure"])
def test_the_kernels_give_what_the_general_path_gives(case: str, build: str, seed: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    batches = stored_batches(readings(seed), partitions=3, per_batch=60)
    want = run(general_path(Executor(CASES[case]())), batches, ticks=True)
    with_kernels(SELECTED if build == "selected" else PURE, monkeypatch)
    got = run(Executor(CASES[case]()), batches, ticks=True)
    assert got == want
    # the workload reaches what it is meant to: each kind of dead letter, late records, several windows
    reasons = {dict(r.headers)["sluice-error"].split(b":")[0] for r in want["outputs"]
               if not isinstance(r, tuple) and r.topic == "g.dead-letter"}
    assert reasons >= {b"cannot decode record", b"key_by failed"}
    assert want["late"] > 10 and len([r for r in want["outputs"] if not isinstance(r, tuple) and r.topic == "out"]) > 50


def test_a_key_by_that_is_not_the_sources_only_operator_is_not_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two branches under the source: each gets the decoded values; the key_by is not done in the decode loop."""
    def build() -> Pipeline:
        stream = Pipeline.source("in", group="g", event_time=lambda v: v["ts"], watermarks=BoundedOutOfOrderness(3_000))
        stream.key_by(keyed_key).window(Tumbling(1_000)).aggregate(Mean("temp")).sink("out")
        stream.filter(lambda v: v["temp"] > 25).sink("hot")
        return stream.pipeline

    batches = stored_batches(readings(3), partitions=3, per_batch=60)
    want = run(general_path(Executor(build())), batches, ticks=False)
    assert Executor(build())._source_key_by is None
    with_kernels(SELECTED, monkeypatch)
    assert run(Executor(build()), batches, ticks=False) == want


# -- JSON ---------------------------------------------------------------------------------------------

LONG_NUMBERS = [
    b"[18446744073709551615, -9223372036854775808]", b"18446744073709551616", b"[-9223372036854775809]",
    b'{"a": -9223372036854775809}', b"-9223372036854775809",
    b'{"a": {"b": [1, {"c": 123456789012345678901234567890}]}}',
    b"1e19", b"-1e19", b"9.3e18", b"1.7976931348623157e308", b"1e400", b"[1e-400, -0.0, 0.1e1]",
    b"0.1000000000000000055511151231257827021181583404541015625",
    b"123456789012345678901.5e-2",
]


@pytest.mark.parametrize("kernels", [SELECTED, PURE], ids=["selected", "pure"])
@pytest.mark.parametrize("raw", LONG_NUMBERS)
def test_loads_reads_numbers_beyond_64_bits_and_a_double_as_the_stdlib_does(kernels: ModuleType, raw: bytes) -> None:
    want = json.loads(raw.decode())
    got = kernels.loads(raw)
    assert got == want and repr(got) == repr(want)


@pytest.mark.parametrize("kernels", [SELECTED, PURE], ids=["selected", "pure"])
def test_loads_reads_random_long_decimals_as_the_stdlib_does(kernels: ModuleType) -> None:
    rng = random.Random(5)
    for _ in range(3_000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30))).lstrip("0") or "0"
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30)))
        raw = f"[{rng.choice(['', '-'])}{digits}.{frac}e{rng.randint(-330, 310)}, {digits}]".encode()
        want = json.loads(raw.decode())
        assert repr(kernels.loads(raw)) == repr(want), raw


@pytest.mark.parametrize("kernels", [SELECTED, PURE], ids=["selected", "pure"])
def test_a_window_a_restored_partitions_floor_has_passed_fires_on_its_next_record(
        kernels: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two partitions restored with different floors (a rebalance): the operator watermark is the lower
    one, records of the other are judged against its floor. A window opened by the first partition and
    not fired must emit at once when a record of the second, whose floor is past the window, reaches it."""
    def records(values: list[tuple[str, float, int]], first_offset: int) -> list[RecordLike]:
        specs = [RecordSpec(json.dumps({"sensor": s, "temp": t, "ts": ts}).encode(), None, (), ts)
                 for s, t, ts in values]
        data = bytearray(encode_batch(specs))
        data[0:8] = first_offset.to_bytes(8, "big")
        return decode_from(bytes(data), first_offset)

    def drive(ex: Executor) -> list[Any]:
        for p, floor in ((0, T0 + 1_000), (1, T0 + 20_000)):
            ex.restore_partition(("in", p), 0, max_ts=floor, heartbeat=floor, floor=floor, quiet_ms=0, ops={})
        ex.advance(0)
        ex.process(("in", 0), records([("s1", 1.0, T0 + 12_000), ("s1", 2.0, T0 + 13_000)], 0), 0)
        ex.process(("in", 1), records([("s1", 4.0, T0 + 14_000), ("s1", 8.0, T0 + 15_000)], 0), 0)
        return ex.take_outputs()

    want = drive(general_path(Executor(pipeline(Tumbling(10_000), Mean("temp")))))
    assert [json.loads(r.value or b"")["emit"] for r in want if r.topic == "out"] == ["first", "update"]
    with_kernels(kernels, monkeypatch)
    assert drive(Executor(pipeline(Tumbling(10_000), Mean("temp")))) == want


# -- records read in place from stored batches (fastdecode.StoredRecords) -----------------------------


def stored_partition(rows: list[tuple[bytes | None, tuple[tuple[str, bytes | None], ...]]],
                     per_batch: int) -> bytes:
    """One partition's stored bytes: batches of ``rows`` with keys, long values (multi-byte varints)
    among them, a transaction's commit marker after the second batch, and a LogAppendTime batch."""
    out = bytearray()
    offset = 0
    for n, start in enumerate(range(0, len(rows), per_batch)):
        specs = [RecordSpec(raw if i % 50 else (raw or b"") + b" " * 300, f"k{i}".encode() if i % 3 else None,
                            headers, T0 + start + i)
                 for i, (raw, headers) in enumerate(rows[start : start + per_batch])]
        batch = bytearray(encode_batch(specs, base_offset=offset))
        if n == 3:
            stamp_log_append_time(batch, T0 + 99_000)
        out += batch
        offset += len(specs)
        if n == 1:
            out += with_base_offset(encode_marker(7, 0, True, timestamp_ms=T0), offset)
            offset += 1
    return bytes(out)


@pytest.mark.parametrize("min_offset", [0, 37, 130])
@pytest.mark.parametrize("case", ["tumbling mean", "tumbling max (add called)", "sliding (general path)"])
@pytest.mark.parametrize("build", ["selected", "pure"])
def test_stored_records_read_in_place_give_what_decoded_records_give(
        case: str, build: str, min_offset: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Executor.process_stored`` over stored bytes (``decode_stored_json``: no record objects) gives
    the outputs, dead letters, late records and state that ``process`` gives over the same records
    decoded by aiokafka's parser: headers and watermark punctuations, undecodable values, null values,
    multi-byte lengths, a control batch, a LogAppendTime batch and a start inside a batch."""
    with_kernels(SELECTED if build == "selected" else PURE, monkeypatch)
    monkeypatch.setattr(fastdecode, "_KERNELS", SELECTED if build == "selected" else PURE)
    data = stored_partition(readings(4, 600), per_batch=60)
    stored = fastdecode.stored_from(data, min_offset, 250)
    assert isinstance(stored, fastdecode.StoredRecords)
    decoded = decode_from(data, min_offset, 250)
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in stored.records()] == [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in decoded]
    assert stored.first_offset == decoded[0].offset and stored.next_offset == decoded[-1].offset + 1
    assert len(stored) >= len(decoded)

    def drive(feed: Callable[[Executor], None]) -> dict[str, Any]:
        ex = Executor(CASES[case]())
        ex.add_partition(("in", 0), 1_000)
        feed(ex)
        out = ex.take_outputs()
        snapshot = json.dumps(ex.snapshot(), sort_keys=True, default=repr)
        ex.eof(2_000)
        return {"outputs": out + ex.take_outputs(), "state": snapshot, "records_in": ex.records_in,
                "late": ex.late_count, "dead": ex.dead_letters, "watermark": ex.watermark}

    want = drive(lambda ex: ex.process(("in", 0), decoded, 1_000))
    assert drive(lambda ex: ex.process_stored(("in", 0), stored, 1_000)) == want
    assert want["dead"] > 5 and want["records_in"] > 150


def test_stored_from_decodes_what_it_cannot_read_in_place() -> None:
    """A compressed batch goes to the bounded decoder (record objects); so does a read with nothing at
    or after the offset asked for, and a corrupt record is the broker's CorruptRecordError."""
    specs = [RecordSpec(b'{"a": 1}', None, (), T0)] * 3
    compressed = encode_batch(specs, compression=Compression.GZIP)
    assert isinstance(fastdecode.stored_from(compressed, 0), list)
    assert fastdecode.stored_from(encode_batch(specs), 3) == []
    assert fastdecode.stored_from(b"", 0) == []
    broken = bytearray(encode_batch(specs))
    broken[61] = 0x7E  # the first record's length: far past the batch
    stored = fastdecode.stored_from(bytes(broken), 0)
    assert isinstance(stored, fastdecode.StoredRecords)
    with pytest.raises(CorruptRecordError):
        Executor(CASES["tumbling mean"]()).process_stored(("in", 0), stored, 0)


@pytest.mark.parametrize("build", ["selected", "pure"])
def test_fetched_segments_read_in_place_give_what_decoded_records_give(build: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A standalone processor's fetch (``kafka_records.RawSegment``s of plain batches, one starting inside
    its batch, and parser records of another batch between them) through ``process_stored`` gives what
    ``process`` gives over the same records decoded."""
    with_kernels(SELECTED if build == "selected" else PURE, monkeypatch)
    monkeypatch.setattr(fastdecode, "_KERNELS", SELECTED if build == "selected" else PURE)
    rows = readings(6, 300)
    batches: list[tuple[bytes, int]] = []
    for base in range(0, 300, 100):
        specs = [RecordSpec(raw, b"k" if i % 2 else None, headers, T0 + base + i)
                 for i, (raw, headers) in enumerate(rows[base : base + 100])]
        batches.append((encode_batch(specs, base_offset=1_000 + base), 1_000 + base))
    skip = 17
    first = batches[0][0]
    pos = shuffle_kernels.skip_records(first, 61, skip)
    parts: list[Any] = [
        fastdecode.SegmentSpan(RawSegment(first, pos, 100 - skip, 1_000 + skip, T0)),
        decode_from(batches[1][0], 0),
        fastdecode.SegmentSpan(RawSegment(batches[2][0], 61, 100, 1_200, T0 + 200)),
    ]
    stored = fastdecode.StoredRecords(parts, 1_000 + skip, 1_300, 300 - skip)
    decoded = decode_from(first, 1_000 + skip) + decode_from(batches[1][0], 0) + decode_from(batches[2][0], 0)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in stored.records()] == [
        (r.offset, r.timestamp, r.key, r.value) for r in decoded]

    def drive(feed: Callable[[Executor], None]) -> tuple[Any, ...]:
        ex = Executor(CASES["tumbling mean"]())
        ex.add_partition(("in", 0), 1_000)
        feed(ex)
        ex.eof(2_000)
        out = ex.take_outputs()
        # the results in their order; dead letters and late records of one 200-record slice come out
        # together, and the slices follow the parts here, the whole list there: the same records
        return ([r for r in out if r.topic == "out"], sorted(map(repr, out)), ex.records_in, ex.late_count,
                ex.dead_letters, ex.watermark)

    want = drive(lambda ex: ex.process(("in", 0), decoded, 1_000))
    assert drive(lambda ex: ex.process_stored(("in", 0), stored, 1_000)) == want
    assert want[2] > 200 and want[4] > 3 and len(want[0]) > 20
