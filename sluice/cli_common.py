"""Shared pieces of the ``sluice`` client commands: exit codes, error reporting, output, options.

Exit codes (documented in docs/cli.md):

    0  ok
    1  runtime failure (the broker refused a request, a device could not deliver, ...)
    2  usage error (bad flags or arguments; typer's own code)
    3  Sluice unreachable (Kafka protocol or HTTP API)
    4  not found (unknown topic or group)
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
from collections.abc import Coroutine
from typing import Annotated, Any, NoReturn, TypeVar

import httpx
import typer
from rich.console import Console

from clients.errors import (
    BrokerUnreachableError,
    ClientError,
    TopicExistsError,
    UnknownGroupError,
    UnknownTopicError,
)
from clients.security import ClientSecurity

__all__ = [
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_RUNTIME",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "Bootstrap",
    "HttpUrl",
    "JsonFlag",
    "console",
    "err_console",
    "fail",
    "http_auth",
    "http_get",
    "http_request",
    "name_value_pairs",
    "plural",
    "print_json",
    "run",
]

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4

def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 record``, ``2 records``, ``0 records`` (``nouns`` for irregular plurals)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


DEFAULT_BOOTSTRAP = os.environ.get("SLUICE_BOOTSTRAP", "127.0.0.1:9092")
DEFAULT_HTTP = os.environ.get("SLUICE_HTTP", "http://127.0.0.1:8080")

Bootstrap = Annotated[
    str, typer.Option("--bootstrap", "-b", help="Kafka-protocol address of Sluice (env SLUICE_BOOTSTRAP).")
]
HttpUrl = Annotated[str, typer.Option("--http", help="Base URL of Sluice's HTTP API (env SLUICE_HTTP).")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]


class _Console(Console):
    """A rich Console that sizes itself when it prints: ``COLUMNS`` if set, else the terminal's width, else 80.

    Rich keeps a ``COLUMNS``/``LINES`` set when the Console is made for good, so the module-level consoles
    below would take the width of whatever environment first imported this module (pytest-xdist workers
    start with ``COLUMNS=80``) instead of the command's own: tables squeezed to 80 columns in a pipe whose
    caller asked for 200."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._width = self._height = None  # rich's ``size`` then reads the terminal and the environment


console: Console = _Console(highlight=False, soft_wrap=True)
err_console: Console = _Console(stderr=True, highlight=False, soft_wrap=True)

T = TypeVar("T")


def fail(message: str, code: int) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", markup=True)
    raise typer.Exit(code)


def run(coro: Coroutine[Any, Any, T], *, topic: str | None = None, group: str | None = None) -> T:
    """Run a command's coroutine, turning client errors into one sentence and an exit code."""
    try:
        return asyncio.run(coro)
    except BrokerUnreachableError as exc:
        fail(str(exc).split(" (")[0], EXIT_UNREACHABLE)
    except UnknownTopicError:
        name = topic or "?"
        fail(f"unknown topic {name!r}: create it with `sluice topics create {name}`", EXIT_NOT_FOUND)
    except UnknownGroupError:
        fail(f"unknown consumer group {group!r}: `sluice groups list` shows the groups Sluice knows", EXIT_NOT_FOUND)
    except TopicExistsError:
        fail(f"topic {topic!r} already exists: pick another name or `sluice topics delete {topic}` first", EXIT_RUNTIME)
    except ClientError as exc:
        fail(str(exc), EXIT_RUNTIME)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def name_value_pairs(pairs: list[str] | None, usage: str) -> dict[str, str]:
    """Repeatable ``name=value`` options as a dict; a pair without ``=`` fails with ``usage``."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep:
            fail(f"{usage}, got {pair!r}", EXIT_USAGE)
        out[name] = value
    return out


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def http_auth() -> httpx.Auth | None:
    """The caller's credentials for the HTTP API (a broker with ``security.auth = required``), from the
    environment, never from flags: ``SLUICE_TOKEN`` (a bearer token), else ``SLUICE_USER`` and
    ``SLUICE_PASSWORD`` (Basic)."""
    token = os.environ.get("SLUICE_TOKEN")
    if token:
        return _Bearer(token)
    user = os.environ.get("SLUICE_USER")
    if user:
        return httpx.BasicAuth(user, os.environ.get("SLUICE_PASSWORD", ""))
    return None


class _Bearer(httpx.Auth):
    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    def auth_flow(self, request: httpx.Request) -> Any:
        request.headers["Authorization"] = self._header
        yield request


async def http_request(method: str, base: str, path: str, *, params: dict[str, Any] | None = None,
                       json_body: Any = None) -> httpx.Response:
    """One request with the caller's credentials (``http_auth``); unreachable exits 3, 401/403 exit 1."""
    url = base.rstrip("/") + path
    try:
        # SLUICE_TLS_CA: trust that CA for an HTTPS API (a dev certificate), else the system's
        verify: ssl.SSLContext | bool = ClientSecurity.from_env().ssl_context() or True
        async with httpx.AsyncClient(timeout=10, auth=http_auth(), verify=verify) as client:
            resp = await client.request(method, url, params=params, json=json_body)
    except httpx.TransportError:
        fail(f"cannot reach the Sluice HTTP API at {base}: is `sluice serve` running? pass --http", EXIT_UNREACHABLE)
    if resp.status_code in (401, 403):
        detail = resp.json().get("detail", resp.text) if resp.content else resp.reason_phrase
        hint = " (set SLUICE_TOKEN, or SLUICE_USER and SLUICE_PASSWORD)" if resp.status_code == 401 else ""
        fail(f"the HTTP API answered {resp.status_code}: {detail}{hint}", EXIT_RUNTIME)
    return resp


async def http_get(base: str, path: str, params: dict[str, Any] | None = None, *, missing_ok: bool = False) -> Any:
    """GET a JSON document; unreachable exits 3, 404 exits 4 (or returns None with ``missing_ok``)."""
    resp = await http_request("GET", base, path, params=params)
    if resp.status_code == 404:
        if missing_ok:
            return None
        detail = resp.json().get("detail", "not found") if resp.content else "not found"
        fail(detail, EXIT_NOT_FOUND)
    if resp.status_code >= 400:
        detail = resp.json().get("detail", resp.text) if resp.content else resp.reason_phrase
        fail(f"the HTTP API answered {resp.status_code}: {detail}", EXIT_RUNTIME)
    return resp.json()
