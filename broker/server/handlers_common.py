"""What every Kafka request handler shares: the broker context and error mapping."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.errors import (
    BrokerError,
    CorruptRecordError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRecordError,
    InvalidTimestampError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    PolicyViolationError,
    RecordTooLargeError,
    StorageError,
    TopicExistsError,
    UnknownTopicError,
    UnsupportedCompressionError,
    UnsupportedMagicError,
)
from broker.groups.offsets import CommittedOffset
from broker.log.api import LogStore
from broker.protocol.kafka_codes import ErrorCode
from broker.security import ANONYMOUS, Authorizer, Principal, UserStore
from broker.server.producer_state import ProducerIdAllocator, ProducerStateTable
from broker.server.stats import KafkaStats
from broker.txn.coordinator import TransactionCoordinator
from broker.txn.metadata import PendingOffset, TopicPartition

__all__ = ["DEFAULT_LISTENER", "NODE_ID", "BrokerContext", "ConnectionInfo", "error_code_for", "millis"]

NODE_ID = 0
DEFAULT_LISTENER = "default"


@dataclass
class BrokerContext:
    """State shared by all Kafka connections of one broker."""

    store: LogStore
    coordinator: Any  # broker.groups.coordinator.GroupCoordinator (contract in handlers_groups)
    advertised_host: str
    advertised_port: int
    cluster_id: str = "sluice"
    producer_state: ProducerStateTable = field(default_factory=ProducerStateTable)
    producer_ids: ProducerIdAllocator = field(default_factory=ProducerIdAllocator)
    # Extra listeners' advertised (host, port) by listener name; a connection is told the address of
    # the listener it arrived on (Metadata, FindCoordinator), the default one otherwise.
    listener_addresses: dict[str, tuple[str, int]] = field(default_factory=dict)
    stats: KafkaStats = field(default_factory=KafkaStats)  # plain counters for metrics
    users: UserStore | None = None  # the SCRAM user store the SCRAM admin APIs manage (handlers_scram)
    # May the connection's principal perform an operation ("describe", "alter") on the cluster? None: anyone
    # may. A refusal the callable answers False to is audited by it (the client is told).
    cluster_access: Callable[[ConnectionInfo, str], bool] | None = None
    # The ACLs (security.auth = required), asked through broker.server.authz; None: everything is allowed.
    authorizer: Authorizer | None = None
    transactions: TransactionCoordinator = field(init=False)

    def __post_init__(self) -> None:
        self.transactions = TransactionCoordinator(self.store, self._allocate_producer_id, self._commit_txn_offsets)
        # Whichever path deletes a topic, its idempotent-producer state goes with it (late-bound:
        # the assembly may replace ``producer_state`` with a configured table).
        self.store.subscribe_deletions(lambda topic: self.producer_state.forget_topic(topic))
        # ... and so do the offsets groups committed for it (Kafka's handleDeletedPartitions).
        self.store.subscribe_deletions(lambda topic: self.coordinator.forget_topic(topic))

    def _allocate_producer_id(self) -> int:
        return self.producer_ids.allocate()  # looked up per call: serve replaces producer_ids after construction

    async def _commit_txn_offsets(self, group_id: str, offsets: dict[TopicPartition, PendingOffset]) -> None:
        await self.coordinator.offsets.commit(
            group_id, {tp: CommittedOffset(offset, metadata) for tp, (offset, metadata) in offsets.items()})

    def advertised_for(self, conn: ConnectionInfo) -> tuple[str, int]:
        """The (host, port) a client connected through ``conn.listener`` should use to reach us."""
        return self.listener_addresses.get(conn.listener, (self.advertised_host, self.advertised_port))


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    peer_host: str
    peer_port: int
    listener: str = DEFAULT_LISTENER  # the name of the listener the connection arrived on
    # Who the connection acts as: its SASL login, else its verified TLS client certificate's subject DN
    # (Kafka's DefaultKafkaPrincipalBuilder), else ANONYMOUS.
    principal: Principal = ANONYMOUS


_ERRORS: tuple[tuple[type[BrokerError], ErrorCode], ...] = (
    (UnsupportedMagicError, ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT),
    (RecordTooLargeError, ErrorCode.MESSAGE_TOO_LARGE),
    (CorruptRecordError, ErrorCode.CORRUPT_MESSAGE),
    (InvalidTimestampError, ErrorCode.INVALID_TIMESTAMP),
    (UnsupportedCompressionError, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
    (InvalidRecordError, ErrorCode.INVALID_RECORD),  # after its subclasses: the first match wins
    (UnknownTopicError, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    (TopicExistsError, ErrorCode.TOPIC_ALREADY_EXISTS),
    (InvalidTopicError, ErrorCode.INVALID_TOPIC_EXCEPTION),
    (InvalidPartitionsError, ErrorCode.INVALID_PARTITIONS),
    (InvalidConfigError, ErrorCode.INVALID_CONFIG),
    (PolicyViolationError, ErrorCode.POLICY_VIOLATION),
    (OffsetOutOfRangeError, ErrorCode.OFFSET_OUT_OF_RANGE),
    (StorageError, ErrorCode.KAFKA_STORAGE_ERROR),
)


def error_code_for(exc: BaseException) -> ErrorCode:
    """The Kafka error code a broker exception is answered with."""
    for kind, code in _ERRORS:
        if isinstance(exc, kind):
            return code
    return ErrorCode.UNKNOWN_SERVER_ERROR


def millis(value: datetime.timedelta | int) -> int:
    """kio hands durations over as timedeltas."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)
