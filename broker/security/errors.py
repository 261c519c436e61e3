"""Errors raised by ``broker.security``.

One root, so callers can catch everything this package raises::

    SecurityError
    ├── InvalidUserError          a user name or password this store refuses (also a ValueError)
    ├── UnknownUserError          no such user (deleting one that is not there)
    ├── AuthenticationFailed      the peer's credentials or SASL exchange were not accepted (the peer's fault)
    │   └── UnsupportedMechanismError  a SASL mechanism this broker does not offer
    ├── UserStoreError            our side: the user store in the data directory cannot be read or written
    └── TlsConfigError            the TLS settings name a missing, unreadable or mismatched certificate or key
"""

from __future__ import annotations

__all__ = [
    "AuthenticationFailed",
    "InvalidUserError",
    "SecurityError",
    "TlsConfigError",
    "UnknownUserError",
    "UnsupportedMechanismError",
    "UserStoreError",
]


class SecurityError(Exception):
    """Root of every error ``broker.security`` raises."""


class InvalidUserError(SecurityError, ValueError):
    """The user name or password cannot be stored (empty, control characters, too long)."""


class UnknownUserError(SecurityError, LookupError):
    """No user of that name."""


class AuthenticationFailed(SecurityError):
    """The credentials (or the SASL exchange carrying them) were not accepted.

    The message is safe to send to the peer: it never says whether the user exists."""


class UnsupportedMechanismError(AuthenticationFailed):
    """The client asked for a SASL mechanism this broker does not offer."""


class UserStoreError(SecurityError):
    """The user store file cannot be read, parsed or written."""


class TlsConfigError(SecurityError):
    """A TLS certificate, key or CA file cannot be used (the message names the setting and the file)."""
