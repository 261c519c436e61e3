"""OffsetFetch v6-v7 against one real ``sluice serve`` with librdkafka (confluent-kafka): v7's
require_stable (KIP-447), which a read_committed consumer sets, holds a group's offset back while a
transaction that commits it is open (UNSTABLE_OFFSET_COMMIT; the client retries) and answers it once
the transaction commits. librdkafka 2.0's ListConsumerGroupOffsets for all partitions of a group only
works from v7 on (its v5 request names an empty topic list): its test 0081 found Sluice stopping at v5."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker.protocol.kafka import ApiKey
from broker.protocol.kafka.codec import SUPPORTED_APIS
from tests.sluice_server import SluiceProcess

TOPIC = "stable-in"
GROUP = "stable-group"


@pytest.fixture(scope="module")
def sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    server = SluiceProcess(Path(tmp_path_factory.mktemp("offset-fetch")) / "data").start()
    yield server
    server.stop()


def test_offset_fetch_is_served_up_to_v7() -> None:
    assert SUPPORTED_APIS[ApiKey.OFFSET_FETCH].max_version == 7


def test_read_committed_consumer_sees_transactional_offsets_only_once_committed(sluice: SluiceProcess) -> None:
    bootstrap = sluice.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1)])[TOPIC].result(10)
    plain = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False,
                      "isolation.level": "read_uncommitted"})  # librdkafka's default is read_committed
    plain.commit(offsets=[TopicPartition(TOPIC, 0, 5)], asynchronous=False)

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "stable-txn"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 9)], plain.consumer_group_metadata(), 30)

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "isolation.level": "read_committed",
                       "enable.auto.commit": False})
    try:
        # While the transaction is open the offset is unstable: librdkafka retries until its timeout.
        with pytest.raises(KafkaException) as unstable:
            reader.committed([TopicPartition(TOPIC, 0)], timeout=2)
        assert unstable.value.args[0].code() in (KafkaError._TIMED_OUT, KafkaError.UNSTABLE_OFFSET_COMMIT)
        # read_uncommitted readers (no require_stable) see the last stored commit meanwhile.
        assert plain.committed([TopicPartition(TOPIC, 0)], timeout=10)[0].offset == 5

        producer.commit_transaction(30)
        assert reader.committed([TopicPartition(TOPIC, 0)], timeout=10)[0].offset == 9
    finally:
        reader.close()
        plain.close()
