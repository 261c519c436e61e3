"""The one ``Authenticator`` and ``Authorizer`` every front door of a running Sluice shares, built from
``settings.security``.

With ``security.auth = "required"`` the authenticator checks logins against the user store and bearer
tokens in the data directory (``broker.security.UserStore``, ``TokenStore``) and the authorizer answers
from the ACL store there (``AclStore``) and ``security.super_users``; they are published as
``runtime.registries["authenticator"]`` and ``["authorizer"]``. With ``"off"`` there are none: front doors
ask nobody and allow everything. Counters go to ``/metrics``: ``sluice_auth_failures_total{front_door}``,
``sluice_auth_logins_total{front_door}`` and ``sluice_authorization_denied_total{front_door}``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.security import AclStore, Authenticator, Authorizer, TokenStore, UserStore
from sluice.front_metrics import publish_collector
from sluice.runtime import Runtime

__all__ = ["AuthCollector", "authenticator", "authorizer"]

log = logging.getLogger("sluice.security")

_DOORS = ("kafka", "mqtt", "tcp", "http")


class AuthCollector(Collector):
    def __init__(self, auth: Authenticator, authz: Authorizer) -> None:
        self.auth = auth
        self.authz = authz

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily("sluice_auth_failures", "Failed logins (refused credentials or SASL "
                                       "exchanges, requests before login), by front door", labels=["front_door"])
        logins = CounterMetricFamily("sluice_auth_logins", "Successful logins, by front door", labels=["front_door"])
        denied = CounterMetricFamily("sluice_authorization_denied", "Requests the ACLs refused (answered with "
                                     "the front door's authorization error), by front door", labels=["front_door"])
        for door in _DOORS:
            failures.add_metric([door], self.auth.failures.get(door, 0))
            logins.add_metric([door], self.auth.successes.get(door, 0))
            denied.add_metric([door], self.authz.denials.get(door, 0))
        yield failures
        yield logins
        yield denied


def authenticator(runtime: Runtime) -> Authenticator | None:
    """The runtime's authenticator (created on first use), or None when ``security.auth`` is off."""
    if runtime.settings.security.auth == "off":
        return None
    existing = runtime.registries.get("authenticator")
    if isinstance(existing, Authenticator):
        return existing
    data_dir = runtime.settings.data_dir
    tokens = TokenStore(data_dir)
    tokens.list_tokens()  # an unreadable token store fails start-up (UserStoreError), as the user store does
    auth = Authenticator(UserStore(data_dir), tokens=tokens)
    if not auth.users.names():  # also fails start-up here (UserStoreError) when the store cannot be read
        log.warning(f"security.auth = required but {auth.users.path} holds no users: every login will fail "
                    f"(create one: sluice users add NAME --data-dir {data_dir})")
    runtime.registries["authenticator"] = auth
    publish_collector(runtime, AuthCollector(auth, _build_authorizer(runtime)))
    return auth


def _build_authorizer(runtime: Runtime) -> Authorizer:
    settings = runtime.settings.security
    try:
        authz = Authorizer(AclStore(runtime.settings.data_dir), settings.super_users)
    except ValueError as exc:
        raise ValueError(f"security.super_users: {exc}") from None
    authz.acls.bindings()  # an unreadable ACL store fails start-up (UserStoreError)
    if not authz.super_users and not authz.acls.bindings():
        log.warning("security.auth = required with no ACLs and no security.super_users: every request will be "
                    "refused (sluice acl add ... --data-dir, or SLUICE_SECURITY__SUPER_USERS='[\"admin\"]')")
    runtime.registries["authorizer"] = authz
    return authz


def authorizer(runtime: Runtime) -> Authorizer | None:
    """The runtime's authorizer (ACLs and super users), or None when ``security.auth`` is off."""
    if authenticator(runtime) is None:
        return None
    authz = runtime.registries["authorizer"]
    assert isinstance(authz, Authorizer)
    return authz
