"""Sans-IO Kafka wire protocol: framing, headers, request decoding and response encoding.

``FrameDecoder.feed(bytes) -> [frame]`` (or ``FrameAssembler`` for reads into its buffers);
``decode_request(frame) -> Request``; ``encode_response(header, body) -> bytes``. Errors: see ``errors.py``.
"""

from broker.protocol.kafka.codec import (
    SUPPORTED_APIS,
    ApiKey,
    ApiSpec,
    Request,
    api_versions_body,
    build_entity,
    decode_request,
    decode_response_body,
    encode_request,
    encode_response,
    encode_response_parts,
    encode_unsupported_version,
    is_flexible,
)
from broker.protocol.kafka.errors import (
    FrameError,
    KafkaProtocolError,
    MalformedRequestError,
    UnsupportedRequestError,
)
from broker.protocol.kafka.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameAssembler,
    FrameDecoder,
    FramePool,
    encode_frame,
)
from broker.protocol.kafka.header import RequestHeader

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "SUPPORTED_APIS",
    "ApiKey",
    "ApiSpec",
    "FrameAssembler",
    "FrameDecoder",
    "FramePool",
    "FrameError",
    "KafkaProtocolError",
    "MalformedRequestError",
    "Request",
    "RequestHeader",
    "UnsupportedRequestError",
    "api_versions_body",
    "build_entity",
    "decode_request",
    "decode_response_body",
    "encode_frame",
    "encode_request",
    "encode_response",
    "encode_response_parts",
    "encode_unsupported_version",
    "is_flexible",
]
