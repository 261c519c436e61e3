"""ApiVersions, Metadata, CreateTopics, DeleteTopics (configs: ``handlers_configs``).

One broker (node id 0) leads every partition, is its only replica and the controller; Metadata
advertises the configured host and port so clients reconnect to the right place.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.errors import BrokerError
from broker.protocol.kafka import api_versions_body
from broker.protocol.kafka_codes import ErrorCode
from broker.security import Operation, ResourceType
from broker.server.authz import allowed, authorized_operations
from broker.server.handlers_common import NODE_ID, BrokerContext, ConnectionInfo, error_code_for
from broker.server.handlers_configs import created_topic_configs

__all__ = [
    "handle_api_versions",
    "handle_create_topics",
    "handle_delete_topics",
    "handle_metadata",
]

log = logging.getLogger("broker.server.kafka")

_NO_AUTHORIZED_OPERATIONS = -(2**31)


async def handle_api_versions(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    return api_versions_body()


def _topic_metadata(ctx: BrokerContext, name: str, create: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"error_code": ErrorCode.NONE, "name": name, "is_internal": False, "partitions": [],
                             "topic_authorized_operations": _NO_AUTHORIZED_OPERATIONS}
    try:
        info = ctx.store.ensure_topic(name) if create else ctx.store.topic(name)
    except BrokerError as exc:
        entry["error_code"] = error_code_for(exc)
        return entry
    entry["is_internal"] = info.internal
    entry["partitions"] = [
        {"error_code": ErrorCode.NONE, "partition_index": p, "leader_id": NODE_ID, "leader_epoch": 0,
         "replica_nodes": [NODE_ID], "isr_nodes": [NODE_ID], "offline_replicas": []}
        for p in range(info.partitions)
    ]
    return entry


def _denied_metadata(name: str) -> dict[str, Any]:
    return {"error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "name": name, "is_internal": False, "partitions": [],
            "topic_authorized_operations": _NO_AUTHORIZED_OPERATIONS}


def _requested_metadata(ctx: BrokerContext, conn: ConnectionInfo, name: str, create: bool) -> dict[str, Any]:
    """Kafka's order: DESCRIBE on the topic, then (auto-creating one that is missing) CREATE on the cluster
    or the topic; refused, TOPIC_AUTHORIZATION_FAILED without telling whether the topic exists."""
    if not allowed(ctx, conn, Operation.DESCRIBE, ResourceType.TOPIC, name):
        return _denied_metadata(name)
    if create and not ctx.store.has_topic(name) and not allowed(
            ctx, conn, Operation.CREATE, ResourceType.CLUSTER, audit=False) and not allowed(
            ctx, conn, Operation.CREATE, ResourceType.TOPIC, name):
        return _denied_metadata(name)
    return _topic_metadata(ctx, name, create)


async def handle_metadata(ctx: BrokerContext, body: Any, conn: ConnectionInfo, version: int) -> dict[str, Any]:
    requested = body.topics
    if requested is None or (version == 0 and not requested):  # all topics: those the principal may describe
        topics = [_topic_metadata(ctx, t.name, False) for t in ctx.store.list_topics()
                  if allowed(ctx, conn, Operation.DESCRIBE, ResourceType.TOPIC, t.name, audit=False)]
    else:
        create = bool(getattr(body, "allow_auto_topic_creation", True)) and ctx.store.auto_create_topics
        topics = [_requested_metadata(ctx, conn, str(t.name), create) for t in requested]
    if getattr(body, "include_topic_authorized_operations", False):  # v8+: what the principal may do
        for entry in topics:
            if entry["error_code"] == ErrorCode.NONE:
                entry["topic_authorized_operations"] = authorized_operations(ctx, conn, ResourceType.TOPIC,
                                                                             entry["name"])
    cluster_ops = (authorized_operations(ctx, conn, ResourceType.CLUSTER)
                   if getattr(body, "include_cluster_authorized_operations", False) else _NO_AUTHORIZED_OPERATIONS)
    host, port = ctx.advertised_for(conn)
    return {
        "throttle_time": 0,
        "brokers": [{"node_id": NODE_ID, "host": host, "port": port, "rack": None}],
        "cluster_id": ctx.cluster_id,
        "controller_id": NODE_ID,
        "topics": topics,
        "cluster_authorized_operations": cluster_ops,
    }


def _requested_partitions(ctx: BrokerContext, topics: Any) -> int:
    """Partitions a CreateTopics request asks for in all, counted as Kafka's controller does."""
    total = 0
    for topic in topics:
        if topic.assignments:
            total += len(topic.assignments)
        elif int(topic.num_partitions) == -1:
            total += ctx.store.default_partitions
        elif int(topic.num_partitions) > 0:
            total += int(topic.num_partitions)
    return total


async def handle_create_topics(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    try:  # Kafka fails the whole request when it would create too many partitions (KAFKA-17870)
        ctx.store.limits.check_request(_requested_partitions(ctx, body.topics))
    except BrokerError as exc:
        log.warning("create topics refused", extra={"error": str(exc), "peer": conn.peer_host})
        return {"throttle_time": 0, "topics": [
            {"name": str(t.name), "error_code": error_code_for(exc), "error_message": str(exc), "configs": None,
             "topic_config_error_code": error_code_for(exc)} for t in body.topics]}
    on_cluster = allowed(ctx, conn, Operation.CREATE, ResourceType.CLUSTER, audit=False)
    for topic in body.topics:
        name = str(topic.name)
        # configs (v5+) stays null unless the topic is (or would be) created, as Kafka answers
        result: dict[str, Any] = {"name": name, "error_code": ErrorCode.NONE, "error_message": None, "configs": None}
        results.append(result)
        if not on_cluster and not allowed(ctx, conn, Operation.CREATE, ResourceType.TOPIC, name):
            result["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED  # Kafka: CREATE on the cluster or topic
            result["error_message"] = "Authorization failed."
            continue
        count: int | None = int(topic.num_partitions)
        if topic.assignments:
            count = len(topic.assignments)
        elif count == -1:
            count = None
        if int(topic.replication_factor) not in (-1, 1):
            result["error_code"] = ErrorCode.INVALID_REPLICATION_FACTOR
            result["error_message"] = "Sluice is a single broker: replication factor must be 1"
            continue
        try:
            config = ctx.store.default_config.with_kafka_configs({c.name: c.value for c in topic.configs})
        except ValueError as exc:
            result["error_code"] = ErrorCode.INVALID_CONFIG
            result["error_message"] = str(exc)
            log.warning(f"CreateTopics refused: {exc}", extra={"topic": name, "error": "INVALID_CONFIG",
                                                               "peer": conn.peer_host})
            continue
        if ctx.store.has_topic(name):
            result["error_code"] = ErrorCode.TOPIC_ALREADY_EXISTS
            result["error_message"] = f"topic {name!r} already exists"
            continue
        try:
            if body.validate_only:
                ctx.store.validate_create(name, count)
            else:
                ctx.store.create_topic(name, count, config)
                log.info("topic created", extra={"topic": name, "partitions": count, "peer": conn.peer_host})
            # v5+: what the topic was (or would be) created with, every config included
            result.update(num_partitions=count or ctx.store.default_partitions, replication_factor=1,
                          configs=created_topic_configs(ctx, config))
        except BrokerError as exc:
            result["error_code"] = error_code_for(exc)
            result["error_message"] = str(exc)
    for result in results:  # v5+: why no configs came back (a tagged field; 0 when they did)
        result["topic_config_error_code"] = result["error_code"]
        if result["configs"] is not None and not allowed(ctx, conn, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC,
                                                         result["name"], audit=False):
            result["configs"] = None  # Kafka shows them only to who may describe them
            result["topic_config_error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    return {"throttle_time": 0, "topics": results}


async def handle_delete_topics(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    responses: list[dict[str, Any]] = []
    for name in body.topic_names:
        code = ErrorCode.NONE
        try:
            await ctx.store.delete_topic(str(name))  # producer state goes with it (store listener)
            log.info("topic deleted", extra={"topic": name, "peer": conn.peer_host})
        except BrokerError as exc:
            code = error_code_for(exc)
        responses.append({"name": str(name), "error_code": code})
    return {"throttle_time": 0, "responses": responses}
