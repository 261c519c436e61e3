"""RFC 9457 problem details: every error the HTTP API returns is ``application/problem+json``.

Domain errors are translated here, once, at the boundary::

    UnknownTopicError        404  unknown-topic
    TopicExistsError         409  topic-exists
    InvalidTopicError        400  invalid-topic-name
    InvalidPartitionsError   400  invalid-partitions
    PolicyViolationError     400  policy-violation
    OffsetOutOfRangeError    416  offset-out-of-range
    RecordTooLargeError      413  record-too-large
    InvalidRecordError       400  invalid-record
    StorageError             503  storage-error    (the disk failed: send the records again)
    malformed JSON body      400  malformed-body
    number out of range      400  out-of-range     (Kafka's INT32/INT64 ranges, see limits.py)
    body over the limit      413  body-too-large   (http.max_body_bytes, see limits.py)
    validation failure       422  invalid-request
    no or bad credentials    401  unauthorized     (security.auth = required; see auth.py)
    refused by the ACLs      403  forbidden
    anything else            500  internal-error (logged with the traceback)

Handlers raise ``ProblemError`` for their own cases (bad offset, a missing group).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from broker.errors import (
    BrokerError,
    InvalidPartitionsError,
    InvalidRecordError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    PolicyViolationError,
    RecordTooLargeError,
    StorageError,
    TopicExistsError,
    UnknownTopicError,
)

__all__ = ["PROBLEM_RESPONSES", "Problem", "ProblemError", "install_problem_handlers", "problem_response"]

log = logging.getLogger("sluice.http")

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:sluice:problem:"


class Problem(BaseModel):
    """An error, as RFC 9457 describes it."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None


class ProblemError(Exception):
    """Raised by route handlers; rendered as a problem document."""

    def __init__(self, status: int, slug: str, title: str, detail: str,
                 headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.headers = headers or []  # may repeat a name (two WWW-Authenticate challenges)


def _problem_doc(status: int, slug: str, title: str, detail: str, instance: str | None) -> dict[str, Any]:
    return {"type": TYPE_PREFIX + slug, "title": title, "status": status, "detail": detail, "instance": instance}


class ProblemJSONResponse(JSONResponse):
    """ASCII-escaped JSON: a detail that echoes input holding a lone surrogate (legal in JSON text, not in
    UTF-8) still renders, instead of failing while the error is being reported."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def problem_response(
    status: int, slug: str, title: str, detail: str, instance: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return ProblemJSONResponse(
        _problem_doc(status, slug, title, detail, instance),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


_PROBLEM_CONTENT = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": text, "content": _PROBLEM_CONTENT}
    for code, text in {
        400: "Bad request (invalid name, malformed body, number out of range)",
        401: "Authentication required (security.auth = required): Basic or Bearer credentials missing or wrong",
        403: "The ACLs do not allow this principal the operation",
        404: "Unknown topic, partition or group",
        409: "Conflict (topic exists)",
        413: "Record or request body too large",
        416: "Offset out of range",
        422: "Invalid request parameters",
        500: "Internal error",
        501: "Not supported by this Sluice",
        503: "Not ready, or a storage failure (send again)",
    }.items()
}

_DOMAIN: list[tuple[type[BrokerError], int, str, str]] = [
    (UnknownTopicError, 404, "unknown-topic", "Unknown topic or partition"),
    (TopicExistsError, 409, "topic-exists", "Topic already exists"),
    (InvalidTopicError, 400, "invalid-topic-name", "Invalid topic name"),
    (InvalidPartitionsError, 400, "invalid-partitions", "Invalid partition count"),
    (PolicyViolationError, 400, "policy-violation", "Refused by a broker limit"),
    (OffsetOutOfRangeError, 416, "offset-out-of-range", "Offset out of range"),
    (RecordTooLargeError, 413, "record-too-large", "Record too large"),
    (InvalidRecordError, 400, "invalid-record", "Invalid record"),
    (StorageError, 503, "storage-error", "Storage failure"),  # our side, not the request's: send it again
]


# A number outside the range its field allows (Kafka's INT32/INT64 ranges, declared on models and parameters).
_RANGE_ERRORS = frozenset(("greater_than", "greater_than_equal", "less_than", "less_than_equal"))


def _where(err: Any) -> str:
    return ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"


def _validation_detail(exc: RequestValidationError) -> tuple[str, str, str, int]:
    errors = exc.errors()
    for err in errors:
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            reason = ctx.get("error", "invalid JSON")
            return "malformed-body", "Malformed request body", f"the request body is not valid JSON: {reason}", 400
        if tuple(err.get("loc", ())) == ("body",) and err.get("type") in ("model_attributes_type", "dict_type"):
            return (
                "malformed-body",
                "Malformed request body",
                "the request body must be a JSON object; send it with Content-Type: application/json",
                400,
            )
    ranges = [err for err in errors if err.get("type") in _RANGE_ERRORS]
    if ranges:
        parts = [f"{_where(err)}: {err.get('msg', 'out of range')}, got {err.get('input')!r:.40}" for err in ranges[:5]]
        return "out-of-range", "Number out of range", "; ".join(parts), 400
    parts = []
    for err in errors[:5]:
        parts.append(f"{_where(err)}: {err.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid-request", "Invalid request", "; ".join(parts) + more, 422


def install_problem_handlers(app: FastAPI) -> None:
    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        response = problem_response(exc.status, exc.slug, exc.title, exc.detail, request.url.path)
        for name, value in exc.headers:
            response.headers.append(name, value)
        return response

    async def on_broker(request: Request, exc: Exception) -> JSONResponse:
        for cls, status, slug, title in _DOMAIN:
            if isinstance(exc, cls):
                if status >= 500:
                    log.error("storage failure in HTTP request", extra={"path": request.url.path, "error": str(exc)})
                return problem_response(status, slug, title, str(exc), request.url.path)
        log.error("broker error in HTTP request", extra={"path": request.url.path, "error": str(exc)})
        return problem_response(500, "broker-error", "Broker error", str(exc), request.url.path)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        slug, title, detail, status = _validation_detail(exc)
        return problem_response(status, slug, title, detail, request.url.path)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        slug = {404: "not-found", 405: "method-not-allowed", 413: "body-too-large"}.get(exc.status_code, "http-error")
        detail = str(exc.detail)
        title = "Request body too large" if exc.status_code == 413 else detail
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route for {request.method} {request.url.path}; the API is listed at /docs"
        elif exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}; see /docs for the methods it takes"
        return problem_response(exc.status_code, slug, title, detail, request.url.path, dict(exc.headers or {}))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in HTTP request", extra={"path": request.url.path})
        return problem_response(
            500, "internal-error", "Internal error", f"the server failed: {type(exc).__name__}: {exc}", request.url.path
        )

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(BrokerError, on_broker)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
