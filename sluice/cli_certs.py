"""``sluice certs dev`` — a development CA, server certificate and client certificates (``sluice.dev_certs``).

For trying TLS out and for local compose setups, never for production (the CA key lies beside them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sluice.cli_common import JsonFlag, console, print_json
from sluice.dev_certs import issue_client, write_dev_certificates

__all__ = ["register"]

certs_app = typer.Typer(no_args_is_help=True, help="Certificates for TLS (development only).")


@certs_app.command("dev")
def dev(
    data_dir: Annotated[Path, typer.Option("--data-dir", envvar="SLUICE_DATA_DIR",
                                           help="Certificates go to DATA_DIR/tls.")] = Path("./sluice-data"),
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="More names or addresses the server certificate is valid for (repeatable).")] = None,
    client: Annotated[list[str] | None, typer.Option(
        "--client", help="Also issue a client certificate CN=NAME for mTLS (repeatable).")] = None,
    if_missing: Annotated[bool, typer.Option(
        "--if-missing", help="Keep the certificates already in DATA_DIR/tls (a container's first start).")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Write a new dev CA and server certificate (localhost, 127.0.0.1, ::1, this host) into DATA_DIR/tls."""
    directory = data_dir / "tls"
    if if_missing and (directory / "server.pem").exists() and (directory / "server-key.pem").exists():
        console.print(f"keeping the certificates in {directory}", markup=False)
        return
    try:
        files = write_dev_certificates(directory, tuple(host or ()))
        clients = {name: [str(p) for p in issue_client(directory, name)] for name in client or ()}
    except OSError as exc:
        typer.echo(f"error: cannot write certificates to {directory}: {exc.strerror}", err=True)
        raise typer.Exit(1) from None
    settings = {"SLUICE_SECURITY__TLS_CERT": str(files.cert), "SLUICE_SECURITY__TLS_KEY": str(files.key)}
    if json_out:
        print_json({"ca": str(files.ca), "settings": settings, "clients": clients})
        return
    console.print(f"wrote a development CA and server certificate to {directory} (not for production)")
    console.print(f"clients trust {files.ca}; start the broker with:", highlight=False)
    for name, value in settings.items():
        console.print(f"  export {name}={value}", markup=False, highlight=False)
    if clients:
        console.print(f"  export SLUICE_SECURITY__TLS_CLIENT_CA={files.ca}   # client certificates log in",
                      markup=False, highlight=False)
        for name, (cert, key) in clients.items():
            console.print(f"client {name}: {cert} {key}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(certs_app, name="certs")
