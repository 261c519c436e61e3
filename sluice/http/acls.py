"""``/acls``: list, add and delete ACL bindings (``broker.security.acl``), as Kafka's DescribeAcls, CreateAcls
and DeleteAcls do over the Kafka protocol: listing needs describe on the cluster, changes need alter on it.

With ``security.auth = off`` there is no authorizer and every route answers 409 ``security-disabled`` (Kafka:
SECURITY_DISABLED); ``sluice acl ... --data-dir`` edits the store offline.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from broker.security import (
    AclBinding,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    normalize_principal,
)
from sluice.http.auth import Caller, allow
from sluice.http.context import ApiContext, Ctx
from sluice.http.problems import PROBLEM_RESPONSES, ProblemError

__all__ = ["AclIn", "router"]

log = logging.getLogger("sluice.http")

router = APIRouter(prefix="/acls", tags=["security"], responses={k: PROBLEM_RESPONSES[k] for k in (409, 500)})


class AclIn(BaseModel):
    """One binding; names as in ``sluice acl`` (lower case: ``topic``, ``prefixed``, ``describe_configs``)."""

    resource_type: str = Field(description="topic, group, cluster or transactional_id")
    resource_name: str = Field(description="the name, or its prefix; `*` for all; the cluster is kafka-cluster")
    pattern_type: str = "literal"
    principal: str = Field(description="User:alice (or just alice), User:* for everyone")
    host: str = "*"
    operation: str = Field(description="read, write, create, delete, alter, describe, describe_configs, "
                                       "alter_configs, idempotent_write or all")
    permission: str = "allow"

    def binding(self) -> AclBinding:
        return AclBinding(ResourceType.parse(self.resource_type), self.resource_name,
                          PatternType.parse(self.pattern_type), normalize_principal(self.principal), self.host,
                          Operation.parse(self.operation), Permission.parse(self.permission))


class AclsIn(BaseModel):
    acls: list[AclIn]


def _authorizer(ctx: ApiContext) -> Authorizer:
    if ctx.authorizer is None:
        raise ProblemError(409, "security-disabled", "ACLs are not enforced",
                           "security.auth is off, so this broker has no authorizer (Kafka answers SECURITY_DISABLED);"
                           " edit the ACLs offline with `sluice acl ... --data-dir`")
    return ctx.authorizer


def _filter(resource_type: str | None, resource_name: str | None, pattern_type: str | None, principal: str | None,
            host: str | None, operation: str | None, permission: str | None) -> AclFilter:
    try:
        return AclFilter(ResourceType.parse(resource_type or "any"), resource_name,
                         PatternType.parse(pattern_type or ("match" if resource_name else "any")),
                         normalize_principal(principal) if principal else None, host,
                         Operation.parse(operation or "any"), Permission.parse(permission or "any"))
    except ValueError as exc:
        raise ProblemError(400, "invalid-acl-filter", "Invalid ACL filter", str(exc)) from None


class FilterParams:
    """Query parameters naming bindings; absent ones match every value (``match``: a resource name also
    matches the prefixed and ``*`` bindings that apply to it)."""

    def __init__(self, resource_type: str | None = None, resource_name: str | None = None,
                 pattern_type: str | None = None, principal: str | None = None, host: str | None = None,
                 operation: str | None = None, permission: str | None = None) -> None:
        self.given = any(v is not None for v in (resource_type, resource_name, pattern_type, principal, host,
                                                 operation, permission))
        self.filter = _filter(resource_type, resource_name, pattern_type, principal, host, operation, permission)


Filter = Annotated[FilterParams, Depends()]


@router.get("", response_model=list[AclIn], summary="List ACL bindings (describe on the cluster)",
            dependencies=[Depends(allow(Operation.DESCRIBE, ResourceType.CLUSTER))])
async def list_acls(ctx: Ctx, params: Filter) -> list[AclIn]:
    return [AclIn(**b.to_json()) for b in _authorizer(ctx).acls.describe(params.filter)]


@router.post("", status_code=201, summary="Add ACL bindings (alter on the cluster); existing ones are kept",
             responses={400: PROBLEM_RESPONSES[400]},
             dependencies=[Depends(allow(Operation.ALTER, ResourceType.CLUSTER))])
async def add_acls(body: AclsIn, ctx: Ctx, request: Request, who: Caller) -> dict[str, object]:
    authz = _authorizer(ctx)
    try:
        bindings = [item.binding() for item in body.acls]
    except ValueError as exc:
        raise ProblemError(400, "invalid-acl", "Invalid ACL", str(exc)) from None
    created = authz.acls.add(bindings)
    log.info(f"ACLs added by {who} over HTTP: " + "; ".join(str(b) for b in bindings),
             extra={"peer": request.client.host if request.client else "?"})
    return {"created": created, "acls": [b.to_json() for b in bindings]}


@router.delete("", summary="Delete the ACL bindings a filter names (alter on the cluster)",
               responses={400: PROBLEM_RESPONSES[400]},
               dependencies=[Depends(allow(Operation.ALTER, ResourceType.CLUSTER))])
async def delete_acls(ctx: Ctx, params: Filter, request: Request, who: Caller,
                      all: bool = Query(False, description="Needed to delete with an empty filter (every ACL).")
                      ) -> dict[str, object]:
    authz = _authorizer(ctx)
    if not params.given and not all:
        raise ProblemError(400, "empty-acl-filter", "Empty ACL filter",
                           "name what to delete (resource_type, resource_name, principal, ...) or pass all=true")
    gone = authz.acls.delete([params.filter])[0]
    if gone:
        log.info(f"ACLs deleted by {who} over HTTP: " + "; ".join(str(b) for b in gone),
                 extra={"peer": request.client.host if request.client else "?"})
    return {"deleted": [b.to_json() for b in gone]}
