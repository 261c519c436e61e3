"""Issue 17, item 1 for attached processors: ``sluice serve --processor`` with
``SLUICE_PROCESSOR_GUARANTEE=exactly-once``. Each checkpoint interval (outputs, the state checkpoint
with the input positions) is one transaction of the broker's coordinator; kill -9 of the broker (and
so of the processor inside it) at seeded random points, and a read_committed reader sees every
(window, key) result and every alert exactly once, equal to the batch computation."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from broker.log.memory import MemoryLogStore
from processors.errors import PipelineDefinitionError
from processors.examples.sensors import build
from processors.hosting import AttachedRunner
from processors.runner import RunnerConfig
from tests.broker.server.conftest import SluiceProcess
from tests.processors.test_exactly_once import batch_jump_alerts
from tests.processors.test_exactly_once_broker_kill import free_port, kill9_and_restart
from tests.processors.test_standalone import PARTITIONS, finals, heartbeat_all, produce, read_all, topics
from tests.processors.workloads import batch_window_means, sensor_readings

pytestmark = pytest.mark.slow

ENV = topics("eos-att")


@pytest.fixture
def attached_sluice(tmp_path: Path) -> Iterator[SluiceProcess]:
    server = SluiceProcess(tmp_path / "data", partitions=PARTITIONS, env={
        **ENV, "SLUICE_KAFKA__PORT": str(free_port()), "SLUICE_STORAGE__FLUSH": "always",
        "SLUICE_PROCESSORS": json.dumps(["processors.examples.sensors:pipeline"]),
        "SLUICE_PROCESSOR_GUARANTEE": "exactly-once", "SLUICE_PROCESSOR_CHECKPOINT_INTERVAL_MS": "3000"})
    server.start()
    yield server
    server.stop()


async def test_kill_9_of_serve_with_an_attached_processor_read_committed_sees_every_window_exactly_once(
        attached_sluice: SluiceProcess) -> None:
    sluice = attached_sluice
    seed = int(os.environ.get("SLUICE_TEST_SEED", "31"))
    rng = random.Random(seed)
    readings = sensor_readings(90)
    expected = batch_window_means(readings, 10_000)
    chunks = [readings[i : i + 1_000] for i in range(0, len(readings), 1_000)]
    open_at_kill: list[bool] = []  # results written in the open transaction when it died

    async def open_alerts() -> int:
        # the high watermark less the last stable offset: alerts of the open transaction. Two offset
        # look-ups, not two reads of the topic, so that a commit can hardly land between this and the kill
        return await open_records(sluice.bootstrap, ENV["SENSORS_ALERTS"])

    for i, chunk in enumerate(chunks):
        await produce(sluice.bootstrap, ENV["SENSORS_INPUT"], chunk)  # acked = durable (flush=always)
        if i % 3 != 1:
            continue
        if len(open_at_kill) != 1 and rng.random() < 0.5:
            await asyncio.sleep(rng.uniform(0.0, 2.0))  # anywhere in the interval
            now = await open_alerts()
        else:  # right after results were written in the open transaction (always in the second round)
            until = time.monotonic() + 20
            while (now := await open_alerts()) == 0 and time.monotonic() < until:
                await asyncio.sleep(rng.uniform(0, 0.05))
        kill9_and_restart(sluice)
        open_at_kill.append(now > 0)
    await heartbeat_all(sluice.bootstrap, ENV["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)
    deadline = time.monotonic() + 120
    while len(finals(await read_all(sluice.bootstrap, ENV["SENSORS_OUTPUT"], "read_committed"))) < len(expected):
        assert time.monotonic() < deadline, sluice.log_text()[-4000:]
        await asyncio.sleep(0.3)
    rows = await read_all(sluice.bootstrap, ENV["SENSORS_OUTPUT"], "read_committed")
    alerts = [(a["sensor"], a["ts"], a["temp"]) for a in
              await read_all(sluice.bootstrap, ENV["SENSORS_ALERTS"], "read_committed")]
    written = await read_all(sluice.bootstrap, ENV["SENSORS_ALERTS"])
    print(f"seed {seed}: read_committed {len(rows)} rows for {len(expected)} windows; alerts {len(alerts)} "
          f"committed, {len(written)} written; new results open at each kill: {open_at_kill}")
    counts = Counter(tuple(r["_key"]) for r in rows)
    assert [k for k, n in counts.items() if n > 1] == []
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}
    assert sorted(alerts) == batch_jump_alerts(readings)
    # the kills did cut intervals whose results were written: those were aborted, then written again
    # (open_at_kill is what the polling saw; a commit may land between a poll and the kill)
    assert len(written) > len(alerts), open_at_kill
    assert "Traceback" not in sluice.log_text()


async def open_records(bootstrap: str, topic: str) -> int:
    """Records written to ``topic`` in transactions still open: the high watermarks less the last
    stable offsets (ListOffsets read_uncommitted against read_committed), summed over partitions."""
    ends: dict[str, int] = {}
    for isolation_level in ("read_committed", "read_uncommitted"):  # the stable offsets first: never above
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level)
        await consumer.start()
        try:
            if topic not in await consumer.topics():
                return 0
            offsets = await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
            ends[isolation_level] = sum(offsets.values())
        finally:
            await consumer.stop()
    return ends["read_uncommitted"] - ends["read_committed"]


def test_attached_exactly_once_refuses_to_run_without_the_transaction_coordinator() -> None:
    with pytest.raises(PipelineDefinitionError, match="needs the broker's transaction coordinator"):
        AttachedRunner(build({}), MemoryLogStore(), config=RunnerConfig(guarantee="exactly-once"))
