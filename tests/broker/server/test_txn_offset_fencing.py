"""TxnOffsetCommit v3 (KIP-447) against one real ``sluice serve`` over raw sockets: the group checks
Kafka's GroupCoordinator makes (``validateOffsetCommit`` with isTransactional) before the offsets join
the transaction. A producer whose consumer has lost its partitions (a member removed from the group,
a generation that has moved on, a static instance taken over) is refused, so it aborts and its
outputs never become visible; requests without group metadata (v0-v2 clients) are still accepted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from broker.protocol.kafka import ApiKey
from broker.protocol.kafka_codes import ErrorCode
from tests.broker.server.raw_client import RawClient
from tests.sluice_server import SluiceProcess

TOPIC = "fencing-in"


@pytest.fixture(scope="module")
def sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    server = SluiceProcess(Path(tmp_path_factory.mktemp("txn-offset-fencing")) / "data").start()
    yield server
    server.stop()


class Session:
    """One connection acting as a transactional producer and as group members."""

    def __init__(self, client: RawClient) -> None:
        self.client = client
        self.pid = -1
        self.epoch = -1

    async def init_producer(self, txn_id: str) -> None:
        r = await self.client.request(ApiKey.INIT_PRODUCER_ID, 1, {
            "transactional_id": txn_id, "transaction_timeout": timedelta(seconds=60)})
        assert r.error_code == ErrorCode.NONE
        self.pid, self.epoch = int(r.producer_id), int(r.producer_epoch)
        self.txn_id = txn_id

    async def add_group(self, group: str) -> None:
        r = await self.client.request(ApiKey.ADD_OFFSETS_TO_TXN, 1, {
            "transactional_id": self.txn_id, "producer_id": self.pid, "producer_epoch": self.epoch, "group_id": group})
        assert r.error_code == ErrorCode.NONE

    async def join(self, group: str, instance: str | None = None) -> tuple[str, int]:
        """JoinGroup v5 (a dynamic member first gets MEMBER_ID_REQUIRED, then joins with that id)."""
        member = ""
        for _ in range(2):
            r = await self.client.request(ApiKey.JOIN_GROUP, 5, {
                "group_id": group, "session_timeout": timedelta(seconds=30), "rebalance_timeout": timedelta(seconds=30),
                "member_id": member, "group_instance_id": instance, "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}]})
            member = str(r.member_id)
            if r.error_code == ErrorCode.MEMBER_ID_REQUIRED:
                continue
            assert r.error_code == ErrorCode.NONE, r
            return member, int(r.generation_id)
        raise AssertionError("JoinGroup never completed")

    async def sync(self, group: str, member: str, generation: int, instance: str | None = None) -> None:
        r = await self.client.request(ApiKey.SYNC_GROUP, 3, {
            "group_id": group, "generation_id": generation, "member_id": member, "group_instance_id": instance,
            "assignments": [{"member_id": member, "assignment": b""}]})
        assert r.error_code == ErrorCode.NONE, r

    async def txn_commit(self, group: str, generation: int, member: str, instance: str | None = None) -> ErrorCode:
        body: dict[str, Any] = {
            "transactional_id": self.txn_id, "group_id": group, "producer_id": self.pid,
            "producer_epoch": self.epoch, "generation_id": generation, "member_id": member,
            "group_instance_id": instance,
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "committed_offset": 5,
                                                      "committed_leader_epoch": -1, "committed_metadata": ""}]}]}
        r = await self.client.request(ApiKey.TXN_OFFSET_COMMIT, 3, body)
        [code] = {int(p.error_code) for t in r.topics for p in t.partitions}
        return ErrorCode(code)


async def session(server: SluiceProcess, txn_id: str) -> Session:
    s = Session(await RawClient.connect(int(server.endpoints["kafka"]["port"])))
    await s.init_producer(txn_id)
    return s


def test_a_member_that_lost_its_generation_is_refused_and_metadata_free_commits_pass(sluice: SluiceProcess) -> None:
    async def main() -> None:
        s = await session(sluice, "fence-dynamic")
        try:
            # an unknown group: Kafka creates it Empty and validates the member, who is nobody; without a
            # generation an Empty group passes, and the transaction's own check follows (group not added)
            assert await s.txn_commit("no-such-group", 3, "someone") == ErrorCode.UNKNOWN_MEMBER_ID
            assert await s.txn_commit("no-such-group", -1, "someone") == ErrorCode.INVALID_TXN_STATE
            group = "fence-group"
            await s.add_group(group)
            member, generation = await s.join(group)
            # CompletingRebalance (joined, not synced) refuses OffsetCommit, not TxnOffsetCommit
            assert await s.txn_commit(group, generation, member) == ErrorCode.NONE
            await s.sync(group, member, generation)
            assert await s.txn_commit(group, generation, member) == ErrorCode.NONE
            assert await s.txn_commit(group, generation - 1, member) == ErrorCode.ILLEGAL_GENERATION
            # a member id without a generation is still checked (it is a member's request)
            assert await s.txn_commit(group, -1, member) == ErrorCode.ILLEGAL_GENERATION
            assert await s.txn_commit(group, generation, "not-a-member") == ErrorCode.UNKNOWN_MEMBER_ID
            # v0-v2 clients send neither: accepted in a non-empty group, as Kafka does
            assert await s.txn_commit(group, -1, "") == ErrorCode.NONE
            # the member leaves (as one removed at its session timeout): its commits are refused
            r = await s.client.request(ApiKey.LEAVE_GROUP, 3, {
                "group_id": group, "members": [{"member_id": member, "group_instance_id": None}]})
            assert r.error_code == ErrorCode.NONE
            assert await s.txn_commit(group, generation, member) == ErrorCode.UNKNOWN_MEMBER_ID
            # a new generation: the old one is refused even for a member that is back under a new id
            again, next_generation = await s.join(group)
            assert next_generation > generation
            assert await s.txn_commit(group, generation, again) == ErrorCode.ILLEGAL_GENERATION
            assert await s.txn_commit(group, next_generation, again) == ErrorCode.NONE
        finally:
            await s.client.close()
    asyncio.run(main())


def test_a_static_instance_taken_over_is_fenced(sluice: SluiceProcess) -> None:
    async def main() -> None:
        s = await session(sluice, "fence-static")
        try:
            group = "fence-static-group"
            await s.add_group(group)
            old, generation = await s.join(group, instance="worker-1")
            await s.sync(group, old, generation, instance="worker-1")
            assert await s.txn_commit(group, generation, old, "worker-1") == ErrorCode.NONE
            new, generation = await s.join(group, instance="worker-1")  # the restarted instance
            assert new != old
            assert await s.txn_commit(group, generation, old, "worker-1") == ErrorCode.FENCED_INSTANCE_ID
            assert await s.txn_commit(group, generation, new, "worker-2") == ErrorCode.UNKNOWN_MEMBER_ID
            assert await s.txn_commit(group, generation, new, "worker-1") == ErrorCode.NONE
        finally:
            await s.client.close()
    asyncio.run(main())
