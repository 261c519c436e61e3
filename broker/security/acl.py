"""The ACL model: Kafka's ``AclBinding`` (a resource pattern and an access-control entry), its filters, and
the rule that decides whether an entry grants or refuses an action. Pure values, no I/O.

Rules (Kafka's ``StandardAuthorizerData``; the numbers are Kafka's wire codes):
- A binding is: resource type (topic, group, cluster, transactional_id) and name, matched LITERAL (equal,
  or the name ``*`` for every resource of that type) or PREFIXED (the resource name starts with it);
  principal (``User:alice``, or ``User:*`` for everyone); host (a client IP address, or ``*``);
  operation; ALLOW or DENY. The cluster resource is named ``kafka-cluster``.
- An entry applies to an action when its principal, host, resource and operation match. Operation
  ``all`` matches every operation. An ALLOW entry of read, write, delete or alter also grants describe,
  and one of alter_configs also grants describe_configs; a DENY entry refuses only its own operation
  (a DENY of read does not refuse describe), or every one when it is ``all``.
- Deny wins: one matching DENY refuses, whatever allows. With no matching ALLOW the action is refused,
  also when no ACL names the resource at all (Kafka's ``allow.everyone.if.no.acl.found = false``).
- Filters (DescribeAcls, DeleteAcls, ``sluice acl list|delete``) use ``any`` for "every value" and the
  pattern type ``match``: every binding that would apply to the named resource (literal, ``*``, prefixes).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CLUSTER_NAME",
    "WILDCARD",
    "AclBinding",
    "AclFilter",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "entry_result",
    "normalize_principal",
    "pattern_matches",
]

WILDCARD = "*"
CLUSTER_NAME = "kafka-cluster"  # Kafka's name for the one cluster resource


class _Named(enum.IntEnum):
    """Kafka's code on the wire, a lower-case name for people (``describe_configs``)."""

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Any:
        try:
            return cls[text.strip().upper().replace("-", "_")]
        except KeyError:
            names = ", ".join(m.label for m in cls if m.name != "UNKNOWN")
            raise ValueError(f"unknown {cls.__name__.lower()} {text!r} (one of: {names})") from None


class ResourceType(_Named):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(_Named):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(_Named):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class Permission(_Named):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# Kafka's ResourceType ids for the types this broker has resources of (filters may also say ANY).
CONCRETE_RESOURCES = frozenset({ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                                ResourceType.TRANSACTIONAL_ID})
_IMPLIES_DESCRIBE = frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE,
                               Operation.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS})


def normalize_principal(text: str) -> str:
    """``alice`` -> ``User:alice``; ``User:alice`` and ``User:*`` as given. Kafka principals are ``Type:name``."""
    text = text.strip()
    if not text:
        raise ValueError("a principal may not be empty")
    kind, sep, name = text.partition(":")
    if not sep:
        return f"User:{text}"
    if not kind or not name:
        raise ValueError(f"a principal is Type:name (User:alice), got {text!r}")
    return text


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def __post_init__(self) -> None:
        problem = self.invalid_reason()
        if problem:
            raise ValueError(problem)

    def invalid_reason(self) -> str | None:
        """Why Kafka's CreateAcls would refuse this binding (INVALID_REQUEST), or None."""
        if self.resource_type not in CONCRETE_RESOURCES:
            return f"resource type {self.resource_type.label} cannot be used in an ACL"
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            return f"pattern type {self.pattern_type.label} cannot be used in an ACL (literal or prefixed)"
        if not self.resource_name:
            return "the resource name may not be empty"
        if self.resource_type == ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            return f"the cluster resource is named {CLUSTER_NAME!r}"
        if self.operation in (Operation.ANY, Operation.UNKNOWN):
            return f"operation {self.operation.label} cannot be used in an ACL"
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            return f"permission {self.permission.label} cannot be used in an ACL (allow or deny)"
        if ":" not in self.principal or self.principal.startswith(":") or self.principal.endswith(":"):
            return f"a principal is Type:name (User:alice), got {self.principal!r}"
        if not self.host:
            return "the host may not be empty (* for every host)"
        return None

    @property
    def key(self) -> str:
        """A stable identity: creating a binding that exists already changes nothing (as in Kafka)."""
        return "|".join((self.resource_type.label, self.pattern_type.label, self.resource_name, self.principal,
                         self.host, self.operation.label, self.permission.label))

    def to_json(self) -> dict[str, str]:
        return {"resource_type": self.resource_type.label, "resource_name": self.resource_name,
                "pattern_type": self.pattern_type.label, "principal": self.principal, "host": self.host,
                "operation": self.operation.label, "permission": self.permission.label}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AclBinding:
        return cls(ResourceType.parse(data["resource_type"]), str(data["resource_name"]),
                   PatternType.parse(data["pattern_type"]), str(data["principal"]), str(data.get("host", WILDCARD)),
                   Operation.parse(data["operation"]), Permission.parse(data["permission"]))

    def __str__(self) -> str:
        return (f"{self.permission.label} {self.principal} {self.operation.label} on {self.resource_type.label} "
                f"{self.pattern_type.label} {self.resource_name!r} from {self.host}")


def pattern_matches(binding: AclBinding, resource_type: ResourceType, name: str) -> bool:
    """Whether ``binding``'s resource pattern covers the resource ``name`` of ``resource_type``."""
    if binding.resource_type != resource_type:
        return False
    if binding.pattern_type == PatternType.LITERAL:
        return binding.resource_name in (name, WILDCARD)
    return name.startswith(binding.resource_name)


def entry_result(binding: AclBinding, principal: str, host: str, operation: Operation) -> Permission | None:
    """ALLOW or DENY when the binding's entry applies to ``principal`` doing ``operation`` from ``host``
    (its resource is assumed to match), None when it does not apply (``findResult`` in Kafka)."""
    if binding.principal not in (principal, "User:*"):
        return None
    if binding.host not in (WILDCARD, host):
        return None
    if binding.operation != Operation.ALL:
        if binding.permission == Permission.ALLOW:
            if operation == Operation.DESCRIBE:
                if binding.operation not in _IMPLIES_DESCRIBE:
                    return None
            elif operation == Operation.DESCRIBE_CONFIGS:
                if binding.operation not in _IMPLIES_DESCRIBE_CONFIGS:
                    return None
            elif binding.operation != operation:
                return None
        elif binding.operation != operation:
            return None
    return binding.permission


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings a DescribeAcls/DeleteAcls (or ``sluice acl list|delete``) names; None: any value."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def invalid_reason(self) -> str | None:
        for value, what in ((self.resource_type, "resource type"), (self.pattern_type, "pattern type"),
                            (self.operation, "operation"), (self.permission, "permission")):
            if value.name == "UNKNOWN":
                return f"unknown {what} in the filter"
        return None

    def matches(self, binding: AclBinding) -> bool:
        """Kafka's ``AclBindingFilter.matches`` (``ResourcePatternFilter`` and ``AccessControlEntryFilter``)."""
        if self.resource_type not in (ResourceType.ANY, binding.resource_type):
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, binding.pattern_type):
            return False
        if self.resource_name is not None:
            if self.pattern_type in (PatternType.ANY, binding.pattern_type):
                if self.resource_name != binding.resource_name:
                    return False
            elif binding.pattern_type == PatternType.LITERAL:  # MATCH against a literal binding
                if binding.resource_name not in (self.resource_name, WILDCARD):
                    return False
            elif not self.resource_name.startswith(binding.resource_name):  # MATCH against a prefix
                return False
        if self.principal is not None and self.principal != binding.principal:
            return False
        if self.host is not None and self.host != binding.host:
            return False
        if self.operation not in (Operation.ANY, binding.operation):
            return False
        return self.permission in (Permission.ANY, binding.permission)
