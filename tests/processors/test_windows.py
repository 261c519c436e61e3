"""Event-time windows over the lectures' workloads, driven by a fake clock (no sleeps)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import pytest

from processors.aggregations import Count, Max, Mean, Min
from processors.operators import KeyedProcessFunction, ProcessContext
from processors.pipeline import Pipeline
from processors.testing import Harness
from processors.triggers import CountTrigger, EarlyEvery
from processors.watermarks import BoundedOutOfOrderness
from processors.windows import Session, Sliding, Tumbling
from tests.processors.workloads import T0, batch_window_means, sensor_readings, shuffle_by

K = TypeVar("K")


def sensor_pipeline(idle_timeout: int = 30_000) -> Pipeline:
    stream = Pipeline.source(
        "sensors", group="avg-temp", event_time=lambda v: v["ts"],
        watermarks=BoundedOutOfOrderness(5_000, idle_timeout=idle_timeout),
    )
    (stream.key_by(lambda v: v["sensor"])
        .window(Tumbling(10_000), allowed_lateness=5_000, late_topic="temp-late")
        .aggregate(Mean("temp"))
        .sink("temp-avg"))
    return stream.pipeline


def run(records: Iterable[Any], pipeline: Pipeline | None = None) -> Harness:
    h = Harness(pipeline or sensor_pipeline())
    for r in records:
        h.send(r)
    h.eof()
    return h


def approx_map(d: dict[K, float]) -> dict[K, Any]:
    return {k: pytest.approx(v, rel=1e-9) for k, v in d.items()}


def test_shuffled_timestamps_give_the_same_windows_as_sorted_input_and_as_a_batch_job() -> None:
    readings = sensor_readings(60)
    shuffled = shuffle_by(readings, 7_000)
    assert shuffled != readings
    sorted_run = run(readings).final_results("temp-avg")
    shuffled_h = run(shuffled)
    shuffled_run = shuffled_h.final_results("temp-avg")
    expected = {(s, e, k): v for (s, e, k), v in batch_window_means(readings, 10_000).items()}
    assert len(expected) == 60  # 6 windows x 10 sensors
    assert sorted_run == approx_map(expected)
    assert shuffled_run == approx_map(expected)
    # Shuffling by 7 s against a 5 s bound made some results arrive as updates, none went late.
    emits = [o["_headers"]["sluice-emit"] for o in shuffled_h.outputs("temp-avg")]
    assert "update" in emits
    assert shuffled_h.outputs("temp-late") == []


def test_results_are_emitted_when_the_watermark_passes_not_at_eof() -> None:
    h = Harness(sensor_pipeline())
    for r in sensor_readings(16):
        h.send(r)
    # max ts = T0 + 15.9 s -> watermark T0 + 10.9 s - 1: the first window [T0, T0+10s) is out.
    firsts = h.outputs("temp-avg")
    assert {(o["window_start"], o["emit"]) for o in firsts} == {(T0, "first")}
    assert len(firsts) == 10


def test_record_within_lateness_updates_and_beyond_goes_to_the_late_topic() -> None:
    h = Harness(sensor_pipeline())
    h.send({"sensor": "sensor_1", "temp": 10.0, "ts": T0 + 1_000})
    h.send({"sensor": "sensor_1", "temp": 99.0, "ts": T0 + 16_000})  # watermark T0 + 10_999
    assert [(o["value"], o["emit"]) for o in h.outputs("temp-avg")] == [(10.0, "first")]
    h.send({"sensor": "sensor_1", "temp": 20.0, "ts": T0 + 2_000})  # within lateness (until wm 14_999)
    out = h.outputs("temp-avg")
    assert [(o["value"], o["emit"], o["_headers"]["sluice-emit"]) for o in out] == [
        (10.0, "first", "first"), (15.0, "update", "update")]
    assert out[0]["_key"] == out[1]["_key"] == [T0, T0 + 10_000, "sensor_1"]
    h.send({"sensor": "sensor_1", "temp": 1.0, "ts": T0 + 21_000})  # watermark T0 + 15_999: [T0, +10s) purged
    h.send({"sensor": "sensor_1", "temp": 30.0, "ts": T0 + 3_000})
    late = h.outputs("temp-late")
    assert len(late) == 1
    assert late[0]["temp"] == 30.0
    assert "window ending" in late[0]["_headers"]["sluice-late-reason"]
    assert late[0]["_headers"]["sluice-watermark"] == str(T0 + 15_999)
    assert len(h.outputs("temp-avg")) == 2  # the late record changed nothing; [10 s, 20 s) is still open


def test_progress_example_slack_1_and_heartbeat_at_4() -> None:
    """Tuples t = 1…7 arrive out of order, counted in 4 s tumbling windows with slack 1 s; a
    heartbeat at t = 4 closes [0, 4) before any later tuple arrives."""
    stream = Pipeline.source("ticks", group="progress", event_time=lambda v: v["t"] * 1000,
                             watermarks=BoundedOutOfOrderness(1_000))
    stream.key_by(lambda v: "all").window(Tumbling(4_000)).aggregate(Count()).sink("counts")
    h = Harness(stream)
    for t in (2, 1, 3):
        h.send({"t": t})
    assert h.outputs("counts") == []  # slack alone: watermark 3 s - 1 s - 1 ms, [0,4) still open
    h.heartbeat(3_999)  # heartbeat at t = 4: nothing before 4 s follows
    assert [(o["window_start"], o["value"]) for o in h.outputs("counts")] == [(0, 3)]
    for t in (6, 4, 5, 7):
        h.send({"t": t})
    assert len(h.outputs("counts")) == 1  # watermark 5.999 s: [4, 8) still open
    h.heartbeat(7_999)
    assert [(o["window_start"], o["value"], o["emit"]) for o in h.outputs("counts")] == [
        (0, 3, "first"), (4_000, 4, "first")]


def test_slack_too_small_makes_a_tuple_late() -> None:
    stream = Pipeline.source("ticks", group="progress", event_time=lambda v: v["t"] * 1000,
                             watermarks=BoundedOutOfOrderness(1_000))
    stream.key_by(lambda v: "all").window(Tumbling(4_000), late_topic="late").aggregate(Count()).sink("counts")
    h = Harness(stream)
    for t in (1, 2, 5, 3, 4, 6, 7):
        h.send({"t": t})
    h.eof()
    assert [(o["window_start"], o["value"]) for o in h.outputs("counts")] == [(0, 2), (4_000, 4)]
    assert [o["t"] for o in h.outputs("late")] == [3]


def test_slow_source_one_record_per_minute_still_produces_correct_windows() -> None:
    h = Harness(sensor_pipeline())
    records = [{"sensor": "sensor_0", "temp": float(i), "ts": T0 + i * 60_000} for i in range(6)]
    for r in records:
        h.clock.advance(60_000)  # one record per minute of wall time too
        h.send(r)
    got = {o["window_start"]: o["value"] for o in h.outputs("temp-avg")}
    # each record closes the previous record's window (no idle timeout, one partition)
    assert got == {T0 + i * 60_000: float(i) for i in range(5)}


def test_session_windows_merge_when_an_out_of_order_record_bridges_two() -> None:
    stream = Pipeline.source("clicks", group="sessions", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(15 * 60_000))
    stream.key_by(lambda v: v["user"]).window(Session(gap_ms=600_000)).aggregate(Count()).sink("sessions")
    h = Harness(stream)
    minute = 60_000
    for m in (0, 5, 20):  # two sessions: [0, 5m] and [20m]
        h.send({"user": "u", "ts": T0 + m * minute})
    h.send({"user": "u", "ts": T0 + 12 * minute})  # bridges them: 5m + 10m > 12m > 20m - 10m
    assert h.outputs("sessions") == []
    h.send({"user": "u", "ts": T0 + 60 * minute})  # far later: closes the merged session
    out = h.outputs("sessions")
    assert [(o["window_start"], o["window_end"], o["value"]) for o in out] == [
        (T0, T0 + 30 * minute, 4)]


def test_sliding_windows_count_each_record_in_every_window_it_falls_in() -> None:
    stream = Pipeline.source("words", group="wc", event_time=lambda v: v["ts"])
    stream.key_by(lambda v: v["w"]).window(Sliding(30_000, 10_000)).aggregate(Count()).sink("counts")
    h = Harness(stream)
    for s in (1, 12, 25, 41):
        h.send({"w": "x", "ts": T0 + s * 1000})
    h.eof()
    got = {(o["window_start"] - T0) // 1000: o["value"] for o in h.outputs("counts")}
    assert got == {-20: 1, -10: 2, 0: 3, 10: 2, 20: 2, 30: 1, 40: 1}


def test_stock_min_max_mean_over_sliding_windows() -> None:
    stream = Pipeline.source("stocks", group="stocks", event_time=lambda v: v["ts"])
    keyed = stream.key_by(lambda v: v["sym"])
    for agg, topic in ((Min("p"), "min"), (Max("p"), "max"), (Mean("p"), "mean")):
        keyed.window(Sliding(10_000, 5_000)).aggregate(agg).sink(topic)
    h = Harness(stream)
    for i, p in enumerate([10.0, 12.0, 9.0, 11.0]):
        h.send({"sym": "ACME", "p": p, "ts": T0 + i * 2_000})
    h.eof()
    window = lambda topic: {o["window_start"] - T0: o["value"] for o in h.outputs(topic)}  # noqa: E731
    assert window("min") == {-5_000: 9.0, 0: 9.0, 5_000: 11.0}
    assert window("max") == {-5_000: 12.0, 0: 12.0, 5_000: 11.0}
    assert window("mean") == {-5_000: pytest.approx(31 / 3), 0: 10.5, 5_000: 11.0}


def test_early_firing_every_second_of_processing_time_then_first() -> None:
    stream = Pipeline.source("sensors", group="early", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(5_000))
    (stream.key_by(lambda v: v["sensor"]).window(Tumbling(30_000), trigger=EarlyEvery(1_000))
        .aggregate(Count()).sink("out"))
    h = Harness(stream)
    h.send({"sensor": "s", "ts": T0})
    h.send({"sensor": "s", "ts": T0 + 100})
    h.advance(1_000)
    h.advance(1_000)  # nothing changed: no new early result
    h.send({"sensor": "s", "ts": T0 + 200})
    h.advance(1_000)
    h.send({"sensor": "s", "ts": T0 + 40_000})
    assert [(o["emit"], o["value"]) for o in h.outputs("out")] == [("early", 2), ("early", 3), ("first", 3)]


def test_count_trigger_fires_every_n_records() -> None:
    stream = Pipeline.source("sensors", group="count", event_time=lambda v: v["ts"])
    stream.key_by(lambda v: 0).window(Tumbling(10_000), trigger=CountTrigger(2)).aggregate(Count()).sink("out")
    h = Harness(stream)
    for i in range(5):
        h.send({"ts": T0 + i})
    h.eof()
    assert [(o["emit"], o["value"]) for o in h.outputs("out")] == [("early", 2), ("early", 4), ("first", 5)]


def test_undecodable_records_go_to_the_dead_letter_topic_with_the_reason() -> None:
    h = Harness(sensor_pipeline())
    h.send(b"{not json")
    h.send({"sensor": "sensor_1", "temp": 1.0})  # no ts field: event_time fails
    dead = [r for r in h.sent if r.topic == "avg-temp.dead-letter"]
    assert [r.value for r in dead][0] == b"{not json"
    assert all((dict(r.headers)["sluice-error"] or b"").startswith(b"cannot decode record") for r in dead)
    assert len(dead) == 2


def test_every_window_and_timer_restored_from_a_snapshot_still_fires() -> None:
    """Two windows open per key and two pending timers at snapshot time: all of them fire after
    a restore into a fresh executor (as after a restart)."""
    def timers(v: Any, ctx: ProcessContext) -> None:
        ctx.register_event_timer(ctx.timestamp + 1_000)
        ctx.register_event_timer(ctx.timestamp + 2_000)

    class Fire(KeyedProcessFunction):
        def process(self, value: Any, ctx: ProcessContext) -> None:
            timers(value, ctx)

        def on_timer(self, timestamp: int, ctx: ProcessContext, domain: str) -> None:
            ctx.emit({"timer": timestamp - T0})

    def build() -> Pipeline:
        stream = Pipeline.source("s", group="g", event_time=lambda v: v["ts"], watermarks=BoundedOutOfOrderness(15_000))
        keyed = stream.key_by(lambda v: v["k"])
        keyed.window(Tumbling(10_000)).aggregate(Count()).sink("counts")
        keyed.process(Fire()).sink("timers")
        return stream.pipeline

    first = Harness(build())
    for ts in (1_000, 12_000, 14_000):
        first.send({"k": "a", "ts": T0 + ts})
    assert first.outputs("counts") == [] and first.outputs("timers") == []
    snapshot = first.executor.snapshot()
    second = Harness(build())
    second.executor.tracker.observe(("s", 0), first.executor.tracker.partitions[("s", 0)].max_ts, 0)
    second.executor.restore(snapshot)
    second.send({"k": "b", "ts": T0 + 26_000})  # watermark 10.999 s: the first window and two timers
    counts_a = lambda: [(o["window_start"] - T0, o["value"]) for o in second.outputs("counts") if o["key"] == "a"]  # noqa: E731
    assert counts_a() == [(0, 1)]
    second.send({"k": "b", "ts": T0 + 60_000})  # watermark 44.999 s: the rest
    assert counts_a() == [(0, 1), (10_000, 2)]
    assert sorted(o["timer"] for o in second.outputs("timers"))[:6] == [2_000, 3_000, 13_000, 14_000, 15_000, 16_000]
