"""HTTP authentication and authorization against a real ``sluice serve`` with ``security.auth = required``:
curl and httpx with Basic, a bearer token (made with the real ``sluice tokens`` command) and nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.security import AclBinding, AclStore, Operation, PatternType, Permission, ResourceType, UserStore
from tests.sluice_server import SluiceProcess

ROOT = Path(__file__).resolve().parents[3]


def sluice(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SLUICE_DATA_DIR", None)
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def allow(principal: str, operation: Operation, resource_type: ResourceType, name: str,
          pattern: PatternType = PatternType.LITERAL) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, "*", operation, Permission.ALLOW)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = tmp_path_factory.mktemp("http-auth") / "data"
    users = UserStore(data)
    users.add("root", "root-pw")
    users.add("alice", "alice-pw")
    AclStore(data).add([allow("User:alice", Operation.READ, ResourceType.TOPIC, "sensors")])
    proc = SluiceProcess(data, env={"SLUICE_SECURITY__AUTH": "required", "SLUICE_SECURITY__SUPER_USERS": '["root"]'})
    proc.start()
    with httpx.Client(base_url=proc.http, auth=("root", "root-pw")) as root:
        assert root.post("/topics", json={"name": "sensors", "partitions": 1}).status_code == 201
        assert root.post("/topics", json={"name": "secret", "partitions": 1}).status_code == 201
    yield proc
    proc.stop()


def curl(server: SluiceProcess, path: str, *args: str) -> tuple[int, dict[str, list[str]], str]:
    out = subprocess.run(["curl", "-s", "-i", *args, f"{server.http}{path}"], capture_output=True,
                         timeout=30, check=True).stdout.decode()
    head, _, body = out.partition("\r\n\r\n")
    status_line, *lines = head.split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return int(status_line.split()[1]), headers, body


def test_no_or_bad_credentials_get_401_problem_with_both_challenges(server: SluiceProcess) -> None:
    for args in ((), ("-u", "alice:wrong"), ("-u", "nobody:x"), ("-H", "Authorization: Bearer sluice_00000000_nope"),
                 ("-H", "Authorization: Digest x")):
        status, headers, body = curl(server, "/topics", *args)
        assert status == 401, args
        assert headers["content-type"] == ["application/problem+json"]
        doc = json.loads(body)
        assert doc["status"] == 401 and doc["type"] == "urn:sluice:problem:unauthorized"
        challenges = headers["www-authenticate"]
        assert challenges[0] == 'Basic realm="sluice", charset="UTF-8"'
        assert challenges[1].startswith('Bearer realm="sluice"')
        assert ('error="invalid_token"' in challenges[1]) == ("Bearer" in " ".join(args))


def test_basic_user_is_authorized_by_acls(server: SluiceProcess) -> None:
    status, _, body = curl(server, "/topics", "-u", "alice:alice-pw")
    assert status == 200 and [t["name"] for t in json.loads(body)] == ["sensors"]  # only what alice may describe
    status, _, body = curl(server, "/topics/sensors/records", "-u", "alice:alice-pw")
    assert status == 200 and json.loads(body)["records"] == []
    status, headers, body = curl(server, "/topics/sensors", "-u", "alice:alice-pw", "-X", "DELETE")
    assert status == 403 and headers["content-type"] == ["application/problem+json"]
    doc = json.loads(body)
    assert doc["type"] == "urn:sluice:problem:forbidden"
    assert "User:alice may not delete topic 'sensors'" in doc["detail"]
    # Denied before existence is told (Kafka answers TOPIC_AUTHORIZATION_FAILED for unknown topics too).
    assert curl(server, "/topics/missing/records", "-u", "alice:alice-pw")[0] == 403
    assert curl(server, "/topics/secret/records", "-u", "alice:alice-pw")[0] == 403
    assert curl(server, "/topics/sensors/records", "-u", "alice:alice-pw", "-X", "POST", "-H",
                "Content-Type: application/json", "-d", '{"records": [{"value": 1}]}')[0] == 403
    assert curl(server, "/sources", "-u", "alice:alice-pw")[0] == 403


def test_bearer_token_from_the_cli_then_revoked(server: SluiceProcess) -> None:
    made = sluice("tokens", "create", "dash", "--data-dir", str(server.data_dir), "--json")
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    assert token not in (server.data_dir / "security" / "tokens.json").read_text()  # only its hash is kept
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.http) as client:
        assert client.get("/topics", headers=headers).json() == []  # User:dash has no ACL yet
        assert client.get("/topics/sensors/records", headers=headers).status_code == 403
        AclStore(server.data_dir).add([allow("User:dash", Operation.READ, ResourceType.TOPIC, "sens",
                                             PatternType.PREFIXED)])
        assert client.get("/topics/sensors/records", headers=headers).status_code == 200  # offline ACL picked up
        listed = sluice("tokens", "list", "--data-dir", str(server.data_dir), "--json")
        token_id = json.loads(listed.stdout)["tokens"][0]["id"]
        assert sluice("tokens", "revoke", token_id, "--data-dir", str(server.data_dir)).returncode == 0
        assert client.get("/topics/sensors/records", headers=headers).status_code == 401


def test_health_open_metrics_need_describe_on_the_cluster(server: SluiceProcess) -> None:
    with httpx.Client(base_url=server.http) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 200
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", auth=("alice", "alice-pw")).status_code == 403
        client.get("/topics", auth=("alice", "nope"))
        assert client.get("/console").status_code == 401  # a browser asks for the Basic password
        assert client.get("/console/topics/sensors/messages", auth=("alice", "alice-pw")).status_code == 403
        assert client.get("/console/topics/sensors", auth=("root", "root-pw")).status_code == 200
        metrics = client.get("/metrics", auth=("root", "root-pw"))
    assert metrics.status_code == 200
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
              for line in metrics.text.splitlines() if line and not line.startswith("#")}
    assert values['sluice_auth_failures_total{front_door="http"}'] >= 2
    assert values['sluice_authorization_denied_total{front_door="http"}'] >= 1
    assert values['sluice_auth_logins_total{front_door="http"}'] >= 1


async def test_acls_route_without_an_authorizer_is_security_disabled(client: httpx.AsyncClient) -> None:
    answer = await client.get("/acls")
    assert answer.status_code == 409 and answer.json()["type"] == "urn:sluice:problem:security-disabled"
    assert (await client.get("/topics")).status_code == 200  # auth off: everything else open, as before
