"""Zombie fencing for the exactly-once processors (KIP-447) on aiokafka's transactional producer.

Each instance has one ``transactional.id``; what stops an instance that has lost its partitions from
committing results of them is the consumer group. An instance that stalls past its session timeout
(GC pause, SIGSTOP, an overloaded host) is removed from the group, and its partitions are restored
from their last committed checkpoint by another member; when it resumes, its open transaction holds
results of the same input. aiokafka's ``send_offsets_to_transaction`` sends TxnOffsetCommit v0, which
names the group but no member, so the group coordinator accepts it and both instances' results
commit: read_committed readers see those windows twice.

Kafka's own clients (Java since 2.5, librdkafka) send TxnOffsetCommit v3 with the consumer's
generation id, member id and group instance id, and the coordinator refuses a member that is not
current (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID); the producer makes that an
abortable error (Java's ``CommitFailedException``), the application aborts and rejoins.

``fence_by_group(producer, member_of)`` does the same for one aiokafka producer: its TxnOffsetCommit
carries ``member_of(group_id)`` (v3; v0 to a broker without v3, with a warning: no fencing there),
and those three errors, or a consumer that already knows it is out of its group (no generation:
``member_of`` answers None), fail the transaction with the abortable ``MemberFencedError``. Such a
member is refused without asking the broker: a v3 request without a generation passes, as requests
of pre-KIP-447 clients must. It replaces the sender's ``_do_txn_offset_commit`` and subclasses its
``TxnOffsetCommitHandler`` (aiokafka's internals, version pinned in pyproject.toml);
``tests/processors/test_txn_fencing.py`` fails if they change.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from types import MethodType
from typing import Any

from aiokafka.client import CoordinationType
from aiokafka.errors import GroupAuthorizationFailedError, KafkaError
from aiokafka.producer.sender import TxnOffsetCommitHandler
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.transaction import TxnOffsetCommitRequest_v0
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

__all__ = ["GroupMember", "MemberFencedError", "fence_by_group"]

log = logging.getLogger("processors.txn_offsets")

# Kafka's answers to a TxnOffsetCommit of a member that is not current (the producer aborts on them)
_FENCING_CODES = {25: "UNKNOWN_MEMBER_ID", 22: "ILLEGAL_GENERATION", 82: "FENCED_INSTANCE_ID"}


@dataclass(frozen=True, slots=True)
class GroupMember:
    """What Kafka's ``consumer.groupMetadata()`` holds: the member as of its last join."""

    generation_id: int
    member_id: str
    group_instance_id: str | None = None


class MemberFencedError(KafkaError):
    """The group refused this member's offsets (or it knows it is out of the group): its partitions
    belong to others now, and the transaction must be aborted."""

    retriable = False


class TxnOffsetCommitResponse_v3(Response):
    API_KEY = 28
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("topics", CompactArray(
            ("name", CompactString("utf-8")),
            ("partitions", CompactArray(("partition_index", Int32), ("error_code", Int16), ("tags", TaggedFields))),
            ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest_v3(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 28
    API_VERSION = 3
    RESPONSE_TYPE = TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        ("topics", CompactArray(
            ("name", CompactString("utf-8")),
            ("partitions", CompactArray(
                ("partition_index", Int32), ("committed_offset", Int64), ("committed_leader_epoch", Int32),
                ("committed_metadata", CompactString("utf-8")), ("tags", TaggedFields))),
            ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


Offsets = dict[str, list[tuple[int, int, str]]]  # topic -> [(partition, offset, metadata)]


class MemberTxnOffsetCommitRequest(Request[TxnOffsetCommitRequest_v0 | TxnOffsetCommitRequest_v3]):
    """v3 with the member when the broker serves it, else v0 (Request.prepare picks the highest)."""

    API_KEY = 28

    def __init__(self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
                 member: GroupMember, topics: Offsets) -> None:
        self.args = (transactional_id, group_id, producer_id, producer_epoch)
        self.member = member
        self.topics = topics

    def build(self, request_struct_class: type[Any]) -> Any:
        if request_struct_class.API_VERSION < 3:
            log.warning("the broker has no TxnOffsetCommit v3 (Kafka < 2.5): a member that lost its "
                        "partitions is not fenced", extra={"group": self.args[1]})
            return request_struct_class(*self.args, list(self.topics.items()))
        m = self.member
        topics: list[tuple[str, list[tuple[int, int, int, str, dict[int, bytes]]], dict[int, bytes]]] = [
            (topic, [(p, off, -1, meta, {}) for p, off, meta in parts], {}) for topic, parts in self.topics.items()]
        return request_struct_class(*self.args, m.generation_id, m.member_id, m.group_instance_id, topics, {})


class _V0Shape:
    """A v3 response as aiokafka's handler reads v0's: ``errors`` = [(topic, [(partition, code)])]."""

    def __init__(self, response: Any) -> None:
        self.errors = [(name, [(p[0], p[1]) for p in parts]) for name, parts, _tags in response.topics]


class _MemberTxnOffsetCommitHandler(TxnOffsetCommitHandler):
    def __init__(self, sender: Any, offsets: Any, group_id: str, member: GroupMember) -> None:
        super().__init__(sender, offsets, group_id)
        self._member = member

    def create_request(self) -> MemberTxnOffsetCommitRequest:
        txn = self._sender._txn_manager
        topics: Offsets = defaultdict(list)
        for tp, meta in sorted(self._offsets.items()):
            topics[tp.topic].append((tp.partition, meta.offset, meta.metadata))
        return MemberTxnOffsetCommitRequest(txn.transactional_id, self._group_id, txn.producer_id,
                                            txn.producer_epoch, self._member, dict(topics))

    def handle_response(self, resp: Any) -> Any:
        shaped = _V0Shape(resp) if getattr(resp, "API_VERSION", 0) >= 3 else resp
        for _topic, partitions in shaped.errors:
            for _partition, code in partitions:
                if code in _FENCING_CODES:
                    _abortable(self._sender._txn_manager, MemberFencedError(
                        f"group {self._group_id!r} refused the offsets of member {self._member.member_id!r} "
                        f"(generation {self._member.generation_id}): {_FENCING_CODES[code]}"))
                    return None
        return super().handle_response(shaped)


def _abortable(txn: Any, exc: KafkaError) -> None:
    """Java's ``abortableError``: the transaction can only be aborted now. aiokafka's
    ``error_transaction`` also forgets the partitions and the group the transaction holds, after which
    its abort sends no EndTxn (an "empty" transaction): the broker would keep the transaction open and
    the producer's next one would continue it, committing what was meant to be aborted. They are kept."""
    partitions, group = set(txn._txn_partitions), txn._txn_consumer_group
    txn.error_transaction(exc)
    txn._txn_partitions.update(partitions)
    txn._txn_consumer_group = group
    txn.wait_for_transaction_end().exception()  # read here: the abort replaces this waiter unread


def fence_by_group(producer: Any, member_of: Callable[[str], GroupMember | None]) -> None:
    """Make ``producer``'s (started or not) transactional offset commits carry ``member_of(group)``,
    read when each request is built; None (the consumer has no generation) fails the transaction."""
    sender = producer._sender

    async def do_txn_offset_commit(self: Any, offsets: Any, group_id: str) -> None:
        if not offsets:
            return
        member = member_of(group_id)
        if member is None:
            _abortable(self._txn_manager, MemberFencedError(
                f"the consumer of group {group_id!r} is not a member now (it lost its partitions)"))
            return
        try:
            node_id = await self._find_coordinator(CoordinationType.GROUP, group_id)
        except GroupAuthorizationFailedError as exc:
            self._txn_manager.error_transaction(exc)
            return
        await _MemberTxnOffsetCommitHandler(self, offsets, group_id, member).do(node_id)

    sender._do_txn_offset_commit = MethodType(do_txn_offset_commit, sender)
