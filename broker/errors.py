"""Errors raised by the broker package.

One root, so callers can catch everything the broker raises::

    BrokerError
    ├── InvalidRecordError          the peer sent bytes that are not a valid RecordBatch v2 (may name
    │   │                           the offending records: ``record_errors``)
    │   ├── CorruptRecordError      CRC mismatch, bad lengths, truncated input
    │   ├── UnsupportedMagicError   magic byte other than 2
    │   ├── RecordTooLargeError     batch above the topic's max_message_bytes (compressed or not)
    │   ├── UnsupportedCompressionError  zstd in a Produce request older than v7
    │   └── InvalidTimestampError   a record's timestamp (or timestamp type) is not accepted
    ├── TopicError
    │   ├── UnknownTopicError
    │   ├── TopicExistsError
    │   ├── InvalidTopicError       name breaks Kafka's naming rules
    │   ├── InvalidPartitionsError
    │   ├── InvalidConfigError      a topic config name or value Kafka would refuse (also a ValueError)
    │   └── PolicyViolationError    a limit of this broker (partitions per request or in total)
    ├── OffsetOutOfRangeError
    └── StorageError                our side: the data directory cannot be used
"""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "CorruptRecordError",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidRecordError",
    "InvalidTimestampError",
    "InvalidTopicError",
    "OffsetOutOfRangeError",
    "PolicyViolationError",
    "RecordTooLargeError",
    "StorageError",
    "TopicError",
    "TopicExistsError",
    "UnknownTopicError",
    "UnsupportedCompressionError",
    "UnsupportedMagicError",
]


class BrokerError(Exception):
    """Root of every error the broker raises."""


class InvalidRecordError(BrokerError):
    """The bytes offered as a record batch are not acceptable (the peer's fault).

    ``record_errors`` holds (index of the record in its batch, reason) for the records at fault,
    as Kafka's Produce v8 reports them."""

    def __init__(self, message: str, record_errors: tuple[tuple[int, str], ...] = ()) -> None:
        super().__init__(message)
        self.record_errors = record_errors


class CorruptRecordError(InvalidRecordError):
    """CRC mismatch, inconsistent lengths or truncated input."""


class UnsupportedMagicError(InvalidRecordError):
    """Only RecordBatch v2 (magic 2) is stored."""


class RecordTooLargeError(InvalidRecordError):
    """The batch is larger than the topic accepts."""


class UnsupportedCompressionError(InvalidRecordError):
    """The batch's codec is not allowed at this request version (zstd before Produce v7)."""


class InvalidTimestampError(InvalidRecordError):
    """A record's timestamp, or the batch's timestamp type, is not accepted."""


class TopicError(BrokerError):
    """A topic-level request cannot be served."""


class UnknownTopicError(TopicError):
    """No such topic or partition."""


class TopicExistsError(TopicError):
    """The topic already exists."""


class InvalidTopicError(TopicError):
    """The topic name breaks Kafka's rules."""


class InvalidPartitionsError(TopicError):
    """The partition count is not a positive number within limits."""


class InvalidConfigError(TopicError, ValueError):
    """A topic config name is unknown or its value is out of Kafka's range."""


class PolicyViolationError(TopicError):
    """The request is valid but breaks a limit this broker enforces (Kafka's POLICY_VIOLATION)."""


class OffsetOutOfRangeError(BrokerError):
    """The requested offset is outside [log start, high watermark]."""


class StorageError(BrokerError):
    """The data directory or a segment file cannot be used (our side, not the peer's)."""
