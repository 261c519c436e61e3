"""Bearer tokens for the HTTP API: ``<data_dir>/security/tokens.json`` keeps their SHA-256, never a token.

Rules:
- A token is ``sluice_<id>_<secret>``: ``id`` (8 hex digits) names it in lists and revocations, ``secret`` is
  32 random bytes (``secrets.token_urlsafe``). It is shown once, when made; the store keeps the SHA-256
  of the whole token. A fast hash is enough here (unlike passwords): 256 random bits cannot be guessed, so
  a stolen store gives nothing to brute-force, and checking a request costs one hash and one lookup.
- A token acts as the principal ``User:<name>``; the name need not be a user of the user store (a service
  account such as a dashboard), and ACLs name it like any other principal.
- Revoking removes the hash: the next request with that token is refused (401). The file is shared with
  offline ``sluice tokens`` commands as the other security stores are (``filestore.JsonDocument``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.security.errors import UnknownUserError
from broker.security.filestore import JsonDocument
from broker.security.principal import Principal
from broker.security.users import check_name

__all__ = ["TOKENS_FILE", "TokenInfo", "TokenStore"]

TOKENS_FILE = Path("security") / "tokens.json"
_PREFIX = "sluice_"


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: str
    name: str  # the principal's name (User:<name>)
    created_ms: int
    description: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "created_ms": self.created_ms, "description": self.description}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class TokenStore:
    def __init__(self, data_dir: Path) -> None:
        self._doc = JsonDocument(Path(data_dir) / TOKENS_FILE, "tokens", "the token store")
        self.path = self._doc.path

    def create(self, name: str, description: str = "") -> tuple[str, TokenInfo]:
        """A new token for ``User:<name>``: (the token, to show once; what is kept about it)."""
        check_name(name)
        with self._doc.locked() as tokens:
            token_id = secrets.token_hex(4)
            while token_id in tokens:
                token_id = secrets.token_hex(4)
            token = f"{_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
            info = TokenInfo(token_id, name, int(time.time() * 1000), description)
            tokens[token_id] = {**info.to_json(), "sha256": _digest(token)}
        return token, info

    def list_tokens(self) -> list[TokenInfo]:
        return sorted((_info(entry) for entry in self._doc.read().values()), key=lambda t: (t.name, t.created_ms))

    def revoke(self, id_or_name: str) -> list[TokenInfo]:
        """Revoke the token with that id, or else every token of that name; UnknownUserError if none."""
        with self._doc.locked() as tokens:
            if id_or_name in tokens:
                gone = [tokens.pop(id_or_name)]
            else:
                gone = [tokens.pop(i) for i in [i for i, e in tokens.items() if e.get("name") == id_or_name]]
            if not gone:
                raise UnknownUserError(f"no token with id or name {id_or_name!r}")
        return [_info(entry) for entry in gone]

    def principal(self, token: str) -> Principal | None:
        """The principal ``token`` acts as, or None when it is not a live token (constant-time comparison)."""
        if not token.startswith(_PREFIX):
            return None
        token_id = token[len(_PREFIX):].split("_", 1)[0]
        entry = self._doc.read().get(token_id)
        if entry is None or not hmac.compare_digest(str(entry.get("sha256", "")), _digest(token)):
            return None
        return Principal(str(entry["name"]))


def _info(entry: dict[str, Any]) -> TokenInfo:
    return TokenInfo(str(entry["id"]), str(entry["name"]), int(entry["created_ms"]), str(entry.get("description", "")))
