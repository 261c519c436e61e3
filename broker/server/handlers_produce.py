"""Produce and InitProducerId.

Produce runs in two steps so that pipelined requests keep their order and still share fsyncs:
``handle_produce`` validates and appends synchronously (offsets assigned in request order, no await),
then returns an awaitable that waits for the flush policy's durability and builds the response.
acks=0 gets no response at all; when a partition failed, the listener closes the connection instead,
as Kafka does, so the producer learns something went wrong and refreshes its metadata. Each partition's
records pass Kafka's checks first (``broker.protocol.batch_validation``); a refusal is answered with
Kafka's code, ``error_message`` and, for Produce v8, ``record_errors`` naming the records at fault.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from broker.errors import BrokerError, InvalidRecordError, StorageError, UnknownTopicError
from broker.log.partition_log import PartitionLog
from broker.protocol.batch_validation import validate_produce_batch
from broker.protocol.kafka import produce
from broker.protocol.kafka.produce import ProducePartitionResponse, ProduceResponse, ProduceTopicResponse
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import BatchHeader
from broker.server.handlers_common import BrokerContext, ConnectionInfo, error_code_for
from broker.server.handlers_txn import handle_init_transactional_producer

__all__ = ["handle_init_producer_id", "handle_produce", "has_errors"]

log = logging.getLogger("broker.server.kafka")


def has_errors(response: ProduceResponse) -> bool:
    return any(p.error_code != ErrorCode.NONE for t in response.topics for p in t.partitions)


async def _durable(marks: list[tuple[PartitionLog, int]]) -> dict[tuple[str, int], StorageError]:
    """Wait for each partition's writes; the partitions whose flush failed, with the failure."""
    failed: dict[tuple[str, int], StorageError] = {}
    for plog, mark in marks:
        # The flush policy's wait for this request's own writes (appended synchronously at dispatch):
        # not for those of requests dispatched since, which would cost each response another fsync.
        try:
            await plog.wait_durable(mark)
        except StorageError as exc:  # logged once by the store, with the partition; answered here
            failed[(plog.topic, plog.partition)] = exc
    return failed


def _with_storage_errors(
    response: ProduceResponse, failed: dict[tuple[str, int], StorageError]
) -> ProduceResponse:
    """``response`` with KAFKA_STORAGE_ERROR for every partition whose writes did not reach the disk."""
    topics = []
    for topic in response.topics:
        parts = tuple(
            ProducePartitionResponse(p.index, ErrorCode.KAFKA_STORAGE_ERROR, error_message=str(exc))
            if (exc := failed.get((topic.name, p.index))) is not None else p
            for p in topic.partitions
        )
        topics.append(ProduceTopicResponse(topic.name, parts))
    return ProduceResponse(tuple(topics))


def _topic_rules(plog: PartitionLog) -> tuple[int, bool]:
    """The topic's max.message.bytes and whether it is compacted (records need keys): the one place
    Produce reads the topic config, which owns them."""
    return plog.config.max_message_bytes, plog.config.compact


def _transaction_refusal(
    ctx: BrokerContext, topic: str, partition: int, header: BatchHeader, conn: ConnectionInfo
) -> ErrorCode | None:
    """Why a transactional batch may not be appended (epoch fenced, partition not in the producer's
    open transaction: the coordinator's checks), or None."""
    if not header.is_transactional:
        return None
    code = ctx.transactions.check_produce(topic, partition, header)
    if code == ErrorCode.NONE:
        return None
    log.info("transactional produce refused", extra={"topic": topic, "partition": partition, "error": code.name,
                                                      "producer_id": header.producer_id, "peer": conn.peer_host})
    return code


def _append_one(
    ctx: BrokerContext, topic: str, partition: int, records: bytes | None, conn: ConnectionInfo, version: int
) -> tuple[ProducePartitionResponse, PartitionLog | None]:
    store = ctx.store
    try:
        plog = store.partition(topic, partition)
    except UnknownTopicError:
        return ProducePartitionResponse(partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), None
    try:
        if not records:
            raise InvalidRecordError("Produce requests must have one complete record batch per partition")
        max_message_bytes, compacted = _topic_rules(plog)
        accepted = validate_produce_batch(records, max_message_bytes, compacted=compacted, version=version)
        header = accepted.header
        refusal = _transaction_refusal(ctx, topic, partition, header, conn)
        if refusal is not None:
            return ProducePartitionResponse(partition, refusal, error_message=f"transaction: {refusal.name}"), None
        decision = ctx.producer_state.check(topic, partition, header)
        if decision.duplicate_of is not None:
            return ProducePartitionResponse(partition, ErrorCode.NONE, decision.duplicate_of, -1,
                                            plog.log_start_offset), plog
        if decision.error != ErrorCode.NONE:
            log.info(
                "produce rejected by sequence check",
                extra={"topic": topic, "partition": partition, "error": decision.error.name,
                       "producer_id": header.producer_id, "sequence": header.base_sequence},
            )
            return ProducePartitionResponse(partition, decision.error), None
        # validate_produce_batch checked the CRC and read the header: neither is done again
        result = plog.append_nowait(accepted.data, verified=True, header=header)
        ctx.producer_state.record(topic, partition, header, result.base_offset)
        if header.is_transactional:
            ctx.transactions.appended(topic, partition, header.producer_id, result.base_offset)
        ctx.stats.produce_records += result.last_offset - result.base_offset + 1
        ctx.stats.produce_bytes += len(accepted.data)
    except BrokerError as exc:
        code = error_code_for(exc)
        record_errors: tuple[tuple[int, str | None], ...] = ()
        if code == ErrorCode.KAFKA_STORAGE_ERROR:
            ctx.stats.produce_storage_errors += 1  # logged by the store, once per failure
        if isinstance(exc, InvalidRecordError):
            record_errors = tuple(exc.record_errors)
            log.warning(
                "rejected record batch",
                extra={"topic": topic, "partition": partition, "peer": conn.peer_host, "error": code.name,
                       "reason": str(exc)},
            )
        return ProducePartitionResponse(partition, code, error_message=str(exc), record_errors=record_errors), None
    # Kafka answers the append time only for message.timestamp.type=LogAppendTime topics (else -1).
    append_time = result.log_append_time if plog.config.message_timestamp_type == "LogAppendTime" else -1
    return ProducePartitionResponse(partition, ErrorCode.NONE, result.base_offset, append_time,
                                    result.log_start_offset), plog


def handle_produce(
    ctx: BrokerContext, body: Any, conn: ConnectionInfo, version: int = produce.MAX_VERSION
) -> Awaitable[ProduceResponse | None]:
    acks = int(body.acks)
    topics: list[ProduceTopicResponse] = []
    touched: dict[int, PartitionLog] = {}
    for topic_data in body.topic_data:
        name = str(topic_data.name)
        responses: list[ProducePartitionResponse] = []
        topic_error: ErrorCode | None = None
        if acks not in (0, 1, -1):
            topic_error = ErrorCode.INVALID_REQUIRED_ACKS
        else:
            try:
                ctx.store.ensure_topic(name)
            except BrokerError as exc:
                topic_error = error_code_for(exc)
        for part in topic_data.partition_data:
            if topic_error is not None:
                responses.append(ProducePartitionResponse(int(part.index), topic_error))
                continue
            resp, plog = _append_one(ctx, name, int(part.index), part.records, conn, version)
            responses.append(resp)
            if plog is not None:
                touched[id(plog)] = plog
        topics.append(ProduceTopicResponse(name, tuple(responses)))
    response = ProduceResponse(tuple(topics))
    # Only the writes a flush policy still has to make durable are waited for (flush=os: none), so the
    # common answer costs no coroutine per partition.
    marks = [(plog, mark) for plog in touched.values() if not plog.is_durable(mark := plog.write_mark())]

    async def finish() -> ProduceResponse | None:
        if acks == 0:
            ctx.stats.count_response(response)  # nobody hears about these errors but the metrics
            return response if has_errors(response) else None  # with errors the listener closes the socket
        if not marks:
            return response
        failed = await _durable(marks)
        if not failed:
            return response
        ctx.stats.produce_storage_errors += sum(
            1 for t in response.topics for p in t.partitions if p.error_code == 0 and (t.name, p.index) in failed)
        return _with_storage_errors(response, failed)

    return finish()


async def handle_init_producer_id(ctx: BrokerContext, body: Any, conn: ConnectionInfo,
                                  version: int) -> dict[str, Any]:
    if body.transactional_id is not None:
        return await handle_init_transactional_producer(ctx, body, conn, version)
    try:
        producer_id = ctx.producer_ids.allocate()  # may write the next reserved block under the data dir
    except BrokerError as exc:
        log.error("cannot allocate a producer id", extra={"error": str(exc), "peer": conn.peer_host})
        return {"throttle_time": 0, "error_code": error_code_for(exc), "producer_id": -1, "producer_epoch": -1}
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "producer_id": producer_id, "producer_epoch": 0}
