"""The attached runner on a real in-memory LogStore: end to end, checkpoints and restarts,
status, and backpressure from a slow sink."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
import tracemalloc
from collections.abc import Callable, Collection

import crc32c
import pytest

from broker.log.api import LogStore
from broker.log.memory import MemoryLogStore
from broker.protocol.records import RecordSpec, decode_all, encode_batch
from processors.aggregations import Mean
from processors.checkpoint import LogCheckpointStore, PartitionRestore
from processors.executor import RecordLike, TopicPartition
from processors.hosting import AttachedRunner
from processors.pipeline import Pipeline
from processors.runner import Runner, RunnerConfig
from processors.sources import AssignmentListener, LogSource
from processors.testing import FakeClock, MemorySink, decode_output
from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness
from processors.windows import Tumbling, WindowLogic
from tests.long_runs import sized
from tests.processors.workloads import T0, batch_window_means, sensor_readings, shuffle_by


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def shift_timestamps(batch: bytes, delta: int) -> bytes:
    """The same RecordBatch v2 with base/max timestamps moved by ``delta`` ms (CRC recomputed)."""
    out = bytearray(batch)
    base, top = struct.unpack_from(">qq", out, 27)
    struct.pack_into(">qq", out, 27, base + delta, top + delta)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def sensor_pipeline() -> Pipeline:
    stream = Pipeline.source("sensors", group="avg-temp", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(5_000, idle_timeout=30_000),
                             all_idle=AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK(after=0))
    (stream.key_by(lambda v: v["sensor"])
        .window(Tumbling(10_000), allowed_lateness=5_000, late_topic="temp-late")
        .aggregate(Mean("temp")).sink("temp-avg"))
    return stream.pipeline


async def publish(store: MemoryLogStore, topic: str, rows: list[dict], batch: int = 500) -> None:
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        by_partition: dict[int, list[RecordSpec]] = {}
        for r in chunk:
            key = r["sensor"].encode()
            by_partition.setdefault(store.partition_for(topic, key), []).append(
                RecordSpec(json.dumps(r).encode(), key, (), r["ts"]))
        for p, specs in by_partition.items():
            await store.append_records(topic, specs, partition=p)


def read_topic(store: LogStore, topic: str) -> list[dict]:
    if not store.has_topic(topic):
        return []
    out = []
    for log in store.partitions(topic):
        if log.high_watermark:
            out += [decode_output(r) for r in decode_all(log.read(log.log_start_offset, 1 << 30))]
    return out


async def wait_until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.01)


def finals(rows: list[dict]) -> dict[tuple, float]:
    out: dict[tuple, float] = {}
    for o in rows:
        if o["emit"] in ("first", "update"):
            out[tuple(o["_key"])] = o["value"]
    return out


@pytest.fixture
def store() -> MemoryLogStore:
    s = MemoryLogStore(default_partitions=1)
    s.create_topic("sensors", 3)
    return s


async def test_attached_runner_end_to_end_matches_a_batch_job(store: MemoryLogStore) -> None:
    clock = FakeClock()
    readings = sensor_readings(40)
    await publish(store, "sensors", shuffle_by(readings, 7_000))
    runner = AttachedRunner(sensor_pipeline(), store, clock=clock, config=RunnerConfig(tick_ms=100))
    await runner.start()
    try:
        await wait_until(lambda: runner.executor.records_in == len(readings))
        clock.advance(40_000)  # every partition idle, then the all-idle policy closes the rest
        expected = {(s, e, k): v for (s, e, k), v in batch_window_means(readings, 10_000).items()}
        await wait_until(lambda: len(finals(read_topic(store, "temp-avg"))) == len(expected))
        assert finals(read_topic(store, "temp-avg")) == {k: pytest.approx(v) for k, v in expected.items()}
        status = runner.status()
        json.dumps(status)
        assert {p["partition"] for p in status["partitions"]} == {0, 1, 2}
        assert sum(p["offset_lag"] for p in status["partitions"]) == 0
        assert all(p["idle"] for p in status["partitions"])
        assert status["event_time_lag_ms"] is not None
        assert status["late_records"] == 0
    finally:
        await runner.stop()


async def test_restart_resumes_from_the_checkpoint_and_re_emits_only_same_keys(store: MemoryLogStore) -> None:
    clock = FakeClock()
    readings = sensor_readings(60)
    half = len(readings) // 2
    await publish(store, "sensors", readings[:half])
    config = RunnerConfig(tick_ms=100, checkpoint_interval_ms=1_000)
    first = AttachedRunner(sensor_pipeline(), store, clock=clock, config=config)
    await first.start()
    await wait_until(lambda: first.executor.records_in == half)
    clock.advance(1_000)
    await wait_until(lambda: first.checkpoints_written >= 1)
    await publish(store, "sensors", readings[half : half + 600])  # processed but never checkpointed
    await wait_until(lambda: first.executor.records_in == half + 600)
    await first.stop(checkpoint=False)  # a crash: no final checkpoint

    restores = await LogCheckpointStore(store, "avg-temp").load()
    assert len(restores) == 3 and sum(max(r.offset, 0) for r in restores.values()) == half
    await publish(store, "sensors", readings[half + 600 :])
    second = AttachedRunner(sensor_pipeline(), store, clock=clock, config=config)
    await second.start()
    try:
        await wait_until(lambda: second.executor.records_in == len(readings) - half)  # replay from the checkpoint
        clock.advance(40_000)
        expected = batch_window_means(readings, 10_000)
        await wait_until(lambda: len(finals(read_topic(store, "temp-avg"))) == len(expected))
        rows = read_topic(store, "temp-avg")
        assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}
        # duplicates exist only as re-emissions of the same deterministic key with the same value
        seen: dict[tuple, float] = {}
        for o in rows:
            key = tuple(o["_key"])
            assert key == (o["window_start"], o["window_end"], o["key"])
            if key in seen and o["emit"] == "first":
                assert o["value"] == pytest.approx(seen[key])
            seen[key] = o["value"]
    finally:
        await second.stop()


@pytest.mark.slow
async def test_a_slow_sink_pauses_fetching_and_a_burst_stays_in_the_log(store: MemoryLogStore) -> None:
    """250k small records (1M in bench_long_tests) land in the log in one burst while the sink is blocked: the
    processor reads only what its bounded queues hold (55k at most, a fifth of the burst); memory stays flat;
    opening the sink drains it."""
    total, per_batch = sized(250_000, 1_000_000), 5_000
    encoded = encode_batch([RecordSpec(b'{"k":"a","v":1}', b"a", (), T0 + i) for i in range(per_batch)])
    store.create_topic("burst", 1)
    log = store.partition("burst", 0)
    for n in range(total // per_batch):  # the burst: straight into the store, event time moving on
        log.append_nowait(shift_timestamps(encoded, n * per_batch))
    assert log.high_watermark == total

    stream = Pipeline.source("burst", group="burst", watermarks=BoundedOutOfOrderness(0, idle_timeout=None))
    stream.key_by(lambda v: v["k"]).window(Tumbling(1_000)).aggregate(Mean("v")).sink("out")
    sink = MemorySink()
    sink.gate = asyncio.Event()  # the sink is stuck
    config = RunnerConfig(max_batch_records=2_000, queue_batches=4)
    source = LogSource(store, ("burst",))
    runner = Runner(stream.pipeline, source, sink, LogCheckpointStore(store, "burst"),
                    clock=FakeClock(), config=config)
    tracemalloc.start()
    try:
        await runner.start()
        await wait_until(lambda: runner.out_q.full() and runner.in_q.full())
        await asyncio.sleep(0.2)  # give a runaway reader the chance to show itself
        read = source.positions[("burst", 0)]
        # the fetcher hands over whole stored batches (5 000 records here, more than max_batch_records)
        in_flight_bound = (2 * config.queue_batches + 3) * per_batch
        assert read <= in_flight_bound, f"read {read} records with the sink blocked"
        _, peak_blocked = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak_blocked < 32 * 1024 * 1024, f"peak traced memory {peak_blocked / 1e6:.1f} MB"
        rss_before = rss_bytes()
        sink.gate.set()
        # one window per 1 000 records (1 ms apart): all but the last are closed by the watermark
        await wait_until(lambda: len([r for r in sink.records if r.topic == "out"]) == total // 1_000 - 1,
                         timeout=120)
        status = runner.status()
        assert status["partitions"][0]["offset_lag"] == 0
        assert status["queues"]["max_in_seen"] <= config.queue_batches
        assert status["queues"]["max_out_seen"] <= config.queue_batches
        assert rss_bytes() - rss_before < 64 * 1024 * 1024
        assert runner.executor.records_in == total
    finally:
        tracemalloc.stop()
        await runner.stop()


async def test_records_fetched_before_the_assignment_is_restored_are_not_lost() -> None:
    """Like aiokafka: the fetcher can return records of a newly assigned partition while the
    assignment listener is still loading checkpoints. They must be read again, not dropped."""
    from processors.testing import MemoryCheckpointStore, MemorySource

    class SlowCheckpoints(MemoryCheckpointStore):
        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()

        async def load(self, tps: Collection[TopicPartition] | None = None) -> dict[TopicPartition, PartitionRestore]:
            await self.gate.wait()
            return await super().load(tps)

    class BackgroundAssign(MemorySource):
        async def start(self, on_assigned: AssignmentListener, on_revoked: AssignmentListener,
                        on_lost: AssignmentListener | None = None) -> None:
            tps = [(self.topic, p) for p in self.data]
            self.positions = dict.fromkeys(tps, 0)
            # typed as returning an Awaitable; ensure_future wraps the coroutine in a Task like create_task
            self.assigning: asyncio.Future[None] = asyncio.ensure_future(on_assigned(tps))
            self.delivered = 0

        async def fetch(self, max_records: int, timeout: float, paused: set[TopicPartition]
                        ) -> list[tuple[TopicPartition, list[RecordLike]]]:
            out = await super().fetch(max_records, timeout, paused)
            self.delivered += sum(len(rows) for _, rows in out)
            return out

    source = BackgroundAssign("in", 2)
    for i in range(500):
        source.append(i % 2, {"sensor": f"s{i % 4}", "temp": 1.0, "ts": T0 + i}, T0 + i)
    checkpoints = SlowCheckpoints()
    runner = Runner(sensor_pipeline(), source, MemorySink(), checkpoints, clock=FakeClock())
    await runner.start()
    try:
        await wait_until(lambda: source.delivered >= 500)  # the fetcher saw all the data while the load is pending
        checkpoints.gate.set()
        await wait_until(lambda: runner.executor.records_in == 500)
        assert sorted(p["position"] for p in runner.status()["partitions"]) == [250, 250]
    finally:
        await runner.stop()


async def test_watermark_alignment_pauses_the_partition_running_ahead() -> None:
    from processors.testing import MemoryCheckpointStore, MemorySource
    from processors.watermarks import WatermarkAlignment

    stream = Pipeline.source("in", group="aligned", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(0, idle_timeout=None),
                             alignment=WatermarkAlignment(2_000))
    stream.key_by(lambda v: v["sensor"]).window(Tumbling(10_000)).aggregate(Mean("temp")).sink("out")
    source = MemorySource("in", 2)
    for i in range(1_000):  # partition 0: 100 s of event time, all available at once
        source.append(0, {"sensor": "fast", "temp": 1.0, "ts": T0 + i * 100}, T0 + i * 100)
    for i in range(10):  # partition 1: only its first second so far
        source.append(1, {"sensor": "slow", "temp": 1.0, "ts": T0 + i * 100}, T0 + i * 100)
    runner = Runner(stream.pipeline, source, MemorySink(), MemoryCheckpointStore(), clock=FakeClock(),
                    config=RunnerConfig(max_batch_records=50, queue_batches=2))
    await runner.start()
    try:
        def position(p: int) -> int:
            parts = runner.status()["partitions"]
            return parts[p]["position"] or 0 if len(parts) == 2 else 0

        await wait_until(lambda: position(1) == 10)
        await asyncio.sleep(0.2)  # the fast partition would be far ahead by now without alignment
        fast = position(0)
        assert fast <= 2_000 // 100 + 50 * (2 * 2 + 3), f"fast partition read to {fast} while paused"
        for i in range(10, 1_000):
            source.append(1, {"sensor": "slow", "temp": 1.0, "ts": T0 + i * 100}, T0 + i * 100)
        await wait_until(lambda: runner.executor.records_in == 2_000)
    finally:
        await runner.stop()


async def test_stop_while_a_rebalance_waits_for_its_checkpoint_does_not_hang() -> None:
    """A revoke arriving while the sink is stuck (queues full), then SIGTERM: stop() returns and the
    rebalance listener is released instead of waiting forever for loops that were stopped."""
    from processors.testing import MemoryCheckpointStore, MemorySource

    source = MemorySource("in", 1)
    for i in range(5_000):
        source.append(0, {"sensor": f"s{i % 50}", "temp": 1.0, "ts": T0 + i * 1_000}, T0 + i * 1_000)
    sink = MemorySink()
    sink.gate = asyncio.Event()
    runner = Runner(sensor_pipeline(), source, sink, MemoryCheckpointStore(), clock=FakeClock(),
                    config=RunnerConfig(max_batch_records=100, queue_batches=2, stop_timeout_s=0.5))
    await runner.start()
    await wait_until(lambda: runner.in_q.full() and runner.out_q.full())
    revoke = asyncio.create_task(runner._on_revoked([("in", 0)]))
    await asyncio.sleep(0.05)
    assert not revoke.done()  # waiting: its checkpoint is stuck behind the blocked sink
    await asyncio.wait_for(runner.stop(), 10)
    await asyncio.wait_for(revoke, 5)


async def test_a_batch_fetched_across_a_reassignment_is_read_again_from_the_checkpoint() -> None:
    """A fetch that started before a rebalance returns after the partition was revoked, assigned
    again and positioned at its checkpoint (aiokafka hands over what it fetched before the seek).
    Processing it on top of the restored state would count those records twice: the runner drops
    it and reads again from the checkpoint's offset."""
    from processors.testing import MemoryCheckpointStore, MemorySource

    class StraddlingSource(MemorySource):
        def __init__(self) -> None:
            super().__init__("in", 1)
            self.hold: asyncio.Event | None = None
            self.held: asyncio.Event = asyncio.Event()
            self.stale: list[RecordLike] = []

        async def fetch(self, max_records: int, timeout: float, paused: set[TopicPartition]
                        ) -> list[tuple[TopicPartition, list[RecordLike]]]:
            if self.hold is not None:  # this fetch is in flight across the rebalance
                hold, self.hold = self.hold, None
                self.held.set()
                await hold.wait()
                return [(("in", 0), self.stale)]
            return await super().fetch(max_records, timeout, paused)

    source = StraddlingSource()
    for i in range(100):
        source.append(0, {"sensor": "s", "temp": 1.0, "ts": T0 + i * 10}, T0 + i * 10)
    runner = Runner(sensor_pipeline(), source, MemorySink(), MemoryCheckpointStore(), clock=FakeClock())
    await runner.start()
    try:
        await wait_until(lambda: runner.executor.records_in == 100)
        source.stale = source.data[0][40:100]  # what an earlier fetch position would hand over
        hold = source.hold = asyncio.Event()
        await wait_until(source.held.is_set)
        await runner._on_revoked([("in", 0)])  # checkpoint at offset 100
        await runner._on_assigned([("in", 0)])  # restored there
        hold.set()
        await wait_until(lambda: runner.positions.get(("in", 0)) == 100)
        source.append(0, {"sensor": "s", "temp": 1.0, "ts": T0 + 1_000}, T0 + 1_000)
        await wait_until(lambda: runner.executor.records_in == 101)
        await asyncio.sleep(0.1)  # a stale batch processed late would show here
        assert runner.executor.records_in == 101
        (key_state,) = [logic for node in runner.executor.keyed.values() for logic in node.rt.logics.values()]
        assert isinstance(key_state, WindowLogic)
        assert sum(slot[3] for slot in key_state.windows.values()) == 101  # each record counted once
    finally:
        await runner.stop()


async def test_stop_ends_a_fetch_loop_that_swallowed_its_cancellation() -> None:
    """Python 3.11's asyncio.wait_for returns its future's result instead of raising CancelledError when
    the cancellation arrives just as that future completes (the attached source waits for data so): the
    fetch loop goes on as if nothing happened. stop() must still end it (it waited forever before)."""
    from processors.testing import MemoryCheckpointStore, MemorySource

    class SwallowingSource(MemorySource):
        swallowed = 0

        async def fetch(self, max_records: int, timeout: float, paused: set[TopicPartition]
                        ) -> list[tuple[TopicPartition, list[RecordLike]]]:
            try:
                await asyncio.sleep(timeout)
            except asyncio.CancelledError:
                if self.swallowed == 0:  # the first cancellation is lost, as wait_for loses it
                    self.swallowed += 1
                    return []
                raise
            return await super().fetch(max_records, timeout, paused)

    source = SwallowingSource("in", 1)
    runner = Runner(sensor_pipeline(), source, MemorySink(), MemoryCheckpointStore(), clock=FakeClock(),
                    config=RunnerConfig(fetch_timeout_s=0.05))
    await runner.start()
    stopping = asyncio.ensure_future(runner.stop())
    done, _ = await asyncio.wait([stopping], timeout=5)
    assert stopping in done, "stop() is still waiting for the fetch loop"
    assert source.swallowed == 1


async def test_an_assignment_whose_checkpoints_cannot_be_read_fails_the_processor() -> None:
    """The broker killed while an assignment's checkpoints load: the load fails inside the consumer's
    rebalance listener, whose exception aiokafka logs and swallows, going on as the partitions' owner.
    The processor must fail (exit 1, its supervisor restarts it), not wait for an assignment that
    never reaches it (the exactly-once broker-kill test hung until its 300 s timeout)."""
    from processors.errors import CheckpointError
    from processors.testing import MemoryCheckpointStore, MemorySource

    class UnreadableCheckpoints(MemoryCheckpointStore):
        async def load(self, tps: Collection[TopicPartition] | None = None) -> dict[TopicPartition, PartitionRestore]:
            raise CheckpointError("cannot read _checkpoints.sensors: the broker is gone")

    class SwallowingListenerErrors(MemorySource):  # as aiokafka's group coordinator calls the listener
        async def start(self, on_assigned: AssignmentListener, on_revoked: AssignmentListener,
                        on_lost: AssignmentListener | None = None) -> None:
            tps = [(self.topic, p) for p in self.data]
            self.positions = dict.fromkeys(tps, 0)
            try:
                await on_assigned(tps)
            except Exception:
                pass

    source = SwallowingListenerErrors("in", 2)
    for i in range(100):
        source.append(i % 2, {"sensor": f"s{i % 4}", "temp": 1.0, "ts": T0 + i}, T0 + i)
    runner = Runner(sensor_pipeline(), source, MemorySink(), UnreadableCheckpoints(), clock=FakeClock())
    await runner.start()
    try:
        await asyncio.wait_for(runner.stopped.wait(), 20)
        assert isinstance(runner.failed, CheckpointError)
        assert runner.executor.records_in == 0
    finally:
        await runner.stop()


async def test_a_checkpoint_of_another_pipeline_in_the_same_group_is_refused_with_the_way_out(
        store: MemoryLogStore, caplog: pytest.LogCaptureFixture) -> None:
    """The README attaches the example (group sensor-avg, two keyed operators); a newcomer's own pipeline
    reusing that group must say which checkpoint topic is in the way and what to do, in one log line."""
    from processors.examples.sensors import build

    clock = FakeClock()
    readings = sensor_readings(5)
    await publish(store, "sensors", readings)
    config = RunnerConfig(tick_ms=100, checkpoint_interval_ms=1_000)
    example = AttachedRunner(build({"SENSORS_GROUP": "shared"}), store, clock=clock, config=config)
    await example.start()
    await wait_until(lambda: example.executor.records_in == len(readings))
    await example.stop()  # a final checkpoint with the state of both keyed operators

    stream = Pipeline.source("sensors", group="shared", event_time=lambda v: v["ts"])
    stream.key_by(lambda v: v["sensor"]).window(Tumbling(10_000)).aggregate(Mean("temp")).sink("mine")
    mine = AttachedRunner(stream.pipeline, store, clock=clock, config=config)
    await mine.start()
    try:
        await wait_until(lambda: mine.failed is not None)
    finally:
        await mine.stop()
    message = str(mine.failed)
    assert "_checkpoints.shared" in message and "group of its own" in message, message
    assert "sluice topics delete _checkpoints.shared" in message
    failed = [r for r in caplog.records if r.getMessage().startswith("processor failed")]
    assert len(failed) == 1 and failed[0].exc_info is None  # the reason in the line, no traceback
    assert "_checkpoints.shared" in failed[0].getMessage()
