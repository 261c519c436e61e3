"""Security shared by every front door: the user store (salted SCRAM credentials), SASL exchanges, the
``Authenticator`` front doors receive at construction, and the ``Principal`` a connection acts as.

No sockets here: listeners (``broker/server``, ``ingest/``) ask these objects and map the answers to their
protocol's codes. Errors: see ``broker.security.errors`` (root ``SecurityError``).
"""

from broker.security.authenticator import Authenticator
from broker.security.errors import (
    AuthenticationFailed,
    InvalidUserError,
    SecurityError,
    UnknownUserError,
    UnsupportedMechanismError,
    UserStoreError,
)
from broker.security.principal import ANONYMOUS, Principal
from broker.security.sasl import MECHANISMS, PlainExchange, SaslExchange, ScramExchange, start_exchange
from broker.security.users import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    SCRAM_MECHANISMS,
    CredentialChange,
    ScramCredential,
    UserStore,
    check_name,
)

__all__ = [
    "ANONYMOUS",
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "MECHANISMS",
    "SCRAM_MECHANISMS",
    "AuthenticationFailed",
    "Authenticator",
    "CredentialChange",
    "InvalidUserError",
    "PlainExchange",
    "Principal",
    "SaslExchange",
    "ScramCredential",
    "ScramExchange",
    "SecurityError",
    "UnknownUserError",
    "UnsupportedMechanismError",
    "UserStore",
    "UserStoreError",
    "check_name",
    "start_exchange",
]
