"""ACLs over the Kafka protocol against a real ``sluice serve`` (``security.auth = required``): confluent-kafka's
AdminClient manages them (CreateAcls, DescribeAcls, DeleteAcls), and an allow/deny matrix of real clients
(confluent-kafka, kcat) gets Kafka's exact error codes; the ACLs survive a restart."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ElectionType, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka import TopicPartition as KafkaTopicPartition
from kafka import errors as kafka_errors
from kafka.admin import KafkaAdminClient
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.static.primitive import i8

from broker.log.memory import MemoryLogStore
from broker.protocol.kafka_codes import ErrorCode
from broker.security import AclStore, Authorizer, Principal, UserStore
from broker.server.handlers_acls import handle_describe_acls
from broker.server.handlers_common import BrokerContext, ConnectionInfo
from tests.sluice_server import SluiceProcess

PASSWORD = "pw-for-acl-tests"
ANY_FILTER = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)


def acl(rtype: ResourceType, name: str, op: AclOperation, who: str = "User:alice",
        pattern: ResourcePatternType = ResourcePatternType.LITERAL, deny: bool = False) -> AclBinding:
    return AclBinding(rtype, name, pattern, who, "*", op, AclPermissionType.DENY if deny else AclPermissionType.ALLOW)


def start(data: Path) -> SluiceProcess:
    return SluiceProcess(data, env={"SLUICE_SECURITY__AUTH": "required",
                                    "SLUICE_SECURITY__SUPER_USERS": '["admin"]'}).start()


def conf(server: SluiceProcess, user: str) -> dict[str, Any]:
    return {"bootstrap.servers": server.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": PASSWORD}


def error_of(future: Any) -> int | None:
    try:
        future.result()
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = tmp_path_factory.mktemp("acl-kafka") / "data"
    users = UserStore(data)
    for name in ("admin", "alice", "bob"):
        users.add(name, PASSWORD)
    proc = start(data)
    admin = AdminClient(conf(proc, "admin"))
    for future in admin.create_topics([NewTopic(t, 1) for t in ("t-one", "t-denied", "secret")]).values():
        future.result()
    bindings = [
        acl(ResourceType.TOPIC, "t-", AclOperation.ALL, pattern=ResourcePatternType.PREFIXED),
        acl(ResourceType.TOPIC, "t-denied", AclOperation.READ, deny=True),  # deny wins over the prefix
        acl(ResourceType.GROUP, "g-alice", AclOperation.READ),
        acl(ResourceType.TRANSACTIONAL_ID, "tx-alice", AclOperation.WRITE),
        acl(ResourceType.TOPIC, "t-one", AclOperation.DESCRIBE, who="User:bob"),
    ]
    for future in admin.create_acls(bindings).values():
        assert future.result() is None
    yield proc
    proc.stop()


def test_admin_client_manages_acls_and_non_admins_are_refused(server: SluiceProcess) -> None:
    admin = AdminClient(conf(server, "admin"))
    described = admin.describe_acls(AclBindingFilter(ResourceType.TOPIC, "t-denied", ResourcePatternType.MATCH,
                                                     None, None, AclOperation.ANY, AclPermissionType.ANY)).result()
    assert {(b.name, b.resource_pattern_type, b.permission_type) for b in described} == {
        ("t-", ResourcePatternType.PREFIXED, AclPermissionType.ALLOW),
        ("t-denied", ResourcePatternType.LITERAL, AclPermissionType.DENY)}
    extra = acl(ResourceType.GROUP, "g-temp", AclOperation.DESCRIBE)
    assert error_of(admin.create_acls([extra])[extra]) is None
    gone = admin.delete_acls([AclBindingFilter(ResourceType.GROUP, "g-temp", ResourcePatternType.LITERAL, None,
                                               None, AclOperation.ANY, AclPermissionType.ANY)])
    assert [b.name for b in next(iter(gone.values())).result()] == ["g-temp"]

    alice = AdminClient(conf(server, "alice"))
    denied = KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # librdkafka 2.12 drops DescribeAcls' error code (rd_kafka_DescribeAclsResponse_parse): alice sees no
    # bindings; the code on the wire is checked in test_describe_acls_refusal_on_the_wire.
    assert alice.describe_acls(ANY_FILTER).result() == []
    assert error_of(alice.create_acls([extra])[extra]) == denied
    assert error_of(next(iter(alice.delete_acls([ANY_FILTER]).values()))) == denied
    assert len(admin.describe_acls(ANY_FILTER).result()) == 5  # nothing changed by alice


async def test_describe_acls_refusal_on_the_wire(tmp_path: Path) -> None:
    ctx = BrokerContext(MemoryLogStore(), None, "localhost", 9092)
    ctx.authorizer = Authorizer(AclStore(tmp_path), ["admin"])
    body = DescribeAclsRequest(resource_type_filter=i8(1), resource_name_filter=None, pattern_type_filter=i8(1),
                               principal_filter=None, host_filter=None, operation=i8(1), permission_type=i8(1))
    refused = await handle_describe_acls(ctx, body, ConnectionInfo("127.0.0.1", 1, principal=Principal("alice")))
    assert refused["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and refused["resources"] == []
    ctx.authorizer = None
    disabled = await handle_describe_acls(ctx, body, ConnectionInfo("127.0.0.1", 1, principal=Principal("alice")))
    assert disabled["error_code"] == ErrorCode.SECURITY_DISABLED


def test_produce_consume_and_metadata_matrix(server: SluiceProcess) -> None:
    alice = AdminClient(conf(server, "alice"))
    assert sorted(alice.list_topics(timeout=10).topics) == ["t-denied", "t-one"]  # secret is hidden
    bob = AdminClient(conf(server, "bob"))
    assert sorted(bob.list_topics(timeout=10).topics) == ["t-one"]

    outcomes: dict[str, int | None] = {}
    producer = Producer({**conf(server, "alice"), "message.timeout.ms": 10_000, "enable.idempotence": True})
    for topic in ("t-one", "secret"):
        producer.produce(topic, b"v", on_delivery=lambda e, m: outcomes.__setitem__(m.topic(), e and e.code()))
    producer.flush(15)
    assert outcomes == {"t-one": None, "secret": KafkaError.TOPIC_AUTHORIZATION_FAILED}

    def first_event(group: str, topic: str) -> Any:
        consumer = Consumer({**conf(server, "alice"), "group.id": group, "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        try:
            for _ in range(30):
                message = consumer.poll(1)
                if message is not None:
                    return message
            raise AssertionError("no message or error within 30 s")
        finally:
            consumer.close()

    assert first_event("g-alice", "t-one").value() == b"v"
    assert first_event("g-other", "t-one").error().code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert first_event("g-alice", "t-denied").error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_admin_operations_matrix(server: SluiceProcess) -> None:
    alice = AdminClient(conf(server, "alice"))
    assert error_of(alice.create_topics([NewTopic("nope", 1)])["nope"]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert error_of(alice.create_topics([NewTopic("t-new", 1)])["t-new"]) is None  # ALL on t- includes CREATE
    assert error_of(alice.delete_topics(["secret"])["secret"]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    topic, broker = ConfigResource("topic", "secret"), ConfigResource("broker", "0")
    results = alice.describe_configs([topic, broker])
    assert error_of(results[topic]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert error_of(results[broker]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert error_of(alice.describe_configs([ConfigResource("topic", "t-one")])[ConfigResource("topic", "t-one")]) \
        is None
    elected = alice.elect_leaders(ElectionType.PREFERRED, [TopicPartition("t-one", 0)])  # ALTER on the cluster
    assert error_of(elected) == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_transactional_ids(server: SluiceProcess) -> None:
    refused = Producer({**conf(server, "alice"), "transactional.id": "tx-other"})
    with pytest.raises(KafkaException) as info:
        refused.init_transactions(15)
    assert info.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    allowed = Producer({**conf(server, "alice"), "transactional.id": "tx-alice"})
    allowed.init_transactions(15)
    allowed.begin_transaction()
    allowed.produce("t-one", b"in-txn")
    allowed.commit_transaction(15)


def test_kcat_sees_only_describable_topics(server: SluiceProcess) -> None:
    out = subprocess.run(["kcat", "-b", server.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                          "-X", "sasl.mechanism=PLAIN", "-X", "sasl.username=bob", "-X", f"sasl.password={PASSWORD}",
                          "-L", "-J"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert '"topic":"t-one"' in out and "secret" not in out and "t-denied" not in out


def test_acls_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    UserStore(data).add("admin", PASSWORD)
    binding = acl(ResourceType.TOPIC, "kept", AclOperation.WRITE)
    first = start(data)
    try:
        admin = AdminClient(conf(first, "admin"))  # kept referenced until the future is done
        assert error_of(admin.create_acls([binding])[binding]) is None
    finally:
        first.stop()
    second = start(data)
    try:
        admin = AdminClient(conf(second, "admin"))
        assert admin.describe_acls(ANY_FILTER).result() == [binding]
    finally:
        second.stop()


def test_group_authorized_operations(server: SluiceProcess) -> None:
    alice = AdminClient(conf(server, "alice"))
    found = alice.describe_consumer_groups(["g-alice", "g-other"], include_authorized_operations=True)
    assert set(found["g-alice"].result().authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE}
    assert error_of(found["g-other"]) == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_admin_apis_kafka_python_calls_check_their_acls(server: SluiceProcess) -> None:
    # OffsetDelete needs DELETE on the group (alice may only READ g-alice), DescribeLogDirs DESCRIBE on the
    # cluster, DescribeProducers READ per topic (alice may describe "t-denied" but not read it), in Kafka's codes.
    alice = KafkaAdminClient(bootstrap_servers=server.bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
                             sasl_plain_password=PASSWORD)
    try:
        with pytest.raises(kafka_errors.GroupAuthorizationFailedError):
            alice.delete_group_offsets("g-alice", [KafkaTopicPartition("t-one", 0)])
        [broker] = alice.describe_log_dirs()
        assert broker["log_dirs"] == [], "refused: no directories"
        with pytest.raises(kafka_errors.TopicAuthorizationFailedError):
            alice.describe_producers([KafkaTopicPartition("t-denied", 0)])
        [state] = alice.describe_producers([KafkaTopicPartition("t-one", 0)]).values()  # READ allowed: answered
        assert all(p.producer_id >= 0 for p in state.active_producers)
    finally:
        alice.close()
