"""Kafka requests aiokafka does not ship, in aiokafka's own protocol types (so its client sends them).

IncrementalAlterConfigs v0 (KIP-339; Kafka 2.3+): set or delete single configs of a resource without
restating the others (AlterConfigs replaces the whole set).
"""

from __future__ import annotations

from typing import Any, TypeAlias

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int8, Int16, Int32, Schema, String

__all__ = ["CONFIG_DELETE", "CONFIG_SET", "IncrementalAlterConfigsRequest"]

CONFIG_SET = 0
CONFIG_DELETE = 1


class IncrementalAlterConfigsResponse_v0(Response):
    API_KEY = 44
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("responses", Array(
            ("error_code", Int16),
            ("error_message", String("utf-8")),
            ("resource_type", Int8),
            ("resource_name", String("utf-8")),
        )),
    )


class IncrementalAlterConfigsRequest_v0(RequestStruct):
    API_KEY = 44
    API_VERSION = 0
    RESPONSE_TYPE = IncrementalAlterConfigsResponse_v0
    SCHEMA = Schema(
        ("resources", Array(
            ("resource_type", Int8),
            ("resource_name", String("utf-8")),
            ("configs", Array(
                ("name", String("utf-8")),
                ("config_operation", Int8),
                ("value", String("utf-8")),  # nullable: None for a delete
            )),
        )),
        ("validate_only", Boolean),
    )


IncrementalAlterConfigsRequestStruct: TypeAlias = IncrementalAlterConfigsRequest_v0


class IncrementalAlterConfigsRequest(Request[IncrementalAlterConfigsRequestStruct]):
    API_KEY = 44

    def __init__(self, resources: list[tuple[int, str, list[tuple[str, int, str | None]]]],
                 validate_only: bool = False) -> None:
        self._resources = resources
        self._validate_only = validate_only

    def build(self, request_struct_class: type[IncrementalAlterConfigsRequestStruct]) -> Any:
        return request_struct_class(self._resources, self._validate_only)
