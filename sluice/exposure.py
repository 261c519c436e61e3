"""Refuse to open an unauthenticated broker to the network.

Rule: with ``security.auth = "off"`` every enabled listener must be bound to a loopback address
(127.0.0.0/8, ::1, or a name resolving only to those, such as ``localhost``). Otherwise ``sluice serve``
refuses to start with an error naming each exposed listener and the two ways out (turn authentication on,
or set ``security.allow_insecure = true``); with ``allow_insecure`` it starts and logs one WARNING naming them.
An empty host or ``0.0.0.0`` / ``::`` (every interface) is never loopback.

Rule 2 (Kafka's: ``advertised.listeners cannot use the nonroutable meta-address 0.0.0.0``): a Kafka listener
bound to every interface must be given the address clients are told to connect to (``kafka.advertised_host``,
or the extra listener's ``advertised_host``); otherwise ``sluice serve`` refuses to start. Without it, clients
on other machines bootstrap and are then sent to 0.0.0.0, which is not this machine for them.
"""

from __future__ import annotations

import ipaddress
import logging
import socket

from broker.security import SecurityError
from sluice.config import Settings

__all__ = [
    "InsecureExposureError",
    "UnroutableAdvertisedHostError",
    "check_advertised_hosts",
    "check_exposure",
    "exposed_listeners",
    "is_loopback",
]

log = logging.getLogger("sluice.security")


class InsecureExposureError(SecurityError):
    """Listeners would accept anyone from the network: auth is off and a bind address is not loopback."""


class UnroutableAdvertisedHostError(ValueError):
    """A Kafka listener binds every interface and nobody said which address its clients should be sent to."""


_EVERY_INTERFACE = frozenset({"", "0.0.0.0", "::", "[::]"})


def is_loopback(host: str) -> bool:
    """True when every address ``host`` binds is a loopback address."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if host.lower() == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False  # unresolvable: the bind will fail anyway, but never call it safe
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def _listeners(settings: Settings) -> list[tuple[str, str]]:
    """(listener, bind host) of every enabled listener."""
    found: list[tuple[str, str]] = []
    if settings.kafka.enabled:
        found.append(("kafka", settings.host))
        found += [(f"kafka:{extra.name}", extra.host or settings.host) for extra in settings.kafka.extra_listeners]
    if settings.mqtt.enabled:
        found.append(("mqtt", settings.host))
    if settings.tcp.enabled:
        found.append(("tcp", settings.host))
    if settings.http.enabled:
        found.append(("http", settings.host))
    return found


def exposed_listeners(settings: Settings) -> list[str]:
    """``name on host`` for each enabled listener bound beyond loopback (empty when auth is required)."""
    if settings.security.auth != "off":
        return []
    return [f"{name} on {host or '*'}" for name, host in _listeners(settings) if not is_loopback(host)]


def check_exposure(settings: Settings) -> None:
    """Raise ``InsecureExposureError`` (or, with ``security.allow_insecure``, log a WARNING) for exposed listeners."""
    exposed = exposed_listeners(settings)
    if not exposed:
        return
    listed = ", ".join(exposed)
    if settings.security.allow_insecure:
        log.warning(f"security.auth = off and listeners accept anyone from the network ({listed}): "
                    "security.allow_insecure = true allows it; turn authentication on before devices or "
                    "clients you do not control can reach this host")
        return
    raise InsecureExposureError(
        f"refusing to start: security.auth = off and listeners are bound beyond loopback ({listed}). "
        "Turn authentication on (SLUICE_SECURITY__AUTH=required, users from `sluice users add NAME --data-dir DIR`), "
        "bind to 127.0.0.1, or set security.allow_insecure = true (SLUICE_SECURITY__ALLOW_INSECURE=true) "
        "to accept an open broker")


def check_advertised_hosts(settings: Settings) -> None:
    """Raise ``UnroutableAdvertisedHostError`` for each Kafka listener that would advertise 0.0.0.0 (rule 2)."""
    if not settings.kafka.enabled:
        return
    kafka = settings.kafka
    unroutable: list[tuple[str, str, str]] = []  # (listener, bind host, the setting to set)
    if kafka.advertised_host is None and settings.host in _EVERY_INTERFACE:
        unroutable.append(("kafka", settings.host, "kafka.advertised_host (SLUICE_KAFKA__ADVERTISED_HOST)"))
    for extra in kafka.extra_listeners:
        host = extra.host or settings.host
        if extra.advertised_host is None and host in _EVERY_INTERFACE:
            unroutable.append((f"kafka:{extra.name}", host, "its advertised_host in kafka.extra_listeners"))
    if unroutable:
        listed = "; ".join(f"{name} binds {host or '*'}: set {setting}" for name, host, setting in unroutable)
        raise UnroutableAdvertisedHostError(
            f"a Kafka listener on every interface needs the address its clients are sent to ({listed}), e.g. "
            "SLUICE_KAFKA__ADVERTISED_HOST=broker.example, the name or address clients reach this machine by "
            "(Kafka refuses to advertise 0.0.0.0 too)")
