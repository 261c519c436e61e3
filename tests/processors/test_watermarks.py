"""Per-partition watermarks: idle partitions, the all-idle policy, rejoining, alignment."""

from __future__ import annotations

from processors.aggregations import Mean
from processors.pipeline import Pipeline, Stream
from processors.testing import Harness
from processors.time import NO_TIME
from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness, WatermarkAlignment, WatermarkTracker
from processors.windows import Tumbling
from tests.processors.workloads import T0, sensor_readings


def pipeline(all_idle: AllIdlePolicy | None = None, idle_timeout: int | None = 30_000) -> Stream:
    stream = Pipeline.source("sensors", group="avg", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(5_000, idle_timeout=idle_timeout), all_idle=all_idle)
    stream.key_by(lambda v: v["sensor"]).window(Tumbling(10_000)).aggregate(Mean("temp")).sink("avg")
    return stream


def windows(h: Harness) -> set[tuple[int, str]]:
    return {(o["window_start"], o["key"]) for o in h.outputs("avg")}


def test_a_silent_partition_past_its_idle_timeout_does_not_block_the_others() -> None:
    h = Harness(pipeline(), partitions=2)
    readings = sensor_readings(30)
    for i in range(0, len(readings), 10):  # partition 0 sends one 100 ms step per 100 ms
        h.send_batch(readings[i : i + 10], partition=0)
        h.clock.advance(100)
    assert windows(h) == set()  # partition 1 has sent nothing and is not idle yet: it holds time back
    h.advance(30_001 - 3_000)  # 30 s since partition 1 was last heard of: it is idle now
    assert {s for s, _ in windows(h)} == {T0, T0 + 10_000}
    assert len(windows(h)) == 20


def test_an_idle_partition_rejoins_without_moving_the_watermark_backwards() -> None:
    tracker = WatermarkTracker(BoundedOutOfOrderness(0, idle_timeout=1_000), AllIdlePolicy.HOLD)
    tracker.add_partition("a", now=0)
    tracker.add_partition("b", now=0)
    tracker.observe("a", 10_000, now=0)
    tracker.observe("b", 2_000, now=0)
    assert tracker.advance(0) == 1_999
    tracker.observe("a", 20_000, now=1_500)  # b has been silent for 1.5 s > 1 s: idle
    assert tracker.advance(1_500) == 19_999
    tracker.observe("b", 3_000, now=1_600)  # b is back, far behind
    assert tracker.advance(1_600) == 19_999  # held, never backwards
    tracker.observe("b", 25_000, now=1_700)
    tracker.observe("a", 30_000, now=1_700)
    assert tracker.advance(1_700) == 24_999  # b holds time back again now that it is active


def test_all_idle_advance_with_wall_clock_closes_the_last_windows() -> None:
    h = Harness(pipeline(AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK(after=10_000)))
    for r in sensor_readings(26):
        h.send(r)
    # max ts T0 + 25.9 s -> watermark T0 + 20.9 s: [T0+20 s, T0+30 s) is open and nothing more comes
    assert {s for s, _ in windows(h)} == {T0, T0 + 10_000}
    h.advance(30_001)  # the only partition is idle; all-idle policy waits 10 s more
    assert {s for s, _ in windows(h)} == {T0, T0 + 10_000}
    h.advance(10_000)  # idle 10 s: the watermark follows the wall clock from here
    h.advance(10_000)  # ...and passes T0 + 30 s - 1
    assert {s for s, _ in windows(h)} == {T0, T0 + 10_000, T0 + 20_000}


def test_all_idle_hold_keeps_the_last_window_open() -> None:
    h = Harness(pipeline(AllIdlePolicy.HOLD))
    for r in sensor_readings(26):
        h.send(r)
    h.advance(3_600_000)
    assert {s for s, _ in windows(h)} == {T0, T0 + 10_000}


def test_without_an_idle_timeout_a_silent_partition_holds_time_back_forever() -> None:
    h = Harness(pipeline(idle_timeout=None), partitions=2)
    for r in sensor_readings(30):
        h.send(r)
    h.advance(3_600_000)
    assert windows(h) == set()


def test_watermark_alignment_pauses_a_partition_running_ahead() -> None:
    tracker = WatermarkTracker(BoundedOutOfOrderness(0, idle_timeout=60_000), alignment=WatermarkAlignment(5_000))
    tracker.add_partition("fast", now=0)
    tracker.add_partition("slow", now=0)
    assert tracker.paused(0) == set()
    tracker.observe("slow", 1_000, now=0)
    tracker.observe("fast", 20_000, now=0)
    tracker.advance(0)
    assert tracker.paused(0) == {"fast"}
    tracker.observe("slow", 16_000, now=10)
    tracker.advance(10)
    assert tracker.paused(10) == set()


def test_a_partition_that_never_sent_anything_has_no_watermark() -> None:
    tracker = WatermarkTracker(BoundedOutOfOrderness(5_000))
    tracker.add_partition(0, now=0)
    assert tracker.advance(10**9) == NO_TIME


def test_a_restored_executor_keeps_the_watermark_idleness_and_lateness() -> None:
    """Through a checkpoint (the records a runner stores) and back: the operator watermark the
    all-idle policy reached, each partition's idleness and the lateness of old records survive."""
    h = Harness(pipeline(AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK(after=0)), partitions=2)
    h.send_batch(sensor_readings(26), partition=0)
    h.advance(31_000)  # both partitions idle: the wall clock moves the watermark on
    h.advance(20_000)
    before = h.executor.watermark
    assert before > T0 + 25_900 - 5_001 + 20_000
    restored = Harness(pipeline(AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK(after=0)), clock=h.clock, partitions=2,
                       restore=h.checkpoint())
    assert restored.executor.watermark == before
    assert [p.idle(h.clock.now_ms()) for p in restored.executor.tracker.partitions.values()] == [True, True]
    restored.send({"sensor": "sensor_0", "temp": 1.0, "ts": T0 + 21_000}, partition=1)  # its window closed
    assert restored.outputs("avg") == [] and restored.executor.late_count == 1
