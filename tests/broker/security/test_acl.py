"""The ACL rules (Kafka's StandardAuthorizer: implied operations, deny wins, no ACL refuses), filters, and
the durable store shared by two processes' worth of objects."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker.security import (
    ANONYMOUS,
    AclBinding,
    AclFilter,
    AclStore,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    Principal,
    ResourceType,
    TokenStore,
    UserStoreError,
)

ALICE = Principal("alice")
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER


def acl(op: Operation, name: str = "sensors", *, who: str = "User:alice", rtype: ResourceType = TOPIC,
        pattern: PatternType = PatternType.LITERAL, deny: bool = False, host: str = "*") -> AclBinding:
    return AclBinding(rtype, name, pattern, who, host, op, Permission.DENY if deny else Permission.ALLOW)


def authorizer(tmp_path: Path, *bindings: AclBinding, super_users: tuple[str, ...] = ()) -> Authorizer:
    store = AclStore(tmp_path)
    store.add(list(bindings))
    return Authorizer(store, super_users)


@pytest.mark.parametrize(("granted", "asked", "allowed"), [
    (Operation.READ, Operation.DESCRIBE, True),
    (Operation.WRITE, Operation.DESCRIBE, True),
    (Operation.DELETE, Operation.DESCRIBE, True),
    (Operation.ALTER, Operation.DESCRIBE, True),
    (Operation.CREATE, Operation.DESCRIBE, False),
    (Operation.ALTER_CONFIGS, Operation.DESCRIBE_CONFIGS, True),
    (Operation.ALTER_CONFIGS, Operation.DESCRIBE, False),
    (Operation.DESCRIBE, Operation.READ, False),
    (Operation.READ, Operation.WRITE, False),
    (Operation.ALL, Operation.ALTER_CONFIGS, True),
])
def test_implied_operations(tmp_path: Path, granted: Operation, asked: Operation, allowed: bool) -> None:
    assert authorizer(tmp_path, acl(granted)).allowed(ALICE, "10.0.0.1", asked, TOPIC, "sensors") is allowed


def test_deny_wins_and_denies_only_its_own_operation(tmp_path: Path) -> None:
    authz = authorizer(tmp_path, acl(Operation.ALL), acl(Operation.READ, deny=True))
    assert not authz.allowed(ALICE, "h", Operation.READ, TOPIC, "sensors")
    assert authz.allowed(ALICE, "h", Operation.DESCRIBE, TOPIC, "sensors")  # a DENY of read does not deny describe
    assert authz.allowed(ALICE, "h", Operation.WRITE, TOPIC, "sensors")
    everyone = authorizer(tmp_path / "2", acl(Operation.WRITE, "s", pattern=PatternType.PREFIXED),
                          acl(Operation.ALL, "*", who="User:*", deny=True))
    assert not everyone.allowed(ALICE, "h", Operation.WRITE, TOPIC, "sensors")


def test_patterns_principals_hosts_and_no_acl(tmp_path: Path) -> None:
    authz = authorizer(
        tmp_path, acl(Operation.READ, "sens", pattern=PatternType.PREFIXED), acl(Operation.WRITE, "*", who="User:*"),
        acl(Operation.READ, "app", rtype=GROUP, host="127.0.0.1"), super_users=("root",))
    assert authz.allowed(ALICE, "h", Operation.READ, TOPIC, "sensors-2")
    assert not authz.allowed(ALICE, "h", Operation.READ, TOPIC, "other")  # no ACL names it: refused
    assert authz.allowed(Principal("bob"), "h", Operation.WRITE, TOPIC, "anything")  # User:* and the * resource
    assert authz.allowed(ALICE, "127.0.0.1", Operation.READ, GROUP, "app")
    assert not authz.allowed(ALICE, "127.0.0.2", Operation.READ, GROUP, "app")
    assert not authz.allowed(ANONYMOUS, "h", Operation.DESCRIBE, CLUSTER)
    assert authz.allowed(Principal("root"), "h", Operation.ALTER, CLUSTER)
    assert authz.allowed_any(ALICE, "h", Operation.WRITE, TOPIC)
    assert not authz.allowed_any(ALICE, "h", Operation.WRITE, GROUP)


def test_denials_are_counted_and_logged_rate_limited(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    authz = Authorizer(AclStore(tmp_path), (), clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "broker.security.authorizer"):
        for _ in range(3):
            assert not authz.check("kafka", ALICE, "h", Operation.READ, TOPIC, "t")
        now[0] = 11.0
        authz.check("kafka", ALICE, "h", Operation.READ, TOPIC, "t")
    assert authz.denials == {"kafka": 4}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "(2 more refused since the previous line)" in lines[1]


def test_filters_as_kafka_matches_them(tmp_path: Path) -> None:
    literal, prefix, star = (acl(Operation.READ, "sensors"), acl(Operation.READ, "sen", pattern=PatternType.PREFIXED),
                             acl(Operation.READ, "*"))
    match = AclFilter(TOPIC, "sensors", PatternType.MATCH)
    assert [match.matches(b) for b in (literal, prefix, star)] == [True, True, True]
    exact = AclFilter(TOPIC, "sensors", PatternType.ANY)
    assert [exact.matches(b) for b in (literal, prefix, star)] == [True, False, False]
    assert AclFilter(principal="User:bob").matches(literal) is False
    assert AclFilter(permission=Permission.DENY).matches(literal) is False
    with pytest.raises(ValueError, match="cluster resource is named"):
        acl(Operation.ALTER, "x", rtype=CLUSTER)


def test_store_is_durable_deduplicated_and_seen_by_another_reader(tmp_path: Path) -> None:
    writer, reader = AclStore(tmp_path), AclStore(tmp_path)
    assert reader.bindings() == ()
    assert writer.add([acl(Operation.READ), acl(Operation.READ), acl(Operation.WRITE)]) == 2
    assert writer.add([acl(Operation.READ)]) == 0  # exists already: not an error, as in Kafka
    assert len(reader.bindings()) == 2
    removed = writer.delete([AclFilter(operation=Operation.WRITE)])
    assert removed == [[acl(Operation.WRITE)]]
    assert AclStore(tmp_path).bindings() == (acl(Operation.READ),) == reader.bindings()
    (tmp_path / "security" / "acls.json").write_text("{broken")
    assert reader.bindings() == (acl(Operation.READ),)  # broken while running: the last good ACLs stay
    with pytest.raises(UserStoreError):
        AclStore(tmp_path).bindings()  # broken at the first read: start-up fails


def test_token_store_keeps_only_hashes(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    token, info = store.create("dash")
    assert token not in store.path.read_text()
    assert TokenStore(tmp_path).principal(token) == Principal("dash")
    assert store.principal(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert store.principal("garbage") is None
    store.revoke(info.id)
    assert TokenStore(tmp_path).principal(token) is None
