"""Standalone processors (`sluice process`) against a real Sluice Kafka listener: scale-out in one
consumer group, and kill -9 at random points with restarts from checkpoints."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.broker.server.conftest import SluiceProcess
from tests.long_runs import sized
from tests.processors.workloads import batch_window_means, sensor_readings

pytestmark = pytest.mark.slow
PARTITIONS = 4


def topics(prefix: str) -> dict[str, str]:
    return {"SENSORS_INPUT": f"{prefix}-in", "SENSORS_OUTPUT": f"{prefix}-avg", "SENSORS_LATE": f"{prefix}-late",
            "SENSORS_ALERTS": f"{prefix}-alerts", "SENSORS_GROUP": f"{prefix}-group"}


async def produce(bootstrap: str, topic: str, rows: list[dict[str, Any]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, json.dumps(r).encode(), key=r["sensor"].encode(), timestamp_ms=r["ts"])
                   for r in rows]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def heartbeat_all(bootstrap: str, topic: str, watermark: int) -> None:
    """A punctuation on every partition: nothing at or before ``watermark`` follows."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for p in range(PARTITIONS):
            headers = [("sluice-watermark", str(watermark).encode())]
            await producer.send_and_wait(topic, b"", partition=p, headers=headers)
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str, isolation_level: str = "read_uncommitted") -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation_level)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return []
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]  # the broker's default partition count
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out = []
        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in tps])

        while await behind():
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                for m in messages:
                    value = json.loads(m.value)
                    value["_key"] = json.loads(m.key) if m.key else None
                    value["_emit_header"] = dict(m.headers).get("sluice-emit", b"").decode()
                    out.append(value)
        return out
    finally:
        await consumer.stop()


class Processor:
    def __init__(self, bootstrap: str, env: dict[str, str], log: Path, *options: str) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "process", "processors.examples.sensors:pipeline",
             "--bootstrap", bootstrap, "--checkpoint-interval", "0.3", "--session-timeout-ms", "2000", *options],
            env={**os.environ, **env}, stderr=log.open("a"), stdout=subprocess.DEVNULL,
        )

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def assigned(self) -> list[list[Any]]:
        return [json.loads(line.split("partitions=", 1)[1].split(" restored=")[0]
                           .replace("(", "[").replace(")", "]").replace("'", '"'))
                for line in self.log.read_text().splitlines() if "partitions assigned" in line]

    def restored(self) -> list[str]:
        return [line.split("restored=", 1)[1] for line in self.log.read_text().splitlines()
                if "partitions assigned" in line]


def finals(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], float]:
    return {tuple(r["_key"]): r["value"] for r in rows}


async def wait_for_windows(bootstrap: str, topic: str, expected: int, timeout: float = 90,
                           isolation_level: str = "read_uncommitted") -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        rows = await read_all(bootstrap, topic, isolation_level)
        if len(finals(rows)) >= expected:
            return rows
        assert time.monotonic() < deadline, f"only {len(finals(rows))} of {expected} windows"
        await asyncio.sleep(0.3)


@pytest.fixture
def sluice(tmp_path: Path) -> Iterator[SluiceProcess]:
    server = SluiceProcess(tmp_path / "data", partitions=PARTITIONS)
    server.start()
    yield server
    server.stop()


async def test_two_instances_split_the_partitions_and_produce_the_same_results_as_one(
        sluice: SluiceProcess, tmp_path: Path) -> None:
    readings = sensor_readings(60)
    expected = batch_window_means(readings, 10_000)
    env_two, env_one = topics("two"), topics("one")
    all_two = [(env_two["SENSORS_INPUT"], p) for p in range(PARTITIONS)]
    # create the input topics, then let both instances join and split them before data flows
    await heartbeat_all(sluice.bootstrap, env_two["SENSORS_INPUT"], readings[0]["ts"] - 10_000)
    a = Processor(sluice.bootstrap, env_two, tmp_path / "a.log")
    b = Processor(sluice.bootstrap, env_two, tmp_path / "b.log")
    single = Processor(sluice.bootstrap, env_one, tmp_path / "one.log")
    try:
        deadline = time.monotonic() + 60
        while True:
            last_a, last_b = (a.assigned() or [[]])[-1], (b.assigned() or [[]])[-1]
            if last_a and last_b and sorted(map(tuple, last_a + last_b)) == all_two:
                break
            assert time.monotonic() < deadline, (a.log.read_text()[-2000:], b.log.read_text()[-2000:])
            await asyncio.sleep(0.1)
        end = readings[-1]["ts"] + 60_000
        for env in (env_two, env_one):
            await produce(sluice.bootstrap, env["SENSORS_INPUT"], readings)
            await heartbeat_all(sluice.bootstrap, env["SENSORS_INPUT"], end)
        two_rows = await wait_for_windows(sluice.bootstrap, env_two["SENSORS_OUTPUT"], len(expected))
        one_rows = await wait_for_windows(sluice.bootstrap, env_one["SENSORS_OUTPUT"], len(expected))
        assert finals(two_rows) == finals(one_rows) == {k: pytest.approx(v) for k, v in expected.items()}
        # each window came out exactly once, from whichever instance owns its sensor's partition
        assert sorted(tuple(r["_key"]) for r in two_rows) == sorted(finals(two_rows))
        assert (a.assigned()[-1], b.assigned()[-1]) == (last_a, last_b)  # the split held throughout
    finally:
        for p in (a, b, single):
            assert p.stop() == 0, p.log.read_text()[-3000:]


async def test_kill_9_at_random_points_then_restart_loses_no_window(sluice: SluiceProcess, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("SLUICE_TEST_SEED", "7")))
    readings = sensor_readings(sized(90, 120))  # a kill every 3 000 readings: 3 (4 in bench_long_tests)
    expected = batch_window_means(readings, 10_000)
    env = topics("crash")
    # each instance with its own log: a rebalance beyond the one at its start (a session that expired on
    # a loaded host) assigns it again, and the count of assignments in a shared log then went wrong
    instances: list[Processor] = []

    def start() -> Processor:
        instances.append(Processor(sluice.bootstrap, env, tmp_path / f"crash-{len(instances)}.log"))
        return instances[-1]

    proc = start()
    chunks = [readings[i : i + 1_000] for i in range(0, len(readings), 1_000)]
    kills = 0
    try:
        for i, chunk in enumerate(chunks):
            await produce(sluice.bootstrap, env["SENSORS_INPUT"], chunk)
            if i % 3 == 1:
                # wait until this instance owns the partitions, then kill at a random point of its work
                deadline = time.monotonic() + 60
                while not proc.restored():
                    assert time.monotonic() < deadline and proc.proc.poll() is None, proc.log.read_text()[-3000:]
                    await asyncio.sleep(0.05)
                await asyncio.sleep(rng.uniform(0.1, 1.5))
                proc.kill9()
                kills += 1
                proc = start()
        await heartbeat_all(sluice.bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)
        rows = await wait_for_windows(sluice.bootstrap, env["SENSORS_OUTPUT"], len(expected), timeout=120)
    finally:
        assert proc.stop() == 0, proc.log.read_text()[-3000:]
    assert kills == sized(3, 4) and len(instances) == kills + 1
    restores = [i.restored() for i in instances]  # per instance, what each assignment restored
    assert all(restores) and restores[0][0] == "{}", restores
    # restarts resume from the newest checkpoint (or from the start if the killed one never wrote one)
    assert any(r[0] != "{}" for r in restores[1:]), restores
    print("restored offsets per start:", restores, "emissions:", len(rows), "windows:", len(expected))
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}
    # duplicates only as re-emissions of the same deterministic key, with the same result
    for r in rows:
        assert tuple(r["_key"]) == (r["window_start"], r["window_end"], r["key"])
        assert r["value"] == pytest.approx(expected[tuple(r["_key"])])
        assert r["_emit_header"] == r["emit"] == "first"


async def test_an_instance_joining_mid_stream_takes_over_partitions_with_their_state(
        sluice: SluiceProcess, tmp_path: Path) -> None:
    """A runs alone over half the data (windows half full); B joins: A checkpoints and hands the
    revoked partitions over, B restores their keyed state and finishes the windows."""
    readings = sensor_readings(60)
    expected = batch_window_means(readings, 10_000)
    env = topics("join")
    half = len(readings) // 2 + 55  # mid-window for every sensor
    await produce(sluice.bootstrap, env["SENSORS_INPUT"], readings[:half])
    # the partitions no sensor hashes to would hold time back until their idle timeout: punctuate them
    await heartbeat_all(sluice.bootstrap, env["SENSORS_INPUT"], readings[half - 1]["ts"] - 6_000)
    a = Processor(sluice.bootstrap, env, tmp_path / "a.log")
    b = None
    try:
        deadline = time.monotonic() + 60
        while len(finals(await read_all(sluice.bootstrap, env["SENSORS_OUTPUT"]))) < 20:
            assert time.monotonic() < deadline, a.log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        b = Processor(sluice.bootstrap, env, tmp_path / "b.log")
        while not (b.assigned() and b.assigned()[-1] and len(a.assigned()) >= 2):
            assert time.monotonic() < deadline, (a.log.read_text()[-2000:], b.log.read_text()[-2000:])
            await asyncio.sleep(0.1)
        await produce(sluice.bootstrap, env["SENSORS_INPUT"], readings[half:])
        await heartbeat_all(sluice.bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)
        rows = await wait_for_windows(sluice.bootstrap, env["SENSORS_OUTPUT"], len(expected))
        logs = (a.log.read_text()[-4000:], b.log.read_text()[-4000:])
        assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}, logs
        for r in rows:  # every emission (re-emissions included) is the complete window
            assert r["value"] == pytest.approx(expected[tuple(r["_key"])]), (r, logs)
        taken = [tp for tp in b.assigned()[-1]]
        assert any(r != "{}" for r in b.restored()), ("B should restore the state A checkpointed on revoke",
                                                      b.log.read_text()[-3000:])
        assert taken and sorted(map(tuple, a.assigned()[-1] + taken)) == [
            (env["SENSORS_INPUT"], p) for p in range(PARTITIONS)], logs
    finally:
        for p in (a, b):
            if p is not None:
                assert p.stop() == 0, p.log.read_text()[-3000:]


async def test_a_checkpoint_larger_than_the_brokers_record_limit_round_trips(sluice: SluiceProcess) -> None:
    from processors.kafka import KafkaCheckpointStore, KafkaSink
    from tests.processors.test_codec import big_checkpoint

    sink = KafkaSink(sluice.bootstrap)
    await sink.start()
    try:
        store = KafkaCheckpointStore(sluice.bootstrap, "bigstate", sink)
        assert await store.load() == {}
        records = store.codec.encode(big_checkpoint(40_000))
        assert sum(len(v or b"") for _, v in records) > 1024 * 1024  # above the broker's default max.message.bytes
        await store.save(records)
        loaded = (await store.load())[("t", 0)]
        assert len(loaded.ops["1"]) == 40_000 and loaded.offset == 5
        # Created compacted (issue 13, item 4): the newest record per key is all a restore reads.
        from confluent_kafka.admin import AdminClient, ConfigResource

        resource = ConfigResource(ConfigResource.Type.TOPIC, store.topic)
        admin = AdminClient({"bootstrap.servers": sluice.bootstrap})
        described = next(iter(admin.describe_configs([resource]).values())).result(10)
        assert described["cleanup.policy"].value == "compact"
    finally:
        await sink.stop()


async def test_a_commit_lost_to_a_rebalance_does_not_stop_the_processor(sluice: SluiceProcess, tmp_path: Path) -> None:
    """Issue 12, item 8. The processor stalls (SIGSTOP, like a long GC pause) past its session
    timeout while another member joins: the group rebalances without it. When it resumes, its
    commit carries a generation the group has left behind (aiokafka: CommitFailedError from
    UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION). It must log that, rejoin and go on, not exit 1."""
    readings = sensor_readings(60)
    expected = batch_window_means(readings, 10_000)
    env = topics("race")
    third = len(readings) // 3
    await produce(sluice.bootstrap, env["SENSORS_INPUT"], readings[:third])
    # punctuate the partitions no sensor hashes to, so windows close without waiting for idle
    # timeouts and the stall below stays far shorter than the idle timeout (30 s)
    await heartbeat_all(sluice.bootstrap, env["SENSORS_INPUT"], readings[third - 1]["ts"] - 6_000)
    a = Processor(sluice.bootstrap, env, tmp_path / "a.log")
    rival = AIOKafkaConsumer(env["SENSORS_INPUT"], bootstrap_servers=sluice.bootstrap, group_id=env["SENSORS_GROUP"],
                             enable_auto_commit=False, session_timeout_ms=6_000, heartbeat_interval_ms=500)
    try:
        deadline = time.monotonic() + 60
        while len(finals(await read_all(sluice.bootstrap, env["SENSORS_OUTPUT"]))) < 10:  # A owns and processes
            assert time.monotonic() < deadline and a.proc.poll() is None, a.log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        a.proc.send_signal(signal.SIGSTOP)
        await rival.start()  # the group waits for A to rejoin, A's session (2 s) expires, the rival gets all
        while len(rival.assignment()) < PARTITIONS:
            assert time.monotonic() < deadline
            await rival.getmany(timeout_ms=200)
        await produce(sluice.bootstrap, env["SENSORS_INPUT"], readings[third : 2 * third])
        a.proc.send_signal(signal.SIGCONT)
        while "offset commit lost to a group rebalance" not in a.log.read_text():
            assert time.monotonic() < deadline and a.proc.poll() is None, a.log.read_text()[-3000:]
            await asyncio.sleep(0.1)
    finally:
        a.proc.send_signal(signal.SIGCONT)
        await rival.stop()  # leaves the group: A takes every partition back, with its checkpoints
    # it rejoins, takes every partition back with its checkpoints and goes on: every window comes out right
    try:
        await produce(sluice.bootstrap, env["SENSORS_INPUT"], readings[2 * third :])
        await heartbeat_all(sluice.bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)
        rows = await wait_for_windows(sluice.bootstrap, env["SENSORS_OUTPUT"], len(expected))
        logs = a.log.read_text()[-3000:]
        assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}, logs
        for r in rows:  # re-emissions (input replayed after the lost commit) carry the same result
            assert r["value"] == pytest.approx(expected[tuple(r["_key"])]), (r, logs)
        assert a.proc.poll() is None and a.restored()[-1] != "{}"
    finally:
        assert a.stop() == 0, a.log.read_text()[-3000:]


async def test_the_standalone_checkpoint_topic_is_compacted_to_the_newest_checkpoints(tmp_path: Path) -> None:
    """Issue 12, item 10 for standalone processors: the checkpoint topic is created compacted and,
    checkpoints being keyed by source partition, Sluice's log cleaner shrinks 40 checkpoints to
    about the newest one per partition (plus the active segment); restores still find it."""
    from processors.checkpoint import Checkpoint, PartitionState
    from processors.kafka import KafkaCheckpointStore, KafkaSink

    server = SluiceProcess(tmp_path / "data", env={"SLUICE_STORAGE__BACKEND": "segment",
                                                   "SLUICE_STORAGE__CLEANER_INTERVAL_S": "0.2"})
    server.start()
    sink = KafkaSink(server.bootstrap)
    await sink.start()
    try:
        store = KafkaCheckpointStore(server.bootstrap, "compacted", sink)
        tps = [("in", p) for p in range(4)]
        for n in range(40):  # 4 records of ~60 KB per checkpoint: about 10 MB, ten 1 MiB segments
            state = {"w": [[w, [w + 10, [float(n), 1], False, 1, 0]] for w in range(2_000)], "s": []}
            parts = {tp: PartitionState(n * 100 + tp[1]) for tp in tps}
            ops = {"1": [[f"k{tp[1]}", [tp[0], tp[1]], state] for tp in tps]}
            await store.save(store.codec.encode(Checkpoint("compacted", n, n, parts, ops)))
        topic = TopicPartition("_checkpoints.compacted", 0)
        consumer = AIOKafkaConsumer(bootstrap_servers=server.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([topic])
            end = (await consumer.end_offsets([topic]))[topic]
            assert end == 160
            deadline = time.monotonic() + 60
            while True:  # the cleaner runs in the background; count what a reader from the start gets
                consumer.seek(topic, 0)
                kept = 0
                while await consumer.position(topic) < end:
                    kept += sum(len(m) for m in (await consumer.getmany(topic, timeout_ms=500)).values())
                if kept <= 4 + 2 * 1024 * 1024 // 60_000:  # newest per partition + at most two segments
                    break
                assert time.monotonic() < deadline, f"{kept} of 160 checkpoint records still there"
                await asyncio.sleep(0.3)
        finally:
            await consumer.stop()
        restored = await KafkaCheckpointStore(server.bootstrap, "compacted", sink).load(tps)
        assert {tp: r.offset for tp, r in restored.items()} == {tp: 3_900 + tp[1] for tp in tps}
        assert restored[("in", 0)].ops["1"][0][2]["w"][0][1][1] == [39.0, 1]
    finally:
        await sink.stop()
        server.stop()
