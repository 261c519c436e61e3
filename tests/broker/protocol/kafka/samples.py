"""One sample request per API the broker serves (superset of fields over the served versions)."""

from __future__ import annotations

from typing import Any

from broker.protocol.kafka import ApiKey
from broker.protocol.records import RecordSpec, encode_batch

BATCH = encode_batch([RecordSpec(b"value-%d" % i, key=b"key-%d" % i) for i in range(3)], timestamp=1_700_000_000_000)

SAMPLE_REQUESTS: dict[int, dict[str, Any]] = {
    ApiKey.PRODUCE: {
        "transactional_id": None, "acks": -1, "timeout": 30000,
        "topic_data": [{"name": "samples", "partition_data": [{"index": 0, "records": BATCH}]}],
    },
    ApiKey.FETCH: {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "samples", "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "log_start_offset": -1,
             "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [], "rack_id": "",
    },
    ApiKey.LIST_OFFSETS: {
        "replica_id": -1, "isolation_level": 0,
        "topics": [{"name": "samples", "partitions": [
            {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}],
    },
    ApiKey.METADATA: {
        "topics": [{"name": "samples"}], "allow_auto_topic_creation": True,
        "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False,
    },
    ApiKey.OFFSET_COMMIT: {
        "group_id": "sample-group", "generation_id_or_member_epoch": -1, "member_id": "", "retention_time": -1,
        "group_instance_id": None,
        "topics": [{"name": "samples", "partitions": [
            {"partition_index": 0, "committed_offset": 2, "committed_leader_epoch": -1,
             "committed_metadata": "meta"}]}],
    },
    ApiKey.OFFSET_FETCH: {"group_id": "sample-group", "topics": [{"name": "samples", "partition_indexes": [0, 1]}],
                          "require_stable": False},
    ApiKey.FIND_COORDINATOR: {"key": "sample-group", "key_type": 0},
    ApiKey.JOIN_GROUP: {
        "group_id": "join-group", "session_timeout": 10000, "rebalance_timeout": 30000, "member_id": "",
        "group_instance_id": None, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"\x00\x01"}],
    },
    ApiKey.HEARTBEAT: {"group_id": "join-group", "generation_id": 1, "member_id": "nobody",
                       "group_instance_id": None},
    ApiKey.LEAVE_GROUP: {"group_id": "join-group", "member_id": "nobody",
                         "members": [{"member_id": "nobody", "group_instance_id": None}]},
    ApiKey.SYNC_GROUP: {"group_id": "join-group", "generation_id": 1, "member_id": "nobody",
                        "group_instance_id": None, "assignments": []},
    ApiKey.DESCRIBE_GROUPS: {"groups": ["sample-group"], "include_authorized_operations": False},
    ApiKey.LIST_GROUPS: {"states_filter": ["Stable"]},
    ApiKey.API_VERSIONS: {"client_software_name": "sluice-tests", "client_software_version": "1.0"},
    ApiKey.SASL_HANDSHAKE: {"mechanism": "SCRAM-SHA-256"},
    ApiKey.SASL_AUTHENTICATE: {"auth_bytes": b"n,,n=alice,r=abc"},
    ApiKey.CREATE_TOPICS: {
        "topics": [{"name": "created", "num_partitions": 3, "replication_factor": 1, "assignments": [],
                    "configs": [{"name": "retention.ms", "value": "60000"}]}],
        "timeout": 1000, "validate_only": True,
    },
    ApiKey.DELETE_TOPICS: {"topic_names": ["does-not-exist"], "timeout": 1000},
    ApiKey.INIT_PRODUCER_ID: {"transactional_id": None, "transaction_timeout": 60000, "producer_id": -1,
                              "producer_epoch": -1},
    ApiKey.ADD_PARTITIONS_TO_TXN: {"v3_and_below_transactional_id": "sample-txn", "v3_and_below_producer_id": 7,
                                   "v3_and_below_producer_epoch": 0,
                                   "v3_and_below_topics": [{"name": "samples", "partitions": [0]}]},
    ApiKey.ADD_OFFSETS_TO_TXN: {"transactional_id": "sample-txn", "producer_id": 7, "producer_epoch": 0,
                                "group_id": "g"},
    ApiKey.END_TXN: {"transactional_id": "sample-txn", "producer_id": 7, "producer_epoch": 0, "committed": True},
    ApiKey.TXN_OFFSET_COMMIT: {
        "transactional_id": "sample-txn", "group_id": "g", "producer_id": 7, "producer_epoch": 0,
        "generation_id": -1, "member_id": "", "group_instance_id": None,
        "topics": [{"name": "samples", "partitions": [{"partition_index": 0, "committed_offset": 5,
                                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}],
    },
    ApiKey.DESCRIBE_TRANSACTIONS: {"transactional_ids": ["sample-txn"]},
    ApiKey.LIST_TRANSACTIONS: {"state_filters": [], "producer_id_filters": [], "duration_filter": -1},
    ApiKey.DESCRIBE_CONFIGS: {
        "resources": [{"resource_type": 2, "resource_name": "samples", "configuration_keys": None}],
        "include_synonyms": False, "include_documentation": False,
    },
    ApiKey.ALTER_CONFIGS: {
        "resources": [{"resource_type": 2, "resource_name": "samples",
                       "configs": [{"name": "retention.ms", "value": "60000"}]}],
        "validate_only": True,
    },
    ApiKey.DELETE_GROUPS: {"groups_names": ["sample-group", "never-seen"]},
    ApiKey.LIST_PARTITION_REASSIGNMENTS: {"timeout": 1000, "topics": [{"name": "samples", "partition_indexes": [0]}]},
    ApiKey.DESCRIBE_PRODUCERS: {"topics": [{"name": "samples", "partition_indexes": [0]}]},
    ApiKey.DESCRIBE_LOG_DIRS: {"topics": [{"topic": "samples", "partitions": [0]}]},
    ApiKey.ELECT_LEADERS: {"election_type": 0, "topic_partitions": [{"topic": "samples", "partitions": [0]}],
                           "timeout": 1000},
    ApiKey.OFFSET_DELETE: {"group_id": "sample-group", "topics": [{"name": "samples", "partitions": [
        {"partition_index": 0}]}]},
    ApiKey.DELETE_RECORDS: {
        "topics": [{"name": "samples", "partitions": [{"partition_index": 0, "offset": 1}]}], "timeout": 1000,
    },
    ApiKey.CREATE_PARTITIONS: {
        "topics": [{"name": "samples", "count": 3, "assignments": None}], "timeout": 1000, "validate_only": True,
    },
    ApiKey.OFFSET_FOR_LEADER_EPOCH: {
        "replica_id": -1,
        "topics": [{"topic": "samples", "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}],
    },
    ApiKey.INCREMENTAL_ALTER_CONFIGS: {
        "resources": [{"resource_type": 2, "resource_name": "samples",
                       "configs": [{"name": "cleanup.policy", "config_operation": 2, "value": "compact"}]}],
        "validate_only": True,
    },
    ApiKey.DESCRIBE_ACLS: {"resource_type_filter": 2, "resource_name_filter": "samples", "pattern_type_filter": 3,
                           "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1},
    ApiKey.CREATE_ACLS: {"creations": [{"resource_type": 2, "resource_name": "samples", "resource_pattern_type": 3,
                                        "principal": "User:alice", "host": "*", "operation": 3,
                                        "permission_type": 3}]},
    ApiKey.DELETE_ACLS: {"filters": [{"resource_type_filter": 2, "resource_name_filter": "samples",
                                      "pattern_type_filter": 1, "principal_filter": "User:alice", "host_filter": None,
                                      "operation": 1, "permission_type": 1}]},
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: {"users": [{"name": "sample-user"}]},
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: {
        "deletions": [{"name": "never-seen", "mechanism": 1}],
        "upsertions": [{"name": "sample-user", "mechanism": 2, "iterations": 4096, "salt": b"salt",
                        "salted_password": b"x" * 64}],
    },
}
