"""Connection handling of the Kafka listener, over real sockets on port 0: a client that leaves with a
long-poll pending frees its socket at once, answers keep request order, idle connections close
(``connections_max_idle_ms``) and connection limits refuse with a log line and a counter."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import MemoryOffsetStore
from broker.log.memory import MemoryLogStore
from broker.protocol.kafka import ApiKey
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import RecordSpec, decode_all, encode_batch
from broker.server import kafka
from broker.server.kafka import KafkaServer, KafkaServerConfig, fd_headroom_warning
from sluice.front_metrics import KafkaCollector
from tests.broker.server.raw_client import RawClient

INT32_MAX = 2**31 - 1
_TCP_CLOSE_WAIT = "08"  # state column of /proc/net/tcp


@asynccontextmanager
async def running(**config: Any) -> AsyncIterator[KafkaServer]:
    coordinator = GroupCoordinator(MemoryOffsetStore())
    await coordinator.start()
    srv = KafkaServer(MemoryLogStore(default_partitions=1), coordinator, KafkaServerConfig(port=0, **config))
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()
        await coordinator.stop()


def produce_body(*values: bytes) -> dict[str, Any]:
    batch = encode_batch([RecordSpec(v) for v in values])
    return {"transactional_id": None, "acks": -1, "timeout": 5000,
            "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": batch}]}]}


def fetch_body(offset: int, max_wait: int) -> dict[str, Any]:
    return {"replica_id": -1, "max_wait": max_wait, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                       "fetch_offset": offset, "log_start_offset": -1,
                                                       "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}


METADATA_ALL = {"topics": None, "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False}


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait (polling the server's own state) until ``condition`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def open_sockets() -> set[str]:
    """This process's open sockets, as their /proc links name them (``socket:[inode]``). Not a count of
    descriptors: objects a previous test left to the garbage collector close theirs at any moment (seen under load: 22
    descriptors open after the test, 28 before), and a closed descriptor's number is reused."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile (the listing's own descriptor among them)
            continue
        if target.startswith("socket:"):
            sockets.add(target)
    return sockets


def close_wait_sockets(port: int) -> int:
    """Sockets of this machine whose local port is ``port`` and whose peer has closed (kernel's view)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == _TCP_CLOSE_WAIT:
                    count += 1
    return count


async def api_versions_ok(client: RawClient) -> bool:
    resp = await client.request(ApiKey.API_VERSIONS, 0, {})
    return int(resp.error_code) == ErrorCode.NONE


async def test_closing_during_an_int32_max_long_poll_frees_the_socket_at_once() -> None:
    async with running() as server:
        producer = await RawClient.connect(server.port)
        await producer.request(ApiKey.PRODUCE, 8, produce_body(b"first"))
        sockets_before = open_sockets()
        consumers = [await RawClient.connect(server.port) for _ in range(20)]
        for consumer in consumers:
            consumer.send(ApiKey.FETCH, 11, fetch_body(1, max_wait=INT32_MAX))  # nothing at offset 1 yet
        await until(lambda: server.stats.requests.get(ApiKey.FETCH) == 20)
        assert len(server._connections) == 21
        for consumer in consumers:
            await consumer.close()
        await until(lambda: len(server._connections) == 1)
        # client and server ends of all 20 sockets are closed (the transport closes its socket one loop turn
        # after the connection task has ended: waited for, the bound is seconds against the poll's 24 days)
        await until(lambda: close_wait_sockets(server.port) == 0 and not open_sockets() - sockets_before)
        assert server.stats.requests_cancelled == 20
        assert server.stats.connections_open["default"] == 1
        assert await api_versions_ok(producer)
        await producer.close()


async def test_answers_keep_request_order_behind_a_pending_long_poll() -> None:
    async with running() as server:
        producer = await RawClient.connect(server.port)
        await producer.request(ApiKey.PRODUCE, 8, produce_body(b"first"))
        consumer = await RawClient.connect(server.port)
        fetch_corr = consumer.send(ApiKey.FETCH, 11, fetch_body(1, max_wait=30_000))
        meta_corr = consumer.send(ApiKey.METADATA, 8, METADATA_ALL)
        await until(lambda: server.stats.requests.get(ApiKey.FETCH) == 1)
        await producer.request(ApiKey.PRODUCE, 8, produce_body(b"second"))
        got, fetched = await consumer.receive(ApiKey.FETCH, 11)
        assert got == fetch_corr
        assert [r.value for r in decode_all(bytes(fetched.topics[0].partitions[0].records))] == [b"second"]
        got, meta = await consumer.receive(ApiKey.METADATA, 8)
        assert got == meta_corr and [t.name for t in meta.topics] == ["t"]
        await consumer.close()
        await producer.close()


async def test_idle_connections_close_after_connections_max_idle_ms() -> None:
    # 1 s: the client runs in the broker's process and event loop, so a pause of the whole process between an
    # answer and the next request counts as idle time (300 ms failed at load 14: the busy one was closed)
    async with running(connections_max_idle_ms=1000) as server:
        producer = await RawClient.connect(server.port)
        await producer.request(ApiKey.PRODUCE, 8, produce_body(b"first"))
        busy = await RawClient.connect(server.port)
        started = time.monotonic()
        while time.monotonic() - started < 1.5:  # 100 ms long polls keep it busy past an idle period
            resp = await busy.request(ApiKey.FETCH, 11, fetch_body(1, max_wait=100))
            assert resp.topics[0].partitions[0].error_code == ErrorCode.NONE
        assert await busy.closed_by_server(timeout=5)  # silent from now on
        assert await producer.closed_by_server(timeout=5)
        assert server.stats.closed_idle == 2
        await until(lambda: not server._connections)
        await busy.close()
        await producer.close()


async def test_max_connections_refuses_with_one_log_line_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    async with running(max_connections=2) as server:
        first, second = await RawClient.connect(server.port), await RawClient.connect(server.port)
        assert await api_versions_ok(first) and await api_versions_ok(second)
        with caplog.at_level(logging.WARNING, logger="broker.server.kafka"):
            for _ in range(3):
                refused = await RawClient.connect(server.port)
                assert await refused.closed_by_server()
                await refused.close()
        lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(lines) == 1 and "max_connections = 2" in lines[0], lines  # later ones within 10 s: counted
        assert server.stats.connections_refused == {"max_connections": 3}
        refused_series = [s for family in KafkaCollector(server.stats).collect()
                          if family.name == "sluice_kafka_connections_refused" for s in family.samples]
        assert [(s.labels, s.value) for s in refused_series] == [({"reason": "max_connections"}, 3)]
        await first.close()
        await until(lambda: len(server._connections) == 1)
        again = await RawClient.connect(server.port)
        assert await api_versions_ok(again) and await api_versions_ok(second)
        await again.close()
        await second.close()


async def test_max_connections_per_address_refuses_only_that_address() -> None:
    async with running(max_connections_per_address=1) as server:
        first = await RawClient.connect(server.port)
        assert await api_versions_ok(first)
        same = await RawClient.connect(server.port)
        assert await same.closed_by_server()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, local_addr=("127.0.0.2", 0))
        other = RawClient(reader, writer)
        assert await api_versions_ok(other)
        assert server.stats.connections_refused == {"max_connections_per_address": 1}
        for client in (first, same, other):
            await client.close()

async def test_a_connection_cancelled_twice_while_ending_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """Shutdown can cancel a connection again while it waits for its tasks to end (seen under sluice serve)."""
    async with running() as server:
        producer = await RawClient.connect(server.port)
        await producer.request(ApiKey.PRODUCE, 8, produce_body(b"first"))
        consumer = await RawClient.connect(server.port)
        consumer.send(ApiKey.FETCH, 11, fetch_body(1, max_wait=INT32_MAX))
        await until(lambda: server.stats.requests.get(ApiKey.FETCH) == 1)
        with caplog.at_level(logging.WARNING):
            for candidate in list(server._connections):
                candidate.cancel()
            await asyncio.sleep(0)  # each connection is now inside serve()'s cleanup
            for candidate in list(server._connections):
                candidate.cancel()
            await until(lambda: not server._connections)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
        await consumer.close()
        await producer.close()


async def test_a_state_changing_request_runs_to_its_end_when_its_client_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only reads and waits are cancelled with their connection: a commit (or a topic create, an EndTxn…)
    in progress completes, as in Kafka; its answer is dropped."""
    release = asyncio.Event()
    committed: list[str] = []

    async def slow_commit(ctx: Any, header: Any, body: Any, conn: Any) -> dict[str, Any]:
        await release.wait()  # stands for a durable write in progress
        committed.append(str(body.group_id))
        return {"throttle_time": 0, "topics": []}

    monkeypatch.setitem(kafka._HANDLERS, ApiKey.OFFSET_COMMIT, slow_commit)
    async with running() as server:
        client = await RawClient.connect(server.port)
        client.send(ApiKey.OFFSET_COMMIT, 2, {
            "group_id": "g", "generation_id": -1, "member_id": "", "retention_time": -1,
            "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                      "committed_metadata": ""}]}]})
        await until(lambda: server.stats.requests.get(ApiKey.OFFSET_COMMIT) == 1)
        await client.close()
        await until(lambda: not server._connections)
        assert committed == []
        release.set()
        await until(lambda: committed == ["g"])
        await until(lambda: not server._detached)


def test_fd_headroom_warning() -> None:
    assert fd_headroom_warning(1000, 20_000) is None
    assert fd_headroom_warning(1000, resource.RLIM_INFINITY) is None
    warning = fd_headroom_warning(1000, 1024)
    assert warning is not None and "ulimit -n" in warning and "1024" in warning
    assert fd_headroom_warning(0, 1_000_000) is not None  # no cap at all


async def test_a_cap_above_the_fd_limit_is_reported_at_start(caplog: pytest.LogCaptureFixture) -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no file descriptor limit in this process: nothing to warn about")
    with caplog.at_level(logging.WARNING, logger="broker.server.kafka"):
        async with running(max_connections=soft):
            pass
    assert [r.getMessage() for r in caplog.records if "ulimit -n" in r.getMessage()]
