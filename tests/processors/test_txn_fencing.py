"""Exactly-once standalone instances against a member that stalls past its session timeout (a GC
pause, an overloaded host; here SIGSTOP): the group gives its partitions to another instance, which
restores them from their last committed checkpoint and emits their windows; when the stalled one
resumes, the results it had in its open transaction must never commit (before KIP-447 fencing it
committed them on its way back into the group, and read_committed readers saw those windows twice:
the unexplained duplicates of ``test_scale_out`` under load). Also the pieces on their own: a
transactional producer whose group member is out of the group is refused and aborts
(``processors.txn_offsets``, TxnOffsetCommit v3), and can go on with the next transaction."""

from __future__ import annotations

import asyncio
import os
import signal
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
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata

from broker.log.partitioner import partition_for_key
from processors.errors import PartitionsLostError
from processors.executor import OutRecord
from processors.kafka import KafkaSink
from processors.kafka_source import KafkaSource
from processors.txn_offsets import GroupMember, fence_by_group
from tests.processors.test_standalone import finals, heartbeat_all, produce, read_all
from tests.processors.workloads import batch_window_means, sensor_readings
from tests.sluice_server import SluiceProcess

pytestmark = pytest.mark.slow
PARTITIONS = 4


@pytest.fixture
def sluice(tmp_path: Path) -> Iterator[SluiceProcess]:
    server = SluiceProcess(tmp_path / "data", env={"SLUICE_STORAGE__DEFAULT_PARTITIONS": str(PARTITIONS)}).start()
    yield server
    server.stop()


class Instance:
    """``sluice process tests.processors.pipelines:rekeyed`` without a shuffle (input keyed by sensor),
    exactly-once."""

    def __init__(self, bootstrap: str, env: dict[str, str], log: Path, name: str, interval: str) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "process", "tests.processors.pipelines:rekeyed",
             "--bootstrap", bootstrap, "--checkpoint-interval", interval, "--session-timeout-ms", "2000",
             "--guarantee", "exactly-once", "--instance-id", name],
            env={**os.environ, **env, "SENSORS_REPARTITION": "no"}, stderr=log.open("a"), stdout=subprocess.DEVNULL)

    def text(self) -> str:
        return self.log.read_text()

    def owns_all(self, topic: str) -> bool:
        lines = [line for line in self.text().splitlines() if "partitions assigned" in line]
        return bool(lines) and all(f"('{topic}', {p})" in lines[-1] for p in range(PARTITIONS))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


async def punctuate(bootstrap: str, topic: str, partitions: set[int], watermark: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for p in sorted(partitions):
            headers = [("sluice-watermark", str(watermark).encode())]
            await producer.send_and_wait(topic, b"", partition=p, headers=headers)
    finally:
        await producer.stop()


async def end_offsets(bootstrap: str, topic: str) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
        return {tp: int(offset) for tp, offset in ends.items()}
    finally:
        await consumer.stop()


async def committed(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {tp: meta.offset for tp, meta in (await admin.list_consumer_group_offsets(group)).items()}
    finally:
        await admin.close()


async def until(condition: Any, what: str, instances: list[Instance], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        for i in instances:
            assert i.proc.poll() is None, i.text()[-3000:]
        assert time.monotonic() < deadline, (what, [i.text()[-2000:] for i in instances])
        await asyncio.sleep(0.1)


async def test_an_instance_stalled_past_its_session_timeout_commits_none_of_its_lost_windows(
        sluice: SluiceProcess, tmp_path: Path) -> None:
    readings = sensor_readings(60)
    expected = batch_window_means(readings, 10_000)
    tag = uuid.uuid4().hex[:8]
    env = {"SENSORS_INPUT": f"stall-{tag}-in", "SENSORS_OUTPUT": f"stall-{tag}-avg", "SENSORS_GROUP": f"stall-{tag}"}
    bootstrap, output = sluice.bootstrap, env["SENSORS_OUTPUT"]
    await produce(bootstrap, env["SENSORS_INPUT"], readings)
    # the partitions no sensor hashes to are done at once (else they hold every watermark back)
    used = {partition_for_key(r["sensor"].encode(), PARTITIONS) for r in readings}
    await punctuate(bootstrap, env["SENSORS_INPUT"], set(range(PARTITIONS)) - used, readings[-1]["ts"] + 60_000)
    # A alone, committing only every 5 minutes: every window it emits stays in its open transaction
    a = Instance(bootstrap, env, tmp_path / "a.log", "a", "300")
    instances = [a]
    try:
        async def a_emitted() -> bool:  # the windows its watermark has closed, written, none committed
            return (len(await read_all(bootstrap, output)) >= len(expected) - 10
                    and not await read_all(bootstrap, output, "read_committed"))
        await until(a_emitted, "A writes its windows in an open transaction", instances)
        a.proc.send_signal(signal.SIGSTOP)  # A stalls: its session ends, the group gives B everything
        b = Instance(bootstrap, env, tmp_path / "b.log", "b", "0.3")
        instances.append(b)

        async def b_took_over() -> bool:
            """B restored A's partitions (A committed nothing) and committed the input to its end: its
            windows are committed, though read_committed readers wait for A's open transaction."""
            return b.owns_all(env["SENSORS_INPUT"]) and await committed(bootstrap, env["SENSORS_GROUP"]) == ends
        ends = await end_offsets(bootstrap, env["SENSORS_INPUT"])
        await until(b_took_over, "B owns every partition and committed the input", [b])
        a.proc.send_signal(signal.SIGCONT)  # A resumes with its open transaction

        async def a_gave_up() -> bool:
            return "partitions lost" in a.text() or "refused this member's commit" in a.text()
        await until(a_gave_up, "A finds its partitions lost", instances)
        # A stops cleanly (what it may hold now, restored and committed by the group's rules, commits);
        # B, committing every 0.3 s, finishes the last windows
        assert a.stop() == 0, a.text()[-3000:]
        await heartbeat_all(bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)

        async def all_windows() -> bool:
            return len(finals(await read_all(bootstrap, output, "read_committed"))) >= len(expected)
        await until(all_windows, "every window committed", [b])
    finally:
        codes = [i.stop() for i in instances]
    assert codes == [0] * len(instances), [i.text()[-3000:] for i in instances]
    rows = await read_all(bootstrap, output, "read_committed")
    assert [k for k, n in Counter(tuple(r["_key"]) for r in rows).items() if n > 1] == []
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}


async def test_a_producer_whose_member_left_the_group_is_refused_aborts_and_goes_on(sluice: SluiceProcess) -> None:
    bootstrap, group = sluice.bootstrap, f"fence-{uuid.uuid4().hex[:8]}"
    await produce(bootstrap, "fence-in", sensor_readings(0.1))
    consumer = AIOKafkaConsumer("fence-in", bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    # joined: it has a generation and a member id (a fixed 3 s wait may end before the join on a loaded machine)
    deadline = time.monotonic() + 60
    while not consumer.assignment():
        assert time.monotonic() < deadline, "the consumer never joined its group"
        await consumer.getmany(timeout_ms=200)
    coordinator = consumer._coordinator
    member: GroupMember | None = GroupMember(coordinator.generation, coordinator.member_id)
    sink = KafkaSink(bootstrap, transactional_id=f"{group}-t")
    await sink.start()
    fence_by_group(sink.producer, lambda g: member if g == group else None)
    offsets = {TopicPartition("fence-in", 0): OffsetAndMetadata(1, "")}

    async def interval(value: bytes) -> None:
        await sink.write([OutRecord("fence-out", b"k", value, (), 0)])
        await sink.commit_transaction(offsets, group)
    try:
        await interval(b"while a member")  # current: committed
        await consumer.stop()  # leaves the group (as a member removed at its session timeout)
        with pytest.raises(PartitionsLostError):
            await interval(b"after leaving")  # the broker answers UNKNOWN_MEMBER_ID
        member = None  # the consumer knows it is out (no generation): refused without asking
        with pytest.raises(PartitionsLostError):
            await interval(b"without a generation")
        member = GroupMember(-1, "")  # what a v0-v2 client sends: accepted once the group is empty
        await interval(b"without group metadata")
    finally:
        await sink.stop()
    rows = await read_values(bootstrap, "fence-out")
    assert rows == [b"while a member", b"without group metadata"]
    assert sink.transactions_aborted == 2


async def read_values(bootstrap: str, topic: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[bytes] = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                out += [m.value for m in messages]
        return out
    finally:
        await consumer.stop()



async def test_a_member_slower_to_revoke_than_its_session_timeout_keeps_its_place(sluice: SluiceProcess) -> None:
    """A revoke (checkpoint and commit) may take longer than the session timeout on a loaded host: the
    group must wait for the member to rejoin (the rebalance timeout) while it heartbeats, not remove it
    at the session timeout (aiokafka's default rebalance timeout), which lost its partitions and made
    it rejoin under a new member id, starting the next rebalance (the storms seen under load)."""
    bootstrap, group = sluice.bootstrap, f"slow-{uuid.uuid4().hex[:8]}"
    await produce(bootstrap, "slow-in", sensor_readings(0.4))
    source = KafkaSource(bootstrap, ("slow-in",), group, session_timeout_ms=2000)
    assigned: list[list[tuple[str, int]]] = []
    revoked = asyncio.Event()

    async def on_assigned(tps: list[tuple[str, int]]) -> None:
        assigned.append(tps)

    async def on_revoked(tps: list[tuple[str, int]]) -> None:
        if tps:
            revoked.set()
            await asyncio.sleep(5)  # 2.5 session timeouts

    await source.start(on_assigned, on_revoked)
    # the bystander's session is no part of the claim: long enough that a loaded host does not end it (a
    # third rebalance would break the generation count below)
    other = AIOKafkaConsumer("slow-in", bootstrap_servers=bootstrap, group_id=group, session_timeout_ms=10_000,
                             heartbeat_interval_ms=300, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + 60
        while not assigned:
            await source.fetch(100, 0.2, set())
            assert time.monotonic() < deadline
        before = source.member(group)
        assert before is not None
        await other.start()  # its join starts a rebalance; the source's revoke takes 5 s
        while len(assigned) < 2:
            await asyncio.gather(source.fetch(100, 0.2, set()), other.getmany(timeout_ms=200))
            assert time.monotonic() < deadline, assigned
        assert revoked.is_set()
        after = source.member(group)
        assert after is not None and after.member_id == before.member_id, (before, after)
        assert after.generation_id == before.generation_id + 1  # one rebalance, not a storm
        assert sorted(assigned[-1] + [(tp.topic, tp.partition) for tp in other.assignment()]) == [
            ("slow-in", p) for p in range(PARTITIONS)]
    finally:
        await other.stop()
        await source.stop()


async def test_a_member_slower_to_restore_its_assignment_than_its_session_timeout_keeps_it(
        sluice: SluiceProcess) -> None:
    """Restoring an assignment's checkpoints (the assignment callback) may take longer than the session
    timeout on a loaded host. aiokafka stops its heartbeats for the whole rejoin, the callback included:
    the group removed the member just after giving it the partitions, so it lost them (exactly-once:
    the interval aborted) and its rejoin started another rebalance (seen in the exactly-once rebalance
    test under load 17). The member must stay in the group, as Kafka's consumers (which heartbeat from
    their own thread meanwhile) do."""
    bootstrap, group = sluice.bootstrap, f"restore-{uuid.uuid4().hex[:8]}"
    await produce(bootstrap, "restore-in", sensor_readings(0.4))
    source = KafkaSource(bootstrap, ("restore-in",), group, session_timeout_ms=2000)
    assigned: list[list[tuple[str, int]]] = []
    members: list[list[str]] = []
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)

    async def on_assigned(tps: list[tuple[str, int]]) -> None:
        if not assigned:
            await asyncio.sleep(5)  # 2.5 session timeouts
            # what the group holds as the callback ends (Sluice and Kafka expire sessions on a timer)
            described = (await admin.describe_consumer_groups([group]))[0].groups[0]  # raw: members 6th
            members.append([m[0] for m in described[5]])
        assigned.append(tps)

    async def on_revoked(tps: list[tuple[str, int]]) -> None:
        pass

    await admin.start()
    await source.start(on_assigned, on_revoked)
    try:
        deadline = time.monotonic() + 60
        while not assigned:
            await source.fetch(100, 0.2, set())
            assert time.monotonic() < deadline
        member = source.member(group)
        assert member is not None
        assert members == [[member.member_id]], (members, member)
        assert assigned == [[("restore-in", p) for p in range(PARTITIONS)]]
    finally:
        await source.stop()
        await admin.close()
