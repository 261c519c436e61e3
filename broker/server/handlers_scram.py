"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51): the user store over the Kafka protocol
(KIP-554), so AdminClient ``describe_user_scram_credentials`` / ``alter_user_scram_credentials`` manage the
same users as ``sluice users``.

Rules (Kafka's ``ScramImage.describe`` and ``ScramControlManager.alterCredentials``, in their order):
- Describe needs DESCRIBE on the cluster, Alter needs ALTER on the cluster (``may_on_cluster``); refused,
  Describe answers CLUSTER_AUTHORIZATION_FAILED at the top level and per user, Alter per user.
- Describe with no (or an empty) user list describes every user; a user named twice is answered
  DUPLICATE_RESOURCE, one without credentials RESOURCE_NOT_FOUND; each credential shows its mechanism
  (1 = SCRAM-SHA-256, 2 = SCRAM-SHA-512) and iteration count, never a salt or key.
- Alter: a user named in two items of one request (deletions and upsertions together) is answered
  DUPLICATE_RESOURCE and none of its items applies; an empty name is UNACCEPTABLE_CREDENTIAL (as is a
  name the store refuses: control characters, longer than 256); an unknown mechanism
  UNSUPPORTED_SASL_MECHANISM; an upsertion with fewer than 4096 or more than 16384 iterations
  UNACCEPTABLE_CREDENTIAL; deleting a credential that does not exist RESOURCE_NOT_FOUND. Upsertions carry
  the salt and the salted password (``Hi(password, salt, i)``), from which StoredKey and ServerKey are
  derived; the password never reaches the broker. Every accepted change is written in one atomic
  replacement of the store file. Results: deletions, then upsertions, then errors (Kafka's order).
- Without a user store (a bare listener in tests) every user is answered UNSUPPORTED_VERSION, as Kafka does
  when its metadata version has no SCRAM.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.protocol.kafka_codes import ErrorCode
from broker.security import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    SCRAM_MECHANISMS,
    CredentialChange,
    InvalidUserError,
    ScramCredential,
    UserStoreError,
    check_name,
)
from broker.server.handlers_common import BrokerContext, ConnectionInfo

__all__ = ["MECHANISM_TYPES", "handle_alter_user_scram_credentials", "handle_describe_user_scram_credentials",
           "may_on_cluster"]

log = logging.getLogger("broker.server.kafka")

MECHANISM_TYPES = {1: SCRAM_MECHANISMS[0], 2: SCRAM_MECHANISMS[1]}  # Kafka's ScramMechanism.type()
_TYPE_OF = {name: kind for kind, name in MECHANISM_TYPES.items()}
_DUPLICATE_ALTER = "A user credential cannot be altered twice in the same request"
_DUPLICATE_DESCRIBE = "Cannot describe SCRAM credentials for the same user twice in a single request: "
_NOT_FOUND_DESCRIBE = "Attempt to describe a user credential that does not exist: "
_NO_STORE = "This broker keeps no SCRAM credentials"
_CLUSTER_DENIED = "Cluster authorization failed."  # Kafka's ClusterAuthorizationException message


def may_on_cluster(ctx: BrokerContext, conn: ConnectionInfo, operation: str) -> bool:
    """Whether ``conn``'s principal may perform ``operation`` ("describe", "alter") on the cluster: the
    authorizer's answer (ACLs, super users) when logins are required; without authentication everyone may
    (every listener is then bound to loopback, or allow_insecure was set)."""
    return ctx.cluster_access is None or ctx.cluster_access(conn, operation)


async def handle_describe_user_scram_credentials(ctx: BrokerContext, body: Any,
                                                 conn: ConnectionInfo) -> dict[str, Any]:
    requested = [str(user.name) for user in body.users or ()]
    if not may_on_cluster(ctx, conn, "describe"):  # Kafka's getErrorResponse: its message at the top and per user
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return {"throttle_time": 0, "error_code": code, "error_message": _CLUSTER_DENIED,
                "results": [_describe_result(name, code, _CLUSTER_DENIED) for name in dict.fromkeys(requested)]}
    store = ctx.users
    if store is None:
        return {"throttle_time": 0, "error_code": ErrorCode.NONE, "error_message": None,
                "results": [_describe_result(n, ErrorCode.UNSUPPORTED_VERSION, _NO_STORE)
                            for n in dict.fromkeys(requested)]}
    try:
        names = requested or store.names()
        results = []
        for name in dict.fromkeys(names):
            if requested.count(name) > 1:
                results.append(_describe_result(name, ErrorCode.DUPLICATE_RESOURCE, _DUPLICATE_DESCRIBE + name))
                continue
            credentials = store.credentials(name)
            if not credentials:
                results.append(_describe_result(name, ErrorCode.RESOURCE_NOT_FOUND, _NOT_FOUND_DESCRIBE + name))
                continue
            infos = [{"mechanism": _TYPE_OF[mechanism], "iterations": credentials[mechanism].iterations}
                     for mechanism in SCRAM_MECHANISMS if mechanism in credentials]
            results.append({**_describe_result(name, ErrorCode.NONE), "credential_infos": infos})
    except UserStoreError as exc:
        log.error(f"DescribeUserScramCredentials failed: {exc}", extra={"peer": conn.peer_host})
        return {"throttle_time": 0, "error_code": ErrorCode.UNKNOWN_SERVER_ERROR, "error_message": str(exc),
                "results": []}
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "error_message": None, "results": results}


def _describe_result(name: str, code: int, message: str | None = None) -> dict[str, Any]:
    return {"user": name, "error_code": code, "error_message": message, "credential_infos": []}


def _check_user(name: str, mechanism_type: int) -> tuple[int, str] | None:
    """Kafka's validateScramUsernameAndMechanism (the store's name rules on top)."""
    if not name:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    try:
        check_name(name)
    except InvalidUserError as exc:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, str(exc)
    if mechanism_type not in MECHANISM_TYPES:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    return None


async def handle_alter_user_scram_credentials(ctx: BrokerContext, body: Any,
                                              conn: ConnectionInfo) -> dict[str, Any]:
    deletions, upsertions = tuple(body.deletions), tuple(body.upsertions)
    if not may_on_cluster(ctx, conn, "alter"):
        names = dict.fromkeys(str(item.name) for item in (*deletions, *upsertions))
        return {"throttle_time": 0, "results": [
            {"user": name, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "error_message": _CLUSTER_DENIED}
            for name in names]}
    errors: dict[str, tuple[int, str]] = {}
    accepted: dict[str, CredentialChange] = {}
    deleted: list[str] = []
    for item in deletions:
        name = str(item.name)
        if name in errors:
            continue
        if accepted.pop(name, None) is not None:
            errors[name] = (ErrorCode.DUPLICATE_RESOURCE, _DUPLICATE_ALTER)
            continue
        problem = _check_user(name, int(item.mechanism))
        if problem is not None:
            errors[name] = problem
            continue
        accepted[name] = CredentialChange(name, MECHANISM_TYPES[int(item.mechanism)])
        deleted.append(name)
    for item in upsertions:
        name = str(item.name)
        if name in errors:
            continue
        if accepted.pop(name, None) is not None:
            errors[name] = (ErrorCode.DUPLICATE_RESOURCE, _DUPLICATE_ALTER)
            continue
        problem = _check_user(name, int(item.mechanism))
        iterations = int(item.iterations)
        if problem is None and iterations < DEFAULT_ITERATIONS:
            problem = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
        elif problem is None and iterations > MAX_ITERATIONS:
            problem = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations")
        if problem is not None:
            errors[name] = problem
            continue
        mechanism = MECHANISM_TYPES[int(item.mechanism)]
        accepted[name] = CredentialChange(name, mechanism, ScramCredential.from_salted_password(
            mechanism, bytes(item.salt), bytes(item.salted_password), iterations))
    store = ctx.users
    if store is None:
        errors.update({name: (ErrorCode.UNSUPPORTED_VERSION, _NO_STORE) for name in accepted})
        accepted.clear()
    elif accepted:
        try:
            missing = store.alter(list(accepted.values()))
        except UserStoreError as exc:
            log.error(f"AlterUserScramCredentials failed: {exc}", extra={"peer": conn.peer_host})
            missing = {}
            errors.update({name: (ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)) for name in accepted})
            accepted.clear()
        for name, why in missing.items():
            errors[name] = (ErrorCode.RESOURCE_NOT_FOUND, why)
            accepted.pop(name)
        if accepted:
            log.info(f"SCRAM credentials changed by {conn.principal}: {sorted(accepted)}",
                     extra={"peer": conn.peer_host})
    ok = [name for name in deleted if name in accepted and accepted[name].credential is None]
    ok += [name for name, change in accepted.items() if change.credential is not None]
    results: list[dict[str, Any]] = [{"user": name, "error_code": ErrorCode.NONE, "error_message": None}
                                     for name in ok]
    results += [{"user": name, "error_code": code, "error_message": message}
                for name, (code, message) in errors.items()]
    return {"throttle_time": 0, "results": results}
