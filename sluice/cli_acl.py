"""``sluice acl add|list|delete`` — the ACLs every front door enforces with ``security.auth = required``.

With ``--data-dir`` the commands edit ``<data_dir>/security/acls.json`` offline (how the first ACLs are made;
a running broker reading that directory sees the change at its next check). Without it they go through the
HTTP API of a running broker (``--http``, env SLUICE_HTTP) with the caller's credentials (SLUICE_TOKEN, or
SLUICE_USER and SLUICE_PASSWORD), which need alter (add, delete) or describe (list) on the cluster.

Bindings are named as with Kafka's ``kafka-acls``: a principal (``User:alice`` or ``alice``), operations,
resources (``--topic``, ``--group``, ``--transactional-id``, ``--cluster``; ``--prefixed`` makes the names
prefixes, ``*`` names every resource of its type), ``--deny`` (default allow) and ``--host`` (default ``*``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.security import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    AclStore,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    SecurityError,
    normalize_principal,
)
from sluice.cli_common import DEFAULT_HTTP, EXIT_RUNTIME, EXIT_USAGE, HttpUrl, JsonFlag, console, fail, http_request
from sluice.cli_common import print_json as _print_json

__all__ = ["register"]

acl_app = typer.Typer(no_args_is_help=True, help="Add, list and delete ACLs (offline with --data-dir, else over HTTP).")

DataDir = Annotated[Path | None, typer.Option("--data-dir", help="Edit this data directory's ACLs offline.")]
Principal = Annotated[str | None, typer.Option("--principal", "-p", help="User:alice (or alice); User:* is everyone.")]
Ops = Annotated[list[str] | None, typer.Option("--operation", "-o", help=(
    "read, write, create, delete, alter, describe, describe_configs, alter_configs, idempotent_write, all "
    "(repeatable)."))]
Topics = Annotated[list[str] | None, typer.Option("--topic", help="A topic (repeatable; * for all).")]
Groups = Annotated[list[str] | None, typer.Option("--group", help="A consumer group (repeatable; * for all).")]
TxnIds = Annotated[list[str] | None, typer.Option("--transactional-id", help="A transactional id (repeatable).")]
Cluster = Annotated[bool, typer.Option("--cluster", help="The cluster resource (kafka-cluster).")]
Prefixed = Annotated[bool, typer.Option("--prefixed", help="The resource names are prefixes.")]
Deny = Annotated[bool, typer.Option("--deny", help="A DENY binding (default: ALLOW). Deny wins.")]
Host = Annotated[str, typer.Option("--host", help="Client address the binding applies to (* for any).")]


def _resources(topics: list[str] | None, groups: list[str] | None, txn_ids: list[str] | None,
               cluster: bool) -> list[tuple[ResourceType, str]]:
    out = [(ResourceType.TOPIC, t) for t in topics or ()]
    out += [(ResourceType.GROUP, g) for g in groups or ()]
    out += [(ResourceType.TRANSACTIONAL_ID, t) for t in txn_ids or ()]
    if cluster:
        out.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return out


def _parsed(kind: Any, text: str) -> Any:
    try:
        return kind.parse(text)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)


def _principal(text: str) -> str:
    try:
        return normalize_principal(text)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)


def _show(bindings: list[dict[str, str]], json_out: bool) -> None:
    if json_out:
        _print_json({"acls": bindings})
        return
    if not bindings:
        console.print("no ACLs")
    for b in bindings:
        console.print(f"{b['permission']:<5} {b['principal']:<24} {b['operation']:<16} {b['resource_type']} "
                      f"{b['pattern_type']} {b['resource_name']!r} from {b['host']}", markup=False)


def _offline(data_dir: Path, action: Any) -> Any:
    try:
        return action(AclStore(data_dir))
    except SecurityError as exc:
        fail(str(exc), EXIT_RUNTIME)


def _http(method: str, base: str, params: dict[str, Any] | None = None, body: Any = None) -> Any:
    resp = asyncio.run(http_request(method, base, "/acls", params=params, json_body=body))
    if resp.status_code >= 400:
        detail = resp.json().get("detail", resp.text) if resp.content else resp.reason_phrase
        fail(f"the HTTP API answered {resp.status_code}: {detail}", EXIT_RUNTIME)
    return resp.json()


@acl_app.command("add")
def add(principal: Principal = None, operation: Ops = None, topic: Topics = None, group: Groups = None,
        transactional_id: TxnIds = None, cluster: Cluster = False, prefixed: Prefixed = False, deny: Deny = False,
        host: Host = "*", data_dir: DataDir = None, http: HttpUrl = DEFAULT_HTTP, json_out: JsonFlag = False) -> None:
    """Add bindings: PRINCIPAL may (or, with --deny, may not) do each OPERATION on each resource."""
    if principal is None or not operation:
        fail("add needs --principal and at least one --operation", EXIT_USAGE)
    resources = _resources(topic, group, transactional_id, cluster)
    if not resources:
        fail("name at least one resource: --topic, --group, --transactional-id or --cluster", EXIT_USAGE)
    pattern = PatternType.PREFIXED if prefixed else PatternType.LITERAL
    permission = Permission.DENY if deny else Permission.ALLOW
    try:
        bindings = [AclBinding(rtype, name, pattern, _principal(principal), host, _parsed(Operation, op), permission)
                    for rtype, name in resources for op in operation]
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    if data_dir is not None:
        created = _offline(data_dir, lambda store: store.add(bindings))
    else:
        created = _http("POST", http, body={"acls": [b.to_json() for b in bindings]})["created"]
    if json_out:
        _print_json({"created": created, "acls": [b.to_json() for b in bindings]})
    else:
        console.print(f"added {created} ACL(s) ({len(bindings) - created} existed already)")


def _filter_for(principal: str | None, operation: list[str] | None, resources: list[tuple[ResourceType, str]],
                pattern: PatternType, permission: Permission) -> list[AclFilter]:
    who = _principal(principal) if principal else None
    ops = [_parsed(Operation, op) for op in operation] if operation else [Operation.ANY]
    named: list[tuple[ResourceType, str | None]] = list(resources) or [(ResourceType.ANY, None)]
    return [AclFilter(rtype, name, pattern if name is not None else PatternType.ANY, who, None, op, permission)
            for rtype, name in named for op in ops]


@acl_app.command("list")
def list_acls(principal: Principal = None, topic: Topics = None, group: Groups = None,
              transactional_id: TxnIds = None, cluster: Cluster = False, data_dir: DataDir = None,
              http: HttpUrl = DEFAULT_HTTP, json_out: JsonFlag = False) -> None:
    """List bindings; with a resource, every binding that applies to it (literal, prefixed and *)."""
    filters = _filter_for(principal, None, _resources(topic, group, transactional_id, cluster), PatternType.MATCH,
                          Permission.ANY)
    found: dict[str, dict[str, str]] = {}
    for acl_filter in filters:
        if data_dir is not None:
            rows = [b.to_json() for b in _offline(data_dir, lambda store, f=acl_filter: store.describe(f))]
        else:
            params = {k: v for k, v in {
                "resource_type": acl_filter.resource_type.label if acl_filter.resource_name else None,
                "resource_name": acl_filter.resource_name, "principal": acl_filter.principal}.items() if v}
            rows = _http("GET", http, params=params)
        for row in rows:
            found["|".join(row.values())] = row
    _show(sorted(found.values(), key=lambda r: (r["resource_type"], r["resource_name"], r["principal"])), json_out)


@acl_app.command("delete")
def delete(principal: Principal = None, operation: Ops = None, topic: Topics = None, group: Groups = None,
           transactional_id: TxnIds = None, cluster: Cluster = False, prefixed: Prefixed = False,
           deny: Annotated[bool, typer.Option("--deny", help="Only DENY bindings.")] = False,
           allow_only: Annotated[bool, typer.Option("--allow", help="Only ALLOW bindings.")] = False,
           data_dir: DataDir = None, http: HttpUrl = DEFAULT_HTTP, json_out: JsonFlag = False) -> None:
    """Delete the bindings named (a resource exactly as added, and/or a principal; operations narrow it)."""
    resources = _resources(topic, group, transactional_id, cluster)
    if not resources and principal is None:
        fail("name what to delete: a resource (--topic, --group, --transactional-id, --cluster) or --principal",
             EXIT_USAGE)
    permission = Permission.DENY if deny else Permission.ALLOW if allow_only else Permission.ANY
    pattern = PatternType.PREFIXED if prefixed else PatternType.LITERAL
    filters = _filter_for(principal, operation, resources, pattern, permission)
    gone: list[dict[str, str]] = []
    for acl_filter in filters:
        if data_dir is not None:
            gone += [b.to_json() for b in _offline(data_dir, lambda store, f=acl_filter: store.delete([f])[0])]
        else:
            params = {k: v for k, v in {
                "resource_type": acl_filter.resource_type.label if acl_filter.resource_name else None,
                "resource_name": acl_filter.resource_name,
                "pattern_type": acl_filter.pattern_type.label if acl_filter.resource_name else None,
                "principal": acl_filter.principal,
                "operation": acl_filter.operation.label if acl_filter.operation != Operation.ANY else None,
                "permission": acl_filter.permission.label if acl_filter.permission != Permission.ANY else None,
            }.items() if v}
            gone += _http("DELETE", http, params=params)["deleted"]
    if json_out:
        _print_json({"deleted": gone})
    else:
        console.print(f"deleted {len(gone)} ACL(s)")
        if gone:
            _show(gone, False)


def register(app: typer.Typer) -> None:
    app.add_typer(acl_app, name="acl")
