"""``sluice users add|list|delete`` run as a user would: the real command, offline on a data directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.security import UserStore

ROOT = Path(__file__).resolve().parents[3]


def sluice(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SLUICE_DATA_DIR", None)
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=60, check=False)


@pytest.mark.slow
def test_users_add_list_delete_offline(tmp_path: Path) -> None:
    data = str(tmp_path)
    added = sluice("users", "add", "alice", "--data-dir", data, stdin="wonder land\n")
    assert added.returncode == 0, added.stderr
    assert "added user alice" in added.stdout
    assert UserStore(tmp_path).check_password("alice", "wonder land")  # the newline is not part of it
    assert "wonder" not in (tmp_path / "security" / "users.json").read_text()

    changed = sluice("users", "add", "alice", "--data-dir", data, stdin="other")
    assert changed.returncode == 0 and "changed the password" in changed.stdout
    assert UserStore(tmp_path).check_password("alice", "other")
    assert sluice("users", "add", "bob", "--data-dir", data, stdin="pw\n").returncode == 0

    listed = sluice("users", "list", "--data-dir", data, "--json")
    assert json.loads(listed.stdout) == {"users": ["alice", "bob"]}

    assert sluice("users", "delete", "alice", "--data-dir", data).returncode == 0
    assert UserStore(tmp_path).names() == ["bob"]
    missing = sluice("users", "delete", "alice", "--data-dir", data)
    assert missing.returncode == 1 and "no user 'alice'" in missing.stderr


def test_users_add_refuses_empty_password_and_has_no_password_flag(tmp_path: Path) -> None:
    empty = sluice("users", "add", "alice", "--data-dir", str(tmp_path), stdin="\n")
    assert empty.returncode == 1 and "password may not be empty" in empty.stderr
    flag = sluice("users", "add", "alice", "--password", "x", "--data-dir", str(tmp_path))
    assert flag.returncode != 0 and "No such option" in flag.stderr
    assert UserStore(tmp_path).names() == []
