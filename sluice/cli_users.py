"""``sluice users add|list|delete`` — the user store of a broker's data directory (``broker.security``).

These work offline, on the files of ``--data-dir`` (how the first user is made, before auth is turned on);
a running broker reading that directory picks the change up at its next login. The password is read from
a prompt (asked twice) or, when stdin is not a terminal, from stdin's first line — never from a flag,
which would leave it in the shell history and the process list.
"""

from __future__ import annotations

import getpass
import sys
from pathlib import Path
from typing import Annotated

import typer

from broker.security import SecurityError, UnknownUserError, UserStore
from sluice.cli_common import JsonFlag, console, print_json

__all__ = ["register"]

users_app = typer.Typer(no_args_is_help=True, help="Add, list and delete users (SCRAM credentials, offline).")

DataDir = Annotated[Path, typer.Option("--data-dir", envvar="SLUICE_DATA_DIR",
                                       help="The broker's data directory (default ./sluice-data).")]
_DEFAULT_DIR = Path("./sluice-data")


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


@users_app.command("add")
def add(name: str, data_dir: DataDir = _DEFAULT_DIR, json_out: JsonFlag = False) -> None:
    """Create a user, or set a new password for an existing one (password from a prompt or stdin)."""
    password = _read_password()
    try:
        created = UserStore(data_dir).add(name, password)
    except SecurityError as exc:
        raise _fail(str(exc)) from None
    if json_out:
        print_json({"user": name, "created": created})
    else:
        console.print(f"{'added user' if created else 'changed the password of'} {name}")


@users_app.command("list")
def list_users(data_dir: DataDir = _DEFAULT_DIR, json_out: JsonFlag = False) -> None:
    """List user names (never credentials)."""
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
def delete(name: str, data_dir: DataDir = _DEFAULT_DIR, json_out: JsonFlag = False) -> None:
    """Delete a user (its connections stay open until they close; new logins are refused)."""
    try:
        UserStore(data_dir).delete(name)
    except UnknownUserError:
        raise _fail(f"no user {name!r} in {data_dir}") from None
    except SecurityError as exc:
        raise _fail(str(exc)) from None
    if json_out:
        print_json({"user": name, "deleted": True})
    else:
        console.print(f"deleted user {name}")


def register(app: typer.Typer) -> None:
    app.add_typer(users_app, name="users")
