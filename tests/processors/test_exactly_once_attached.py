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
from tests.processors.test_exactly_once_broker_kill import free_port, kill9
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
    open_at_kill: list[int] = []  # alerts the probe saw in the open transaction just before each kill
    aborted = 0  # alerts of the transactions the kills cut (aborted after the restart), after each kill

    for i, chunk in enumerate(chunks):
        await produce(sluice.bootstrap, ENV["SENSORS_INPUT"], chunk)  # acked = durable (flush=always)
        # A commit may still land just before the kill, or be in flight at it (the restart completes it):
        # then the next chunks each get a kill in an open transaction until one of them has been cut.
        retry = len(open_at_kill) > 1 and aborted == 0
        if i % 3 != 1 and not retry:
            continue
        async with OffsetProbe(sluice.bootstrap, ENV["SENSORS_ALERTS"]) as probe:
            if len(open_at_kill) != 1 and not retry and rng.random() < 0.5:
                await asyncio.sleep(rng.uniform(0.0, 2.0))  # anywhere in the interval
                high, now = await probe.open_records()
            else:  # right after results were written in the open transaction (always in the second round)
                until = time.monotonic() + 20
                high, now = await probe.open_records()
                while now == 0 and time.monotonic() < until:
                    await asyncio.sleep(rng.uniform(0, 0.05))
                    high, now = await probe.open_records()
            kill9(sluice)  # nothing between the look-up and the kill
        sluice.start()
        open_at_kill.append(now)
        await wait_decided(sluice.bootstrap, high)  # the restarted coordinator ended the cut transaction
        aborted = await aborted_records(sluice.bootstrap, ENV["SENSORS_ALERTS"])
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
          f"committed, {len(written)} written; alerts open at each kill: {open_at_kill}")
    counts = Counter(tuple(r["_key"]) for r in rows)
    assert [k for k, n in counts.items() if n > 1] == []
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}
    assert sorted(alerts) == batch_jump_alerts(readings)
    # the kills did cut intervals whose results were written: those were aborted, then written again
    assert len(written) > len(alerts), open_at_kill
    assert "Traceback" not in sluice.log_text()


class OffsetProbe:
    """Two consumers kept open on one topic, to look up its high watermarks and then its last stable
    offsets with nothing but two ListOffsets requests in between."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.uncommitted = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted")
        self.committed = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")

    async def __aenter__(self) -> OffsetProbe:
        await self.uncommitted.start()
        await self.committed.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.uncommitted.stop()
        await self.committed.stop()

    async def open_records(self) -> tuple[dict[TopicPartition, int], int]:
        """The high watermarks, and how many records below them are still in open transactions when the
        last stable offsets are read just after. In that order: read the other way round, a commit landing
        between the two look-ups counted its records as open, and the kill that followed cut nothing."""
        if self.topic not in await self.uncommitted.topics():
            return {}, 0
        high = await self.uncommitted.end_offsets(self.tps)
        stable = await self.committed.end_offsets(self.tps)
        return high, sum(max(0, high[tp] - stable[tp]) for tp in self.tps)


async def wait_decided(bootstrap: str, high: dict[TopicPartition, int]) -> None:
    """Until every record below ``high`` is committed or aborted: the last stable offsets reach it."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        deadline = time.monotonic() + 60
        while high:
            stable = await consumer.end_offsets(list(high))
            if all(stable[tp] >= end for tp, end in high.items()):
                return
            assert time.monotonic() < deadline, (high, stable)
            await asyncio.sleep(0.1)
    finally:
        await consumer.stop()


async def aborted_records(bootstrap: str, topic: str) -> int:
    """Records of ``topic`` below its last stable offsets that a read_committed reader does not get."""
    seen: dict[str, set[tuple[int, int]]] = {}
    stable: dict[TopicPartition, int] = {}
    for isolation_level in ("read_committed", "read_uncommitted"):
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    isolation_level=isolation_level)
        await consumer.start()
        try:
            if topic not in await consumer.topics():
                return 0
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            stable = stable or ends  # read_committed's ends: the last stable offsets
            offsets = seen.setdefault(isolation_level, set())
            while any([await consumer.position(tp) < ends[tp] for tp in tps]):
                for tp, messages in (await consumer.getmany(timeout_ms=500)).items():
                    offsets.update((tp.partition, m.offset) for m in messages)
        finally:
            await consumer.stop()
    return sum(1 for p, offset in seen["read_uncommitted"] - seen["read_committed"]
               if offset < stable[TopicPartition(topic, p)])


def test_attached_exactly_once_refuses_to_run_without_the_transaction_coordinator() -> None:
    with pytest.raises(PipelineDefinitionError, match="needs the broker's transaction coordinator"):
        AttachedRunner(build({}), MemoryLogStore(), config=RunnerConfig(guarantee="exactly-once"))
