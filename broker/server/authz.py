"""ACL checks of the Kafka front door, per API, in the order Kafka's ``KafkaApis`` makes them.

Only with an authorizer (``security.auth = "required"``); without one every request goes straight to its
handler (a Kafka broker without an authorizer allows everything). ``gate`` runs before the handler:

- Request-level checks answer the whole request with the API's error response (every error code set, as
  Kafka's ``getErrorResponse``) and the handler never runs:
  JoinGroup, SyncGroup, Heartbeat, LeaveGroup (READ group); OffsetCommit (READ group), OffsetFetch
  (DESCRIBE group), OffsetDelete (DELETE group; READ per topic in its handler): GROUP_AUTHORIZATION_FAILED.
  FindCoordinator: DESCRIBE on the group
  (GROUP_AUTHORIZATION_FAILED) or transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
  Produce with a transactional id, AddPartitionsToTxn, EndTxn (WRITE transactional id):
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED. AddOffsetsToTxn and TxnOffsetCommit: WRITE transactional id,
  then READ group (GROUP_AUTHORIZATION_FAILED). InitProducerId: WRITE on its transactional id, or without
  one IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679), else CLUSTER_AUTHORIZATION_FAILED.
  ElectLeaders: ALTER on the cluster, ListPartitionReassignments: DESCRIBE on it (CLUSTER_AUTHORIZATION_FAILED).
- Item-level checks take the refused topics/groups/resources out of the request, let the handler serve
  the rest, and add the refused ones to its answer: Produce (WRITE), Fetch (READ), ListOffsets and
  OffsetForLeaderEpoch (DESCRIBE), OffsetCommit and TxnOffsetCommit (READ), OffsetFetch (DESCRIBE),
  DeleteTopics and DeleteRecords (DELETE), CreatePartitions (ALTER): TOPIC_AUTHORIZATION_FAILED;
  DescribeGroups (DESCRIBE), DeleteGroups (DELETE): GROUP_AUTHORIZATION_FAILED; DescribeConfigs and
  (Incremental)AlterConfigs: DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic (TOPIC_AUTHORIZATION_FAILED)
  or the cluster for broker resources (CLUSTER_AUTHORIZATION_FAILED); DescribeTransactions (DESCRIBE):
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED. When nothing is left the handler is not called (a Fetch of only
  refused topics answers at once instead of waiting). AddPartitionsToTxn with one refused topic adds
  none: refused ones TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED.
- Listings are filtered without an error: OffsetFetch of all topics (DESCRIBE topic), ListGroups (DESCRIBE
  on the cluster shows all, else DESCRIBE per group), ListTransactions (DESCRIBE per transactional id).
- Metadata, CreateTopics and DescribeLogDirs check inside their handlers (``handlers_admin``): they mix describe, create
  and auto-creation. The ACL APIs check in ``handlers_acls``.
Refusals told to the client are audited (counted, logged rate-limited) under front door "kafka".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from broker.protocol.kafka import ApiKey, RequestHeader
from broker.protocol.kafka.error_responses import error_response
from broker.protocol.kafka_codes import ErrorCode
from broker.security import CLUSTER_NAME, Operation, ResourceType
from broker.server.handlers_common import BrokerContext, ConnectionInfo

__all__ = ["allowed", "authorized_operations", "gate"]

DOOR = "kafka"
_TOPIC, _GROUP, _TXN, _CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID, \
    ResourceType.CLUSTER
_TOPIC_DENIED, _GROUP_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.GROUP_AUTHORIZATION_FAILED
_TXN_DENIED, _CLUSTER_DENIED = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, ErrorCode.CLUSTER_AUTHORIZATION_FAILED
_BROKER_RESOURCE = 4  # ConfigResource.Type.BROKER (2 is TOPIC)


def allowed(ctx: BrokerContext, conn: ConnectionInfo, operation: Operation, resource_type: ResourceType,
            name: str = CLUSTER_NAME, *, audit: bool = True) -> bool:
    """Whether ``conn``'s principal may; always with no authorizer. ``audit``: count and log a refusal."""
    authz = ctx.authorizer
    if authz is None:
        return True
    if audit:
        return authz.check(DOOR, conn.principal, conn.peer_host, operation, resource_type, name)
    return authz.allowed(conn.principal, conn.peer_host, operation, resource_type, name)


# Kafka's AclEntry.supportedOperations: what ``authorized_operations`` reports on, per resource type.
_SUPPORTED: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE, Operation.DELETE,
                         Operation.ALTER, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                           Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE),
}


def authorized_operations(ctx: BrokerContext, conn: ConnectionInfo, resource_type: ResourceType,
                          name: str = CLUSTER_NAME) -> int:
    """Kafka's ``authorizedOperations`` bit field (bit n: operation code n) of what the principal may do on the
    resource (Metadata and DescribeGroups when asked); every supported operation without an authorizer."""
    ops = _SUPPORTED[resource_type]
    return sum(1 << int(op) for op in ops if allowed(ctx, conn, op, resource_type, name, audit=False))


Run = Callable[[Any], Awaitable[Any]]


def _request_denial(ctx: BrokerContext, key: int, body: Any, conn: ConnectionInfo) -> int | None:
    def denied(op: Operation, rtype: ResourceType, name: Any) -> bool:
        return not allowed(ctx, conn, op, rtype, str(name))

    if key in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT):
        return _GROUP_DENIED if denied(Operation.READ, _GROUP, body.group_id) else None
    if key == ApiKey.OFFSET_FETCH:
        return _GROUP_DENIED if denied(Operation.DESCRIBE, _GROUP, body.group_id) else None
    if key == ApiKey.ELECT_LEADERS:
        return _CLUSTER_DENIED if denied(Operation.ALTER, _CLUSTER, CLUSTER_NAME) else None
    if key == ApiKey.LIST_PARTITION_REASSIGNMENTS:
        return _CLUSTER_DENIED if denied(Operation.DESCRIBE, _CLUSTER, CLUSTER_NAME) else None
    if key == ApiKey.OFFSET_DELETE:  # then READ per topic, in its handler
        return _GROUP_DENIED if denied(Operation.DELETE, _GROUP, body.group_id) else None
    if key == ApiKey.FIND_COORDINATOR:
        if int(body.key_type) == 1:
            return _TXN_DENIED if denied(Operation.DESCRIBE, _TXN, body.key) else None
        return _GROUP_DENIED if denied(Operation.DESCRIBE, _GROUP, body.key) else None
    if (key == ApiKey.PRODUCE and body.transactional_id is not None) or key == ApiKey.END_TXN:
        return _TXN_DENIED if denied(Operation.WRITE, _TXN, body.transactional_id) else None
    if key == ApiKey.ADD_PARTITIONS_TO_TXN:
        return _TXN_DENIED if denied(Operation.WRITE, _TXN, body.v3_and_below_transactional_id) else None
    if key in (ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.TXN_OFFSET_COMMIT):
        if denied(Operation.WRITE, _TXN, body.transactional_id):
            return _TXN_DENIED
        return _GROUP_DENIED if denied(Operation.READ, _GROUP, body.group_id) else None
    if key == ApiKey.INIT_PRODUCER_ID:
        if body.transactional_id is not None:
            return _TXN_DENIED if denied(Operation.WRITE, _TXN, body.transactional_id) else None
        if allowed(ctx, conn, Operation.IDEMPOTENT_WRITE, _CLUSTER, audit=False):
            return None
        authz = ctx.authorizer
        assert authz is not None
        if authz.allowed_any(conn.principal, conn.peer_host, Operation.WRITE, _TOPIC):
            return None
        authz.denied(DOOR, conn.principal, conn.peer_host, Operation.IDEMPOTENT_WRITE, _CLUSTER, CLUSTER_NAME)
        return _CLUSTER_DENIED
    return None


# API -> (request list field, name of an item, operation, resource type, refusal code, response list field)
_Item = tuple[str, Callable[[Any], str], Operation, ResourceType, int, str]
_ITEMS: dict[int, _Item] = {
    ApiKey.PRODUCE: ("topic_data", lambda t: str(t.name), Operation.WRITE, _TOPIC, _TOPIC_DENIED, "topics"),
    ApiKey.FETCH: ("topics", lambda t: str(t.topic), Operation.READ, _TOPIC, _TOPIC_DENIED, "topics"),
    ApiKey.LIST_OFFSETS: ("topics", lambda t: str(t.name), Operation.DESCRIBE, _TOPIC, _TOPIC_DENIED, "topics"),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: ("topics", lambda t: str(t.topic), Operation.DESCRIBE, _TOPIC, _TOPIC_DENIED,
                                     "topics"),
    ApiKey.OFFSET_COMMIT: ("topics", lambda t: str(t.name), Operation.READ, _TOPIC, _TOPIC_DENIED, "topics"),
    ApiKey.TXN_OFFSET_COMMIT: ("topics", lambda t: str(t.name), Operation.READ, _TOPIC, _TOPIC_DENIED, "topics"),
    ApiKey.OFFSET_FETCH: ("topics", lambda t: str(t.name), Operation.DESCRIBE, _TOPIC, _TOPIC_DENIED, "topics"),
    ApiKey.DELETE_TOPICS: ("topic_names", str, Operation.DELETE, _TOPIC, _TOPIC_DENIED, "responses"),
    ApiKey.DELETE_RECORDS: ("topics", lambda t: str(t.name), Operation.DELETE, _TOPIC, _TOPIC_DENIED, "topics"),
    ApiKey.CREATE_PARTITIONS: ("topics", lambda t: str(t.name), Operation.ALTER, _TOPIC, _TOPIC_DENIED, "results"),
    ApiKey.DESCRIBE_GROUPS: ("groups", str, Operation.DESCRIBE, _GROUP, _GROUP_DENIED, "groups"),
    ApiKey.DELETE_GROUPS: ("groups_names", str, Operation.DELETE, _GROUP, _GROUP_DENIED, "results"),
    ApiKey.DESCRIBE_TRANSACTIONS: ("transactional_ids", str, Operation.DESCRIBE, _TXN, _TXN_DENIED,
                                   "transaction_states"),
}
_CONFIG_OPS: dict[int, tuple[Operation, str]] = {ApiKey.DESCRIBE_CONFIGS: (Operation.DESCRIBE_CONFIGS, "results"),
               ApiKey.ALTER_CONFIGS: (Operation.ALTER_CONFIGS, "responses"),
               ApiKey.INCREMENTAL_ALTER_CONFIGS: (Operation.ALTER_CONFIGS, "responses")}


def gate(ctx: BrokerContext, header: RequestHeader, body: Any, conn: ConnectionInfo, run: Run) -> Awaitable[Any]:
    """The answer to the request: ``run(body)`` (possibly on a narrowed body, its answer widened), or a
    refusal. ``run`` is called before this returns (Produce appends in order at dispatch)."""
    key, version = header.api_key, header.api_version
    if ctx.authorizer is None:
        return run(body)
    code = _request_denial(ctx, key, body, conn)
    if code is not None:
        return _ready(error_response(key, version, body, code))
    if key in _CONFIG_OPS:
        return _configs(ctx, header, body, conn, run)
    if key == ApiKey.ADD_PARTITIONS_TO_TXN:
        return _add_partitions(ctx, header, body, conn, run)
    if key in (ApiKey.LIST_GROUPS, ApiKey.LIST_TRANSACTIONS) or (key == ApiKey.OFFSET_FETCH and body.topics is None):
        return _filtered_listing(ctx, key, conn, run(body))
    item = _ITEMS.get(key)
    if item is None:
        return run(body)
    field, name_of, op, rtype, refusal, answer_field = item
    items = tuple(getattr(body, field) or ())
    refused = tuple(i for i in items if not allowed(ctx, conn, op, rtype, name_of(i)))
    if not refused:
        return run(body)
    return _split(key, version, body, field, items, refused, refusal, answer_field, run)


async def _ready(answer: Any) -> Any:
    return answer


def _split(key: int, version: int, body: Any, field: str, items: tuple[Any, ...], refused: tuple[Any, ...],
           code: int, answer_field: str, run: Run) -> Awaitable[Any]:
    refused_answer = error_response(key, version, dataclasses.replace(body, **{field: refused}), code)
    kept = tuple(i for i in items if i not in refused)
    if not kept:
        return _ready(refused_answer)
    pending = run(dataclasses.replace(body, **{field: kept}))
    return _merged(pending, refused_answer, answer_field)


async def _merged(pending: Awaitable[Any], refused_answer: Any, answer_field: str) -> Any:
    answer = await pending
    if answer is None:
        return None  # acks=0: nobody hears anything
    extra = tuple(_field(refused_answer, answer_field))
    if isinstance(answer, dict):
        return {**answer, answer_field: [*answer[answer_field], *extra]}
    return dataclasses.replace(answer, **{answer_field: (*getattr(answer, answer_field), *extra)})


def _field(answer: Any, name: str) -> Any:
    return answer[name] if isinstance(answer, dict) else getattr(answer, name)


def _configs(ctx: BrokerContext, header: RequestHeader, body: Any, conn: ConnectionInfo, run: Run) -> Awaitable[Any]:
    op, answer_field = _CONFIG_OPS[header.api_key]
    topic_refused, cluster_refused = [], []
    for resource in body.resources or ():
        if int(resource.resource_type) == _BROKER_RESOURCE:
            if not allowed(ctx, conn, op, _CLUSTER):
                cluster_refused.append(resource)
        elif not allowed(ctx, conn, op, _TOPIC, str(resource.resource_name)):
            topic_refused.append(resource)
    if not topic_refused and not cluster_refused:
        return run(body)
    refused = (*topic_refused, *cluster_refused)
    kept = tuple(r for r in body.resources if r not in refused)
    answers = [error_response(header.api_key, header.api_version,
                              dataclasses.replace(body, resources=tuple(group)), code)[answer_field]
               for group, code in ((topic_refused, _TOPIC_DENIED), (cluster_refused, _CLUSTER_DENIED)) if group]
    refused_answer = {answer_field: [entry for answer in answers for entry in answer]}
    if not kept:
        return _ready({"throttle_time": 0, **refused_answer})
    return _merged(run(dataclasses.replace(body, resources=kept)), refused_answer, answer_field)


def _add_partitions(ctx: BrokerContext, header: RequestHeader, body: Any, conn: ConnectionInfo,
                    run: Run) -> Awaitable[Any]:
    topics = tuple(body.v3_and_below_topics or ())
    refused = {str(t.name) for t in topics if not allowed(ctx, conn, Operation.WRITE, _TOPIC, str(t.name))}
    if not refused:
        return run(body)
    return _ready({"throttle_time": 0, "results_by_topic_v3_and_below": [
        {"name": t.name, "results_by_partition": [
            {"partition_index": i, "partition_error_code":
                _TOPIC_DENIED if str(t.name) in refused else ErrorCode.OPERATION_NOT_ATTEMPTED}
            for i in t.partitions or ()]}
        for t in topics]})


async def _filtered_listing(ctx: BrokerContext, key: int, conn: ConnectionInfo, pending: Awaitable[Any]) -> Any:
    answer = await pending
    if key == ApiKey.LIST_GROUPS:
        if allowed(ctx, conn, Operation.DESCRIBE, _CLUSTER, audit=False):
            return answer
        field, name_of, rtype = "groups", (lambda e: e["group_id"]), _GROUP
    elif key == ApiKey.LIST_TRANSACTIONS:
        field, name_of, rtype = "transaction_states", (lambda e: e["transactional_id"]), _TXN
    else:
        field, name_of, rtype = "topics", (lambda e: e["name"]), _TOPIC
    return {**answer, field: [e for e in answer[field]
                              if allowed(ctx, conn, Operation.DESCRIBE, rtype, str(name_of(e)), audit=False)]}
