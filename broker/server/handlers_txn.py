"""Transactions: InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit, EndTxn, DescribeTransactions and ListTransactions, over ``broker.txn``; and
DescribeProducers (``kafka-transactions describe-producers`` / ``find-hanging``): per partition, as
Kafka's ``activeProducerState``, every producer id its idempotence state tracks, with the first offset
of its open transaction there (-1 without one); READ on the topic with ACLs (TOPIC_AUTHORIZATION_FAILED),
an unknown partition UNKNOWN_TOPIC_OR_PARTITION.

Fencing is answered PRODUCER_FENCED only to request versions that know it (KIP-588): older ones get
INVALID_PRODUCER_EPOCH, as Kafka's KafkaApis does (InitProducerId below v4, the others below v2;
TxnOffsetCommit always, as Kafka's offsets log answers it).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable
from typing import Any

from broker.errors import BrokerError
from broker.protocol.kafka_codes import ErrorCode
from broker.security import Operation, ResourceType
from broker.server.authz import allowed
from broker.server.handlers_common import BrokerContext, ConnectionInfo, error_code_for, millis
from broker.txn.metadata import PendingOffset, TopicPartition, TxnState

__all__ = [
    "handle_add_offsets_to_txn",
    "handle_add_partitions_to_txn",
    "handle_describe_producers",
    "handle_describe_transactions",
    "handle_end_txn",
    "handle_init_transactional_producer",
    "handle_list_transactions",
    "handle_txn_offset_commit",
]

log = logging.getLogger("broker.server.kafka")


def _instant(ms: int) -> datetime.datetime:
    """A start time as kio writes it. Kafka answers -1 for "no transaction yet"; kio's reader (and
    some clients) refuse negative timestamps, so that is sent as 0, the epoch."""
    return datetime.datetime.fromtimestamp(max(ms, 0) / 1000, tz=datetime.UTC)


def _fenced_for(version: int, first_version_with_fenced: int, code: ErrorCode) -> ErrorCode:
    if code == ErrorCode.PRODUCER_FENCED and version < first_version_with_fenced:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code


def _log_refusal(api: str, transactional_id: str, code: ErrorCode, conn: ConnectionInfo) -> None:
    if code not in (ErrorCode.NONE, ErrorCode.CONCURRENT_TRANSACTIONS):
        log.info(f"{api} refused", extra={"transactional_id": transactional_id, "error": code.name,
                                          "peer": conn.peer_host})


async def handle_init_transactional_producer(ctx: BrokerContext, body: Any, conn: ConnectionInfo,
                                             version: int) -> dict[str, Any]:
    txn_id = str(body.transactional_id)
    pid = getattr(body, "producer_id", -1)
    epoch = getattr(body, "producer_epoch", -1)
    expected = (int(pid), int(epoch)) if int(pid) >= 0 else None
    try:
        result = await ctx.transactions.init_producer_id(txn_id, millis(body.transaction_timeout), expected)
        code = _fenced_for(version, 4, result.error)
    except BrokerError as exc:
        log.error("InitProducerId failed", extra={"transactional_id": txn_id, "error": str(exc)})
        return {"throttle_time": 0, "error_code": error_code_for(exc), "producer_id": -1, "producer_epoch": -1}
    _log_refusal("InitProducerId", txn_id, code, conn)
    return {"throttle_time": 0, "error_code": code, "producer_id": result.producer_id,
            "producer_epoch": result.producer_epoch}


async def handle_add_partitions_to_txn(ctx: BrokerContext, body: Any, conn: ConnectionInfo,
                                       version: int) -> dict[str, Any]:
    txn_id = str(body.v3_and_below_transactional_id)
    wanted: list[TopicPartition] = [(str(t.name), int(p)) for t in body.v3_and_below_topics for p in t.partitions]
    try:
        codes = await ctx.transactions.add_partitions(txn_id, int(body.v3_and_below_producer_id),
                                                      int(body.v3_and_below_producer_epoch), wanted)
    except BrokerError as exc:
        log.error("AddPartitionsToTxn failed", extra={"transactional_id": txn_id, "error": str(exc)})
        codes = dict.fromkeys(wanted, error_code_for(exc))
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), code in codes.items():
        code = _fenced_for(version, 2, code)
        by_topic.setdefault(topic, []).append({"partition_index": partition, "partition_error_code": code})
    refused = [code for code in codes.values() if code != ErrorCode.NONE]
    if refused:
        _log_refusal("AddPartitionsToTxn", txn_id, refused[0], conn)
    return {"throttle_time": 0, "results_by_topic_v3_and_below": [
        {"name": topic, "results_by_partition": results} for topic, results in by_topic.items()]}


async def _coordinator_answer(api: str, txn_id: str, call: Awaitable[ErrorCode]) -> ErrorCode:
    """The coordinator's answer to one request, a broker failure (the transaction log's disk) as its code."""
    try:
        return await call
    except BrokerError as exc:
        log.error(f"{api} failed", extra={"transactional_id": txn_id, "error": str(exc)})
        return error_code_for(exc)


async def handle_add_offsets_to_txn(ctx: BrokerContext, body: Any, conn: ConnectionInfo,
                                    version: int) -> dict[str, Any]:
    txn_id = str(body.transactional_id)
    code = _fenced_for(version, 2, await _coordinator_answer("AddOffsetsToTxn", txn_id, ctx.transactions.add_offsets(
        txn_id, int(body.producer_id), int(body.producer_epoch), str(body.group_id))))
    _log_refusal("AddOffsetsToTxn", txn_id, code, conn)
    return {"throttle_time": 0, "error_code": code}


async def handle_txn_offset_commit(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    txn_id, group_id = str(body.transactional_id), str(body.group_id)
    offsets: dict[TopicPartition, PendingOffset] = {
        (str(t.name), int(p.partition_index)): (int(p.committed_offset), p.committed_metadata)
        for t in body.topics for p in t.partitions
    }
    # v3+ (KIP-447) names the consumer's generation and member: the group's checks come first (Kafka's
    # doTxnCommitOffsets validates before the offsets are appended under the producer's epoch)
    generation = int(getattr(body, "generation_id", -1))
    member_id = str(getattr(body, "member_id", ""))
    instance = getattr(body, "group_instance_id", None)
    group = ctx.coordinator.group(group_id)
    if group is not None:
        code = group.validate_txn_commit(generation, member_id, None if instance is None else str(instance))
    else:  # Kafka creates the group Empty and validates it: no generation passes, no member is known
        code = ErrorCode.NONE if generation < 0 else ErrorCode.UNKNOWN_MEMBER_ID
    if code == ErrorCode.NONE:
        code = await _coordinator_answer("TxnOffsetCommit", txn_id, ctx.transactions.txn_offset_commit(
            txn_id, int(body.producer_id), int(body.producer_epoch), group_id, offsets))
    if code == ErrorCode.PRODUCER_FENCED:
        code = ErrorCode.INVALID_PRODUCER_EPOCH
    _log_refusal("TxnOffsetCommit", txn_id, code, conn)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, partition in offsets:
        by_topic.setdefault(topic, []).append({"partition_index": partition, "error_code": code})
    return {"throttle_time": 0, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}


async def handle_end_txn(ctx: BrokerContext, body: Any, conn: ConnectionInfo, version: int) -> dict[str, Any]:
    txn_id = str(body.transactional_id)
    code = _fenced_for(version, 2, await _coordinator_answer("EndTxn", txn_id, ctx.transactions.end_txn(
        txn_id, int(body.producer_id), int(body.producer_epoch), bool(body.committed))))
    _log_refusal("EndTxn", txn_id, code, conn)
    return {"throttle_time": 0, "error_code": code}


async def handle_describe_transactions(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    states: list[dict[str, Any]] = []
    for raw in body.transactional_ids:
        txn_id = str(raw)
        md = ctx.transactions.describe(txn_id) if txn_id else None
        if md is None:
            code = ErrorCode.INVALID_REQUEST if not txn_id else ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
            states.append({"error_code": code, "transactional_id": txn_id, "transaction_state": "",
                           "transaction_timeout": 0, "transaction_start_time": _instant(-1), "producer_id": -1,
                           "producer_epoch": -1, "topics": []})
            continue
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(md.partitions):
            topics.setdefault(topic, []).append(partition)
        states.append({"error_code": ErrorCode.NONE, "transactional_id": txn_id,
                       "transaction_state": md.state.value, "transaction_timeout": md.timeout_ms,
                       "transaction_start_time": _instant(md.start_ms), "producer_id": md.producer_id,
                       "producer_epoch": md.producer_epoch,
                       "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]})
    return {"throttle_time": 0, "transaction_states": states}


async def handle_list_transactions(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    known = {state.value for state in TxnState}
    wanted_states = {str(s) for s in body.state_filters}
    wanted_pids = {int(p) for p in body.producer_id_filters}
    min_age = int(getattr(body, "duration_filter", -1))
    now = ctx.transactions.now_ms()
    listed = [
        {"transactional_id": md.transactional_id, "producer_id": md.producer_id,
         "transaction_state": md.state.value}
        for md in ctx.transactions.transactions()
        if (not wanted_states or md.state.value in wanted_states)
        and (not wanted_pids or md.producer_id in wanted_pids)
        and (min_age < 0 or now - md.start_ms >= min_age)
    ]
    return {"throttle_time": 0, "error_code": ErrorCode.NONE,
            "unknown_state_filters": sorted(wanted_states - known), "transaction_states": listed}


async def handle_describe_producers(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    topics = []
    for topic in body.topics:
        name = str(topic.name)
        readable = allowed(ctx, conn, Operation.READ, ResourceType.TOPIC, name)
        topics.append({"name": name, "partitions": [
            _active_producers(ctx, name, int(index), readable) for index in topic.partition_indexes]})
    return {"throttle_time": 0, "topics": topics}


def _active_producers(ctx: BrokerContext, topic: str, partition: int, readable: bool) -> dict[str, Any]:
    answer: dict[str, Any] = {"partition_index": partition, "error_code": ErrorCode.NONE, "error_message": None,
                              "active_producers": []}
    if not readable:
        answer["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        return answer
    try:
        ctx.store.partition(topic, partition)
    except BrokerError as exc:
        answer["error_code"] = error_code_for(exc)
        return answer
    txn_index = ctx.transactions.index.get(topic, partition)
    open_txns = txn_index.open if txn_index is not None else {}
    answer["active_producers"] = [
        {"producer_id": pid, "producer_epoch": epoch, "last_sequence": last_seq, "last_timestamp": last_ts,
         "coordinator_epoch": -1, "current_txn_start_offset": open_txns.get(pid, -1)}
        for pid, epoch, last_seq, last_ts in ctx.producer_state.active(topic, partition)]
    return answer
