"""Errors raised by the client library.

One root, so applications can catch everything ``clients`` raises::

    ClientError
    ├── BrokerUnreachableError     no broker answered at the bootstrap address
    ├── UnknownTopicError          the topic (or partition) does not exist
    ├── TopicExistsError           creating a topic that is already there
    ├── UnknownGroupError          describing a group the broker does not know
    ├── SerializationError         a value could not be (de)serialised
    ├── ClientClosedError          the producer/consumer/device was already closed
    ├── RequestFailedError         the broker refused a request (carries the Kafka error name)
    └── DeviceError
        └── BufferFullError        a device's local buffer is full and its overflow policy is "error"

Errors of the underlying Kafka client are translated at this boundary (``raise … from exc``).
"""

from __future__ import annotations

__all__ = [
    "BrokerUnreachableError",
    "BufferFullError",
    "ClientClosedError",
    "ClientError",
    "DeviceError",
    "RequestFailedError",
    "SerializationError",
    "TopicExistsError",
    "UnknownGroupError",
    "UnknownTopicError",
]


class ClientError(Exception):
    """Root of every error the client library raises."""


class BrokerUnreachableError(ClientError):
    """No broker answered at the bootstrap address."""


class UnknownTopicError(ClientError):
    """The topic or partition does not exist."""


class TopicExistsError(ClientError):
    """The topic already exists."""


class UnknownGroupError(ClientError):
    """The consumer group is not known to the broker."""


class SerializationError(ClientError):
    """A key or value could not be serialised or deserialised."""


class ClientClosedError(ClientError):
    """The object was closed."""


class RequestFailedError(ClientError):
    """The broker answered with an error."""


class DeviceError(ClientError):
    """A device helper failed."""


class BufferFullError(DeviceError):
    """The local buffer is full and the overflow policy says to raise."""
