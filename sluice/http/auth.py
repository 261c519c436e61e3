"""Who calls the HTTP API, and whether the ACLs let them: one dependency per route.

With ``security.auth = "required"``:
- ``Authorization: Basic`` (a user of the user store; its SCRAM credential verifies the password) or
  ``Authorization: Bearer <token>`` (``sluice tokens create``) names the principal. Without either, or
  with one that does not verify, the answer is 401 problem+json (``unauthorized``) with
  ``WWW-Authenticate: Basic realm="sluice"`` and ``Bearer realm="sluice"`` (RFC 9110 §11.6.1, RFC 6750);
  the failure is counted and logged (rate-limited) as front door "http".
- A route then asks the authorizer for its operation and resource (``allow(...)``); a refusal is 403
  problem+json (``forbidden``), counted in ``sluice_authorization_denied_total{front_door="http"}``.
- Open without credentials: ``/health`` and ``/ready`` (probes of orchestrators and load balancers, as
  Kafka and Redpanda keep health checks open), the OpenAPI document, ``/docs`` and the console's static
  files. ``/metrics`` needs describe on the cluster unless ``security.open_metrics = true`` (for scrapers
  that cannot send a Basic password or a bearer token).
- The console (``/console``, an operator's view of everything) needs describe on the cluster, and on a
  topic's pages describe on the topic, read for its messages and tail. A browser asks for the Basic
  password itself on the 401.

With ``"off"`` every caller is ``User:ANONYMOUS`` and nothing is checked (a Kafka broker without an
authorizer allows everything too).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request

from broker.security import ANONYMOUS, CLUSTER_NAME, Operation, Principal, ResourceType
from sluice.http.context import ApiContext
from sluice.http.problems import ProblemError

__all__ = ["Caller", "allow", "authorize", "caller", "console_access", "may", "metrics_access"]

_DOOR = "http"
_CHALLENGES = [("WWW-Authenticate", 'Basic realm="sluice", charset="UTF-8"'),
               ("WWW-Authenticate", 'Bearer realm="sluice"')]


def _peer(request: Request) -> str:
    return request.client.host if request.client is not None else "?"


def _unauthorized(ctx: ApiContext, request: Request, user: str | None, reason: str, bearer_error: bool) -> ProblemError:
    assert ctx.authenticator is not None
    ctx.authenticator.failed(_DOOR, _peer(request), user, reason)
    challenges = list(_CHALLENGES)
    if bearer_error:  # RFC 6750 §3.1: say that the token itself was refused
        challenges[1] = ("WWW-Authenticate", 'Bearer realm="sluice", error="invalid_token"')
    detail = (f"{reason}: send Authorization: Basic (a user of `sluice users`) or Authorization: Bearer "
              f"(a token of `sluice tokens create`)")
    return ProblemError(401, "unauthorized", "Authentication required", detail, headers=challenges)


async def caller(request: Request) -> Principal:
    """The principal of the request: ANONYMOUS with auth off; 401 when credentials are missing or wrong."""
    ctx: ApiContext = request.app.state.ctx
    auth = ctx.authenticator
    if auth is None:
        return ANONYMOUS
    header = request.headers.get("authorization")
    if not header:
        raise _unauthorized(ctx, request, None, "no credentials", False)
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "basic":
        try:
            user, sep, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise _unauthorized(ctx, request, None, "malformed Basic credentials", False) from None
        principal = auth.check_password(user, password) if sep and user else None
        if principal is None:
            raise _unauthorized(ctx, request, user or None, "bad user name or password", False)
    elif scheme.lower() == "bearer":
        principal = auth.check_token(value)
        if principal is None:
            raise _unauthorized(ctx, request, None, "unknown or revoked token", True)
    else:
        raise _unauthorized(ctx, request, None, f"unsupported authorization scheme {scheme!r}", False)
    auth.succeeded(_DOOR)
    return principal


Caller = Annotated[Principal, Depends(caller)]


def may(ctx: ApiContext, request: Request, principal: Principal, operation: Operation,
        resource_type: ResourceType, name: str = CLUSTER_NAME) -> bool:
    """Whether the ACLs allow it (no audit: for filtering listings). Always true with auth off."""
    authorizer = ctx.authorizer
    return authorizer is None or authorizer.allowed(principal, _peer(request), operation, resource_type, name)


def authorize(ctx: ApiContext, request: Request, principal: Principal, operation: Operation,
              resource_type: ResourceType, name: str = CLUSTER_NAME) -> None:
    """403 problem+json unless the ACLs allow ``operation`` on the resource (the refusal audited)."""
    authorizer = ctx.authorizer
    if authorizer is None or authorizer.check(_DOOR, principal, _peer(request), operation, resource_type, name):
        return
    what = "the cluster" if resource_type == ResourceType.CLUSTER else f"{resource_type.label} {name!r}"
    raise ProblemError(403, "forbidden", "Forbidden",
                       f"{principal} may not {operation.label} {what} (see `sluice acl list`)")


def allow(operation: Operation, resource_type: ResourceType,
          param: str | None = None) -> Callable[[Request, Principal], Coroutine[Any, Any, Principal]]:
    """A route dependency: the caller must be allowed ``operation`` on the resource named by path parameter
    ``param`` (the cluster when None); it yields the principal."""

    async def check(request: Request, principal: Caller) -> Principal:
        name = CLUSTER_NAME if param is None else str(request.path_params[param])
        authorize(request.app.state.ctx, request, principal, operation, resource_type, name)
        return principal

    return check


async def metrics_access(request: Request) -> None:
    """``/metrics``: open with ``security.open_metrics``; otherwise describe on the cluster."""
    ctx: ApiContext = request.app.state.ctx
    if ctx.authenticator is None or ctx.runtime.settings.security.open_metrics:
        return
    authorize(ctx, request, await caller(request), Operation.DESCRIBE, ResourceType.CLUSTER)


async def console_access(request: Request) -> None:
    """``/console``: describe on the cluster; on a topic's pages describe it, or read it (messages, tail)."""
    ctx: ApiContext = request.app.state.ctx
    if ctx.authenticator is None:
        return
    principal = await caller(request)
    authorize(ctx, request, principal, Operation.DESCRIBE, ResourceType.CLUSTER)
    topic = request.path_params.get("topic")
    if topic is not None:
        reads = request.url.path.rstrip("/").endswith(("/messages", "/tail"))
        authorize(ctx, request, principal, Operation.READ if reads else Operation.DESCRIBE, ResourceType.TOPIC,
                  str(topic))
