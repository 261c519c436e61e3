"""``sluice users add|list|delete`` — the user store (salted SCRAM credentials, ``broker.security``).

Two ways, the same store:
- ``--data-dir DIR`` (or ``SLUICE_DATA_DIR``): offline, on the files of a broker's data directory (how the
  first user is made, before auth is turned on); a running broker reading that directory picks the change up
  at its next login.
- Without it: through the HTTP API of a running broker (``--http``, env ``SLUICE_HTTP``) with the caller's
  credentials (``SLUICE_TOKEN``, or ``SLUICE_USER`` and ``SLUICE_PASSWORD``); listing needs describe on the
  cluster, adding and deleting alter on the cluster (super users have both).

The password is read from a prompt (asked twice) or, when stdin is not a terminal, from stdin's first line, or
from the environment variable named by ``--password-env`` (a container's secret) — never from a flag's value,
which would leave it in the shell history and the process list.
"""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from broker.security import SecurityError, UnknownUserError, UserStore
from sluice.cli_common import (
    DEFAULT_HTTP,
    EXIT_NOT_FOUND,
    EXIT_RUNTIME,
    HttpUrl,
    JsonFlag,
    console,
    fail,
    http_request,
    print_json,
    run,
)

__all__ = ["register"]

users_app = typer.Typer(no_args_is_help=True,
                        help="Add, list and delete users (SCRAM credentials): offline with --data-dir, else over HTTP.")

DataDir = Annotated[Path | None, typer.Option(
    "--data-dir", envvar="SLUICE_DATA_DIR",
    help="Work offline on this data directory; without it, the running broker's HTTP API (--http) is used.")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _read_password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("Password: ")
        if getpass.getpass("Password again: ") != first:
            raise _fail("the passwords do not match")
        return first
    line = sys.stdin.readline()
    return line[:-1] if line.endswith("\n") else line


async def _api(method: str, base: str, path: str, json_body: Any = None) -> Any:
    resp = await http_request(method, base, path, json_body=json_body)
    if resp.status_code == 404:
        fail(resp.json().get("detail", "not found") if resp.content else "not found", EXIT_NOT_FOUND)
    if resp.status_code >= 400:
        detail = resp.json().get("detail", resp.text) if resp.content else resp.reason_phrase
        fail(f"the HTTP API answered {resp.status_code}: {detail}", EXIT_RUNTIME)
    return resp.json() if resp.content else None


@users_app.command("add")
def add(
    name: str,
    data_dir: DataDir = None,
    http: HttpUrl = DEFAULT_HTTP,
    password_env: Annotated[str | None, typer.Option(
        "--password-env", metavar="VAR",
        help="Read the password from environment variable VAR (containers, secrets) instead of stdin.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Create a user, or set a new password for an existing one (password from a prompt, stdin or --password-env)."""
    if password_env is not None:
        password = os.environ.get(password_env, "")
        if not password:
            raise _fail(f"environment variable {password_env} is not set or empty")
    else:
        password = _read_password()
    if data_dir is None:
        if not password:
            raise _fail("a password may not be empty")
        created = bool(run(_api("PUT", http, f"/users/{quote(name, safe='')}", {"password": password}))["created"])
    else:
        try:
            created = UserStore(data_dir).add(name, password)
        except SecurityError as exc:
            raise _fail(str(exc)) from None
    if json_out:
        print_json({"user": name, "created": created})
    else:
        console.print(f"{'added user' if created else 'changed the password of'} {name}", markup=False)


@users_app.command("list")
def list_users(data_dir: DataDir = None, http: HttpUrl = DEFAULT_HTTP, json_out: JsonFlag = False) -> None:
    """List user names (never credentials)."""
    if data_dir is None:
        names = [user["name"] for user in run(_api("GET", http, "/users"))["users"]]
    else:
        try:
            names = UserStore(data_dir).names()
        except SecurityError as exc:
            raise _fail(str(exc)) from None
    if json_out:
        print_json({"users": names})
    elif not names:
        console.print("no users")
    else:
        for name in names:
            console.print(name, markup=False, highlight=False)


@users_app.command("delete")
def delete(name: str, data_dir: DataDir = None, http: HttpUrl = DEFAULT_HTTP, json_out: JsonFlag = False) -> None:
    """Delete a user (its connections stay open until they close; new logins are refused)."""
    if data_dir is None:
        run(_api("DELETE", http, f"/users/{quote(name, safe='')}"))
    else:
        try:
            UserStore(data_dir).delete(name)
        except UnknownUserError:
            raise _fail(f"no user {name!r} in {data_dir}") from None
        except SecurityError as exc:
            raise _fail(str(exc)) from None
    if json_out:
        print_json({"user": name, "deleted": True})
    else:
        console.print(f"deleted user {name}", markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(users_app, name="users")
