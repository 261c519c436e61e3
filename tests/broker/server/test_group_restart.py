"""Consumer groups across a restart of ``sluice serve`` (issue 17): the coordinator restores each group
from its stored metadata, as Kafka's does from ``__consumer_offsets``, so members that go on
heartbeating keep their member id, generation and partitions, with no rebalance.

Real clients (librdkafka through confluent-kafka, and aiokafka) in one group; the broker is killed
with SIGKILL (and stopped gracefully) and started again on the same data directory and port. Before
the fix the group came back empty: the members' next heartbeat or commit got UNKNOWN_MEMBER_ID, they
rejoined, and their revoke/assign callbacks fired. A member that does not come back is expired after
its session timeout and the others rebalance; a group whose members all left comes back Empty."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, ConsumerGroupState, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.broker.server.conftest import SluiceProcess

pytestmark = pytest.mark.slow
TOPIC = "restart-group"
PARTITIONS = 4
# Longer than a restart may take (SluiceProcess.start waits up to 120 s): members must not time out
# client-side. At 30 s, a kill -9 and restart at load 26 took 30 s and librdkafka left the group by itself
# ("session timed out ... without a successful response"): its next commit got UNKNOWN_MEMBER_ID.
SESSION_MS = 120_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SluiceProcess]:
    """The broker on a fixed port: the clients' bootstrap must reach it again after its restart."""
    sluice = SluiceProcess(tmp_path / "data", partitions=PARTITIONS, env={"SLUICE_KAFKA__PORT": str(free_port())})
    sluice.start()
    producer = Producer({"bootstrap.servers": sluice.bootstrap})
    for p in range(PARTITIONS):
        producer.produce(TOPIC, b"before-%d" % p, partition=p)
    assert producer.flush(30) == 0
    yield sluice
    sluice.stop()


def kill9_and_restart(server: SluiceProcess) -> None:
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait()
    server.proc = None
    server.start()


def restart_gracefully(server: SluiceProcess) -> None:
    server.stop()
    server.start()


def produce_one_per_partition(bootstrap: str, tag: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(PARTITIONS):
        producer.produce(TOPIC, tag + b"-%d" % p, partition=p)
    assert producer.flush(30) == 0


class RdkafkaMember(threading.Thread):
    """A confluent-kafka consumer polled on its own thread, writing down callbacks and records."""

    def __init__(self, bootstrap: str, group: str, **config: str | int) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 300,
            "partition.assignment.strategy": "roundrobin", **config})
        self.assigned: list[list[int]] = []
        self.revoked: list[list[int]] = []
        self.values: list[bytes] = []
        self.lock = threading.Lock()
        self.calls: list[Callable[[Consumer], None]] = []
        self.stopping = threading.Event()
        self.consumer.subscribe([TOPIC], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)

    def _on_assign(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        self.assigned.append(sorted(p.partition for p in parts))

    def _on_revoke(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        self.revoked.append(sorted(p.partition for p in parts))

    def _on_lost(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        self.revoked.append([-1, *sorted(p.partition for p in parts)])  # -1: lost, not revoked

    def run(self) -> None:
        while not self.stopping.is_set():
            msg = self.consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                with self.lock:
                    self.values.append(msg.value() or b"")
            with self.lock:
                calls, self.calls = self.calls, []
            for call in calls:
                call(self.consumer)
        self.consumer.close()

    def commit(self, timeout: float = 30) -> None:
        """A synchronous OffsetCommit with the member's id and generation, on the polling thread."""
        done = threading.Event()
        errors: list[BaseException] = []

        def call(c: Consumer) -> None:
            try:
                c.commit(offsets=[TopicPartition(TOPIC, p, 1) for p in self.current()], asynchronous=False)
            except BaseException as exc:
                errors.append(exc)
            done.set()

        with self.lock:
            self.calls.append(call)
        assert done.wait(timeout), "the commit was not answered"
        assert not errors, errors

    def current(self) -> list[int]:
        return self.assigned[-1] if self.assigned else []

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


class Callbacks(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.assigned: list[list[int]] = []
        self.revoked: list[list[int]] = []

    async def on_partitions_revoked(self, revoked: set[AioTopicPartition]) -> None:
        self.revoked.append(sorted(tp.partition for tp in revoked))

    async def on_partitions_assigned(self, assigned: set[AioTopicPartition]) -> None:
        self.assigned.append(sorted(tp.partition for tp in assigned))


async def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def describe(bootstrap: str, group: str) -> tuple[str, dict[str, list[int]]]:
    """(state, member id -> partitions) as DescribeGroups answers."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group])[group].result(30)
    members = {m.member_id: sorted(tp.partition for tp in m.assignment.topic_partitions) for m in desc.members}
    return desc.state.name, members


def listed(bootstrap: str, *states: ConsumerGroupState) -> dict[str, str]:
    """ListGroups (v4 when given states: only groups in those states)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    result = admin.list_consumer_groups(states=set(states)).result(30)
    return {g.group_id: g.state.name for g in result.valid}


async def test_members_keep_their_generation_and_partitions_across_kill_9_and_a_graceful_restart(
        server: SluiceProcess) -> None:
    group = "survivors"
    rdkafka = RdkafkaMember(server.bootstrap, group)
    rdkafka.start()
    callbacks = Callbacks()
    aio = AIOKafkaConsumer(bootstrap_servers=server.bootstrap, group_id=group, enable_auto_commit=False,
                           auto_offset_reset="earliest", session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300)
    aio.subscribe([TOPIC], listener=callbacks)
    await aio.start()
    fetched: list[bytes] = []

    async def consume() -> None:
        async for msg in aio:
            fetched.append(msg.value or b"")

    consuming = asyncio.create_task(consume())
    try:
        def settled() -> bool:
            return (len(rdkafka.current()) == len(callbacks.assigned[-1] if callbacks.assigned else []) == 2
                    and describe(server.bootstrap, group)[0] == "STABLE")
        await wait_until(settled, 60, "two members with two partitions each")
        generation, member_id = aio._coordinator.generation, aio._coordinator.member_id
        state, members = describe(server.bootstrap, group)
        callbacks_before = (list(rdkafka.assigned), list(rdkafka.revoked), list(callbacks.assigned),
                            list(callbacks.revoked))
        for restart, tag in ((kill9_and_restart, b"after-kill"), (restart_gracefully, b"after-stop")):
            await asyncio.to_thread(restart, server)
            # OffsetCommit with the old member ids and generation is accepted
            await asyncio.to_thread(rdkafka.commit)
            await aio.commit({AioTopicPartition(TOPIC, p): 1 for p in callbacks.assigned[-1]})
            # the restored group answers DescribeGroups as before the restart
            assert describe(server.bootstrap, group) == (state, members)
            # both go on consuming their partitions: records written after the restart reach them
            await asyncio.to_thread(produce_one_per_partition, server.bootstrap, tag)
            expected = {tag + b"-%d" % p for p in range(PARTITIONS)}
            await wait_until(lambda: expected <= set(rdkafka.values) | set(fetched), 60,  # noqa: B023
                             f"the records written after the restart ({tag!r})")
            assert (aio._coordinator.generation, aio._coordinator.member_id) == (generation, member_id)
            assert describe(server.bootstrap, group) == (state, members)
            assert (rdkafka.assigned, rdkafka.revoked, callbacks.assigned, callbacks.revoked) == callbacks_before, \
                "a member was rebalanced"
        # every member leaves: the group is Empty, and comes back Empty with its committed offsets
        consuming.cancel()
        await aio.stop()
        await asyncio.to_thread(rdkafka.stop)
        await wait_until(lambda: describe(server.bootstrap, group)[0] == "EMPTY", 30, "the group Empty")
        await asyncio.to_thread(restart_gracefully, server)
        assert describe(server.bootstrap, group) == ("EMPTY", {})
        assert listed(server.bootstrap) == {group: "EMPTY"}
        assert listed(server.bootstrap, ConsumerGroupState.EMPTY, ConsumerGroupState.STABLE) == {group: "EMPTY"}
        assert listed(server.bootstrap, ConsumerGroupState.STABLE) == {}
        check = Consumer({"bootstrap.servers": server.bootstrap, "group.id": group})
        committed = check.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=30)
        check.close()
        assert [tp.offset for tp in committed] == [1] * PARTITIONS
    finally:
        consuming.cancel()
        await aio.stop()
        rdkafka.stop()
    assert "Traceback" not in server.log_text()


def _member_process(bootstrap: str, group: str, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.broker.server.group_member", bootstrap, TOPIC, group, str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def test_a_member_that_does_not_come_back_expires_and_the_others_rebalance(
        server: SluiceProcess, tmp_path: Path) -> None:
    group = "one-gone"
    out = tmp_path / "gone.log"
    gone = _member_process(server.bootstrap, group, out)  # range, session 6 s
    stays = RdkafkaMember(server.bootstrap, group, **{"partition.assignment.strategy": "range"})
    stays.start()
    try:
        def assigned_lines() -> list[str]:
            return [line for line in out.read_text().splitlines() if line.startswith("assigned")] \
                if out.exists() else []
        await wait_until(lambda: len(stays.current()) == 2 and assigned_lines()
                         and len(assigned_lines()[-1].split()[1].split(",")) == 2
                         and describe(server.bootstrap, group)[0] == "STABLE", 60, "two members, two partitions each")
        _, members = describe(server.bootstrap, group)
        assert len(members) == 2
        server.proc.kill()  # type: ignore[union-attr]
        server.proc.wait()  # type: ignore[union-attr]
        server.proc = None
        gone.send_signal(signal.SIGKILL)  # it dies while the broker is down: no LeaveGroup
        gone.wait()
        await asyncio.to_thread(server.start)
        assert describe(server.bootstrap, group) == ("STABLE", members)
        # its 6 s session runs out (counted from the load); the one that stays gets every partition
        await wait_until(lambda: stays.current() == list(range(PARTITIONS)), 60, "the survivor to take all partitions")
        state, after = describe(server.bootstrap, group)
        assert state == "STABLE" and list(after.values()) == [list(range(PARTITIONS))]
        assert "group members expired" in server.log_text()
    finally:
        if gone.poll() is None:
            gone.kill()
        gone.wait()
        stays.stop()
    assert "Traceback" not in server.log_text()
