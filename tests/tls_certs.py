"""Certificates for TLS tests, generated per test run (``sluice.dev_certs``): never committed keys."""

from __future__ import annotations

import ssl
from pathlib import Path

from sluice.dev_certs import DevCertificates, issue_client, write_dev_certificates

__all__ = ["client_context", "make_certs", "tls_env"]


def make_certs(directory: Path, clients: tuple[str, ...] = ()) -> DevCertificates:
    files = write_dev_certificates(directory)
    for name in clients:
        issue_client(directory, name)
    return files


def tls_env(files: DevCertificates, client_ca: bool = False) -> dict[str, str]:
    env = {"SLUICE_SECURITY__TLS_CERT": str(files.cert), "SLUICE_SECURITY__TLS_KEY": str(files.key)}
    if client_ca:
        env["SLUICE_SECURITY__TLS_CLIENT_CA"] = str(files.ca)
    return env


def client_context(files: DevCertificates, client: str | None = None) -> ssl.SSLContext:
    """A client context trusting the dev CA (and presenting ``client``'s certificate if given)."""
    context = ssl.create_default_context(cafile=str(files.ca))
    if client is not None:
        context.load_cert_chain(files.directory / f"{client}.pem", files.directory / f"{client}-key.pem")
    return context
