"""Issue 17 with the group coordinator's restored state: an exactly-once standalone processor keeps its
partitions over a kill -9 of ``sluice serve`` (same data directory and port). Its consumer goes on
heartbeating with the member id and generation it had, the restarted coordinator knows them, and the
processor neither loses its partitions nor restores them from its checkpoint: its log shows one
assignment (one restore) for the whole run and no loss. A read_committed reader still sees every
(window, key) result exactly once, equal to the batch computation.

Before the fix the restarted broker had forgotten the group: the heartbeat got UNKNOWN_MEMBER_ID,
the processor reported its partitions lost (aborting its transaction) and restored them from the
checkpoint when it rejoined (two assignments in its log)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.broker.server.conftest import SluiceProcess
from tests.processors.test_exactly_once import EXACTLY_ONCE
from tests.processors.test_exactly_once_broker_kill import free_port, kill9_and_restart
from tests.processors.test_standalone import PARTITIONS, Processor, finals, heartbeat_all, produce, read_all, topics
from tests.processors.workloads import batch_window_means, sensor_readings

pytestmark = pytest.mark.slow
# sessions longer than a restart of the broker on a loaded machine (the later flag wins)
OPTIONS = (*EXACTLY_ONCE, "--session-timeout-ms", "30000")


@pytest.fixture
def durable_sluice(tmp_path: Path) -> Iterator[SluiceProcess]:
    server = SluiceProcess(tmp_path / "data", partitions=PARTITIONS,
                           env={"SLUICE_KAFKA__PORT": str(free_port()), "SLUICE_STORAGE__FLUSH": "always"})
    server.start()
    yield server
    server.stop()


async def committed_input(bootstrap: str, group: str, topic: str) -> tuple[int, int]:
    """(sum of the group's committed offsets, sum of the end offsets) of the input topic."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        committed = [await consumer.committed(tp) for tp in tps]
        return sum(c or 0 for c in committed), sum(ends.values())
    finally:
        await consumer.stop()


async def test_an_exactly_once_processor_keeps_its_partitions_over_a_broker_kill_9(
        durable_sluice: SluiceProcess, tmp_path: Path) -> None:
    sluice = durable_sluice
    readings = sensor_readings(60)
    expected = batch_window_means(readings, 10_000)
    env = topics("eos-keep")
    log = tmp_path / "processor.log"
    half = len(readings) // 2
    await produce(sluice.bootstrap, env["SENSORS_INPUT"], readings[:half])
    proc = Processor(sluice.bootstrap, env, log, *OPTIONS)
    try:
        deadline = time.monotonic() + 90
        # the first half is processed and its transaction committed: no transaction is open at the kill
        while (await committed_input(sluice.bootstrap, env["SENSORS_GROUP"], env["SENSORS_INPUT"]))[0] < half:
            assert time.monotonic() < deadline and proc.proc.poll() is None, log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        assert len(proc.restored()) == 1
        await asyncio.to_thread(kill9_and_restart, sluice)
        await produce(sluice.bootstrap, env["SENSORS_INPUT"], readings[half:])
        await heartbeat_all(sluice.bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)
        deadline = time.monotonic() + 120
        while len(finals(await read_all(sluice.bootstrap, env["SENSORS_OUTPUT"], "read_committed"))) < len(expected):
            assert time.monotonic() < deadline and proc.proc.poll() is None, log.read_text()[-3000:]
            await asyncio.sleep(0.3)
        text = log.read_text()
        assert len(proc.restored()) == 1, ("the processor was assigned (and restored) again", text[-3000:])
        assert "partitions lost" not in text, text[-3000:]
        assert proc.proc.poll() is None, "the processor exited"
    finally:
        assert proc.stop() == 0, log.read_text()[-3000:]
    rows = await read_all(sluice.bootstrap, env["SENSORS_OUTPUT"], "read_committed")
    assert [k for k, n in Counter(tuple(r["_key"]) for r in rows).items() if n > 1] == []
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}
    assert "Traceback" not in sluice.log_text()
