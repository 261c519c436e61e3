"""``sluice users add|list|delete`` against a running broker: through its HTTP API with the caller's
credentials (a super user may, others get 403, nobody without credentials gets 401); the users made this
way log in over Kafka SASL (kcat) and curl's Basic auth."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.security import UserStore
from tests.sluice_server import SluiceProcess

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = tmp_path_factory.mktemp("users-http") / "data"
    store = UserStore(data)
    store.add("admin", "admin pw")
    store.add("eve", "eve pw")
    proc = SluiceProcess(data, env={"SLUICE_SECURITY__AUTH": "required",
                                    "SLUICE_SECURITY__SUPER_USERS": '["admin"]'}).start()
    yield proc
    proc.stop()


def sluice(server: SluiceProcess, *args: str, user: str | None = None, password: str = "",
           stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLUICE_HTTP": server.http}
    for name in ("SLUICE_DATA_DIR", "SLUICE_USER", "SLUICE_PASSWORD", "SLUICE_TOKEN"):
        env.pop(name, None)
    if user is not None:
        env.update(SLUICE_USER=user, SLUICE_PASSWORD=password)
    return subprocess.run([sys.executable, "-m", "sluice.cli", "users", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def curl_status(server: SluiceProcess, user: str, password: str) -> str:
    assert shutil.which("curl"), "curl is installed by scripts/install-system-deps.sh"
    done = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-u", f"{user}:{password}",
                           f"{server.http}/users"], capture_output=True, text=True, timeout=30, check=False)
    return done.stdout


@pytest.mark.slow
def test_a_super_user_manages_users_over_http(server: SluiceProcess) -> None:
    added = sluice(server, "add", "bob", user="admin", password="admin pw", stdin="bob pw\n")
    assert added.returncode == 0, added.stderr
    assert "added user bob" in added.stdout
    again = sluice(server, "add", "bob", "--json", user="admin", password="admin pw", stdin="bob pw2\n")
    assert json.loads(again.stdout) == {"user": "bob", "created": False}
    listed = sluice(server, "list", "--json", user="admin", password="admin pw")
    assert json.loads(listed.stdout) == {"users": ["admin", "bob", "eve"]}
    assert UserStore(server.data_dir).check_password("bob", "bob pw2")  # the broker's own store
    assert curl_status(server, "bob", "bob pw2") == "403"  # logged in (not 401), but no ACL lets him list
    assert curl_status(server, "bob", "bob pw") == "401"
    deleted = sluice(server, "delete", "bob", user="admin", password="admin pw")
    assert deleted.returncode == 0 and "deleted user bob" in deleted.stdout
    assert curl_status(server, "bob", "bob pw2") == "401"
    missing = sluice(server, "delete", "bob", user="admin", password="admin pw")
    assert missing.returncode == 4 and "no user 'bob'" in missing.stderr


def test_others_are_refused(server: SluiceProcess) -> None:
    eve = sluice(server, "add", "mallory", user="eve", password="eve pw", stdin="x\n")
    assert eve.returncode == 1 and "403" in eve.stderr and "may not alter the cluster" in eve.stderr
    anonymous = sluice(server, "list")
    assert anonymous.returncode == 1 and "401" in anonymous.stderr and "SLUICE_USER" in anonymous.stderr
    wrong = sluice(server, "list", user="admin", password="nope")
    assert wrong.returncode == 1 and "401" in wrong.stderr
    assert "mallory" not in UserStore(server.data_dir).names()


def test_bad_names_are_400(server: SluiceProcess) -> None:
    bad = sluice(server, "add", "a\u0007b", user="admin", password="admin pw", stdin="pw\n")
    assert bad.returncode == 1 and "400" in bad.stderr and "control characters" in bad.stderr
