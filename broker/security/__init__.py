"""Security shared by every front door: the user store (salted SCRAM credentials), bearer tokens, SASL
exchanges, the ``Authenticator`` and ``Authorizer`` (ACLs) front doors receive at construction, and the
``Principal`` a connection acts as.

No sockets here: listeners (``broker/server``, ``ingest/``) ask these objects and map the answers to their
protocol's codes. Errors: see ``broker.security.errors`` (root ``SecurityError``).
"""

from broker.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    normalize_principal,
)
from broker.security.acl_authorizer import Authorizer
from broker.security.acl_store import AclStore
from broker.security.authenticator import Authenticator
from broker.security.errors import (
    AuthenticationFailed,
    InvalidUserError,
    SecurityError,
    TlsConfigError,
    UnknownUserError,
    UnsupportedMechanismError,
    UserStoreError,
)
from broker.security.principal import ANONYMOUS, Principal
from broker.security.quotas import ProduceQuotas
from broker.security.sasl import MECHANISMS, PlainExchange, SaslExchange, ScramExchange, start_exchange
from broker.security.tokens import TokenInfo, TokenStore
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
    "CLUSTER_NAME",
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "MECHANISMS",
    "SCRAM_MECHANISMS",
    "AclBinding",
    "AclFilter",
    "AclStore",
    "AuthenticationFailed",
    "Authenticator",
    "Authorizer",
    "CredentialChange",
    "InvalidUserError",
    "Operation",
    "PatternType",
    "Permission",
    "PlainExchange",
    "ProduceQuotas",
    "Principal",
    "ResourceType",
    "SaslExchange",
    "ScramCredential",
    "ScramExchange",
    "SecurityError",
    "TlsConfigError",
    "TokenInfo",
    "TokenStore",
    "UnknownUserError",
    "UnsupportedMechanismError",
    "UserStore",
    "UserStoreError",
    "check_name",
    "normalize_principal",
    "start_exchange",
]
