"""Kafka's answer to a request that failed inside the broker, for every API and version served: the
response encodes, decodes, and carries UNKNOWN_SERVER_ERROR in every error code it has (per partition,
group, resource, or at the top), one entry per item of the request."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

import pytest

from broker.protocol.kafka import (
    SUPPORTED_APIS,
    RequestHeader,
    decode_request,
    decode_response_body,
    encode_request,
    encode_response,
    is_flexible,
)
from broker.protocol.kafka.error_responses import error_response
from broker.protocol.kafka.fetch import FetchResponse
from broker.protocol.kafka_codes import ErrorCode
from tests.broker.protocol.kafka.samples import SAMPLE_REQUESTS

CASES = [(key, version) for key, spec in sorted(SUPPORTED_APIS.items())
         for version in range(spec.min_version, spec.max_version + 1)]


def error_codes(value: Any) -> list[int]:
    """Every ``error_code`` in a decoded response (kio dataclasses or our Produce/Fetch dataclasses)."""
    if isinstance(value, tuple | list):
        return [code for item in value for code in error_codes(item)]
    if not is_dataclass(value):
        return []
    found: list[int] = []
    for f in fields(value):
        item = getattr(value, f.name)
        if f.name.endswith("error_code"):  # AddPartitionsToTxn says partition_error_code
            found.append(int(item))
        else:
            found += error_codes(item)
    return found


@pytest.mark.parametrize(("api_key", "version"), CASES, ids=[f"{SUPPORTED_APIS[k].key.name}-v{v}" for k, v in CASES])
def test_error_response_round_trips_with_the_code_everywhere(api_key: int, version: int) -> None:
    flexible = is_flexible(api_key, version)
    header = RequestHeader(api_key, version, 42, "tests", flexible)
    request = decode_request(encode_request(header, SAMPLE_REQUESTS[api_key])[4:])
    try:
        body = error_response(api_key, version, request.body, ErrorCode.UNKNOWN_SERVER_ERROR)
    except LookupError:
        pytest.fail("served API without an error response: add a builder to error_responses._BUILDERS")
    corr, decoded = decode_response_body(api_key, version, encode_response(header, body)[4:], flexible)
    if isinstance(decoded, FetchResponse) and version < 7:
        decoded = decoded.topics  # no top-level error code on the wire before v7 (the dataclass says 0)
    codes = error_codes(decoded)
    assert corr == 42 and codes and set(codes) == {ErrorCode.UNKNOWN_SERVER_ERROR}, codes
