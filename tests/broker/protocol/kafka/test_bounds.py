"""Compact (flexible) lengths are checked before kio's native reader reserves memory for them.

Found by ``python -m bench.fuzz kafka``: a DescribeConfigs v4 frame whose resources array length is the
varint ``fe ff ff ff 0f`` made kio ask for 34 GB and Rust abort the broker process. Every well-formed
flexible request of every served API and version must still pass the check and decode as before.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema

from broker.protocol.kafka import (
    SUPPORTED_APIS,
    ApiKey,
    MalformedRequestError,
    RequestHeader,
    decode_request,
    encode_request,
    is_flexible,
)
from broker.protocol.kafka.bounds import check_compact_lengths

FLEXIBLE = [(k, v) for k, s in sorted(SUPPORTED_APIS.items()) for v in range(s.min_version, s.max_version + 1)
            if is_flexible(k, v)]
LIE = b"\xfe\xff\xff\xff\x0f"  # uvarint 2^32 - 2: an array of 2^32 - 3 elements


def describe_configs_v4_with_lying_array() -> bytes:
    """The fuzz reproducer, reduced: header v2, then the resources compact array length lies."""
    return struct.pack(">hhih", ApiKey.DESCRIBE_CONFIGS, 4, 7, 1) + b"x" + b"\x00" + LIE + b"\x00\x00\x00"


def test_the_fuzz_reproducer_is_refused_as_malformed() -> None:
    with pytest.raises(MalformedRequestError, match="resources: declares 4294967293 elements"):
        decode_request(describe_configs_v4_with_lying_array())


@pytest.mark.parametrize(("api_key", "version"), FLEXIBLE, ids=[f"{ApiKey(k).name}-v{v}" for k, v in FLEXIBLE])
def test_well_formed_flexible_requests_pass_and_lies_anywhere_are_refused(api_key: int, version: int) -> None:
    cls = load_request_schema(api_key, version)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.from_type(cls))
    def check(entity: Any) -> None:
        frame = encode_request(RequestHeader(api_key, version, 1, "t", True), entity)[4:]
        assert decode_request(frame).body == entity
        # the same request with a lying length at every position: refused or decoded, never an abort
        for pos in range(10, len(frame)):
            try:
                decode_request(frame[:pos] + LIE + frame[pos + 1 :])
            except MalformedRequestError:
                pass

    check()


def test_tagged_fields_are_skipped_by_their_size() -> None:
    cls = load_request_schema(ApiKey.API_VERSIONS, 3)
    body = b"\x02a\x02b" + b"\x02" + b"\x00\x01z" + b"\x05\x02zz"  # two unknown tagged fields
    check_compact_lengths(cls, body, 0)
    with pytest.raises(MalformedRequestError, match="tagged field"):
        check_compact_lengths(cls, b"\x02a\x02b\x01\x00\x7f", 0)
