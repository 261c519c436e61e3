"""The TCP line listener's login (``security.auth = "required"``): a first ``AUTH <user> <password>`` line.

Rules:
- The connection's first line must be ``AUTH``, one space, the user name (no spaces), one space, and the
  password (the rest of the line, spaces included; a trailing CR is dropped). It must arrive within
  ``auth_timeout_s`` of the connection; it is line 1 of the connection's numbering.
- The password is checked against the user store (``broker.security``); the line itself is stored nowhere
  and never logged.
- Accepted: in ack mode the listener answers ``ACK 1`` (the same answer as to any line it has handled),
  in plain mode nothing; the lines after it are ingested as usual. Lines sent right behind the AUTH line,
  before its answer, are kept.
- Refused (a bad password, an unknown user, a first line that is not ``AUTH``, no line in time): the
  listener writes ``FATAL authentication failed`` (in both modes: a device reading nothing sees the
  connection close) and closes the connection. Every refusal is counted and logged by the shared
  ``Authenticator`` under ``tcp`` (rate-limited), never saying whether the user exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from broker.security import Principal

__all__ = ["AUTH_FAILED", "NOT_AUTHORIZED", "AuthLine", "LineAuthenticator", "parse_auth_line"]

AUTH_FAILED = b"FATAL authentication failed\n"
NOT_AUTHORIZED = b"FATAL not authorized\n"  # logged in, but the ACLs refuse this source's log topics
DOOR = "tcp"


class LineAuthenticator(Protocol):
    """What the listener needs of ``broker.security.Authenticator``."""

    def check_password(self, name: str, password: str) -> Principal | None: ...

    def succeeded(self, door: str) -> None: ...

    def failed(self, door: str, peer: str, user: str | None, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class AuthLine:
    user: str
    password: str


def parse_auth_line(line: bytes) -> AuthLine:
    """The credentials of an ``AUTH user password`` line; ValueError (the reason, without secrets) otherwise."""
    if line.endswith(b"\r"):
        line = line[:-1]
    verb, _, rest = line.partition(b" ")
    if verb != b"AUTH":
        raise ValueError("the first line is not AUTH <user> <password>")
    user, _, password = rest.partition(b" ")
    try:
        name, secret = user.decode("utf-8"), password.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("AUTH line is not UTF-8") from None
    if not name or not secret:
        raise ValueError("AUTH needs a user name and a password")
    return AuthLine(name, secret)
