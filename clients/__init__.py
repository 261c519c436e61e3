"""The Python client library for Sluice: producer, consumer and admin over the Kafka protocol (so the same
code runs against a Kafka or Redpanda cluster), serializers, typed records, and device helpers.

Built on aiokafka (see bench/RESULTS.md "Client library, HTTP API and SSE" for the measurement behind the
choice). Imports nothing from the broker, ingest, processors or sluice packages.
"""

from clients.admin import AsyncAdmin, GroupDescription, GroupMember, PartitionInfo, TopicDescription
from clients.consumer import AsyncConsumer, CommitStrategy
from clients.errors import (
    BrokerUnreachableError,
    BufferFullError,
    ClientClosedError,
    ClientError,
    DeviceError,
    RequestFailedError,
    SerializationError,
    TopicExistsError,
    UnknownGroupError,
    UnknownTopicError,
)
from clients.producer import AsyncProducer
from clients.records import ConsumerRecord, PartitionLag, RecordMetadata, TopicPartition
from clients.security import ClientSecurity
from clients.serializers import (
    JsonSerializer,
    MsgpackSerializer,
    RawSerializer,
    Serializer,
    StringSerializer,
    resolve_serializer,
)
from clients.sync import Admin, Consumer, Producer

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "BrokerUnreachableError",
    "BufferFullError",
    "ClientClosedError",
    "ClientSecurity",
    "ClientError",
    "CommitStrategy",
    "Consumer",
    "ConsumerRecord",
    "DeviceError",
    "GroupDescription",
    "GroupMember",
    "JsonSerializer",
    "MsgpackSerializer",
    "PartitionInfo",
    "PartitionLag",
    "Producer",
    "RawSerializer",
    "RecordMetadata",
    "RequestFailedError",
    "SerializationError",
    "Serializer",
    "StringSerializer",
    "TopicDescription",
    "TopicExistsError",
    "TopicPartition",
    "UnknownGroupError",
    "UnknownTopicError",
    "resolve_serializer",
]
