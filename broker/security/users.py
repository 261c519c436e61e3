"""The user store: salted SCRAM credentials per user, one JSON file in the data directory.

Rules:
- Each user has a SCRAM-SHA-256 and a SCRAM-SHA-512 credential (RFC 5802 / RFC 7677: salt, iteration
  count, StoredKey, ServerKey), made with Kafka's default of 4096 iterations. The password itself is
  never stored, and nothing in the file lets one log in without it.
- Kafka's AlterUserScramCredentials may give a user one mechanism only, or remove one (``alter``: the
  client sends the salted password, from which StoredKey and ServerKey are derived as Kafka's
  ScramFormatter does); a user whose last credential is removed is gone.
- PLAIN logins (Kafka PLAIN, MQTT username/password) are checked against the user's SCRAM-SHA-256
  credential, or its SCRAM-SHA-512 one when it has only that: the password is salted and hashed with the
  stored salt and count and the StoredKeys compared in constant time.
- Passwords are taken as their UTF-8 bytes, without SASLprep, as Kafka's ScramFormatter and librdkafka do
  (a client that normalised differently would fail against Kafka too).
- The file is a ``filestore.JsonDocument``: atomic writes under a ``flock`` (an offline ``sluice users``
  command and another one never lose each other's change), re-read when it changed (users added with
  ``sluice users add --data-dir`` reach a running broker without a restart). A file that breaks while
  the broker runs (edited by hand) is logged once at ERROR and the users read before stay in use, so a
  login never ends in a traceback; a store unreadable at the first read raises ``UserStoreError``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import os
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.security.errors import InvalidUserError, UnknownUserError, UserStoreError
from broker.security.filestore import JsonDocument

__all__ = [
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "SCRAM_MECHANISMS",
    "CredentialChange",
    "USERS_FILE",
    "ScramCredential",
    "UserStore",
    "check_name",
    "hash_name",
]

log = logging.getLogger("broker.security")

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_ITERATIONS = 4096  # Kafka's default (and RFC 7677's minimum) for SCRAM credentials
MAX_ITERATIONS = 16384  # the most Kafka's controller accepts in AlterUserScramCredentials
USERS_FILE = Path("security") / "users.json"
_FORMAT = 1
_MAX_NAME = 256


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What RFC 5802 lets a server keep: enough to verify a proof, not enough to make one."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def create(cls, mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
        salt = os.urandom(32)
        stored_key, server_key = _derive(mechanism, password, salt, iterations)
        return cls(salt, stored_key, server_key, iterations)

    @classmethod
    def from_salted_password(cls, mechanism: str, salt: bytes, salted_password: bytes,
                             iterations: int) -> ScramCredential:
        """The credential for ``SaltedPassword = Hi(password, salt, i)``, as AlterUserScramCredentials sends it."""
        stored_key, server_key = _keys(mechanism, salted_password)
        return cls(salt, stored_key, server_key, iterations)

    def matches(self, mechanism: str, password: str) -> bool:
        stored_key, _server_key = _derive(mechanism, password, self.salt, self.iterations)
        return hmac.compare_digest(stored_key, self.stored_key)

    def to_json(self) -> dict[str, Any]:
        return {
            "salt": _b64(self.salt), "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key), "iterations": self.iterations,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScramCredential:
        return cls(base64.b64decode(data["salt"]), base64.b64decode(data["stored_key"]),
                   base64.b64decode(data["server_key"]), int(data["iterations"]))


def hash_name(mechanism: str) -> str:
    """The hashlib name of a SCRAM mechanism's hash ("SCRAM-SHA-256" -> "sha256")."""
    return {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]


def _derive(mechanism: str, password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) of RFC 5802 §3: SaltedPassword = Hi(password, salt, i) = PBKDF2-HMAC."""
    salted = hashlib.pbkdf2_hmac(hash_name(mechanism), password.encode("utf-8"), salt, iterations)
    return _keys(mechanism, salted)


def _keys(mechanism: str, salted_password: bytes) -> tuple[bytes, bytes]:
    name = hash_name(mechanism)
    client_key = hmac.digest(salted_password, b"Client Key", name)
    return hashlib.new(name, client_key).digest(), hmac.digest(salted_password, b"Server Key", name)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def check_name(name: str) -> str:
    """A user name this store accepts: 1-256 characters, no control characters, not blank."""
    if not name or not name.strip():
        raise InvalidUserError("a user name may not be empty")
    if len(name) > _MAX_NAME:
        raise InvalidUserError(f"a user name may have at most {_MAX_NAME} characters")
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in name):
        raise InvalidUserError("a user name may not contain control characters")
    return name


@dataclass(frozen=True, slots=True)
class CredentialChange:
    """One item of ``UserStore.alter``: set (``credential`` given) or remove one mechanism's credential."""

    name: str
    mechanism: str
    credential: ScramCredential | None = None


class UserStore:
    """Users and their SCRAM credentials, kept in ``<data_dir>/security/users.json``."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / USERS_FILE
        self._doc = JsonDocument(self.path, "users", "the user store", _FORMAT)
        self._users: dict[str, dict[str, ScramCredential]] = {}
        self._parsed = -1  # the document version ``_users`` was parsed from

    # -- reading ---------------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self._current())

    def __contains__(self, name: object) -> bool:
        return name in self._current()

    def credential(self, name: str, mechanism: str) -> ScramCredential | None:
        """The ``mechanism`` credential of ``name``, or None if there is no such user."""
        return self._current().get(name, {}).get(mechanism)

    def credentials(self, name: str) -> dict[str, ScramCredential]:
        """``name``'s credentials by mechanism (empty when there is no such user)."""
        return dict(self._current().get(name, {}))

    def check_password(self, name: str, password: str) -> bool:
        """True when ``password`` is ``name``'s password (constant-time comparison of the derived keys)."""
        credentials = self.credentials(name)
        for mechanism in SCRAM_MECHANISMS:
            if mechanism in credentials:
                return credentials[mechanism].matches(mechanism, password)
        return False

    def _current(self) -> dict[str, dict[str, ScramCredential]]:
        """The users as of the file now (re-parsed when it changed; a broken change keeps the last good)."""
        raw = self._doc.read()
        if self._doc.version != self._parsed:
            try:
                self._users = _parse(self.path, raw)
            except UserStoreError as exc:
                if self._parsed < 0:
                    raise  # never read: the caller (start-up, the CLI) reports it
                log.error(f"{exc}; logins are checked against the users read before until it is fixed")
            self._parsed = self._doc.version
        return self._users

    # -- writing ---------------------------------------------------------------------------

    def add(self, name: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> bool:
        """Create ``name`` or replace its password; True if the user is new."""
        check_name(name)
        if not password:
            raise InvalidUserError("a password may not be empty")
        if iterations < DEFAULT_ITERATIONS:
            raise InvalidUserError(f"SCRAM iterations must be at least {DEFAULT_ITERATIONS} (RFC 7677)")
        creds = {mech: ScramCredential.create(mech, password, iterations) for mech in SCRAM_MECHANISMS}
        with self._locked() as users:
            new = name not in users
            users[name] = creds
        return new

    def delete(self, name: str) -> None:
        with self._locked() as users:
            if name not in users:
                raise UnknownUserError(f"no user {name!r}")
            del users[name]

    def alter(self, changes: list[CredentialChange]) -> dict[str, str]:
        """Apply ``changes`` in one write; returns {user: why} for the removals of credentials that do not
        exist (those users are left unchanged; every other change is applied)."""
        missing: dict[str, str] = {}
        with self._locked() as users:
            for change in changes:
                if change.credential is None and change.mechanism not in users.get(change.name, {}):
                    missing[change.name] = "Attempt to delete a user credential that does not exist"
            for change in changes:
                if change.name in missing:
                    continue
                creds = users.setdefault(change.name, {})
                if change.credential is None:
                    del creds[change.mechanism]
                else:
                    creds[change.mechanism] = change.credential
                if not creds:
                    del users[change.name]
        return missing

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, ScramCredential]]]:
        """Read-modify-write under the store's lock; the new content is written when the block ends."""
        with self._doc.locked() as raw:
            users = _parse(self.path, raw)
            yield users
            raw.clear()
            raw.update({name: {mech: c.to_json() for mech, c in creds.items()} for name, creds in users.items()})


def _parse(path: Path, raw: dict[str, Any]) -> dict[str, dict[str, ScramCredential]]:
    try:
        return {name: {mech: ScramCredential.from_json(c) for mech, c in creds.items()} for name, creds in raw.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserStoreError(f"the user store {path} is not valid: {exc}") from exc
