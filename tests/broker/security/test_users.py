"""The user store and the SASL exchanges, driven by scramp's client (an implementation we did not write)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import scramp

from broker.security import (
    AuthenticationFailed,
    Authenticator,
    CredentialChange,
    InvalidUserError,
    ScramCredential,
    UnknownUserError,
    UnsupportedMechanismError,
    UserStore,
    UserStoreError,
)


def test_store_keeps_salted_credentials_never_the_password(tmp_path: Path) -> None:
    store = UserStore(tmp_path)
    assert store.add("alice", "s3cret-pässword") is True
    raw = store.path.read_text()
    assert "s3cret" not in raw
    doc = json.loads(raw)
    creds = doc["users"]["alice"]
    assert set(creds) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert all(c["iterations"] == 4096 for c in creds.values())
    assert creds["SCRAM-SHA-256"]["salt"] != creds["SCRAM-SHA-512"]["salt"]
    assert (store.path.stat().st_mode & 0o777) == 0o600
    # A second store on the same directory (another process) sees the user; a new password replaces the old.
    other = UserStore(tmp_path)
    assert other.check_password("alice", "s3cret-pässword")
    assert not other.check_password("alice", "wrong")
    assert not other.check_password("bob", "s3cret-pässword")
    assert store.add("alice", "new") is False
    assert other.check_password("alice", "new") and not other.check_password("alice", "s3cret-pässword")
    store.delete("alice")
    assert other.names() == []
    with pytest.raises(UnknownUserError):
        store.delete("alice")


@pytest.mark.parametrize("name", ["", "  ", "a\nb", "x" * 257])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidUserError):
        UserStore(tmp_path).add(name, "pw")


def test_empty_password_refused_and_corrupt_file_reported(tmp_path: Path) -> None:
    store = UserStore(tmp_path)
    with pytest.raises(InvalidUserError):
        store.add("alice", "")
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_text("{not json")
    with pytest.raises(UserStoreError):
        store.names()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchange_against_scramp_client(tmp_path: Path, mechanism: str) -> None:
    store = UserStore(tmp_path)
    store.add("alice", "pw")
    auth = Authenticator(store)
    server = auth.exchange(mechanism)
    client = scramp.ScramClient([mechanism], "alice", "pw")
    server_first = server.step(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    server_final = server.step(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # raises if the server's signature is wrong
    assert server.complete and server.principal is not None and server.principal.name == "alice"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize(("user", "password"), [("alice", "bad"), ("nobody", "pw")])
def test_scram_refuses_bad_password_and_unknown_user_alike(tmp_path: Path, mechanism: str, user: str,
                                                           password: str) -> None:
    store = UserStore(tmp_path)
    store.add("alice", "pw")
    server = Authenticator(store).exchange(mechanism)
    client = scramp.ScramClient([mechanism], user, password)
    with pytest.raises(AuthenticationFailed, match="Invalid user credentials"):
        client.set_server_first(server.step(client.get_client_first().encode()).decode())
        server.step(client.get_client_final().encode())
    assert server.principal is None


def test_plain_exchange(tmp_path: Path) -> None:
    store = UserStore(tmp_path)
    store.add("alice", "pw")
    auth = Authenticator(store)
    ok = auth.exchange("PLAIN")
    assert ok.step(b"\0alice\0pw") == b"" and ok.principal is not None
    for token, reason in [(b"\0alice\0bad", "Invalid username or password"), (b"alice\0pw", "3 tokens"),
                          (b"bob\0alice\0pw", "authorization id"), (b"\0\0pw", "username not specified")]:
        with pytest.raises(AuthenticationFailed, match=reason):
            auth.exchange("PLAIN").step(token)
    with pytest.raises(UnsupportedMechanismError):
        auth.exchange("GSSAPI")


def test_failures_are_counted_and_logged_rate_limited(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    auth = Authenticator(UserStore(tmp_path), log_interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="broker.security"):
        for _ in range(5):
            auth.failed("kafka", "10.0.0.1", "eve", "bad password")
        now[0] = 11.0
        auth.failed("kafka", "10.0.0.1", "eve", "bad password")
    assert auth.failures == {"kafka": 6}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "4 more since" in lines[1]


def test_scram_final_nonce_must_end_with_the_servers(tmp_path: Path) -> None:
    store = UserStore(tmp_path)
    store.add("alice", "pw")
    server = Authenticator(store).exchange("SCRAM-SHA-256")
    client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "pw")
    client.set_server_first(server.step(client.get_client_first().encode()).decode())
    final = client.get_client_final()
    tampered = final.replace(",r=", ",r=x", 1).replace(final.split(",r=")[1].split(",")[0][-4:] + ",", "abcd,", 1)
    with pytest.raises(AuthenticationFailed):
        server.step(tampered.encode())
    assert server.principal is None


def test_store_broken_while_running_keeps_the_users_read_before(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    UserStore(tmp_path).add("alice", "pw")
    running = UserStore(tmp_path)
    assert running.check_password("alice", "pw")
    running.path.write_text("{broken")
    with caplog.at_level(logging.ERROR, logger="broker.security"):
        assert running.check_password("alice", "pw")
        assert running.check_password("alice", "pw")
    assert len([r for r in caplog.records if "not valid" in r.getMessage()]) == 1
    with pytest.raises(UserStoreError):
        UserStore(tmp_path).names()  # a fresh reader (start-up, the CLI) is told


def test_alter_sets_and_removes_single_mechanisms_from_salted_passwords(tmp_path: Path) -> None:
    """AlterUserScramCredentials' form: the client sends Hi(password, salt, i); scramp's client logs in with it."""
    store = UserStore(tmp_path)
    salt = b"0123456789abcdef"
    salted = hashlib.pbkdf2_hmac("sha512", b"pw512", salt, 4096)
    credential = ScramCredential.from_salted_password("SCRAM-SHA-512", salt, salted, 4096)
    assert store.alter([CredentialChange("carol", "SCRAM-SHA-512", credential)]) == {}
    assert set(store.credentials("carol")) == {"SCRAM-SHA-512"}
    assert store.check_password("carol", "pw512")  # PLAIN falls back to the only credential she has
    assert store.credential("carol", "SCRAM-SHA-256") is None
    auth = Authenticator(store)
    client = scramp.ScramClient(["SCRAM-SHA-512"], "carol", "pw512")
    exchange = auth.exchange("SCRAM-SHA-512")
    client.set_server_first(exchange.step(client.get_client_first().encode()).decode())
    client.set_server_final(exchange.step(client.get_client_final().encode()).decode())
    assert exchange.principal is not None and exchange.principal.name == "carol"
    # Removing a credential she does not have changes nothing for her; removing her last one removes her.
    assert store.alter([CredentialChange("carol", "SCRAM-SHA-256")]) == {
        "carol": "Attempt to delete a user credential that does not exist"}
    assert store.names() == ["carol"]
    assert store.alter([CredentialChange("carol", "SCRAM-SHA-512")]) == {}
    assert store.names() == []
