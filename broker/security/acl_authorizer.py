"""The ``Authorizer`` every front door asks: may this principal do this operation on this resource?

Front doors receive one at construction (``sluice/serve`` builds it when ``security.auth = "required"``) and
map a refusal to their protocol's answer; with auth off there is no authorizer and nothing is checked (as a
Kafka broker without ``authorizer.class.name`` allows everything).

Rules:
- ``security.super_users`` (``User:alice`` or just ``alice``) are allowed everything, ACLs unread.
- Everyone else: the ACL rules of ``acl.py`` (deny wins; no matching allow, or no ACL at all, refuses).
- ``allowed_any`` is Kafka's ``authorizeByResourceType`` (KIP-679: InitProducerId without a transactional
  id is allowed with IDEMPOTENT_WRITE on the cluster *or* WRITE on any topic): true when some ALLOW binding
  of the type could grant the operation to the principal and no DENY of that operation covers the whole
  type (a literal ``*`` or the empty prefix).
- Results are cached per (principal, host, operation, resource) until the ACLs change.
- A refusal the client is told about is audited: counted per front door and logged at INFO, at most one
  line per front door every ``log_interval_s`` (saying how many were refused since), as Kafka's
  ``kafka.authorizer.logger`` logs denials. Checks that only filter a listing (Metadata, ListGroups) are
  not audited, as Kafka does not log them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from broker.security.acl import (
    CLUSTER_NAME,
    WILDCARD,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    entry_result,
    normalize_principal,
    pattern_matches,
)
from broker.security.acl_store import AclStore
from broker.security.principal import Principal

__all__ = ["Authorizer"]

log = logging.getLogger("broker.security.authorizer")

_CACHE_LIMIT = 10_000


class Authorizer:
    def __init__(self, acls: AclStore, super_users: Iterable[str] = (), *, log_interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.acls = acls
        self.super_users = frozenset(normalize_principal(s) for s in super_users)
        self.denials: dict[str, int] = {}  # refusals told to clients, by front door
        self._log_interval_s = log_interval_s
        self._clock = clock
        self._logged: dict[str, tuple[float, int]] = {}
        self._cache: dict[tuple[str, str, Operation, ResourceType, str], bool] = {}
        self._cache_version = -1

    def is_super_user(self, principal: Principal) -> bool:
        return str(principal) in self.super_users

    def allowed(self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType,
                name: str = CLUSTER_NAME) -> bool:
        """Whether ``principal`` (connected from ``host``) may do ``operation`` on the resource (no audit)."""
        who = str(principal)
        if who in self.super_users:
            return True
        version = self.acls.version
        if version != self._cache_version:
            self._cache.clear()
            self._cache_version = version
        key = (who, host, operation, resource_type, name)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        verdict = False
        for binding in self.acls.bindings():
            if not pattern_matches(binding, resource_type, name):
                continue
            result = entry_result(binding, who, host, operation)
            if result == Permission.DENY:
                verdict = False
                break
            if result == Permission.ALLOW:
                verdict = True
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = verdict
        return verdict

    def check(self, door: str, principal: Principal, host: str, operation: Operation,
              resource_type: ResourceType, name: str = CLUSTER_NAME) -> bool:
        """``allowed``, and a refusal audited under ``door`` (the caller tells the client)."""
        if self.allowed(principal, host, operation, resource_type, name):
            return True
        self.denied(door, principal, host, operation, resource_type, name)
        return False

    def allowed_any(self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether some resource of ``resource_type`` may allow ``operation`` (Kafka's authorizeByResourceType)."""
        who = str(principal)
        if who in self.super_users:
            return True
        allow = False
        for binding in self.acls.bindings():
            if binding.resource_type != resource_type:
                continue
            result = entry_result(binding, who, host, operation)
            if result == Permission.DENY and binding.operation in (operation, Operation.ALL) and (
                    (binding.pattern_type == PatternType.LITERAL and binding.resource_name == WILDCARD)
                    or (binding.pattern_type == PatternType.PREFIXED and binding.resource_name == "")):
                return False
            if result == Permission.ALLOW:
                allow = True
        return allow

    def denied(self, door: str, principal: Principal, host: str, operation: Operation,
               resource_type: ResourceType, name: str) -> None:
        """Count and log (rate-limited) a refusal that ``door`` answered."""
        self.denials[door] = self.denials.get(door, 0) + 1
        now = self._clock()
        last, unlogged = self._logged.get(door, (float("-inf"), 0))
        if now - last < self._log_interval_s:
            self._logged[door] = (last, unlogged + 1)
            return
        since = f" ({unlogged} more refused since the previous line)" if unlogged else ""
        log.info(f"{door}: denied {operation.label} on {resource_type.label} {name!r} to {principal} from {host}"
                 f"{since}", extra={"front_door": door, "principal": str(principal), "peer": host,
                                    "operation": operation.label, "resource": f"{resource_type.label}:{name}"})
        self._logged[door] = (now, 0)
