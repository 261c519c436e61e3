"""Issue 17, items 2 and 3: two and three ``sluice process`` instances of a pipeline keyed by something
other than the input's partitioning (readings spread round-robin over the input partitions, keyed by
sensor in the pipeline) go through the repartition topic: killed with -9 and restarted mid-stream, or
joined by another instance mid-stream, they give the batch computation's windows, each exactly once
read_committed. Against a real ``sluice serve``, and against an external Kafka-protocol cluster when
SLUICE_TEST_KAFKA_BOOTSTRAP names one (as the client tests do)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.processors.clusters import TARGETS, sluice_or_external
from tests.processors.test_standalone import Processor, finals
from tests.processors.workloads import batch_window_means, sensor_readings

pytestmark = pytest.mark.slow
PARTITIONS = 4
EXACTLY_ONCE = ("--guarantee", "exactly-once")


@pytest.fixture(params=TARGETS)
def bootstrap(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sluice_or_external(request.param, tmp_path, PARTITIONS)


def topics(prefix: str) -> dict[str, str]:
    tag = f"{prefix}-{uuid.uuid4().hex[:8]}"  # an external cluster keeps topics between runs
    return {"SENSORS_INPUT": f"{tag}-in", "SENSORS_OUTPUT": f"{tag}-avg", "SENSORS_GROUP": f"{tag}-group"}


async def create_topics(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, PARTITIONS, 1) for name in names])
    finally:
        await admin.close()


async def produce_round_robin(bootstrap: str, topic: str, rows: list[dict[str, Any]], first: int) -> None:
    """Reading ``first + i`` to partition ``(first + i) % 4``: each sensor's readings land in every
    partition, so an instance owning some input partitions sees part of every sensor."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, json.dumps(r).encode(), key=f"reading-{first + i}".encode(),
                                       partition=(first + i) % PARTITIONS, timestamp_ms=r["ts"])
                   for i, r in enumerate(rows)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def punctuate(bootstrap: str, topic: str, watermark: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for p in range(PARTITIONS):
            headers = [("sluice-watermark", str(watermark).encode())]
            await producer.send_and_wait(topic, b"", partition=p, headers=headers)
    finally:
        await producer.stop()


async def read_rows(bootstrap: str, topic: str, isolation_level: str) -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation_level)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return []
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]  # create_topics made it
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                for m in messages:
                    value = json.loads(m.value)
                    value["_key"] = json.loads(m.key)
                    out.append(value)
        return out
    finally:
        await consumer.stop()


async def shuffled_per_origin(bootstrap: str, topic: str) -> Counter[str]:
    """Per input partition (``<topic>:<partition>``), the sum over repartition partitions of the highest
    ``sluice-shuffle-seq`` written there: how many of its records went through the shuffle, replays
    written again not counted (within one per repartition partition)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return Counter()
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        highest: dict[tuple[str, int], int] = {}
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for tp, messages in (await consumer.getmany(timeout_ms=500)).items():
                for m in messages:
                    seq = dict(m.headers).get("sluice-shuffle-seq")
                    if seq is not None:
                        origin, _, n = seq.decode().rpartition(":")
                        highest[(origin, tp.partition)] = max(highest.get((origin, tp.partition), 0), int(n))
        sums: Counter[str] = Counter()
        for (origin, _), n in highest.items():
            sums[origin] += n
        return sums
    finally:
        await consumer.stop()


class Instance(Processor):
    """``sluice process tests.processors.pipelines:rekeyed`` (Processor runs the sensor example)."""

    def __init__(self, bootstrap: str, env: dict[str, str], log: Path, *options: str) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "process", "tests.processors.pipelines:rekeyed",
             "--bootstrap", bootstrap, "--checkpoint-interval", "0.5", "--session-timeout-ms", "2000", *options],
            env={**os.environ, **env}, stderr=log.open("a"), stdout=subprocess.DEVNULL,
        )

    def owned(self, stage: str) -> list[Any]:
        """The partitions of the stage reading ``stage`` (a topic) this instance owns now."""
        lines = [line for line in self.log.read_text().splitlines()
                 if "partitions assigned" in line or "partitions revoked" in line]
        owned: list[Any] = []
        for line in lines:
            if f"'{stage}'" not in line and f'"{stage}"' not in line:
                continue
            if "partitions assigned" in line:
                owned = [tp for tp in self.assigned_in(line)]
        return owned

    @staticmethod
    def assigned_in(line: str) -> list[Any]:
        text = line.split("partitions=", 1)[1].split(" restored=")[0]
        parsed: list[Any] = json.loads(text.replace("(", "[").replace(")", "]").replace("'", '"'))
        return parsed


def running(instances: list[Instance]) -> None:
    for i in instances:
        assert i.proc.poll() is None, i.log.read_text()[-3000:]


async def wait_for(condition: Any, instances: list[Instance], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        running(instances)
        assert time.monotonic() < deadline, (condition.__doc__, [i.log.read_text()[-2000:] for i in instances])
        await asyncio.sleep(0.1)


async def all_own_partitions(instances: list[Instance], env: dict[str, str]) -> None:
    """Every instance owns input and repartition partitions: a kill now lands on a working member."""
    topic = f"{env['SENSORS_GROUP']}.repartition.0"

    async def owning() -> bool:
        return all(i.owned(env["SENSORS_INPUT"]) and i.owned(topic) for i in instances)
    await wait_for(owning, instances)


@pytest.mark.parametrize("count", [2, 3])
async def test_instances_of_a_repartitioned_pipeline_killed_and_restarted_give_each_window_once(
        bootstrap: str, tmp_path: Path, count: int) -> None:
    rng = random.Random(int(os.environ.get("SLUICE_TEST_SEED", "17")) + count)
    readings = sensor_readings(60)
    expected = batch_window_means(readings, 10_000)
    env = topics(f"shuffle{count}")
    await create_topics(bootstrap, env["SENSORS_INPUT"], env["SENSORS_OUTPUT"])
    half = len(readings) // 2
    await produce_round_robin(bootstrap, env["SENSORS_INPUT"], readings[:half], 0)

    def start(n: int) -> Instance:
        return Instance(bootstrap, env, tmp_path / f"{n}.log", *EXACTLY_ONCE, "--instance-id", f"i{n}")

    instances = [start(n) for n in range(count)]
    victim = rng.randrange(count)
    try:
        await all_own_partitions(instances, env)
        async def some_windows() -> bool:  # written by now (committed or not): the kill lands mid-stream
            return len(await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_uncommitted")) >= 10
        await wait_for(some_windows, instances)
        feeding = asyncio.create_task(produce_round_robin(bootstrap, env["SENSORS_INPUT"], readings[half:], half))
        await asyncio.sleep(rng.uniform(0, 0.5))
        instances[victim].kill9()
        await feeding
        started_before = instances[victim].log.read_text().count("processor started")
        instances[victim] = start(victim)  # the same instance id: it fences its predecessor's transactions

        async def victim_back() -> bool:  # both stages of the restarted instance run (and handle SIGTERM)
            return instances[victim].log.read_text().count("processor started") >= started_before + 2
        await wait_for(victim_back, instances)
        await punctuate(bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)

        async def all_windows() -> bool:
            rows = await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_committed")
            missing = sorted(set(expected) - set(finals(rows)))
            all_windows.__doc__ = f"{len(finals(rows))} of {len(expected)} windows committed; missing {missing}"
            return len(finals(rows)) >= len(expected)
        await wait_for(all_windows, instances, timeout=90)
    finally:
        codes = [i.stop() for i in instances]
    assert codes == [0] * count, [i.log.read_text()[-3000:] for i in instances]
    rows = await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_committed")
    assert [k for k, n in Counter(tuple(r["_key"]) for r in rows).items() if n > 1] == []
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}
    # the keyed stage ran in several instances, each owning part of the repartition topic
    topic = f"{env['SENSORS_GROUP']}.repartition.0"
    assert sum(1 for i in instances if i.owned(topic)) >= 2, [i.log.read_text()[-2000:] for i in instances]


async def test_at_least_once_a_killed_instances_replayed_shuffle_writes_count_once(
        bootstrap: str, tmp_path: Path) -> None:
    """At-least-once, two instances, one killed with -9 mid-stream and restarted: its input partitions
    are replayed from their checkpoints and written to the repartition topic again; the downstream
    drops them by sequence number, so every window emission (re-emissions of the keyed stage's own
    replay included) is the batch value, never a window that counted a record twice."""
    readings = sensor_readings(60)
    expected = batch_window_means(readings, 10_000)
    env = topics("alo-kill")
    await create_topics(bootstrap, env["SENSORS_INPUT"], env["SENSORS_OUTPUT"])
    half = len(readings) // 2
    await produce_round_robin(bootstrap, env["SENSORS_INPUT"], readings[:half], 0)
    # checkpoints only at rebalances and stops, and sessions that outlast a loaded machine's pauses (a
    # rebalance checkpoints too): the killed instance's input partitions are surely replayed
    rare = ("--checkpoint-interval", "600", "--session-timeout-ms", "6000")
    instances = [Instance(bootstrap, env, tmp_path / f"{n}.log", *rare) for n in range(2)]
    try:
        await all_own_partitions(instances, env)
        async def some_windows() -> bool:
            return len(await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_uncommitted")) >= 10
        await wait_for(some_windows, instances)
        await produce_round_robin(bootstrap, env["SENSORS_INPUT"], readings[half:], half)
        first_half = Counter(f"{env['SENSORS_INPUT']}:{i % PARTITIONS}" for i in range(half))
        async def second_half_shuffled() -> bool:  # by every input partition's owner: the kill cuts into it
            sent = await shuffled_per_origin(bootstrap, f"{env['SENSORS_GROUP']}.repartition.0")
            return all(sent.get(origin, 0) > n for origin, n in first_half.items())
        await wait_for(second_half_shuffled, instances)
        instances[0].kill9()
        started_before = instances[0].log.read_text().count("processor started")
        instances[0] = Instance(bootstrap, env, tmp_path / "0.log", *rare)

        async def back() -> bool:
            return instances[0].log.read_text().count("processor started") >= started_before + 2
        await wait_for(back, instances)
        await punctuate(bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)

        async def all_windows() -> bool:
            return len(finals(await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_uncommitted"))) >= len(expected)
        await wait_for(all_windows, instances, timeout=90)
    finally:
        codes = [i.stop() for i in instances]
    logs = [i.log.read_text() for i in instances]
    assert codes == [0, 0], [text[-3000:] for text in logs]
    rows = await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_uncommitted")
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}
    for r in rows:
        assert r["value"] == pytest.approx(expected[tuple(r["_key"])]), r
    assert any("dropped records a replaying upstream instance wrote again" in text for text in logs)


async def test_an_instance_joining_mid_stream_takes_repartitioned_keys_with_their_state(
        bootstrap: str, tmp_path: Path) -> None:
    """Two instances (at-least-once) run over half the data, windows half full; a third joins: both
    groups rebalance, revoked repartition partitions are checkpointed and restored by their new owner."""
    readings = sensor_readings(60)
    expected = batch_window_means(readings, 10_000)
    env = topics("join3")
    await create_topics(bootstrap, env["SENSORS_INPUT"], env["SENSORS_OUTPUT"])
    half = len(readings) // 2 + 55  # mid-window for every sensor
    await produce_round_robin(bootstrap, env["SENSORS_INPUT"], readings[:half], 0)
    instances = [Instance(bootstrap, env, tmp_path / f"{n}.log") for n in range(2)]
    topic = f"{env['SENSORS_GROUP']}.repartition.0"
    try:
        async def half_done() -> bool:
            return len(await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_uncommitted")) >= 20
        await wait_for(half_done, instances)
        instances.append(Instance(bootstrap, env, tmp_path / "2.log"))

        async def third_owns() -> bool:
            return bool(instances[2].owned(topic)) and bool(instances[2].owned(env["SENSORS_INPUT"]))
        await wait_for(third_owns, instances)
        await produce_round_robin(bootstrap, env["SENSORS_INPUT"], readings[half:], half)
        await punctuate(bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)

        async def all_windows() -> bool:
            return len(finals(await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_uncommitted"))) >= len(expected)
        await wait_for(all_windows, instances, timeout=90)
    finally:
        codes = [i.stop() for i in instances]
    logs = [i.log.read_text()[-3000:] for i in instances]
    assert codes == [0, 0, 0], logs
    rows = await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_uncommitted")
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}, logs
    for r in rows:  # every emission is the complete window: state moved with its partition
        assert r["value"] == pytest.approx(expected[tuple(r["_key"])]), (r, logs)
    assert any("restored={}" not in line for line in instances[2].log.read_text().splitlines()
               if "partitions assigned" in line and topic in line), logs


async def test_a_restore_waits_for_a_dead_instances_open_checkpoint_transaction(bootstrap: str) -> None:
    """Exactly-once instances share one checkpoint partition. A was killed between writing its
    checkpoint and committing it; B committed a newer checkpoint of the same partition after A's
    transaction began. B's restore must wait until A's transaction ends (A's restart fences it, or the
    broker's timeout aborts it) and then find B's checkpoint: reading up to the last stable offset at
    once found none, and a kill -9 rebalance restored keys without their state."""
    from processors.checkpoint import Checkpoint, CheckpointCodec, PartitionState
    from processors.kafka import KafkaCheckpointStore, KafkaSink

    pipeline = f"cp-{uuid.uuid4().hex[:8]}"
    tp = ("in", 0)

    def checkpoint(offset: int) -> list[tuple[bytes, bytes | None]]:
        return CheckpointCodec().encode(Checkpoint(pipeline, 0, 0, {tp: PartitionState(offset)}))

    a = KafkaSink(bootstrap, transactional_id=f"{pipeline}-a")
    b = KafkaSink(bootstrap, transactional_id=f"{pipeline}-b")
    await a.start()
    await b.start()
    try:
        await KafkaCheckpointStore(bootstrap, pipeline, a).save(checkpoint(5))  # left open
        await KafkaCheckpointStore(bootstrap, pipeline, b).save(checkpoint(10))
        await b.commit_transaction({}, "unused-group")
        loading = asyncio.create_task(KafkaCheckpointStore(bootstrap, pipeline, b).load([tp]))
        done, _ = await asyncio.wait([loading], timeout=1.0)
        assert not done, loading.result()  # still waiting for A's transaction
        await a.abort()  # as A's restart (InitProducerId) or the transaction timeout would
        restored = await asyncio.wait_for(loading, 30)
        assert restored[tp].offset == 10
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
async def test_repartition_records_the_downstream_committed_are_deleted(
        bootstrap: str, tmp_path: Path, guarantee: str) -> None:
    """As Kafka Streams does, the keyed stage deletes (DeleteRecords) what it has committed of the
    repartition topic: after the run each repartition partition starts at the stage's committed offset."""
    readings = sensor_readings(20)
    expected = batch_window_means(readings, 10_000)
    env = topics("purge")
    await create_topics(bootstrap, env["SENSORS_INPUT"], env["SENSORS_OUTPUT"])
    await produce_round_robin(bootstrap, env["SENSORS_INPUT"], readings, 0)
    await punctuate(bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)
    instance = Instance(bootstrap, env, tmp_path / "p.log", "--guarantee", guarantee, "--instance-id", "p0")
    try:
        async def all_windows() -> bool:
            return len(finals(await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_committed"))) >= len(expected)
        await wait_for(all_windows, [instance])
    finally:
        code = instance.stop()  # the final checkpoint commits (and purges) the last positions
    assert code == 0, instance.log.read_text()[-3000:]
    topic = f"{env['SENSORS_GROUP']}.repartition.0"
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        committed = {tp: meta.offset for tp, meta in (await admin.list_consumer_group_offsets(topic)).items()}
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
        await admin.close()
    assert sorted(committed) == tps and all(committed[tp] > 0 for tp in tps), committed
    assert starts == committed, (starts, committed, ends)
    assert "Traceback" not in instance.log.read_text()


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
async def test_a_repartitioned_pipeline_over_its_state_bound_killed_and_restored_gives_the_batch_result(
        bootstrap: str, tmp_path: Path, guarantee: str) -> None:
    """``--state-max-keys`` holds in the keyed stage of a repartitioned pipeline (it was ignored there):
    3 of 10 sensors' state in memory, the rest spilled; kill -9 mid-stream and a restart restore the
    spilled state from its (incremental) checkpoint, and the windows equal the batch computation:
    exactly-once, each once read_committed; at-least-once, every emission (repeats included)."""
    exactly_once = guarantee == "exactly-once"
    isolation = "read_committed" if exactly_once else "read_uncommitted"
    readings = sensor_readings(40)
    expected = batch_window_means(readings, 10_000)
    env = topics("spill")
    await create_topics(bootstrap, env["SENSORS_INPUT"], env["SENSORS_OUTPUT"])
    half = len(readings) // 2
    await produce_round_robin(bootstrap, env["SENSORS_INPUT"], readings[:half], 0)
    options = ("--guarantee", guarantee, "--instance-id", "s0", "--state-max-keys", "3",
               "--state-dir", str(tmp_path / "state"))
    instance = Instance(bootstrap, env, tmp_path / "s.log", *options)
    try:
        async def some_windows() -> bool:
            return len(await read_rows(bootstrap, env["SENSORS_OUTPUT"], "read_uncommitted")) >= 10
        await wait_for(some_windows, [instance])
        await produce_round_robin(bootstrap, env["SENSORS_INPUT"], readings[half:], half)
        instance.kill9()
        instance = Instance(bootstrap, env, tmp_path / "s.log", *options)
        await punctuate(bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)

        async def all_windows() -> bool:
            rows = await read_rows(bootstrap, env["SENSORS_OUTPUT"], isolation)
            return len(finals(rows)) >= len(expected)
        await wait_for(all_windows, [instance], timeout=90)
    finally:
        code = instance.stop()
    text = instance.log.read_text()
    assert code == 0, text[-3000:]
    rows = await read_rows(bootstrap, env["SENSORS_OUTPUT"], isolation)
    if exactly_once:
        assert [k for k, n in Counter(tuple(r["_key"]) for r in rows).items() if n > 1] == []
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}
    for r in rows:  # no emission of a window that lost or double-counted a record
        assert r["value"] == pytest.approx(expected[tuple(r["_key"])]), r
    stage = f"{env['SENSORS_GROUP']}.repartition.0"
    [stopped] = [line for line in text.splitlines() if "processor stopped" in line and f"pipeline={stage}" in line]
    spilled = int(stopped.split("state_spilled=")[1].split()[0])
    assert spilled > 0 and "state_keys_in_memory=" in stopped, stopped
