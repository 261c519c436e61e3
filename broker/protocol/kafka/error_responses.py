"""The answer to a request that failed inside the broker: Kafka's ``AbstractRequest.getErrorResponse``.

Kafka answers an unexpected failure while handling a request with that API's response carrying the
error code (UNKNOWN_SERVER_ERROR) in every place the response has one — per topic/partition, per
group, per resource, or at the top — and keeps the connection open. ``error_response`` builds that
body from the decoded request; the caller encodes it like any other response.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kio.index import load_response_schema

from broker.protocol.kafka.codec import ApiKey
from broker.protocol.kafka.fetch import FetchPartitionResponse, FetchResponse, FetchTopicResponse
from broker.protocol.kafka.produce import ProducePartitionResponse, ProduceResponse, ProduceTopicResponse

__all__ = ["error_response"]

# Fields of the top-level-error APIs that have no schema default (ids -1, strings empty); build_entity
# drops the keys a version lacks.
_TOP_LEVEL_FIELDS: dict[str, Any] = {
    "throttle_time": 0, "generation_id": -1, "member_id": "", "leader": "", "protocol_name": "",
    "protocol_type": "", "producer_id": -1, "producer_epoch": -1, "node_id": -1, "host": "", "port": -1,
    "assignment": b"", "error_message": None, "mechanisms": [], "auth_bytes": b"", "session_lifetime": 0,
}


def _items(value: Any) -> tuple[Any, ...]:
    return tuple(value or ())


def _partitions(body: Any, code: int, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``topics[{name, partitions[{partition_index, error_code}]}]`` from a request of the same shape."""
    return [{"name": t.name,
             "partitions": [{"partition_index": p.partition_index, "error_code": code, **(extra or {})}
                            for p in _items(t.partitions)]}
            for t in _items(body.topics)]


def _produce(body: Any, code: int) -> Any:
    return ProduceResponse(tuple(
        ProduceTopicResponse(str(t.name), tuple(ProducePartitionResponse(int(p.index), code)
                                                for p in _items(t.partition_data)))
        for t in _items(body.topic_data)))


def _fetch(body: Any, code: int) -> Any:
    return FetchResponse(tuple(
        FetchTopicResponse(str(t.topic), tuple(FetchPartitionResponse(int(p.partition), code, -1, -1, -1, b"")
                                               for p in _items(t.partitions)))
        for t in _items(body.topics)), error_code=code)


def _resources(key: str) -> Callable[[Any, int], dict[str, Any]]:
    def build(body: Any, code: int) -> dict[str, Any]:
        return {"throttle_time": 0, key: [
            {"error_code": code, "error_message": None, "resource_type": r.resource_type,
             "resource_name": r.resource_name, "configs": []} for r in _items(body.resources)]}
    return build


_BUILDERS: dict[int, Callable[[Any, int], Any]] = {
    ApiKey.PRODUCE: _produce,
    ApiKey.FETCH: _fetch,
    ApiKey.LIST_OFFSETS: lambda b, c: {"throttle_time": 0,
                                       "topics": _partitions(b, c, {"timestamp": -1, "offset": -1})},
    ApiKey.METADATA: lambda b, c: {"throttle_time": 0, "brokers": [], "cluster_id": None, "controller_id": -1,
                                   "topics": [{"error_code": c, "name": t.name, "partitions": []}
                                              for t in _items(b.topics)]},
    ApiKey.OFFSET_COMMIT: lambda b, c: {"throttle_time": 0, "topics": _partitions(b, c)},
    ApiKey.OFFSET_FETCH: lambda b, c: {"throttle_time": 0, "error_code": c, "topics": [
        {"name": t.name, "partitions": [{"partition_index": i, "error_code": c, "committed_offset": -1,
                                         "committed_leader_epoch": -1, "metadata": ""}
                                        for i in _items(t.partition_indexes)]}
        for t in _items(b.topics)]},
    ApiKey.DESCRIBE_GROUPS: lambda b, c: {"throttle_time": 0, "groups": [
        {"error_code": c, "group_id": g, "group_state": "", "protocol_type": "", "protocol_data": "",
         "members": []} for g in _items(b.groups)]},
    ApiKey.CREATE_TOPICS: lambda b, c: {"throttle_time": 0, "topics": [
        {"name": t.name, "error_code": c, "error_message": None, "configs": None, "topic_config_error_code": c}
        for t in _items(b.topics)]},
    ApiKey.DELETE_TOPICS: lambda b, c: {"throttle_time": 0, "responses": [
        {"name": n, "error_code": c} for n in _items(b.topic_names)]},
    ApiKey.DESCRIBE_CONFIGS: _resources("results"),
    ApiKey.DELETE_RECORDS: lambda b, c: {"throttle_time": 0, "topics": _partitions(b, c, {"low_watermark": -1})},
    ApiKey.OFFSET_FOR_LEADER_EPOCH: lambda b, c: {"throttle_time": 0, "topics": [
        {"topic": t.topic, "partitions": [{"partition": p.partition, "error_code": c, "leader_epoch": -1,
                                           "end_offset": -1} for p in _items(t.partitions)]}
        for t in _items(b.topics)]},
    ApiKey.CREATE_PARTITIONS: lambda b, c: {"throttle_time": 0, "results": [
        {"name": t.name, "error_code": c, "error_message": None, "configs": None, "topic_config_error_code": c}
        for t in _items(b.topics)]},
    ApiKey.ELECT_LEADERS: lambda b, c: {"throttle_time": 0, "error_code": c, "replica_election_results": [
        {"topic": t.topic, "partition_result": [{"partition_id": p, "error_code": c, "error_message": None}
                                                for p in _items(t.partitions)]}
        for t in _items(b.topic_partitions)]},
    # v1-v2 have no top-level code: the failure also rides on the one log directory's entry
    ApiKey.DESCRIBE_LOG_DIRS: lambda b, c: {"throttle_time": 0, "error_code": c, "results": [
        {"error_code": c, "log_dir": "", "topics": []}]},
    ApiKey.DESCRIBE_PRODUCERS: lambda b, c: {"throttle_time": 0, "topics": [
        {"name": t.name, "partitions": [{"partition_index": i, "error_code": c, "error_message": None,
                                         "active_producers": []} for i in _items(t.partition_indexes)]}
        for t in _items(b.topics)]},
    ApiKey.DELETE_GROUPS: lambda b, c: {"throttle_time": 0, "results": [
        {"group_id": g, "error_code": c} for g in _items(b.groups_names)]},
    ApiKey.ADD_PARTITIONS_TO_TXN: lambda b, c: {"throttle_time": 0, "results_by_topic_v3_and_below": [
        {"name": t.name, "results_by_partition": [{"partition_index": i, "partition_error_code": c}
                                                  for i in _items(t.partitions)]}
        for t in _items(b.v3_and_below_topics)]},
    ApiKey.TXN_OFFSET_COMMIT: lambda b, c: {"throttle_time": 0, "topics": _partitions(b, c)},
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: lambda b, c: {"throttle_time": 0, "error_code": c, "error_message": None,
                                                          "results": [{"user": u.name, "error_code": c,
                                                                       "error_message": None, "credential_infos": []}
                                                                      for u in _items(b.users)]},
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: lambda b, c: {"throttle_time": 0, "results": [
        {"user": n, "error_code": c, "error_message": None}
        for n in dict.fromkeys(str(i.name) for i in (*_items(b.deletions), *_items(b.upsertions)))]},
    ApiKey.DESCRIBE_ACLS: lambda b, c: {"throttle_time": 0, "error_code": c, "error_message": None, "resources": []},
    ApiKey.CREATE_ACLS: lambda b, c: {"throttle_time": 0, "results": [
        {"error_code": c, "error_message": None} for _ in _items(b.creations)]},
    ApiKey.DELETE_ACLS: lambda b, c: {"throttle_time": 0, "filter_results": [
        {"error_code": c, "error_message": None, "matching_acls": []} for _ in _items(b.filters)]},
    ApiKey.DESCRIBE_TRANSACTIONS: lambda b, c: {"throttle_time": 0, "transaction_states": [
        {"error_code": c, "transactional_id": t, "transaction_state": "", "transaction_timeout": 0,
         "transaction_start_time": 0, "producer_id": -1, "producer_epoch": -1, "topics": []}
        for t in _items(b.transactional_ids)]},
}


def error_response(api_key: int, version: int, body: Any, code: int) -> Any:
    """The response body answering the request ``body`` of ``api_key`` v``version`` with ``code``.

    APIs without an entry in the table above must have a top-level error code (ApiVersions, the group
    APIs, FindCoordinator, InitProducerId, …); LookupError for one that has not (the caller closes the
    connection instead of answering with an empty response).
    """
    builder = _BUILDERS.get(api_key)
    if builder is not None:
        return builder(body, code)
    if api_key in (ApiKey.ALTER_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS):
        return _resources("responses")(body, code)
    if "error_code" not in load_response_schema(api_key, version).__dataclass_fields__:
        raise LookupError(f"no error response for API key {api_key} v{version}")
    return {**_TOP_LEVEL_FIELDS, "error_code": code}
