"""``sluice tokens create|list|revoke`` — bearer tokens for the HTTP API (``broker.security.TokenStore``).

Offline, on the files of ``--data-dir`` (a running broker reading that directory sees a new or revoked token
at its next request). A token is printed once, when made; the store keeps only its SHA-256.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated

import typer

from broker.security import SecurityError, TokenStore, UnknownUserError
from sluice.cli_common import JsonFlag, console, print_json

__all__ = ["register"]

DataDir = Annotated[Path, typer.Option("--data-dir", envvar="SLUICE_DATA_DIR",
                                       help="The broker's data directory (default ./sluice-data).")]
_DEFAULT_DIR = Path("./sluice-data")


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)

tokens_app = typer.Typer(no_args_is_help=True, help="Create, list and revoke HTTP API bearer tokens (offline).")


@tokens_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="The principal the token acts as (User:NAME in ACLs).")],
    data_dir: DataDir = _DEFAULT_DIR,
    description: Annotated[str, typer.Option(help="What the token is for (shown by list).")] = "",
    json_out: JsonFlag = False,
) -> None:
    """Make a token for NAME and print it (once: only its hash is kept). Send it as Authorization: Bearer."""
    try:
        token, info = TokenStore(data_dir).create(name, description)
    except SecurityError as exc:
        raise _fail(str(exc)) from None
    if json_out:
        print_json({"token": token, **info.to_json()})
    else:
        console.print(f"token {info.id} for User:{name} (shown once; keep it secret):", markup=False)
        typer.echo(token)


@tokens_app.command("list")
def list_tokens(data_dir: DataDir = _DEFAULT_DIR, json_out: JsonFlag = False) -> None:
    """List tokens: id, principal, creation time (never the tokens)."""
    try:
        infos = TokenStore(data_dir).list_tokens()
    except SecurityError as exc:
        raise _fail(str(exc)) from None
    if json_out:
        print_json({"tokens": [i.to_json() for i in infos]})
        return
    if not infos:
        console.print("no tokens")
    for info in infos:
        created = datetime.datetime.fromtimestamp(info.created_ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M")
        console.print(f"{info.id}  User:{info.name}  {created} UTC  {info.description}".rstrip(), markup=False)


@tokens_app.command("revoke")
def revoke(
    id_or_name: Annotated[str, typer.Argument(help="A token id (from list), or a name: all of its tokens.")],
    data_dir: DataDir = _DEFAULT_DIR,
    json_out: JsonFlag = False,
) -> None:
    """Revoke a token (or every token of a name); requests with it are refused (401) from then on."""
    try:
        gone = TokenStore(data_dir).revoke(id_or_name)
    except UnknownUserError as exc:
        raise _fail(f"{exc} in {data_dir}") from None
    except SecurityError as exc:
        raise _fail(str(exc)) from None
    if json_out:
        print_json({"revoked": [i.to_json() for i in gone]})
    else:
        for info in gone:
            console.print(f"revoked token {info.id} of User:{info.name}", markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(tokens_app, name="tokens")
