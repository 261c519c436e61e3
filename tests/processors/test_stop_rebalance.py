"""An exactly-once standalone processor stopped (SIGTERM: ``Runner.stop``) while a rebalance is under way:
its final checkpoint must commit before its consumer rejoins the group.

Before, the revoke listener of a stopping runner returned at once, so aiokafka rejoined while the final
checkpoint was still being written. Its TxnOffsetCommit then named either the generation the group had
left (ILLEGAL_GENERATION: the interval aborted, its windows recomputed by the partitions' next owner), or
the new one, with the offsets of the new assignment only (this test: the input offsets of the partitions
the other member got stayed uncommitted, though the checkpoint of them all was written). Kafka's consumers
run ``onPartitionsRevoked`` (Kafka Streams commits there) before they send JoinGroup; so does the runner now.

The race is made certain: the final checkpoint is held before its first write until either the runner says
its consumer waits for it, or the rebalance has completed without waiting (the old behaviour)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from processors.checkpoint import PartitionRestore
from processors.kafka import KafkaCheckpointStore, KafkaSink
from processors.runner import EXACTLY_ONCE, Runner, RunnerConfig
from processors.scaleout import build_stages
from tests.processors.test_runner import sensor_pipeline
from tests.processors.test_standalone import finals, heartbeat_all, produce, read_all
from tests.processors.test_txn_fencing import committed, end_offsets
from tests.processors.workloads import batch_window_means, sensor_readings
from tests.sluice_server import SluiceProcess

pytestmark = pytest.mark.slow
PARTITIONS = 4
WAITS_MESSAGE = "a rebalance reached the stopping processor"


@pytest.fixture
def sluice(tmp_path: Path) -> Iterator[SluiceProcess]:
    server = SluiceProcess(tmp_path / "data", env={"SLUICE_STORAGE__DEFAULT_PARTITIONS": str(PARTITIONS)}).start()
    yield server
    server.stop()


class _OnMessage(logging.Handler):
    """Sets ``event`` when a record whose message starts with ``prefix`` is logged."""

    def __init__(self, prefix: str, event: asyncio.Event) -> None:
        super().__init__(logging.INFO)
        self.prefix, self.event = prefix, event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.event.set()


async def test_a_rebalance_during_stop_commits_the_final_interval_before_the_rejoin(
        sluice: SluiceProcess, caplog: pytest.LogCaptureFixture) -> None:
    bootstrap = sluice.bootstrap
    pipeline = sensor_pipeline()
    topic, group, output = pipeline.source_config.topics[0], pipeline.name, "temp-avg"
    readings = sensor_readings(30)
    expected = batch_window_means(readings, 10_000)
    await produce(bootstrap, topic, readings)
    await heartbeat_all(bootstrap, topic, readings[-1]["ts"] + 60_000)  # every window closes
    config = RunnerConfig(guarantee=EXACTLY_ONCE, checkpoint_interval_ms=600_000)  # the final checkpoint only
    (stage,) = await build_stages(pipeline, None, bootstrap, config, client_id=None, session_timeout_ms=3000,
                                  instance_id="stopping")
    runner, sink = stage.runner, stage.sink
    caplog.set_level(logging.INFO, logger="processors.runner")
    waits = asyncio.Event()
    handler = _OnMessage(WAITS_MESSAGE, waits)
    logging.getLogger("processors.runner").addHandler(handler)
    gate, revoked = asyncio.Event(), asyncio.Event()
    flush, revoke = sink.flush, runner._on_revoked

    async def gated_flush() -> None:  # the final checkpoint's first step waits until the rebalance reached it
        await gate.wait()
        await flush()

    async def on_revoked(tps: list[tuple[str, int]]) -> None:
        if tps:
            revoked.set()
        await revoke(tps)

    runner._on_revoked = on_revoked  # type: ignore[method-assign]  # before start: the listener calls this one
    other = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             session_timeout_ms=3000, heartbeat_interval_ms=300)
    joining: asyncio.Task[None] | None = None
    try:
        await runner.start()
        await asyncio.wait_for(_emitted(runner, len(expected)), 60)  # in the open transaction
        sink.flush = gated_flush  # type: ignore[method-assign]
        stopping = asyncio.create_task(runner.stop())
        joining = asyncio.create_task(other.start())  # returns once the other member has its assignment
        await asyncio.wait_for(revoked.wait(), 30)  # the rebalance reached the stopping runner
        # either the runner holds its rejoin for the final checkpoint, or the rebalance completed without it
        waiting = asyncio.create_task(waits.wait())
        await asyncio.wait([waiting, joining], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        assert waiting.done() or joining.done(), "neither the final checkpoint nor the rebalance went on"
        waiting.cancel()
        gate.set()
        await asyncio.wait_for(stopping, 60)
        await asyncio.wait_for(joining, 60)  # the rebalance completes once the stopping member has rejoined
    finally:
        logging.getLogger("processors.runner").removeHandler(handler)
        if joining is not None and not joining.done():
            joining.cancel()
        await other.stop()
        await sink.stop()
    assert runner.failed is None
    assert (runner.partitions_lost, sink.transactions_committed, sink.transactions_aborted,
            runner.checkpoints_written) == (0, 1, 0, 1)
    ends = await end_offsets(bootstrap, topic)
    written = {tp: end for tp, end in ends.items() if end > 0}  # a partition nothing was read from has no offset
    assert await committed(bootstrap, group) == written
    # the checkpoint committed with them holds every partition read to its end: the next owner restores there
    restores = await _restores(bootstrap, pipeline.name)
    assert {TopicPartition(*tp): r.offset for tp, r in restores.items() if r.offset >= 0} == written
    rows = await read_all(bootstrap, output, "read_committed")
    assert len(rows) == len(expected) and finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}
    assert sum(WAITS_MESSAGE in r.getMessage() for r in caplog.records) == 1


async def _emitted(runner: Runner, count: int) -> None:
    while runner.records_out < count:
        assert runner.failed is None, runner.failed
        await asyncio.sleep(0.05)


async def _restores(bootstrap: str, pipeline: str) -> dict[tuple[str, int], PartitionRestore]:
    sink = KafkaSink(bootstrap)
    await sink.start()
    try:
        return dict(await KafkaCheckpointStore(bootstrap, pipeline, sink).load())
    finally:
        await sink.stop()
