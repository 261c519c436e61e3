"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31): the ACL store over the Kafka protocol, so AdminClient
``describe_acls`` / ``create_acls`` / ``delete_acls`` manage the same bindings as ``sluice acl``.

Rules (Kafka's ``AclApis`` and ``AclControlManager``):
- Without an authorizer (``security.auth = off``) each answers SECURITY_DISABLED (top level, per creation,
  per filter), as a Kafka broker without ``authorizer.class.name`` does.
- DescribeAcls needs DESCRIBE on the cluster, CreateAcls and DeleteAcls ALTER on the cluster; refused,
  CLUSTER_AUTHORIZATION_FAILED (top level, or per creation/filter).
- A creation Kafka would refuse (resource type or pattern any/unknown/match, operation any, permission
  any, empty name, a principal not ``Type:name``, the cluster not named ``kafka-cluster``) is answered
  INVALID_REQUEST with the reason and not stored; the valid ones of the same request are stored together.
  Creating a binding that exists already succeeds and changes nothing.
- Describe answers the bindings its filter matches grouped by resource pattern; DeleteAcls removes, per
  filter, every binding it matches and lists them. A filter with an unknown value is INVALID_REQUEST.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from broker.protocol.kafka_codes import ErrorCode
from broker.security import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    SecurityError,
)
from broker.server.authz import allowed
from broker.server.handlers_common import BrokerContext, ConnectionInfo

__all__ = ["handle_create_acls", "handle_delete_acls", "handle_describe_acls"]

log = logging.getLogger("broker.server.kafka")

_DISABLED = "No Authorizer is configured (security.auth = off); sluice acl --data-dir edits the ACLs offline"
_DENIED = "Cluster authorization failed."


def _enum(kind: type[Any], value: Any) -> Any:
    try:
        return kind(int(value))
    except ValueError:
        return kind.UNKNOWN


def _filter(f: Any) -> AclFilter:
    return AclFilter(_enum(ResourceType, f.resource_type_filter), f.resource_name_filter,
                     _enum(PatternType, f.pattern_type_filter), f.principal_filter, f.host_filter,
                     _enum(Operation, f.operation), _enum(Permission, f.permission_type))


def _binding_fields(b: AclBinding) -> dict[str, Any]:
    return {"resource_type": int(b.resource_type), "resource_name": b.resource_name,
            "pattern_type": int(b.pattern_type), "principal": b.principal, "host": b.host,
            "operation": int(b.operation), "permission_type": int(b.permission)}


async def handle_describe_acls(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    def answer(code: int, message: str | None, resources: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": code, "error_message": message, "resources": resources or []}

    if ctx.authorizer is None:
        return answer(ErrorCode.SECURITY_DISABLED, _DISABLED)
    if not allowed(ctx, conn, Operation.DESCRIBE, ResourceType.CLUSTER):
        return answer(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, _DENIED)
    acl_filter = _filter(body)
    problem = acl_filter.invalid_reason()
    if problem:
        return answer(ErrorCode.INVALID_REQUEST, problem)
    try:
        found = ctx.authorizer.acls.describe(acl_filter)
    except SecurityError as exc:
        return answer(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))
    grouped: dict[tuple[int, str, int], list[dict[str, Any]]] = defaultdict(list)
    for b in found:
        grouped[(int(b.resource_type), b.resource_name, int(b.pattern_type))].append(
            {"principal": b.principal, "host": b.host, "operation": int(b.operation),
             "permission_type": int(b.permission)})
    resources = [{"resource_type": rt, "resource_name": name, "pattern_type": pt, "acls": acls}
                 for (rt, name, pt), acls in grouped.items()]
    return answer(ErrorCode.NONE, None, resources)


def _creation(c: Any) -> AclBinding:
    return AclBinding(_enum(ResourceType, c.resource_type), str(c.resource_name),
                      _enum(PatternType, c.resource_pattern_type), str(c.principal), str(c.host),
                      _enum(Operation, c.operation), _enum(Permission, c.permission_type))


async def handle_create_acls(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    creations = list(body.creations or ())
    if ctx.authorizer is None or not allowed(ctx, conn, Operation.ALTER, ResourceType.CLUSTER):
        code, message = ((ErrorCode.SECURITY_DISABLED, _DISABLED) if ctx.authorizer is None
                         else (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, _DENIED))
        return {"throttle_time": 0, "results": [{"error_code": code, "error_message": message} for _ in creations]}
    results: list[dict[str, Any]] = []
    valid: list[AclBinding] = []
    for creation in creations:
        try:
            valid.append(_creation(creation))
            results.append({"error_code": ErrorCode.NONE, "error_message": None})
        except ValueError as exc:
            results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(exc)})
    if valid:
        try:
            ctx.authorizer.acls.add(valid)
        except SecurityError as exc:
            log.error(f"CreateAcls: {exc}", extra={"peer": conn.peer_host})
            results = [r if r["error_code"] else {"error_code": ErrorCode.UNKNOWN_SERVER_ERROR,
                                                  "error_message": str(exc)} for r in results]
        else:
            log.info(f"ACLs created by {conn.principal}: " + "; ".join(str(b) for b in valid),
                     extra={"peer": conn.peer_host})
    return {"throttle_time": 0, "results": results}


async def handle_delete_acls(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    filters = list(body.filters or ())

    def failed(code: int, message: str) -> dict[str, Any]:
        return {"error_code": code, "error_message": message, "matching_acls": []}

    if ctx.authorizer is None or not allowed(ctx, conn, Operation.ALTER, ResourceType.CLUSTER):
        code, message = ((ErrorCode.SECURITY_DISABLED, _DISABLED) if ctx.authorizer is None
                         else (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, _DENIED))
        return {"throttle_time": 0, "filter_results": [failed(code, message) for _ in filters]}
    parsed = [_filter(f) for f in filters]
    usable = [f for f in parsed if f.invalid_reason() is None]
    try:
        removed = iter(ctx.authorizer.acls.delete(usable))
    except SecurityError as exc:
        log.error(f"DeleteAcls: {exc}", extra={"peer": conn.peer_host})
        return {"throttle_time": 0, "filter_results": [failed(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))
                                                       for _ in filters]}
    results = []
    for acl_filter in parsed:
        problem = acl_filter.invalid_reason()
        if problem:
            results.append(failed(ErrorCode.INVALID_REQUEST, problem))
            continue
        gone = next(removed)
        if gone:
            log.info(f"ACLs deleted by {conn.principal}: " + "; ".join(str(b) for b in gone),
                     extra={"peer": conn.peer_host})
        results.append({"error_code": ErrorCode.NONE, "error_message": None, "matching_acls": [
            {"error_code": ErrorCode.NONE, "error_message": None, **_binding_fields(b)} for b in gone]})
    return {"throttle_time": 0, "filter_results": results}
