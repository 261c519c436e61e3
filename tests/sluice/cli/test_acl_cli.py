"""``sluice acl add|list|delete`` run as a user would: offline on a data directory, and over the HTTP API of a
running broker with the caller's credentials (SLUICE_USER/SLUICE_PASSWORD, SLUICE_TOKEN)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.security import AclStore, Operation, Principal, ResourceType, UserStore
from broker.security.acl_authorizer import Authorizer
from tests.sluice_server import SluiceProcess

ROOT = Path(__file__).resolve().parents[3]


def sluice(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for name in ("SLUICE_DATA_DIR", "SLUICE_TOKEN", "SLUICE_USER", "SLUICE_PASSWORD"):
        if name not in (env or {}):
            full.pop(name, None)
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True, env=full,
                          timeout=60, check=False)


def test_acl_offline(tmp_path: Path) -> None:
    data = str(tmp_path)
    added = sluice("acl", "add", "--principal", "alice", "-o", "read", "-o", "write", "--topic", "sensors",
                   "--data-dir", data, "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["created"] == 2
    assert sluice("acl", "add", "-p", "User:*", "-o", "describe", "--topic", "sens", "--prefixed", "--deny",
                  "--data-dir", data).returncode == 0
    authz = Authorizer(AclStore(tmp_path))
    assert authz.allowed(Principal("alice"), "h", Operation.WRITE, ResourceType.TOPIC, "sensors")
    assert not authz.allowed(Principal("alice"), "h", Operation.DESCRIBE, ResourceType.TOPIC, "sensors")  # deny wins

    listed = json.loads(sluice("acl", "list", "--topic", "sensors", "--data-dir", data, "--json").stdout)["acls"]
    assert {(a["principal"], a["operation"], a["pattern_type"]) for a in listed} == {
        ("User:alice", "read", "literal"), ("User:alice", "write", "literal"), ("User:*", "describe", "prefixed")}

    deleted = sluice("acl", "delete", "--topic", "sensors", "-o", "write", "--data-dir", data, "--json")
    assert [a["operation"] for a in json.loads(deleted.stdout)["deleted"]] == ["write"]
    assert len(AclStore(tmp_path).bindings()) == 2
    bad = sluice("acl", "add", "-p", "alice", "-o", "fly", "--topic", "t", "--data-dir", data)
    assert bad.returncode == 2 and "unknown operation 'fly'" in bad.stderr
    nothing = sluice("acl", "delete", "--data-dir", data)
    assert nothing.returncode == 2 and "name what to delete" in nothing.stderr


@pytest.mark.slow
def test_acl_over_http_with_credentials(tmp_path: Path) -> None:
    data = tmp_path / "data"
    users = UserStore(data)
    users.add("admin", "admin-pw")
    users.add("alice", "alice-pw")
    server = SluiceProcess(data, env={"SLUICE_SECURITY__AUTH": "required",
                                      "SLUICE_SECURITY__SUPER_USERS": '["admin"]'}).start()
    try:
        admin = {"SLUICE_HTTP": server.http, "SLUICE_USER": "admin", "SLUICE_PASSWORD": "admin-pw"}
        added = sluice("acl", "add", "-p", "alice", "-o", "read", "--group", "app", "--json", env=admin)
        assert added.returncode == 0, added.stderr
        assert json.loads(added.stdout)["created"] == 1
        listed = sluice("acl", "list", "--json", env=admin)
        assert [a["resource_name"] for a in json.loads(listed.stdout)["acls"]] == ["app"]
        assert AclStore(data).bindings()[0].resource_name == "app"  # the same store as offline

        alice = {"SLUICE_HTTP": server.http, "SLUICE_USER": "alice", "SLUICE_PASSWORD": "alice-pw"}
        refused = sluice("acl", "add", "-p", "alice", "-o", "all", "--cluster", env=alice)
        assert refused.returncode == 1 and "403" in refused.stderr and "may not alter the cluster" in refused.stderr
        anonymous = sluice("acl", "list", env={"SLUICE_HTTP": server.http})
        assert anonymous.returncode == 1 and "401" in anonymous.stderr and "SLUICE_TOKEN" in anonymous.stderr

        deleted = sluice("acl", "delete", "--group", "app", "--json", env=admin)
        assert len(json.loads(deleted.stdout)["deleted"]) == 1
        assert AclStore(data).bindings() == ()
    finally:
        server.stop()
