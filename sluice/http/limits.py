"""Request limits of the HTTP API: the body size cap and the numeric ranges of the Kafka wire protocol.

The body cap (``http.max_body_bytes``) is enforced while the body streams in, never after buffering it:

* a declared ``Content-Length`` above the cap is refused before a byte of the body is read (a client
  that sent ``Expect: 100-continue``, as curl does for large uploads, is never told to continue);
* a chunked body is counted as it arrives and refused as soon as it passes the cap.

Either way the answer is ``413`` ``application/problem+json`` (type ``...:body-too-large``). The request
is abandoned, so the server closes the connection after the answer (HTTP/1.1 cannot reuse it).

Numbers in requests are held to the ranges of the Kafka fields they end up in (``INT32``/``INT64``),
declared on the models and parameters with the constants below, so they appear in the OpenAPI schema;
a number outside its range is ``400`` problem+json (``...:out-of-range``), see ``problems.py``.
"""

from __future__ import annotations

import logging

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.http.problems import problem_response

__all__ = ["INT32_MAX", "INT64_MAX", "BodyLimitMiddleware", "BodyTooLarge"]

log = logging.getLogger("sluice.http")

INT32_MAX = 2**31 - 1  # partitions, partition counts, waits in ms (Kafka INT32 fields)
INT64_MAX = 2**63 - 1  # offsets and timestamps (Kafka INT64 fields)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` while a body streams in: FastAPI passes HTTPExceptions from body reading
    through unchanged, and ``problems.py`` renders this one as 413 ``body-too-large``."""

    def __init__(self, limit: int, seen: int, declared: bool) -> None:
        how = "declares" if declared else "is at least"
        super().__init__(
            413, f"the request body {how} {seen} bytes; the limit is {limit} bytes (setting http.max_body_bytes)"
        )


class BodyLimitMiddleware:
    """Pure ASGI (it must see the body as it streams, which ``BaseHTTPMiddleware`` would buffer)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("http.max_body_bytes must be positive")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            # Refused before a byte of the body is read; a client waiting for "100 Continue" sends none.
            log.info("request body too large", extra={"path": scope.get("path"), "bytes": declared})
            await _problem(BodyTooLarge(limit, declared, declared=True), scope["path"])(scope, receive, send)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    log.info("request body too large", extra={"path": scope.get("path"), "bytes": received})
                    if started:  # a streaming answer (SSE) reads only to notice the client leaving
                        return {"type": "http.disconnect"}
                    raise BodyTooLarge(limit, received, declared=False)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counted, watched)


def _problem(exc: BodyTooLarge, path: str) -> ASGIApp:
    return problem_response(413, "body-too-large", "Request body too large", str(exc.detail), path)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
