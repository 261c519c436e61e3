"""The admin APIs clients call, against one real ``sluice serve``: CreatePartitions and DeleteRecords
(confluent-kafka AdminClient, aiokafka's admin client, kcat reading after a deletion), DeleteGroups
(confluent-kafka AdminClient), OffsetForLeaderEpoch (librdkafka's truncation check after a seek, plus
every answer of the epoch table over raw sockets), and idempotent-producer state cleared by a topic
deletion through the HTTP API, as DeleteTopics clears it."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewPartitions as AioNewPartitions
from aiokafka.admin.records_to_delete import RecordsToDelete
from confluent_kafka import Consumer, ElectionType, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient

from broker.protocol.kafka import ApiKey
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import RecordSpec, encode_batch
from tests.broker.server.raw_client import RawClient
from tests.broker.server.test_kafka_server import produce_body
from tests.sluice_server import SluiceProcess


@pytest.fixture(scope="module")
def sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    server = SluiceProcess(Path(tmp_path_factory.mktemp("admin-apis")) / "data").start()
    yield server
    server.stop()


def port_of(server: SluiceProcess) -> int:
    return int(server.endpoints["kafka"]["port"])


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, b"v%d" % i, partition=0)
    assert producer.flush(10) == 0


async def raw_request(port: int, api_key: int, version: int, body: Any) -> Any:
    client = await RawClient.connect(port)
    try:
        return await client.request(api_key, version, body)
    finally:
        await client.close()


def test_api_versions_advertises_the_admin_apis(sluice: SluiceProcess) -> None:
    resp = asyncio.run(raw_request(port_of(sluice), ApiKey.API_VERSIONS, 3,
                                   {"client_software_name": "t", "client_software_version": "1"}))
    served = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
    assert served[ApiKey.DELETE_GROUPS] == (0, 2)
    assert served[ApiKey.OFFSET_FOR_LEADER_EPOCH] == (2, 4)
    assert served[ApiKey.CREATE_PARTITIONS] == (0, 3)
    assert served[ApiKey.DELETE_RECORDS] == (0, 2)
    assert served[ApiKey.ELECT_LEADERS] == (0, 2) and served[ApiKey.OFFSET_DELETE] == (0, 0)
    assert served[ApiKey.DESCRIBE_LOG_DIRS] == (1, 4) and served[ApiKey.DESCRIBE_PRODUCERS] == (0, 0)
    assert served[ApiKey.LIST_PARTITION_REASSIGNMENTS] == (0, 0)
    # Client quotas are not served (docs/kafka.md says why): not advertised, so clients do not send them.
    assert 48 not in served and 49 not in served


# ---------------------------------------------------------------------------- CreatePartitions


def test_confluent_admin_adds_partitions_and_the_producer_uses_them(sluice: SluiceProcess) -> None:
    bootstrap = sluice.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("grow", 2)])["grow"].result(10)
    futures = admin.create_partitions([NewPartitions("grow", 5)], validate_only=True)
    assert futures["grow"].result(10) is None
    assert len(admin.list_topics("grow", timeout=10).topics["grow"].partitions) == 2, "validate_only changed it"
    assert admin.create_partitions([NewPartitions("grow", 5)])["grow"].result(10) is None
    assert len(admin.list_topics("grow", timeout=10).topics["grow"].partitions) == 5
    refusals = {
        "grow": (NewPartitions("grow", 3), KafkaError.INVALID_PARTITIONS),
        "no-such-topic": (NewPartitions("no-such-topic", 3), KafkaError.UNKNOWN_TOPIC_OR_PART),
    }
    for topic, (request, code) in refusals.items():
        with pytest.raises(KafkaException) as info:
            admin.create_partitions([request])[topic].result(10)
        assert info.value.args[0].code() == code
    with pytest.raises(KafkaException) as info:  # a replica on a broker that does not exist
        admin.create_partitions([NewPartitions("grow", 6, replica_assignment=[[7]])])["grow"].result(10)
    assert info.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    producer = Producer({"bootstrap.servers": bootstrap})
    delivered: list[int] = []
    producer.produce("grow", b"x", partition=4, on_delivery=lambda err, msg: delivered.append(msg.partition()))
    assert producer.flush(10) == 0 and delivered == [4]


def test_aiokafka_admin_adds_partitions(sluice: SluiceProcess) -> None:
    produce(sluice.bootstrap, "grow-aio", 1)

    async def main() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=sluice.bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({"grow-aio": AioNewPartitions(total_count=3)})
            described = await admin.describe_topics(["grow-aio"])
            return len(described[0]["partitions"])
        finally:
            await admin.close()

    assert asyncio.run(main()) == 3


# ---------------------------------------------------------------------------- DeleteRecords


def test_confluent_admin_deletes_records_and_kcat_reads_from_the_new_start(sluice: SluiceProcess) -> None:
    bootstrap = sluice.bootstrap
    produce(bootstrap, "trim", 10)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    result = admin.delete_records([TopicPartition("trim", 0, 4)])
    deleted = next(iter(result.values())).result(10)
    assert deleted.low_watermark == 4
    low, high = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"}).get_watermark_offsets(
        TopicPartition("trim", 0), timeout=10)
    assert (low, high) == (4, 10)
    out = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", "trim", "-o", "beginning", "-e", "-q",
                          "-f", "%o %s\\n"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert [line.split() for line in out.splitlines()] == [[str(i), f"v{i}"] for i in range(4, 10)]
    for bad in (11, -5):
        with pytest.raises(KafkaException) as info:
            next(iter(admin.delete_records([TopicPartition("trim", 0, bad)]).values())).result(10)
        assert info.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
    # OFFSET_END (-1) means "up to the high watermark".
    everything = admin.delete_records([TopicPartition("trim", 0, -1)])
    assert next(iter(everything.values())).result(10).low_watermark == 10


def test_aiokafka_admin_deletes_records(sluice: SluiceProcess) -> None:
    produce(sluice.bootstrap, "trim-aio", 6)

    async def main() -> dict[AioTopicPartition, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=sluice.bootstrap)
        await admin.start()
        try:
            return await admin.delete_records({AioTopicPartition("trim-aio", 0): RecordsToDelete(before_offset=2)})
        finally:
            await admin.close()

    assert asyncio.run(main()) == {AioTopicPartition("trim-aio", 0): 2}


# ---------------------------------------------------------------------------- DeleteGroups


def test_confluent_admin_deletes_consumer_groups(sluice: SluiceProcess) -> None:
    bootstrap = sluice.bootstrap
    produce(bootstrap, "dg", 3)
    idle = Consumer({"bootstrap.servers": bootstrap, "group.id": "dg-idle", "enable.auto.commit": False})
    idle.commit(offsets=[TopicPartition("dg", 0, 2)], asynchronous=False)
    idle.close()
    busy = Consumer({"bootstrap.servers": bootstrap, "group.id": "dg-busy", "auto.offset.reset": "earliest"})
    busy.subscribe(["dg"])
    deadline = time.monotonic() + 30
    while not busy.assignment():
        assert time.monotonic() < deadline, "the busy group never formed"
        busy.poll(0.1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        futures = admin.delete_consumer_groups(["dg-idle", "dg-busy", "dg-never"], request_timeout=10)
        assert futures["dg-idle"].result(10) is None
        for group, code in (("dg-busy", KafkaError.NON_EMPTY_GROUP), ("dg-never", KafkaError.GROUP_ID_NOT_FOUND)):
            with pytest.raises(KafkaException) as info:
                futures[group].result(10)
            assert info.value.args[0].code() == code
        listed = {g.group_id for g in admin.list_consumer_groups(request_timeout=60).result(60).valid}
        assert "dg-idle" not in listed and "dg-busy" in listed
        check = Consumer({"bootstrap.servers": bootstrap, "group.id": "dg-idle"})
        assert check.committed([TopicPartition("dg", 0)], timeout=10)[0].offset == -1001
        check.close()
    finally:
        busy.close()


# ---------------------------------------------------------------------------- OffsetForLeaderEpoch


def test_librdkafka_detects_a_position_past_the_end_after_a_seek(sluice: SluiceProcess) -> None:
    """A seek with a leader epoch is validated with OffsetForLeaderEpoch: a position beyond the end
    of epoch 0 is a truncation, and librdkafka continues at the end offset we answer (without the API
    it would fetch, get OFFSET_OUT_OF_RANGE and fall back to auto.offset.reset=earliest)."""
    bootstrap = sluice.bootstrap
    produce(bootstrap, "epochs", 10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "epochs", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("epochs", 0, 0)])
        first = None
        deadline = time.monotonic() + 20
        while first is None or first.error() is not None:
            assert time.monotonic() < deadline
            first = consumer.poll(0.2)
        consumer.seek(TopicPartition("epochs", 0, 50, leader_epoch=0))
        m = None
        next_produce = 0.0
        while m is None or m.error() is not None:
            assert time.monotonic() < deadline, "nothing consumed after the seek"
            if time.monotonic() >= next_produce:  # records appended after the end (10) that the seek found
                produce(bootstrap, "epochs", 1)
                next_produce = time.monotonic() + 1
            m = consumer.poll(0.2)
        offset = m.offset()
        assert offset is not None and offset >= 10, f"consumed offset {offset}: reset to the start, not the end"
    finally:
        consumer.close()


def _epoch_request(topic: str, partition: int, current: int, epoch: int) -> dict[str, Any]:
    return {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
        {"partition": partition, "current_leader_epoch": current, "leader_epoch": epoch}]}]}


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch_answers(sluice: SluiceProcess, version: int) -> None:
    produce(sluice.bootstrap, f"ofle-{version}", 4)
    cases = [  # (topic, partition, current epoch, requested epoch) -> (error, epoch, end offset)
        ((f"ofle-{version}", 0, -1, 0), (ErrorCode.NONE, 0, 4)),
        ((f"ofle-{version}", 0, 0, 0), (ErrorCode.NONE, 0, 4)),
        ((f"ofle-{version}", 0, -1, -1), (ErrorCode.NONE, -1, -1)),
        ((f"ofle-{version}", 0, -1, 3), (ErrorCode.NONE, -1, -1)),
        ((f"ofle-{version}", 0, -1, -7), (ErrorCode.NONE, -7, 0)),
        ((f"ofle-{version}", 0, 1, 0), (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, -1)),
        ((f"ofle-{version}", 0, -2, 0), (ErrorCode.FENCED_LEADER_EPOCH, -1, -1)),
        ((f"ofle-{version}", 9, -1, 0), (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)),
        (("no-such-topic", 0, -1, 0), (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)),
    ]
    for args, expected in cases:
        resp = asyncio.run(raw_request(port_of(sluice), ApiKey.OFFSET_FOR_LEADER_EPOCH, version,
                                       _epoch_request(*args)))
        p = resp.topics[0].partitions[0]
        assert (int(p.error_code), int(p.leader_epoch), int(p.end_offset)) == expected, args


# ---------------------------------------------------------------------------- producer state


def _idempotent(pid: int, seq: int, value: bytes) -> bytes:
    return encode_batch([RecordSpec(value)], producer_id=pid, producer_epoch=0, base_sequence=seq)


async def _produce_idempotent(port: int, topic: str, batch: bytes) -> int:
    resp = await raw_request(port, ApiKey.PRODUCE, 8, produce_body(batch, topic=topic))
    return int(resp.topics[0].partitions[0].error_code)


def test_topic_deleted_over_http_takes_its_producer_state_along(sluice: SluiceProcess) -> None:
    """A producer that wrote sequences 0-2 to a topic deleted through the HTTP API is new on the topic
    created anew: any first sequence is accepted (stale state would want 3: OUT_OF_ORDER_SEQUENCE_NUMBER)."""
    port, pid = port_of(sluice), 4242
    for seq in range(3):
        assert asyncio.run(_produce_idempotent(port, "recycled", _idempotent(pid, seq, b"old"))) == ErrorCode.NONE
    assert asyncio.run(_produce_idempotent(port, "recycled", _idempotent(pid, 7, b"gap"))) == (
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    assert httpx.delete(f"{sluice.http}/topics/recycled", timeout=10).status_code in (200, 204)
    assert asyncio.run(_produce_idempotent(port, "recycled", _idempotent(pid, 7, b"new"))) == ErrorCode.NONE


# ---------------------------------------------------------------------------- ElectLeaders


def test_leader_elections_are_never_needed_on_one_broker(sluice: SluiceProcess) -> None:
    # confluent-kafka's elect_leaders (kafka-leader-election): the only replica is the preferred and a live
    # leader, so Kafka's controller answers ELECTION_NOT_NEEDED per partition, and leaves such partitions
    # out when asked for all of them.
    admin = AdminClient({"bootstrap.servers": sluice.bootstrap})
    admin.create_topics([NewTopic("elect", 2)])["elect"].result(10)
    for election in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
        asked = [TopicPartition("elect", 0), TopicPartition("elect", 1), TopicPartition("elect", 7),
                 TopicPartition("never-created", 0)]
        result = admin.elect_leaders(election, asked).result(10)
        codes = {(tp.topic, tp.partition): error.code() for tp, error in result.items()}
        assert codes == {("elect", 0): KafkaError.ELECTION_NOT_NEEDED, ("elect", 1): KafkaError.ELECTION_NOT_NEEDED,
                         ("elect", 7): KafkaError.UNKNOWN_TOPIC_OR_PART,
                         ("never-created", 0): KafkaError.UNKNOWN_TOPIC_OR_PART}
        assert admin.elect_leaders(election, None).result(10) == {}


# ---------------------------------------------------------------------------- DescribeProducers


def test_describe_producers_shows_each_producer_and_its_open_transaction(sluice: SluiceProcess) -> None:
    # kafka-python's describe_producers (`kafka-transactions describe-producers`, and find-hanging's source):
    # one entry per idempotent or transactional producer of the partition, with its open transaction's
    # first offset there (-1 once it ended), as Kafka's activeProducerState answers.
    admin = AdminClient({"bootstrap.servers": sluice.bootstrap})
    admin.create_topics([NewTopic("produced", 1)])["produced"].result(10)
    idempotent = Producer({"bootstrap.servers": sluice.bootstrap, "enable.idempotence": True})
    for _ in range(3):
        idempotent.produce("produced", b"i", partition=0)
    assert idempotent.flush(10) == 0
    transactional = Producer({"bootstrap.servers": sluice.bootstrap, "transactional.id": "describe-producers"})
    transactional.init_transactions(10)
    transactional.begin_transaction()
    transactional.produce("produced", b"t", partition=0)
    assert transactional.flush(10) == 0
    client = KafkaAdminClient(bootstrap_servers=sluice.bootstrap)
    try:
        def states() -> list[tuple[int, int, int]]:
            [state] = client.describe_producers([KafkaTopicPartition("produced", 0)]).values()
            assert all(p.last_timestamp > 0 and p.producer_epoch == 0 and p.coordinator_epoch == -1
                       for p in state.active_producers)
            return sorted((p.producer_id, p.last_sequence, p.current_transaction_start_offset)
                          for p in state.active_producers)

        (first_id, first_seq, first_txn), (second_id, second_seq, second_txn) = states()
        assert (first_seq, first_txn) == (2, -1) and (second_seq, second_txn) == (0, 3)
        transactional.commit_transaction(10)
        assert states() == [(first_id, 2, -1), (second_id, 0, -1)]
    finally:
        client.close()


def test_no_partition_reassignment_is_ever_in_progress(sluice: SluiceProcess) -> None:
    # kafka-python's list_partition_reassignments (`kafka-reassign-partitions --list`): one replica is never
    # being moved; named topics Sluice does not have are left out, as Kafka's controller leaves them out.
    admin = AdminClient({"bootstrap.servers": sluice.bootstrap})
    admin.create_topics([NewTopic("not-moving", 2)])["not-moving"].result(10)
    client = KafkaAdminClient(bootstrap_servers=sluice.bootstrap)
    try:
        assert client.list_partition_reassignments() == {}
        asked = [KafkaTopicPartition("not-moving", 0), KafkaTopicPartition("never-created", 3)]
        assert client.list_partition_reassignments(asked) == {}
    finally:
        client.close()
