"""How a client logs in to a secured Sluice (``security.auth = "required"``, TLS): one value for every transport.

``ClientSecurity.from_env()`` reads the environment the ``sluice`` CLI documents, never flags (a password in a
flag would sit in the shell history and the process list):

    SLUICE_USER, SLUICE_PASSWORD   a user of the broker's user store (SASL for Kafka, CONNECT for MQTT,
                                   the AUTH line for TCP ingest)
    SLUICE_TLS_CA                  a PEM file of the CA to trust; set, every connection uses TLS (Kafka
                                   SASL_SSL or SSL, MQTT over TLS, TLS to the TCP listener)
    SLUICE_SASL_MECHANISM          Kafka's SASL mechanism (default SCRAM-SHA-256; PLAIN, SCRAM-SHA-512)

Unset, clients connect in plaintext without a login, as before.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ClientSecurity"]

_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None  # trust this CA and use TLS
    mechanism: str = "SCRAM-SHA-256"

    def __post_init__(self) -> None:
        if (self.username is None) != (self.password is None):
            raise ValueError("a user name needs a password (SLUICE_USER and SLUICE_PASSWORD together)")
        if self.mechanism not in _MECHANISMS:
            raise ValueError(f"unsupported SASL mechanism {self.mechanism!r} (one of {', '.join(_MECHANISMS)})")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientSecurity:
        env = os.environ if env is None else env
        user = env.get("SLUICE_USER") or None
        return cls(username=user, password=env.get("SLUICE_PASSWORD", "") if user else None,
                   ca_file=env.get("SLUICE_TLS_CA") or None,
                   mechanism=env.get("SLUICE_SASL_MECHANISM") or "SCRAM-SHA-256")

    @property
    def tls(self) -> bool:
        return self.ca_file is not None

    def ssl_context(self) -> ssl.SSLContext | None:
        """A context trusting ``ca_file`` and checking the server's name, or None without TLS."""
        if self.ca_file is None:
            return None
        return ssl.create_default_context(cafile=self.ca_file)

    def kafka_options(self) -> dict[str, Any]:
        """aiokafka's keyword arguments (producer, consumer and admin client alike)."""
        options: dict[str, Any] = {}
        if self.username is not None:
            options.update(security_protocol="SASL_SSL" if self.tls else "SASL_PLAINTEXT",
                           sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                           sasl_plain_password=self.password)
        elif self.tls:
            options["security_protocol"] = "SSL"
        if self.tls:
            options["ssl_context"] = self.ssl_context()
        return options
