"""Property test: requests generated from the app's own OpenAPI schema never produce a server error,
and every response matches the schema (status codes, content types, bodies).

Both generation modes run: positive (valid requests) and negative (requests that break the schema:
numbers outside Kafka's INT32/INT64 ranges, wrong types, missing fields), which must be refused with a
4xx problem. The app's body cap is set low (2 KiB) so generated bodies cross it and get their 413."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode, checks
from schemathesis.core.result import Ok
from schemathesis.schemas import APIOperation

from broker.log.memory import MemoryLogStore
from broker.protocol.records import RecordSpec
from sluice.config import HttpSettings, Settings
from sluice.http import create_app
from sluice.runtime import Runtime

BODY_CAP = 2048


def _app() -> FastAPI:
    runtime = Runtime(
        Settings(data_dir=Path(tempfile.mkdtemp(prefix="sluice-st-")), http=HttpSettings(max_body_bytes=BODY_CAP)),
        MemoryLogStore(),
    )
    runtime.store.create_topic("sensors", partitions=2)
    runtime.store.partition("sensors", 0).append_nowait(
        __import__("broker.protocol.records", fromlist=["encode_batch"]).encode_batch([RecordSpec(b'{"t": 1}')])
    )
    app = create_app(runtime, max_wait_ms=20, sse_heartbeat_s=0.05)
    app.state.ctx.accepting = True
    return app


schema: schemathesis.BaseSchema = schemathesis.openapi.from_asgi("/openapi.json", _app())
# The SSE stream is endless by design (it ends when the client leaves); it is tested with a real client.
schema = schema.exclude(path="/topics/{topic}/stream")
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
# A schema-breaking request may also be refused for its size (413 body-too-large): that is a rejection too.
_rejection = schema.config.checks.negative_data_rejection
_rejection.expected_statuses = [*_rejection.expected_statuses, "413"]


# One pytest item per operation, named by it. (Not `@schema.parametrize()`: under pytest 9 its items all share
# one node id, and pytest-xdist then runs one of them in place of all.)
_LOADED = list(schema.get_all_operations())
OPERATIONS = [result.ok() for result in _LOADED if isinstance(result, Ok)]


@pytest.mark.parametrize("operation", OPERATIONS, ids=[operation.label for operation in OPERATIONS])
def test_api_conforms_to_its_schema(operation: APIOperation) -> None:
    # Both modes in one stream: an operation with nothing to break (a lone string path parameter) draws valid
    # requests only, as schemathesis' own runner does.
    requests = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(GenerationMode.NEGATIVE)

    @settings(max_examples=24, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=requests)
    def conforms(case: schemathesis.Case) -> None:
        case.call_and_validate(
            checks=[
                checks.not_a_server_error,
                checks.status_code_conformance,
                checks.content_type_conformance,
                checks.response_schema_conformance,
                checks.negative_data_rejection,
            ]
        )

    conforms()


def test_every_operation_but_the_stream_is_tested() -> None:
    assert len(OPERATIONS) == len(_LOADED), [result for result in _LOADED if not isinstance(result, Ok)]
    assert len(OPERATIONS) == len({operation.label for operation in OPERATIONS}) > 20
    assert "GET /topics/{topic}/stream" not in {operation.label for operation in OPERATIONS}
