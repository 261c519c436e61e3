"""The one ``Authenticator`` every front door of a running Sluice shares, built from ``settings.security``.

With ``security.auth = "required"`` it checks logins against the user store in the data directory
(``broker.security.UserStore``) and is published as ``runtime.registries["authenticator"]``; with
``"off"`` there is none and front doors ask nobody. Its counters go to ``/metrics``:
``sluice_auth_failures_total{front_door}`` and ``sluice_auth_logins_total{front_door}``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.security import Authenticator, UserStore
from sluice.front_metrics import publish_collector
from sluice.runtime import Runtime

__all__ = ["AuthCollector", "authenticator"]

log = logging.getLogger("sluice.security")

_DOORS = ("kafka", "mqtt")


class AuthCollector(Collector):
    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily("sluice_auth_failures", "Failed logins (refused credentials or SASL "
                                       "exchanges, requests before login), by front door", labels=["front_door"])
        logins = CounterMetricFamily("sluice_auth_logins", "Successful logins, by front door", labels=["front_door"])
        for door in _DOORS:
            failures.add_metric([door], self.auth.failures.get(door, 0))
            logins.add_metric([door], self.auth.successes.get(door, 0))
        yield failures
        yield logins


def authenticator(runtime: Runtime) -> Authenticator | None:
    """The runtime's authenticator (created on first use), or None when ``security.auth`` is off."""
    if runtime.settings.security.auth == "off":
        return None
    existing = runtime.registries.get("authenticator")
    if isinstance(existing, Authenticator):
        return existing
    auth = Authenticator(UserStore(runtime.settings.data_dir))
    if not auth.users.names():  # also fails start-up here (UserStoreError) when the store cannot be read
        log.warning(f"security.auth = required but {auth.users.path} holds no users: every login will fail "
                    f"(create one: sluice users add NAME --data-dir {runtime.settings.data_dir})")
    runtime.registries["authenticator"] = auth
    publish_collector(runtime, AuthCollector(auth))
    return auth
