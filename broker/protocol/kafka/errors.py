"""Errors raised by the Kafka protocol codecs.

One root for the package; "the peer broke the protocol" is kept apart from "we cannot answer"::

    KafkaProtocolError                  (subclass of broker.errors.BrokerError)
    ├── FrameError                      the peer broke framing: negative or oversized length
    ├── MalformedRequestError           the peer sent a frame whose fields do not parse
    └── UnsupportedRequestError         a well-formed header naming an API key/version we do not serve
"""

from __future__ import annotations

from broker.errors import BrokerError

__all__ = ["FrameError", "KafkaProtocolError", "MalformedRequestError", "UnsupportedRequestError"]


class KafkaProtocolError(BrokerError):
    """Root of every error raised by ``broker.protocol.kafka``."""


class FrameError(KafkaProtocolError):
    """A frame length is negative or above the maximum request size; the stream cannot be resynchronised."""


class MalformedRequestError(KafkaProtocolError):
    """A request frame is truncated or its fields do not parse."""


class UnsupportedRequestError(KafkaProtocolError):
    """The API key or version is not served; the caller answers UNSUPPORTED_VERSION."""

    def __init__(self, message: str, *, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
