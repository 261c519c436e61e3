"""Restarts keep event time: per-partition watermarks, idleness and the operator watermark come back
from the checkpoint, keys created by timers keep an owner, and the checkpoint topic stays small.
Attached runners on a real in-memory LogStore, driven by a fake clock."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from broker.log.api import LogStore
from broker.log.memory import MemoryLogStore
from broker.log.segment import SegmentLogStore
from broker.protocol.records import RecordSpec
from processors.aggregations import Count, Mean
from processors.hosting import AttachedRunner
from processors.pipeline import Pipeline
from processors.runner import RunnerConfig
from processors.testing import FakeClock
from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness
from processors.windows import Tumbling
from tests.processors.test_runner import read_topic, wait_until
from tests.processors.workloads import T0

CONFIG = RunnerConfig(tick_ms=100, checkpoint_interval_ms=1_000)


def sensor_pipeline() -> Pipeline:
    stream = Pipeline.source("sensors", group="restart", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(5_000, idle_timeout=30_000),
                             all_idle=AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK(after=0))
    (stream.key_by(lambda v: v["sensor"])
        .window(Tumbling(10_000), allowed_lateness=5_000, late_topic="late")
        .aggregate(Mean("temp")).sink("avg"))
    return stream.pipeline


async def put(store: LogStore, partition: int, rows: list[dict[str, Any]], topic: str = "sensors") -> None:
    specs = [RecordSpec(json.dumps(r).encode(), r["sensor"].encode(), (), r["ts"]) for r in rows]
    await store.append_records(topic, specs, partition=partition)


def readings(sensor: str, start: int, end: int, step: int = 500, temp: float = 20.0) -> list[dict[str, Any]]:
    return [{"sensor": sensor, "temp": temp, "ts": ts} for ts in range(start, end, step)]


def emitted(store: LogStore, topic: str, emit: str | None = None) -> list[dict[str, Any]]:
    return [r for r in read_topic(store, topic) if emit is None or r.get("emit") == emit]


async def run_until(runner: AttachedRunner, cond: Callable[[], bool]) -> None:
    await runner.start()
    await wait_until(cond)


async def test_a_record_late_before_a_restart_is_late_after_it() -> None:
    """All partitions went quiet, the all-idle policy closed every window, the processor restarted;
    a record for a window closed 25 s of event time earlier goes to the late topic, not out as a
    second ``first`` with a different value (issue 12, item 7)."""
    store = MemoryLogStore()
    store.create_topic("sensors", 2)
    clock = FakeClock()
    await put(store, 0, readings("a", T0, T0 + 40_000))
    await put(store, 1, readings("b", T0, T0 + 40_000))
    first = AttachedRunner(sensor_pipeline(), store, clock=clock, config=CONFIG)
    await run_until(first, lambda: first.executor.records_in == 160)
    clock.advance(60_000)  # idle, then the wall clock closes the last windows (T0 + 30 s … T0 + 40 s)
    await wait_until(lambda: len(emitted(store, "avg", "first")) == 8)
    watermark = first.executor.watermark
    assert watermark > T0 + 40_000 + 5_000  # every window closed, allowed lateness included
    await first.stop()

    second = AttachedRunner(sensor_pipeline(), store, clock=clock, config=CONFIG)
    await run_until(second, lambda: len(second.positions) == 2)  # assigned and restored
    try:
        assert second.executor.watermark >= watermark  # the operator watermark came back at once
        await put(store, 0, [{"sensor": "a", "temp": 99.0, "ts": T0 + 5_000}])
        await wait_until(lambda: second.executor.records_in == 1)
        await wait_until(lambda: len(emitted(store, "late")) == 1)
        firsts = [(r["window_start"], r["key"]) for r in emitted(store, "avg", "first")]
        assert sorted(firsts) == sorted({(T0 + w, k) for w in range(0, 40_000, 10_000) for k in "ab"})
        (late,) = emitted(store, "late")
        assert late["ts"] == T0 + 5_000 and "later than allowed" in late["_headers"]["sluice-late-reason"]
    finally:
        await second.stop()


async def test_an_idle_partition_stays_idle_across_a_restart() -> None:
    """Partition 1 had gone quiet (past its idle timeout) before the restart: afterwards it does not
    hold the watermark back for another idle timeout."""
    store = MemoryLogStore()
    store.create_topic("sensors", 2)
    clock = FakeClock()
    await put(store, 1, readings("b", T0, T0 + 5_000))
    first = AttachedRunner(sensor_pipeline(), store, clock=clock, config=CONFIG)
    await run_until(first, lambda: first.executor.records_in == 10)
    clock.advance(31_000)  # partition 1 is idle now
    await put(store, 0, readings("a", T0, T0 + 21_000))
    await wait_until(lambda: first.executor.records_in == 10 + 42)
    await wait_until(lambda: len(emitted(store, "avg", "first")) >= 1)
    assert {(r["window_start"], r["key"]) for r in emitted(store, "avg", "first")} == {(T0, "a"), (T0, "b")}
    await first.stop()

    second = AttachedRunner(sensor_pipeline(), store, clock=clock, config=CONFIG)
    await second.start()
    try:
        await put(store, 0, readings("a", T0 + 21_000, T0 + 36_000))
        # the watermark follows partition 0 alone, without waiting 30 s of processing time for partition 1
        await wait_until(lambda: {r["window_start"] for r in emitted(store, "avg", "first")} == {T0, T0 + 10_000,
                                                                                               T0 + 20_000})
        status = second.status()
        assert [p["idle"] for p in status["partitions"]] == [False, True]
    finally:
        await second.stop()


def chained_pipeline() -> Pipeline:
    """Window counts per sensor, then a running total per sensor downstream: the downstream keys
    are created when a window fires, i.e. by a timer."""
    stream = Pipeline.source("in", group="chained", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(0, idle_timeout=1_000),
                             all_idle=AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK(after=0))
    (stream.key_by(lambda v: v["sensor"]).window(Tumbling(10_000)).aggregate(Count())
        .map(lambda r: {"sensor": r.key, "n": r.value})
        .key_by(lambda v: v["sensor"])
        .reduce(lambda a, b: {"sensor": a["sensor"], "n": a["n"] + b["n"]})
        .sink("totals"))
    return stream.pipeline


async def test_a_key_created_by_a_timer_right_after_a_restore_keeps_its_state_across_the_next() -> None:
    """Issue 12, item 9: the running total's key is created when the restored window fires on a
    tick (no record processed since the restore). It must belong to the window key's partition, so
    the next checkpoint carries it and the next restore brings it back."""
    store = MemoryLogStore()
    store.create_topic("in", 1)
    clock = FakeClock()
    await put(store, 0, readings("a", T0, T0 + 10_000, step=2_000), topic="in")  # 5 records, window still open
    first = AttachedRunner(chained_pipeline(), store, clock=clock, config=CONFIG)
    await run_until(first, lambda: first.executor.records_in == 5)
    await first.stop()
    assert emitted(store, "totals") == []

    second = AttachedRunner(chained_pipeline(), store, clock=clock, config=CONFIG)
    await run_until(second, lambda: len(second.positions) == 1)  # assigned and restored
    clock.advance(5_000)  # idle: the wall clock closes [T0, T0 + 10 s) on a tick
    await wait_until(lambda: [r["n"] for r in emitted(store, "totals")] == [5])
    assert second.executor.records_in == 0
    await second.stop()

    third = AttachedRunner(chained_pipeline(), store, clock=clock, config=CONFIG)
    await third.start()
    try:
        await put(store, 0, readings("a", T0 + 20_000, T0 + 26_000, step=2_000), topic="in")  # 3 more
        await wait_until(lambda: third.executor.records_in == 3)
        clock.advance(10_000)  # idle again: the wall clock closes [T0 + 20 s, T0 + 30 s)
        await wait_until(lambda: len(emitted(store, "totals")) == 2)
        assert [r["n"] for r in emitted(store, "totals")] == [5, 8]  # the total survived two restores
    finally:
        await third.stop()


def records_in_is(runner: AttachedRunner, n: int) -> bool:
    return runner.executor.records_in == n


def checkpoints_are(runner: AttachedRunner, n: int) -> bool:
    return runner.checkpoints_written == n


@pytest.fixture(params=["memory", "segment"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LogStore]:
    if request.param == "memory":
        yield MemoryLogStore()
        return
    store = SegmentLogStore(tmp_path / "logs")
    await store.start()
    try:
        yield store
    finally:
        await store.close()


async def test_the_checkpoint_topic_holds_about_one_checkpoint_after_many(any_store: LogStore) -> None:
    """Issue 12, item 10: 60 checkpoints later the attached checkpoint topic holds the newest one
    (and at most one more batch), and a restart still restores offsets and state from it."""
    store = any_store
    store.create_topic("sensors", 2)
    clock = FakeClock()
    runner = AttachedRunner(sensor_pipeline(), store, clock=clock, config=CONFIG)
    await runner.start()
    sizes = []
    try:
        for i in range(60):
            await put(store, i % 2, readings(f"s{i % 7}", T0 + i * 1_000, T0 + i * 1_000 + 1_000, step=100))
            await wait_until(partial(records_in_is, runner, (i + 1) * 10))
            clock.advance(CONFIG.checkpoint_interval_ms)
            await wait_until(partial(checkpoints_are, runner, i + 1))
            sizes.append(store.partition("_checkpoints.restart", 0).size_bytes)
    finally:
        await runner.stop(checkpoint=False)
    log = store.partition("_checkpoints.restart", 0)
    assert store.topic("_checkpoints.restart").config.cleanup_policy == "compact,delete"
    assert log.high_watermark == 2 * 60  # one record per source partition per checkpoint
    assert log.log_start_offset >= log.high_watermark - 2 * 2
    newest = max(sizes[-5:])
    assert log.size_bytes <= 2 * newest and max(sizes) <= 2 * newest, sizes

    second = AttachedRunner(sensor_pipeline(), store, clock=clock, config=CONFIG)
    await run_until(second, lambda: len(second.positions) == 2)
    try:
        assert second.positions == {("sensors", 0): 300, ("sensors", 1): 300}
        def keys(r: AttachedRunner) -> set[Any]:
            return {key for node in r.executor.keyed.values() for key in node.rt.logics}

        assert len(keys(runner)) >= 2 and keys(second) == keys(runner)  # the keys with open windows came back
        assert second.executor.watermark == runner.executor.watermark
    finally:
        await second.stop(checkpoint=False)
