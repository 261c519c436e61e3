"""The one server TLS context of a running Sluice, built from ``settings.security`` and shared by every
listener (``broker.security.tls``); SIGHUP reloads its certificate (``sluice serve`` installs the handler).

``server_tls(runtime)`` builds it on first use and publishes it as ``runtime.registries["tls"]``; it is
None when ``security.tls_cert`` / ``security.tls_key`` are not set. A bad file fails start-up with a
``TlsConfigError`` naming the setting and the file.
"""

from __future__ import annotations

import ssl

from broker.security.tls import ReloadableTls, TlsFiles
from sluice.config import SecuritySettings
from sluice.runtime import Runtime

__all__ = ["handshake_timeout", "reload_tls", "server_context", "server_tls", "tls_files"]


def tls_files(security: SecuritySettings) -> TlsFiles | None:
    if security.tls_cert is None or security.tls_key is None:
        return None
    password = security.tls_key_password.get_secret_value() if security.tls_key_password is not None else None
    return TlsFiles(security.tls_cert, security.tls_key, password, security.tls_client_ca,
                    security.tls_client_auth)


def server_tls(runtime: Runtime) -> ReloadableTls | None:
    existing = runtime.registries.get("tls")
    if isinstance(existing, ReloadableTls):
        return existing
    files = tls_files(runtime.settings.security)
    if files is None:
        return None
    tls = ReloadableTls(files)
    runtime.registries["tls"] = tls
    return tls


def server_context(runtime: Runtime) -> ssl.SSLContext | None:
    """The shared context listeners are given (None: plaintext)."""
    tls = server_tls(runtime)
    return tls.context if tls is not None else None


def handshake_timeout(runtime: Runtime) -> float:
    return runtime.settings.security.tls_handshake_timeout_s


def reload_tls(runtime: Runtime) -> None:
    """SIGHUP: new handshakes use the files as they are now; open connections are kept."""
    tls = runtime.registries.get("tls")
    if isinstance(tls, ReloadableTls):
        tls.reload()
