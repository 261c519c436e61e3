"""Errors raised by ``broker.groups``.

Protocol-level refusals (unknown member, stale generation, …) are not exceptions: the coordinator
answers them with Kafka error codes. Exceptions are for the two other kinds of failure::

    BrokerError                              (broker.errors)
    └── GroupsError                          root of this package
        ├── InvalidConsumerProtocolError     the peer's fault: assignment bytes that do not decode
        └── OffsetStoreError                 our side: the offset store cannot read or write its files
            └── OffsetStoreCorruptError      a snapshot or a fully written log file fails its checks
"""

from __future__ import annotations

from broker.errors import BrokerError, StorageError

__all__ = ["GroupsError", "InvalidConsumerProtocolError", "OffsetStoreCorruptError", "OffsetStoreError"]


class GroupsError(BrokerError):
    """Root of every error raised by broker.groups."""


class InvalidConsumerProtocolError(GroupsError, ValueError):
    """Consumer protocol assignment bytes that cannot be decoded (the peer's fault)."""


class OffsetStoreError(GroupsError, StorageError):
    """The offset store cannot read or write its files (our side, not the peer's)."""


class OffsetStoreCorruptError(OffsetStoreError):
    """A snapshot or a log file other than the last one fails its CRC or length checks."""
