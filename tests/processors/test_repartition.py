"""Issue 17, item 2, without I/O: a pipeline split at its repartitioning ``key_by`` (upstream
``ShuffleWriter`` → records routed by their partition → downstream ``ShuffleReader``) computes what one
executor computes, drops what a replaying upstream writes twice, and takes its watermark from the
marks of every input partition. The subprocess tests over a real broker are in
``test_scale_out.py``."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka.consumer.fetcher import READ_COMMITTED, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.structs import TopicPartition

from broker.log.partitioner import partition_for_key
from broker.protocol.records import with_base_offset
from processors import kafka_records
from processors.aggregations import Mean
from processors.checkpoint import CheckpointCodec, restore_executor, take_checkpoint
from processors.errors import PipelineDefinitionError
from processors.executor import OutBatch, OutRecord
from processors.kafka import _PreparedBuilder
from processors.kafka_records import RawRecords, RawSegment
from processors.pipeline import Pipeline
from processors.repartition import (
    HEADER_SHUFFLE_MARK,
    ShuffleReader,
    ShuffleWriter,
    decode_key,
    encode_key,
    plan_shuffle,
)
from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness
from processors.windows import Tumbling
from tests.processors.workloads import batch_window_means, sensor_readings

IN_PARTITIONS = 4
OUT_PARTITIONS = 3


@dataclass(frozen=True)
class Rec:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def sensors_pipeline(*, filtered: bool = True, **key_by: Any) -> Pipeline:
    """``filtered``: a filter before the key_by (items are encoded for the topic); without it the
    key_by is on the source and the upstream forwards the input bytes."""
    stream = Pipeline.source("in", group="g", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(5_000), all_idle=AllIdlePolicy.HOLD)
    keyed = (stream.filter(lambda v: v["temp"] is not None) if filtered else stream).key_by(
        lambda v: v["sensor"], **key_by)
    keyed.window(Tumbling(10_000)).aggregate(Mean("temp")).sink("out")
    return stream.pipeline


def input_partitions(readings: list[dict[str, Any]]) -> dict[tuple[str, int], list[Rec]]:
    """Round-robin over the input partitions: every sensor's readings are spread over all of them."""
    parts: dict[tuple[str, int], list[Rec]] = defaultdict(list)
    for i, r in enumerate(readings):
        tp = ("in", i % IN_PARTITIONS)
        parts[tp].append(Rec(len(parts[tp]), r["ts"], None, json.dumps(r).encode()))
    return parts


def routed(outputs: list[OutRecord], topic: str) -> dict[int, list[Rec]]:
    """The repartition records as a consumer reads them: each ``OutBatch`` as the RecordBatch the sink
    sends, read back by aiokafka's record parser."""
    by_partition: dict[int, list[Rec]] = defaultdict(list)
    for o in outputs:
        if o.topic == topic:
            assert type(o) is OutBatch and o.partition is not None
            for r in DefaultRecordBatch(_PreparedBuilder(o, False)._build()):
                by_partition[o.partition].append(Rec(0, r.timestamp, r.key, r.value, tuple(r.headers)))
    return by_partition


def fetched_raw(outputs: list[OutRecord], topic: str, per_take: int) -> dict[int, list[RawRecords]]:
    """The repartition records as the downstream stage's consumer hands them out: each partition's
    ``OutBatch``es stored one after the other, fetched as one buffer and taken ``per_take`` records at a
    time as ``RawRecords`` (``processors.kafka_records``)."""
    stored: dict[int, bytearray] = defaultdict(bytearray)
    offsets: dict[int, int] = defaultdict(int)
    for o in outputs:
        if o.topic == topic:
            assert type(o) is OutBatch and o.partition is not None
            stored[o.partition] += with_base_offset(_PreparedBuilder(o, False)._build(), offsets[o.partition])
            offsets[o.partition] += o.count
    taken: dict[int, list[RawRecords]] = {}
    for p, buf in stored.items():
        records = PartitionRecords(TopicPartition(topic, p), kafka_records._KeptMemoryRecords(bytes(buf)), [], 0,
                                   None, None, True, READ_COMMITTED)
        kafka_records._adopt(records, True)
        taken[p] = []
        while chunk := records.take(per_take):
            assert all(type(part) is RawSegment for part in chunk.parts)
            taken[p].append(chunk)
        assert records.next_fetch_offset == offsets[p]
    return taken


def results(outputs: list[OutRecord]) -> dict[tuple[int, int, str], float]:
    rows = [json.loads(o.value or b"") for o in outputs if o.topic == "out"]
    keys = [tuple(json.loads(o.key or b"")) for o in outputs if o.topic == "out"]
    assert len(keys) == len(set(keys)), "a window came out twice"
    return {(r["window_start"], r["window_end"], r["key"]): r["value"] for r in rows}


def test_the_plan_splits_at_the_key_by_and_keeps_the_rest_upstream() -> None:
    stream = Pipeline.source("in", group="g")
    mapped = stream.map(lambda v: v)
    mapped.sink("raw")
    mapped.key_by(lambda v: v["k"]).window(Tumbling(1_000)).aggregate(Mean("v")).sink("out")
    plan = plan_shuffle(stream.pipeline)
    assert plan is not None and plan.topic == "g.repartition.2"
    assert [n.kind for n in plan.upstream.nodes] == ["map", "sink", "repartition"]
    assert [(n.id, n.kind, n.parent) for n in plan.downstream.nodes] == [(0, "window", None), (1, "sink", 0)]
    assert plan.downstream.source_config.topics == ("g.repartition.2",)
    assert plan.downstream.source_config.dead_letter_topic == "g.dead-letter"
    assert plan_shuffle(sensors_pipeline(repartition=False)) is None


def test_a_repartitioning_key_by_after_state_or_twice_is_refused() -> None:
    stream = Pipeline.source("in", group="g")
    stream.key_by(lambda v: v["a"], repartition=False).reduce(lambda a, b: b).key_by(lambda v: v["b"]) \
        .window(Tumbling(1_000)).aggregate(Mean("v")).sink("out")
    with pytest.raises(PipelineDefinitionError, match="must follow only map/filter/flat_map"):
        plan_shuffle(stream.pipeline)
    two = Pipeline.source("in", group="g")
    two.key_by(lambda v: v["a"]).window(Tumbling(1_000)).aggregate(Mean("v")).sink("a")
    two.key_by(lambda v: v["b"]).window(Tumbling(1_000)).aggregate(Mean("v")).sink("b")
    with pytest.raises(PipelineDefinitionError, match="one repartitioning key_by per pipeline"):
        plan_shuffle(two.pipeline)


def test_keys_survive_the_topic_and_land_where_kafka_would_put_them() -> None:
    for key in ("sensor_1", 7, ("a", 1), None):
        assert decode_key(encode_key(key)) == key
    assert partition_for_key(encode_key("sensor_1"), 3) == partition_for_key(b'"sensor_1"', 3)


def run_split(readings: list[dict[str, Any]], *, replay_from: int | None = None,
              filtered: bool = True, raw: bool = False) -> dict[tuple[int, int, str], float]:
    """Two upstream instances (input partitions 0-1 and 2-3) write to one topic; one downstream
    executor per repartition partition reads it. With ``replay_from``, upstream instance 0 is replaced
    after that many records per partition by one restored from a checkpoint taken at half of them, so
    it writes the records in between a second time. ``raw``: the downstream reads the stored batches'
    bytes as the standalone stage does (``RawRecords``), else records parsed by aiokafka."""
    plan = plan_shuffle(sensors_pipeline(filtered=filtered))
    assert plan is not None
    counts = {"in": IN_PARTITIONS}
    parts = input_partitions(readings)

    def writer() -> ShuffleWriter:
        return ShuffleWriter(plan.upstream, 0, partitions=OUT_PARTITIONS, partition_counts=lambda: dict(counts))

    uppers = [writer(), writer()]
    owned = [[("in", 0), ("in", 1)], [("in", 2), ("in", 3)]]
    for up, tps in zip(uppers, owned, strict=True):
        restore_executor(up, [(tp, None) for tp in tps], 0)
    written: list[OutRecord] = []
    step = 50
    length = max(len(v) for v in parts.values())
    checkpoint = None
    for start in range(0, length, step):
        if replay_from is not None and start == replay_from // 2:
            checkpoint = CheckpointCodec().encode(take_checkpoint("g", uppers[0], {tp: start for tp in owned[0]}, 0))
        if replay_from is not None and start == replay_from:
            assert checkpoint is not None
            restored = CheckpointCodec().decode(checkpoint)
            uppers[0] = writer()
            restore_executor(uppers[0], [(tp, restored[tp]) for tp in owned[0]], 0)
            for tp in owned[0]:  # the replay: from the checkpoint's offset up to here, again
                uppers[0].process(tp, parts[tp][replay_from // 2 : start], 0)
            written += uppers[0].take_outputs()
        for up, tps in zip(uppers, owned, strict=True):
            for tp in tps:
                up.process(tp, parts[tp][start : start + step], 0)
            up.tick(0)
            written += up.take_outputs()
    shuffled = routed(written, plan.topic)
    assert {p for p, records in shuffled.items()
            if any(h == HEADER_SHUFFLE_MARK for r in records for h, _ in r.headers)} == set(range(OUT_PARTITIONS))
    out: list[OutRecord] = []
    fetched = fetched_raw(written, plan.topic, 37)
    for p, records in shuffled.items():
        down = ShuffleReader(plan.downstream, 0)
        restore_executor(down, [((plan.topic, p), None)], 0)
        for chunk in fetched[p] if raw else [records[i : i + 37] for i in range(0, len(records), 37)]:
            down.process((plan.topic, p), chunk, 0)
        down.eof(0)
        if replay_from is not None:
            assert down.duplicates > 0
        out += down.take_outputs()
    return results(out)


@pytest.mark.parametrize("raw", [False, True], ids=["parsed", "raw"])
@pytest.mark.parametrize("filtered", [True, False])
def test_two_upstream_instances_and_three_partitions_give_the_batch_result(filtered: bool, raw: bool) -> None:
    readings = [r for r in sensor_readings(60) if filtered or r["temp"] is not None]
    expected = batch_window_means(readings, 10_000)
    assert run_split(readings, filtered=filtered, raw=raw) == pytest.approx(expected)


@pytest.mark.parametrize("raw", [False, True], ids=["parsed", "raw"])
@pytest.mark.parametrize("filtered", [True, False])
def test_a_replaying_upstream_instance_writes_twice_and_no_window_counts_it_twice(filtered: bool, raw: bool) -> None:
    readings = [r for r in sensor_readings(60) if filtered or r["temp"] is not None]
    expected = batch_window_means(readings, 10_000)
    assert run_split(readings, replay_from=400, filtered=filtered, raw=raw) == pytest.approx(expected)


def test_a_key_by_on_the_source_forwards_the_input_bytes_and_downstream_reads_the_same_values() -> None:
    """No re-encoding between the stages: long integers, NaN, lone surrogates and whitespace cross as
    they came, and the downstream decodes them as the upstream did."""
    stream = Pipeline.source("in", group="g", event_time=lambda v: v["ts"])
    stream.key_by(lambda v: v["k"]).process(lambda v, ctx: ctx.emit(v)).sink("out")
    plan = plan_shuffle(stream.pipeline)
    assert plan is not None
    up = ShuffleWriter(plan.upstream, 0, partitions=2, partition_counts=lambda: {"in": 1})
    restore_executor(up, [(("in", 0), None)], 0)
    raws = [b'{"k": "a", "ts": 1, "n": 123456789012345678901234567890}', b'{"k":"b","ts":2,"x":NaN}',
            b' {"k": "a", "ts": 3, "s": "\\ud800"} ', b'{"k": ["x", 1], "ts": 4, "f": 0.1}']
    up.process(("in", 0), [Rec(i, 0, None, raw) for i, raw in enumerate(raws)], 0)
    written = up.take_outputs()
    shuffled = [r for records in routed(written, plan.topic).values() for r in records if r.value]  # not marks
    assert sorted(r.value or b"" for r in shuffled) == sorted(raws)
    emitted: list[Any] = []
    for p, records in routed(written, plan.topic).items():
        down = ShuffleReader(plan.downstream, 0)
        restore_executor(down, [((plan.topic, p), None)], 0)
        down.process((plan.topic, p), records, 0)
        emitted += [json.loads(o.value or b"") for o in down.take_outputs() if o.topic == "out"]
    want = [json.loads(raw) for raw in raws]
    # JSON text compares NaN, and tells an exact integer from a float
    assert json.dumps(sorted(emitted, key=lambda v: v["ts"])) == json.dumps(want)


def test_the_downstream_watermark_waits_for_every_input_partition_and_takes_the_lowest() -> None:
    plan = plan_shuffle(sensors_pipeline())
    assert plan is not None
    down = ShuffleReader(plan.downstream, 0)
    tp = (plan.topic, 0)
    restore_executor(down, [(tp, None)], 0)

    def mark(wm: int, parts: list[list[Any]]) -> Rec:
        doc = {"wm": wm, "parts": parts, "of": {"in": 2}}
        return Rec(0, 0, None, None, ((HEADER_SHUFFLE_MARK, json.dumps(doc).encode()),))

    down.process(tp, [mark(5_000, [["in", 0]])], 0)
    assert down.watermark < 0  # input partition 1 has not been heard of: time holds
    down.process(tp, [mark(3_000, [["in", 1]])], 0)
    assert down.watermark == 3_000
    down.process(tp, [mark(1_000, [["in", 1]])], 0)  # an older mark (a restarted owner's): ignored
    down.process(tp, [mark(9_000, [["in", 0], ["in", 1]])], 0)  # a new owner of both
    assert down.watermark == 9_000
    # the marks move with the partition: a new owner restored from a checkpoint knows them
    restored = CheckpointCodec().decode(CheckpointCodec().encode(take_checkpoint("x", down, {tp: 4}, 0)))
    again = ShuffleReader(plan.downstream, 0)
    restore_executor(again, [(tp, restored[tp])], 0)
    again.process(tp, [], 0)
    assert again.watermark == 9_000


def test_a_partition_moving_in_from_an_instance_that_was_behind_keeps_its_records_on_time() -> None:
    """Issue 17, item 3: A's watermark is at 25 s when it takes over partition 1 from B, which had
    seen 5 s. B's keys' replayed and further records are on time at A (the windows equal a single
    instance's); A's own keys keep their lateness."""
    stream = Pipeline.source("in", group="g", event_time=lambda v: v["ts"], watermarks=BoundedOutOfOrderness(0),
                             all_idle=AllIdlePolicy.HOLD)
    stream.key_by(lambda v: v["k"], repartition=False).window(Tumbling(10_000)).aggregate(Mean("v")).sink("out")
    p0, p1 = ("in", 0), ("in", 1)

    def recs(key: str, times: range, first: int = 0) -> list[Rec]:
        return [Rec(first + i, t, None, json.dumps({"k": key, "v": t // 1000, "ts": t}).encode())
                for i, t in enumerate(times)]

    from processors.executor import Executor

    a, b = Executor(stream.pipeline), Executor(stream.pipeline)
    restore_executor(a, [(p0, None)], 0)
    restore_executor(b, [(p1, None)], 0)
    a.process(p0, recs("a", range(0, 25_001, 1_000)), 0)
    b.process(p1, recs("b", range(0, 5_001, 1_000)), 0)
    assert a.watermark > 20_000 and b.watermark < 5_000
    handed = CheckpointCodec().decode(CheckpointCodec().encode(take_checkpoint("g", b, {p1: 6}, 0)))
    restore_executor(a, [(p1, handed[p1])], 0)
    a.process(p1, recs("b", range(6_000, 30_001, 1_000), 6), 0)
    a.process(p0, recs("a", range(30_000, 30_001), 26) + recs("a", range(5_000, 5_001), 27), 0)
    got = results(a.take_outputs())
    assert a.late_count == 1  # A's own late record (5 s, after A's watermark passed 25 s) stays late
    assert got[(0, 10_000, "b")] == pytest.approx(sum(range(0, 10)) / 10)  # B's window, complete
    assert got[(10_000, 20_000, "b")] == pytest.approx(sum(range(10, 20)) / 10)
    assert got[(0, 10_000, "a")] == pytest.approx(sum(range(0, 10)) / 10)


def test_a_key_holding_a_list_crosses_the_shuffle() -> None:
    """A key that hashing refuses (a tuple holding a list) is written like any other, not dead-lettered
    (the key cache used to look it up and fail)."""
    stream = Pipeline.source("in", group="g", event_time=lambda v: v["ts"])
    stream.key_by(lambda v: (v["k"], v["tags"])).process(lambda v, ctx: ctx.emit(v)).sink("out")
    plan = plan_shuffle(stream.pipeline)
    assert plan is not None
    up = ShuffleWriter(plan.upstream, 0, partitions=2, partition_counts=lambda: {"in": 1})
    restore_executor(up, [(("in", 0), None)], 0)
    up.process(("in", 0), [Rec(0, 0, None, b'{"k": "a", "tags": [1, 2], "ts": 1}')], 0)
    written = up.take_outputs()
    assert up.dead_letters == 0
    keys = [decode_key(r.key) for records in routed(written, plan.topic).values() for r in records if r.value]
    assert keys == [("a", (1, 2))]
