"""The group admin calls frameworks and tools make, against one real ``sluice serve`` and real clients:
removing static members by ``group.instance.id`` (kafka-python's ``remove_group_members``, LeaveGroup v3,
what Kafka Streams' and the Java AdminClient's ``removeMembersFromConsumerGroup`` send), and deleting a
group's committed offsets (``delete_group_offsets``, OffsetDelete)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import OffsetAndMetadata
from kafka import TopicPartition as KafkaTopicPartition
from kafka import errors as kafka_errors
from kafka.admin import KafkaAdminClient, MemberToRemove

from tests.sluice_server import SluiceProcess


@pytest.fixture(scope="module")
def sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    server = SluiceProcess(Path(tmp_path_factory.mktemp("group-admin")) / "data").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bootstrap(sluice: SluiceProcess) -> str:
    return f"127.0.0.1:{sluice.endpoints['kafka']['port']}"


@pytest.fixture
def kafka_python_admin(bootstrap: str) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="group-admin-test")
    yield admin
    admin.close()


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll ``condition`` until it returns something truthy (a deadline, not a sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def static_consumer(bootstrap: str, group: str, instance: str, assigned: list[list[int]]) -> Consumer:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": instance,
        "session.timeout.ms": 45000, "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest",
    })

    def on_assign(c: Consumer, partitions: list[TopicPartition]) -> None:
        assigned.append(sorted(p.partition for p in partitions))

    consumer.subscribe([group], on_assign=on_assign)
    return consumer


def members_by_instance(admin: KafkaAdminClient, group: str) -> dict[str | None, str]:
    described = admin.describe_groups([group])[group]
    return {m["group_instance_id"]: m["member_id"] for m in described["members"]}


def test_static_members_are_removed_by_instance_id_as_kafka_does(
    bootstrap: str, kafka_python_admin: KafkaAdminClient
) -> None:
    group = "static-removal"
    confluent_admin = AdminClient({"bootstrap.servers": bootstrap})
    confluent_admin.create_topics([NewTopic(group, 2)])[group].result(10)
    gone_assigned: list[list[int]] = []
    kept_assigned: list[list[int]] = []
    gone = static_consumer(bootstrap, group, "instance-gone", gone_assigned)
    kept = static_consumer(bootstrap, group, "instance-kept", kept_assigned)
    try:
        def both_assigned() -> bool:
            gone.poll(0.1)
            kept.poll(0.1)
            return len(members_by_instance(kafka_python_admin, group)) == 2 and bool(
                gone_assigned and gone_assigned[-1] and kept_assigned and kept_assigned[-1])

        wait_for(both_assigned, "two static members sharing the partitions")
        described = kafka_python_admin.describe_groups([group])[group]["members"]
        assert {m["client_host"] for m in described} == {"/127.0.0.1"}, "Kafka's InetAddress text"
        members = members_by_instance(kafka_python_admin, group)
        # A static member does not leave when its process stops: it stays until its session times out
        # (45 s here), which is what an operator's removal by instance id is for.
        gone.close()
        assert set(members_by_instance(kafka_python_admin, group)) == {"instance-gone", "instance-kept"}

        fenced = MemberToRemove(member_id="not-the-holder", group_instance_id="instance-kept")
        unknown = MemberToRemove(group_instance_id="instance-nobody-has")
        by_instance = MemberToRemove(group_instance_id="instance-gone")
        result = kafka_python_admin.remove_group_members(group, [fenced, unknown, by_instance])
        assert result == {  # kafka-python keys each answer by member id, or instance id without one
            "not-the-holder": kafka_errors.FencedInstanceIdError,
            "instance-nobody-has": kafka_errors.UnknownMemberIdError,
            "instance-gone": kafka_errors.NoError,
        }

        def kept_owns_everything() -> bool:
            kept.poll(0.1)
            return bool(kept_assigned and kept_assigned[-1] == [0, 1])

        wait_for(kept_owns_everything, "the remaining member to take both partitions")
        assert members_by_instance(kafka_python_admin, group) == {"instance-kept": members["instance-kept"]}

        # The member id and instance id of a current member together: it is removed too.
        both = MemberToRemove(member_id=members["instance-kept"], group_instance_id="instance-kept")
        assert list(kafka_python_admin.remove_group_members(group, [both]).values()) == [kafka_errors.NoError]
    finally:
        kept.close()


def test_leaving_a_group_nobody_joined_answers_unknown_member_per_member(
    kafka_python_admin: KafkaAdminClient,
) -> None:
    result = kafka_python_admin.remove_group_members("never-joined", [MemberToRemove(group_instance_id="i")])
    assert list(result.values()) == [kafka_errors.UnknownMemberIdError]


def test_offsets_are_deleted_as_kafka_deletes_them(bootstrap: str, kafka_python_admin: KafkaAdminClient) -> None:
    # OffsetDelete (kafka-python's delete_group_offsets, `kafka-consumer-groups --delete-offsets`):
    # while the group has members, offsets of subscribed topics stay (GROUP_SUBSCRIBED_TO_TOPIC) and the
    # others go; once it is Empty every one goes, and a group left without offsets is deleted.
    group, read, other = "offsets-deleted", "offsets-read", "offsets-other"
    confluent_admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in confluent_admin.create_topics([NewTopic(read, 2), NewTopic(other, 1)]).values():
        future.result(10)
    committed = {KafkaTopicPartition(read, 0): OffsetAndMetadata(5, "", -1),
                 KafkaTopicPartition(read, 1): OffsetAndMetadata(6, "", -1),
                 KafkaTopicPartition(other, 0): OffsetAndMetadata(7, "", -1)}
    assert set(kafka_python_admin.alter_group_offsets(group, committed).values()) == {kafka_errors.NoError}
    assigned: list[list[int]] = []
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.subscribe([read], on_assign=lambda c, ps: assigned.append([p.partition for p in ps]))
    try:
        wait_for(lambda: consumer.poll(0.1) or assigned, "the consumer's assignment")
        result = kafka_python_admin.delete_group_offsets(
            group, [KafkaTopicPartition(read, 0), KafkaTopicPartition(other, 0), KafkaTopicPartition("nope", 0)])
        assert result == {KafkaTopicPartition(read, 0): kafka_errors.GroupSubscribedToTopicError,
                          KafkaTopicPartition(other, 0): kafka_errors.NoError,
                          KafkaTopicPartition("nope", 0): kafka_errors.UnknownTopicOrPartitionError}
        assert set(kafka_python_admin.list_group_offsets({group: None})[group]) == {
            KafkaTopicPartition(read, 0), KafkaTopicPartition(read, 1)}
    finally:
        consumer.close()  # leaves the group: Empty
    result = kafka_python_admin.delete_group_offsets(group, [KafkaTopicPartition(read, p) for p in (0, 1)])
    assert set(result.values()) == {kafka_errors.NoError}
    assert kafka_python_admin.describe_groups([group])[group]["group_state"] == "Dead", "deleted with its last offset"
    with pytest.raises(kafka_errors.GroupIdNotFoundError):
        kafka_python_admin.delete_group_offsets(group, [KafkaTopicPartition(read, 0)])


def test_groups_are_listed_by_type_and_api_versions_v4_is_served(
    sluice: SluiceProcess, bootstrap: str, kafka_python_admin: KafkaAdminClient
) -> None:
    confluent_admin = AdminClient({"bootstrap.servers": bootstrap})
    confluent_admin.create_topics([NewTopic("typed", 1)])["typed"].result(10)
    committed = {KafkaTopicPartition("typed", 0): OffsetAndMetadata(1, "", -1)}
    assert set(kafka_python_admin.alter_group_offsets("typed-group", committed).values()) == {kafka_errors.NoError}
    # ListGroups v5 (KIP-848): every group here is a classic one; the filter ignores case, as Kafka's does.
    classic = kafka_python_admin.list_groups(types_filter=["Classic"])
    assert {"group_id": "typed-group", "protocol_type": "", "group_state": "Empty", "group_type": "classic"} in classic
    assert kafka_python_admin.list_groups(types_filter=["consumer"]) == []
    # kafka-python opens with ApiVersions v4 (Kafka 3.9+ serves it): answered, not refused and logged.
    assert "API_VERSIONS v4" not in sluice.log.read_text()


def test_the_empty_group_id_commits_and_is_deleted_as_in_kafka(
    bootstrap: str, kafka_python_admin: KafkaAdminClient
) -> None:
    # Kafka keeps OffsetCommit, OffsetFetch and DeleteGroups working for the group id "" ("for backwards
    # compatibility"); only the membership APIs refuse it (INVALID_GROUP_ID).
    confluent_admin = AdminClient({"bootstrap.servers": bootstrap})
    confluent_admin.create_topics([NewTopic("unnamed-group", 1)])["unnamed-group"].result(10)
    tp = KafkaTopicPartition("unnamed-group", 0)
    assert kafka_python_admin.alter_group_offsets("", {tp: OffsetAndMetadata(4, "m", -1)}) == {
        tp: kafka_errors.NoError}
    assert kafka_python_admin.list_group_offsets({"": None})[""] == {tp: OffsetAndMetadata(4, "m", -1)}
    assert kafka_python_admin.delete_groups([""]) == {"": "OK"}
    assert kafka_python_admin.list_group_offsets({"": None})[""] == {}


def test_a_static_members_old_incarnation_is_fenced_not_told_to_rejoin(
    bootstrap: str, kafka_python_admin: KafkaAdminClient
) -> None:
    # Two processes started with one group.instance.id: the second takes the member's place, and the
    # first's next heartbeat (v3+, naming the instance id) is FENCED_INSTANCE_ID, as from Kafka, which
    # librdkafka treats as fatal. UNKNOWN_MEMBER_ID instead made it join again and fence the second in turn.
    group = "fenced-instance"
    confluent_admin = AdminClient({"bootstrap.servers": bootstrap})
    confluent_admin.create_topics([NewTopic(group, 1)])[group].result(10)
    old_assigned: list[list[int]] = []
    new_assigned: list[list[int]] = []
    old = static_consumer(bootstrap, group, "the-instance", old_assigned)
    try:
        wait_for(lambda: old.poll(0.1) or old_assigned, "the first incarnation's assignment")
        new = static_consumer(bootstrap, group, "the-instance", new_assigned)
        try:
            wait_for(lambda: new.poll(0.1) or new_assigned, "the second incarnation's assignment")
            new_member = members_by_instance(kafka_python_admin, group)["the-instance"]

            def old_is_fenced() -> bool:
                new.poll(0.05)
                message = old.poll(0.1)
                error = message.error() if message is not None else None
                return error is not None and error.code() == KafkaError._FATAL

            wait_for(old_is_fenced, "the old incarnation's fatal error")
            new.poll(0.5)
            assert members_by_instance(kafka_python_admin, group) == {"the-instance": new_member}
        finally:
            new.close()
    finally:
        old.close()


def test_leaving_the_empty_group_id_answers_invalid_group_id_with_no_members(
    kafka_python_admin: KafkaAdminClient,
) -> None:
    # Kafka's handleLeaveGroup: INVALID_GROUP_ID at the top level and an empty member list (the fuzz
    # campaign found this answered UNKNOWN_SERVER_ERROR with a traceback: one code per member expected)
    with pytest.raises(kafka_errors.InvalidGroupIdError):
        kafka_python_admin.remove_group_members("", [MemberToRemove(group_instance_id="i")])
