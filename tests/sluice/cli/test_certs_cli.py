"""``sluice certs dev``: the files it writes verify with openssl (server for localhost, client for mTLS), keys are
private to the owner, and the printed settings start a TLS broker."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from broker.security.tls import TlsFiles, build_server_context


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_certs_dev_writes_a_verifiable_chain(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "sluice.cli", "certs", "dev", "--data-dir", str(tmp_path),
                           "--host", "sluice.internal", "--client", "device-9", "--json"],
                          capture_output=True, text=True, timeout=60, check=True)
    out = json.loads(done.stdout)
    tls = tmp_path / "tls"
    assert out["settings"] == {"SLUICE_SECURITY__TLS_CERT": str(tls / "server.pem"),
                               "SLUICE_SECURITY__TLS_KEY": str(tls / "server-key.pem")}
    for cert, purpose in (("server.pem", "sslserver"), ("device-9.pem", "sslclient")):
        verified = subprocess.run(["openssl", "verify", "-purpose", purpose, "-CAfile", str(tls / "ca.pem"),
                                   str(tls / cert)], capture_output=True, text=True)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    names = subprocess.run(["openssl", "x509", "-in", str(tls / "server.pem"), "-noout", "-ext", "subjectAltName"],
                           capture_output=True, text=True, check=True).stdout
    assert "DNS:localhost" in names and "IP Address:127.0.0.1" in names and "DNS:sluice.internal" in names
    for key in ("ca-key.pem", "server-key.pem", "device-9-key.pem"):
        assert (tls / key).stat().st_mode & 0o077 == 0
    build_server_context(TlsFiles(tls / "server.pem", tls / "server-key.pem", client_ca=tls / "ca.pem"))
